"""The sync driver's connection: a redis-py connection whose socket the engine reads and writes itself."""

from __future__ import annotations

import select
import socket
import ssl
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from django_redlock.core import clock
from django_redlock.core.books import ConnState
from django_redlock.core.resp import INCOMPLETE as _INCOMPLETE
from django_redlock.core.resp import USUAL as _USUAL
from django_redlock.core.resp import ReplyBuffer, pack

__all__ = ["Wire"]


class Wire(ConnState):
    """A connected redis-py connection, read and written directly.

    redis-py makes the connection (TCP or TLS, AUTH, SELECT); after that the
    engine writes pre-encoded commands to the socket and parses the replies
    itself, which keeps a fan-out cheap enough to cost about one round trip.
    A plain socket is made non-blocking: the fan-out polls all nodes at once,
    so a send or a read needs no poll of its own (one system call, not two);
    one that cannot finish at once waits at most the node timeout. A TLS
    socket keeps the node timeout as its socket timeout.
    """

    __slots__ = ("conn", "fd", "tls", "_sock", "_replies", "_timeout")

    def __init__(self, conn: Any, timeout: float) -> None:
        super().__init__()
        self.conn = conn
        sock = conn._sock
        self._sock = sock
        self.fd: int = sock.fileno()
        #: Decrypted bytes may wait inside the TLS layer, where poll() cannot see them.
        self.tls = hasattr(sock, "pending")
        self._timeout = timeout
        if not self.tls:
            sock.settimeout(0.0)
        self._replies = ReplyBuffer()

    encoder = None

    @staticmethod
    def pack_command(*args: Any) -> bytes:
        return pack(args)

    @staticmethod
    def pack_commands(commands: Sequence[Sequence[Any]]) -> bytes:
        return b"".join(pack(c) for c in commands)

    def send_packed_command(self, data: bytes, check_health: bool = False) -> None:
        try:
            if self.tls:
                self._sock.sendall(data)
                return
            try:
                sent = self._sock.send(data)
            except BlockingIOError:
                sent = 0
            if sent < len(data):
                self._send_rest(memoryview(data)[sent:])
        except OSError as exc:
            raise _socket_error(exc, "writing to") from None

    def _send_rest(self, data: memoryview) -> None:
        """The send buffer is full: wait for room, at most the node timeout in all."""
        deadline = clock.now() + self._timeout
        while data:
            if not _ready(self.fd, select.POLLOUT, deadline - clock.now()):
                raise socket.timeout
            try:
                data = data[self._sock.send(data) :]
            except BlockingIOError:
                pass

    def buffered(self) -> bool:
        """True when reply bytes are already buffered (poll() would not report them)."""
        if self._replies.pending():
            return True
        return self.tls and bool(self._sock.pending())

    def can_read(self, timeout: float = 0) -> bool:
        if self.buffered():
            return True
        if timeout <= 0 and not self.tls:
            return self._take_arrived()
        if not _ready(self.fd, select.POLLIN, timeout):
            return False
        self._fill()
        return True

    def _take_arrived(self) -> bool:
        """Buffer what has already arrived, with one recv (no poll first); False when nothing has."""
        data = self._arrived()
        if data is None:
            return False
        self._replies.feed(data)
        return True

    def _arrived(self) -> bytes | None:
        """The bytes that already arrived (None: none), without waiting for any."""
        sock = self._sock
        try:
            if self.tls:
                if not (sock.pending() or _ready(self.fd, select.POLLIN, 0)):
                    return None
                sock.settimeout(0.0)  # part of a record only: SSLWantReadError, not a wait for the rest
                try:
                    data: bytes = sock.recv(262144)
                finally:
                    sock.settimeout(self._timeout)
            else:
                data = sock.recv(262144)
        except (BlockingIOError, ssl.SSLWantReadError):
            return None
        except OSError as exc:
            raise _socket_error(exc, "reading from") from None
        return data or _closed()

    def arrived_reply(self) -> Any:
        """The next reply if all of it has arrived, else :data:`~django_redlock.core.resp.INCOMPLETE`;
        waits for nothing.

        A reply that comes in several packets is taken once its last one is
        here: the fan-out polls for it with its other nodes, until its own
        deadline, rather than blocking on one socket. Error replies are raised.
        """
        if self._replies.buf or self.tls:  # a reply, or part of one, is buffered (or may be, in TLS)
            return self._next_reply(self._arrived)
        # The usual case after a poll said the socket is readable: one recv (what _arrived does for
        # a plain socket, without the call), and a read that brings exactly one of the usual replies
        # needs no buffer.
        try:
            data = self._sock.recv(262144)
        except BlockingIOError:
            return _INCOMPLETE
        except OSError as exc:
            raise _socket_error(exc, "reading from") from None
        if not data:
            _closed()
        reply = _USUAL.get(data, _INCOMPLETE)
        if reply is _INCOMPLETE:
            self._replies.feed(data)
            reply = self._next_reply(self._arrived)
        return reply

    def tls_buffered(self) -> bool:
        """True when decrypted bytes wait inside the TLS layer (poll() does not report them)."""
        return self.tls and bool(self._sock.pending())

    def more_arrives(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for bytes not read yet; False when none came."""
        return self.tls_buffered() or _ready(self.fd, select.POLLIN, timeout)

    def _next_reply(self, more: Callable[[], bytes | None]) -> Any:
        """The next reply from the buffer, reading more with ``more`` (None: nothing more now, and
        INCOMPLETE is returned)."""
        replies = self._replies
        while True:
            try:
                reply = replies.next()
            except ValueError as exc:
                raise RedisConnectionError(f"Protocol error: {exc}") from None
            if reply is not _INCOMPLETE:
                if isinstance(reply, ResponseError):
                    raise reply
                return reply
            data = more()
            if data is None:
                return _INCOMPLETE
            replies.feed(data)

    def _fill(self) -> None:
        self._replies.feed(self._recv())

    def _recv(self) -> bytes:
        """The bytes that arrived (at least one), waiting at most the node timeout for them."""
        deadline = 0.0
        try:
            while True:
                try:
                    data: bytes = self._sock.recv(262144)
                    break
                except BlockingIOError:  # nothing yet: wait for it, at most the node timeout
                    now = clock.now()
                    deadline = deadline or now + self._timeout
                    if not _ready(self.fd, select.POLLIN, deadline - now):
                        raise socket.timeout from None
        except OSError as exc:
            raise _socket_error(exc, "reading from") from None
        return data or _closed()

    def disconnect(self) -> None:
        self.conn.disconnect()


def _socket_error(exc: OSError, doing: str) -> Exception:
    """What a failed socket call raises: a timeout, or a lost connection (``doing``: "reading from")."""
    if isinstance(exc, socket.timeout):
        return RedisTimeoutError(f"Timeout {doing} socket")
    return RedisConnectionError(f"Error {doing} socket: {exc.__class__.__name__}")


def _closed() -> NoReturn:
    """What an empty read means: the server closed the connection."""
    raise RedisConnectionError("Connection closed by server.")


def _ready(fd: int, events: int, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for ``events`` (or an error or hang-up) on ``fd``."""
    poller = select.poll()
    poller.register(fd, events | select.POLLERR | select.POLLHUP)
    return bool(poller.poll(max(0.0, timeout) * 1000))
