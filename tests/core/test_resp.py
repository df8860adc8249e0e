"""The RESP2 reader and writer (core/resp.py) without a server: every reply split at every byte."""

from __future__ import annotations

from typing import Any

import pytest
from redis.exceptions import AuthenticationError, NoScriptError, ResponseError

from django_redlock.core.resp import INCOMPLETE, ReplyBuffer, pack

#: A reply on the wire and what the reader returns for it (an error reply: its type and text).
REPLIES: list[tuple[bytes, Any]] = [
    (b"+OK\r\n", b"OK"),
    (b"+\r\n", b""),
    (b":0\r\n", 0),
    (b":1\r\n", 1),
    (b":-2\r\n", -2),
    (b":1234567890123\r\n", 1234567890123),
    (b"$-1\r\n", None),
    (b"$0\r\n\r\n", b""),
    (b"$5\r\nhello\r\n", b"hello"),
    (b"$4\r\na\r\nb\r\n", b"a\r\nb"),  # CRLF inside a bulk string
    (b"*-1\r\n", None),
    (b"*0\r\n", []),
    (b"*3\r\n$1\r\nv\r\n:2500\r\n$-1\r\n", [b"v", 2500, None]),
    (b"*2\r\n*2\r\n$1\r\na\r\n:1\r\n*0\r\n", [[b"a", 1], []]),
    (b"*2\r\n+OK\r\n-ERR inside\r\n", [b"OK", (ResponseError, "ERR inside")]),
    (b"-ERR unknown command\r\n", (ResponseError, "ERR unknown command")),
    (b"-NOSCRIPT No matching script.\r\n", (NoScriptError, "NOSCRIPT No matching script.")),
    (b"-WRONGPASS invalid username-password pair\r\n", (AuthenticationError, "WRONGPASS invalid username-password pair")),
    (b"-NOAUTH Authentication required.\r\n", (AuthenticationError, "NOAUTH Authentication required.")),
    (b"-WRONGTYPE Operation against a key\r\n", (ResponseError, "WRONGTYPE Operation against a key")),
]


def seen(reply: Any) -> Any:
    """A reply as :data:`REPLIES` writes it: error objects as (type, text)."""
    if isinstance(reply, Exception):
        return (type(reply), str(reply))
    if isinstance(reply, list):
        return [seen(item) for item in reply]
    return reply


def read_all(chunks: list[bytes]) -> list[Any]:
    """Feed ``chunks`` one by one, taking every whole reply as soon as it is there."""
    buffer, out = ReplyBuffer(), []
    for chunk in chunks:
        buffer.feed(chunk)
        while (reply := buffer.next()) is not INCOMPLETE:
            out.append(seen(reply))
    assert not buffer.pending()
    return out


@pytest.mark.parametrize(("wire", "value"), REPLIES, ids=[repr(w) for w, _ in REPLIES])
def test_a_reply_split_at_every_byte_is_read_once_whole(wire: bytes, value: Any) -> None:
    for cut in range(1, len(wire)):
        buffer = ReplyBuffer()
        buffer.feed(wire[:cut])
        assert buffer.next() is INCOMPLETE, f"a reply read from {wire[:cut]!r}"
        assert buffer.pending()
        buffer.feed(wire[cut:])
        assert seen(buffer.next()) == value
        assert buffer.next() is INCOMPLETE and not buffer.pending()
    assert read_all([bytes([b]) for b in wire]) == [value]


def test_several_replies_in_one_chunk_and_split_anywhere_come_out_in_order() -> None:
    wire = b"".join(w for w, _ in REPLIES)
    values = [v for _, v in REPLIES]
    assert read_all([wire]) == values
    for cut in range(1, len(wire)):
        assert read_all([wire[:cut], wire[cut:]]) == values
    for cuts in ((3, 50, 51, 200), (1, 2, 3, 4)):
        edges = [0, *cuts, len(wire)]
        assert read_all([wire[a:b] for a, b in zip(edges, edges[1:])]) == values


def test_bytes_that_are_not_resp2_raise() -> None:
    buffer = ReplyBuffer()
    buffer.feed(b"?what\r\n")
    with pytest.raises(ValueError, match="not a RESP2 reply"):
        buffer.next()


def test_pack_writes_an_array_of_bulk_strings() -> None:
    assert pack(["SET", "k", b"v\r\n", 1500, 0.25]) == (
        b"*5\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\nv\r\n\r\n$4\r\n1500\r\n$4\r\n0.25\r\n"
    )
    assert pack(["GET", "clé"]) == b"*2\r\n$3\r\nGET\r\n$4\r\ncl\xc3\xa9\r\n"  # utf-8 length
    assert pack([]) == b"*0\r\n"


@pytest.mark.parametrize("value", [True, None, 1j, ["a"]])
def test_pack_refuses_what_redis_cannot_be_sent(value: Any) -> None:
    with pytest.raises(TypeError, match="cannot send"):
        pack(["SET", "k", value])


def test_what_pack_writes_reads_back_as_its_arguments() -> None:
    args = ["EVALSHA", "0" * 40, 2, "redlock:lock:a", "x" * 300, -7, "", "ü"]
    assert read_all([pack(args)]) == [[str(a).encode() if not isinstance(a, bytes) else a for a in args]]


class _Books:
    """Books that only note what they were given to book."""

    def __init__(self) -> None:
        self.booked: list[Any] = []

    def book(self, conn: Any, reply: Any, now: float) -> tuple[bool, None]:
        self.booked.append(seen(reply))
        return False, None


class _Transport:
    def is_closing(self) -> bool:
        return False


class _AsyncNode:
    _settling: dict[Any, Any] = {}

    def drop(self, aconn: Any, reason: str) -> None:
        raise AssertionError(reason)


@pytest.mark.parametrize(
    ("chunks", "booked"),
    [
        ([b"+OK\r\n", b":1\r\n", b"$-1\r\n"], [b"OK", 1, None]),  # one usual reply a read
        ([b"+O", b"K\r\n", b":1\r\n"], [b"OK", 1]),
        ([b":1\r\n+OK\r\n", b":0\r\n"], [1, b"OK", 0]),
        # A read that looks like one usual reply but ends a reply begun before: not booked alone.
        ([b"*2\r\n", b":1\r\n", b"+OK\r\n"], [[1, b"OK"]]),
        ([b"$4\r\n", b":1\r\n", b"\r\n"], [b":1\r\n"]),
        ([b"-NOSCRIPT No matching script.\r\n"], [(NoScriptError, "NOSCRIPT No matching script.")]),
    ],
)
def test_the_asyncio_driver_books_each_reply_once_whole(chunks: list[bytes], booked: list[Any]) -> None:
    from django_redlock.core.anodes import AConn

    books = _Books()
    aconn = AConn(None, _AsyncNode(), books, _Transport())  # type: ignore[arg-type]
    for chunk in chunks:
        aconn.data_received(chunk)
    assert books.booked == booked
    assert aconn.healthy()
