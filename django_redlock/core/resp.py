"""RESP2 on the wire: commands packed as arrays of bulk strings, replies parsed from a byte buffer.

No I/O: the drivers feed what they read into a :class:`ReplyBuffer` and take whole replies out.
An error reply is parsed as the redis-py exception it would raise (``NoScriptError`` for NOSCRIPT).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from redis.exceptions import RedisError

__all__ = ["INCOMPLETE", "USUAL", "ReplyBuffer", "pack", "pack_each", "pack_write"]

_INCOMPLETE = object()


@functools.cache
def _error_types() -> tuple[dict[str, type[RedisError]], type[RedisError]]:
    """redis-py's error types by reply prefix, and the one for the rest: imported on the first
    error reply, so the reader alone loads no I/O library."""
    from redis.exceptions import AuthenticationError, NoScriptError, ResponseError

    by_prefix = {"NOSCRIPT": NoScriptError, "WRONGPASS": AuthenticationError, "NOAUTH": AuthenticationError}
    return by_prefix, ResponseError


def _error(line: bytes) -> RedisError:
    text = line.decode("utf-8", "replace")
    by_prefix, other = _error_types()
    return by_prefix.get(text.split(" ", 1)[0], other)(text)


#: Whole replies a vote or a release usually gets, as :func:`_parse` reads them.
_USUAL: dict[bytes, Any] = {b"+OK\r\n": b"OK", b":1\r\n": 1, b":0\r\n": 0, b"$-1\r\n": None}


def _parse(buf: bytearray, pos: int) -> tuple[Any, int]:
    """Parse one RESP2 reply at ``pos``: ``(value, next position)`` or ``(_INCOMPLETE, pos)``."""
    end = buf.find(b"\r\n", pos)
    if end < 0:
        return _INCOMPLETE, pos
    kind = buf[pos]
    after = end + 2
    if kind == 42:  # *array: items parsed in a loop (bulk strings and integers inline)
        count = int(buf[pos + 1 : end])
        if count < 0:
            return None, after
        items: list[Any] = []
        append = items.append
        find = buf.find
        size_total = len(buf)
        for _ in range(count):
            end = find(b"\r\n", after)
            if end < 0:
                return _INCOMPLETE, pos
            head = buf[after]
            if head == 36:
                size = int(buf[after + 1 : end])
                if size < 0:
                    append(None)
                    after = end + 2
                    continue
                start = end + 2
                if size_total < start + size + 2:
                    return _INCOMPLETE, pos
                append(bytes(buf[start : start + size]))
                after = start + size + 2
            elif head == 58:
                append(int(buf[after + 1 : end]))
                after = end + 2
            else:
                item, after = _parse(buf, after)
                if item is _INCOMPLETE:
                    return _INCOMPLETE, pos
                append(item)
        return items, after
    line = bytes(buf[pos + 1 : end])
    if kind == 43:  # +simple
        return line, after
    if kind == 58:  # :integer
        return int(line), after
    if kind == 36:  # $bulk
        size = int(line)
        if size < 0:
            return None, after
        if len(buf) < after + size + 2:
            return _INCOMPLETE, pos
        return bytes(buf[after : after + size]), after + size + 2
    if kind == 45:  # -error
        return _error(line), after
    raise ValueError(f"not a RESP2 reply (first byte {kind!r})")


def _arg(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return repr(value).encode()
    raise TypeError(f"cannot send {type(value).__name__} to Redis")


def pack(args: Sequence[Any]) -> bytes:
    """Encode one command as a RESP2 array of bulk strings."""
    parts = [b"*%d\r\n" % len(args)]
    for value in args:  # the usual types first, without a call
        kind = type(value)
        if kind is str:
            data = value.encode()
        elif kind is bytes:
            data = value
        else:
            data = b"%d" % value if kind is int else _arg(value)
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def pack_each(commands: Sequence[Any]) -> dict[Any, bytes]:
    """Each distinct command of a round encoded once (None: no command; a tuple of commands: one write).

    What cannot be encoded (text UTF-8 cannot encode, a value of no Redis type) is the caller's error:
    raised here, before any node is asked, as :class:`ValueError` or :class:`TypeError`.
    """
    packed: dict[Any, bytes] = {}
    last = None
    for command in commands:
        if command is None or command is last:
            continue
        last = command
        try:
            if command not in packed:
                packed[command] = b"".join(map(pack, command)) if type(command[0]) is tuple else pack(command)
        except UnicodeEncodeError as exc:
            bad = exc.object[exc.start : exc.end]
            raise ValueError(f"{_name(command)} cannot be sent to Redis: UTF-8 cannot encode {bad!r}.") from None
        except TypeError as exc:
            raise TypeError(f"{_name(command)} cannot be sent to Redis: {exc}.") from None
    return packed


def _name(command: Any) -> str:
    return "a command" if type(command[0]) is tuple else repr(command[0])


def pack_write(commands: Sequence[Any], packed: dict[Any, bytes]) -> bytes:
    """The bytes of one write of ``commands``; a lone one is taken from (or added to) ``packed``: a round
    usually sends the same command to every node."""
    if len(commands) == 1:
        data = packed.get(commands[0])
        if data is None:
            data = packed[commands[0]] = pack(commands[0])
        return data
    return b"".join(map(pack, commands))


class ReplyBuffer:
    """The bytes read from one connection, and the whole RESP2 replies in them, in order.

    Both drivers read through one: the sync :class:`~django_redlock.core.wire.Wire` and the asyncio
    protocol (:class:`~django_redlock.core.anodes.AConn`).
    """

    __slots__ = ("buf", "_pos")

    #: What :meth:`next` returns while the next reply has not fully arrived.
    INCOMPLETE = _INCOMPLETE

    def __init__(self) -> None:
        #: The bytes read and not all returned as replies yet: empty once every reply was returned
        #: (so ``not buf`` is the cheap :meth:`pending`).
        self.buf = bytearray()
        self._pos = 0

    def feed(self, data: bytes) -> None:
        if self._pos:
            del self.buf[: self._pos]
            self._pos = 0
        self.buf += data

    def pending(self) -> bool:
        """True while bytes of a reply not yet returned are buffered."""
        return self._pos < len(self.buf)

    def next(self) -> Any:
        """The next whole reply (an error reply as its exception object), or :attr:`INCOMPLETE`.

        Raises :class:`ValueError` for bytes that are not RESP2.
        """
        buf = self.buf
        # A whole reply always ends with CRLF: do not re-parse a partial one after every read.
        if self._pos >= len(buf) or not buf.endswith(b"\r\n"):
            return _INCOMPLETE
        reply, after = _parse(buf, self._pos)
        if reply is not _INCOMPLETE:
            if after == len(buf):
                buf.clear()
                after = 0
            self._pos = after
        return reply


INCOMPLETE = _INCOMPLETE
USUAL = _USUAL
