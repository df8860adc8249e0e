"""Nodes and the sync driver of the one-round-trip fan-out.

A :class:`Node` is one independent Redis master: how to connect to it (built
with the node timeout as socket timeout, no retries and no handshake round
trips that are not needed) and the core's books for it
(:class:`~django_redlock.core.rounds.NodeBooks`), behind a mutex.

:func:`fanout` runs one :class:`~django_redlock.core.rounds.Round` on real
sockets: it writes what the round asks for to every node before it reads any
reply, then polls until the round says to stop. Which connection a command
goes on, what rides along with it, what a reply means and what is left for
later are the round's and the books' decisions, not this module's. Replies
that arrive late stay booked on their connection and are read, without
waiting, the next time the node is used.
"""

from __future__ import annotations

import atexit
import inspect
import logging
import os
import select
import socket
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
from redis.exceptions import (
    AuthenticationError,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

try:
    from redis.backoff import NoBackoff
except ImportError:  # pragma: no cover - very old redis-py
    NoBackoff = None  # type: ignore[assignment,misc]

from django_redlock.core import clock, ledger
from django_redlock.core.ledger import parse_info
from django_redlock.core.rounds import (
    IDLE_CHECK,
    MAX_PENDING,
    NEW,
    PARKED,
    ConnState,
    Failure,
    NodeBooks,
    NodeUnavailable,
    Round,
)
from django_redlock.core.resp import INCOMPLETE as _INCOMPLETE
from django_redlock.core.resp import USUAL as _USUAL
from django_redlock.core.resp import ReplyBuffer, pack
from django_redlock.core.scripts import Script, script_command

__all__ = [
    "MAX_PENDING",
    "Failure",
    "Node",
    "NodeSpec",
    "NodeUnavailable",
    "fanout",
    "parse_info",
    "parse_nodes",
    "script_command",
]

logger = logging.getLogger("django_redlock")

SCHEMES = ("redis", "rediss", "unix")

NodeSpec = Any  # str URL | redis.Redis | Mapping with "URL"/"OPTIONS"


def _redact(text: str, secrets: Sequence[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def _handshake_off(connection_class: type) -> dict[str, Any]:
    """Keyword arguments that stop redis-py's optional round trips on connect."""
    params: set[str] = set()
    for klass in getattr(connection_class, "__mro__", (connection_class,)):
        init = klass.__dict__.get("__init__")
        if init is not None:
            try:
                params.update(inspect.signature(init).parameters)
            except (TypeError, ValueError):  # pragma: no cover
                pass
    off: dict[str, Any] = {}
    if "driver_info" in params:
        off["driver_info"] = None
    elif "lib_name" in params:
        off.update(lib_name=None, lib_version=None)
    if "maint_notifications_config" in params:
        try:
            from redis.maint_notifications import MaintNotificationsConfig

            off["maint_notifications_config"] = MaintNotificationsConfig(enabled=False)
        except ImportError:  # pragma: no cover
            pass
    return off


def _display_url(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    return f"{parts.scheme}://{netloc}{parts.path}"


def _check_url(url: str, where: str) -> None:
    if "://" not in url and not url.startswith(tuple(f"{scheme}:" for scheme in SCHEMES)):
        bare = "***@" + url.rsplit("@", 1)[1] if "@" in url else url
        meant = f"redis://{bare}" + ("" if "/" in bare else "/0")
        raise ValueError(f"{where}: {bare!r} has no scheme; did you mean {meant!r}?")
    shown = _display_url(url)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"{where}: malformed Redis URL {shown!r} ({_redact(str(exc), [url])}).") from None
    if parts.scheme not in SCHEMES:
        raise ValueError(
            f"{where}: unsupported scheme {parts.scheme!r} in {shown!r}; expected one of redis://, rediss://, unix://."
        )
    if parts.scheme == "unix":
        if not parts.path:
            raise ValueError(f"{where}: unix:// URL {shown!r} has no socket path.")
    elif not parts.hostname:
        raise ValueError(f"{where}: Redis URL {shown!r} has no host.")
    del port


def _name_from_kwargs(kwargs: Mapping[str, Any]) -> str:
    path = kwargs.get("path")
    db = int(kwargs.get("db") or 0)
    if path:
        return f"unix:{path}" + (f"/{db}" if db else "")
    host = kwargs.get("host", "localhost")
    port = kwargs.get("port", 6379)
    if ":" in str(host):
        host = f"[{host}]"
    return f"{host}:{port}/{db}"


class Node:
    """One independent Redis master and its connections (thread-safe, fork-aware).

    Each connection carries its own queue of unanswered entries and what its
    restart probe learned (see :mod:`django_redlock.core.ledger`); the node
    keeps its release debts.
    """

    def __init__(
        self,
        connection_class: type,
        connection_kwargs: Mapping[str, Any],
        *,
        node_timeout: float,
        name: str | None = None,
        fsync_always: bool = False,
    ) -> None:
        kwargs = dict(connection_kwargs)
        secrets = [str(kwargs.get("password") or "")]
        kwargs.update(
            socket_timeout=node_timeout,
            socket_connect_timeout=node_timeout,
            retry_on_timeout=False,
            health_check_interval=0,
            decode_responses=False,
        )
        kwargs.pop("retry_on_error", None)
        # RESP2: no HELLO round trip on connect, and the reply shapes the engine reads.
        kwargs["protocol"] = 2
        if "RESP3" in getattr(kwargs.get("parser_class"), "__name__", ""):
            kwargs.pop("parser_class")
        if NoBackoff is not None:
            kwargs["retry"] = Retry(NoBackoff(), 0)
        kwargs.update(_handshake_off(connection_class))
        self.connection_class = connection_class
        self.kwargs = kwargs
        self.name = name or _name_from_kwargs(kwargs)
        self.host = kwargs.get("host") if not kwargs.get("path") else None
        self.port = kwargs.get("port") if not kwargs.get("path") else None
        self.path = kwargs.get("path")
        self.db = int(kwargs.get("db") or 0)
        self.node_timeout = node_timeout
        self._fsync_always = bool(fsync_always)
        #: What this process learned of the server at this address, kept across forks and shared
        #: by every manager and the asyncio books (a failover is noticed whoever probes first).
        self.history = ledger.history_for(self.path or (f"{self.host}:{self.port}" if self.host else self.name))
        self._secrets = [s for s in secrets if s]
        self._mutex = threading.Lock()
        self._reset()
        _NODES.add(self)
        try:
            connection_class(**kwargs)  # fail now on bad options, not on the first lock
        except (TypeError, ValueError) as exc:
            raise ValueError(f"node {self.name}: invalid connection options: {self.redact(str(exc))}") from None

    @property
    def stale_limit(self) -> float:
        return self.books.stale_limit

    def _reset(self) -> None:
        self._pid = os.getpid()
        #: The core's books for this node: connections, restart knowledge, release debts.
        self.books = NodeBooks(self.name, self.node_timeout, self.fsync_always, self.history)

    @property
    def fsync_always(self) -> bool:
        """Declared to fsync every write: votes at once after a restart, never probed."""
        return self._fsync_always

    @fsync_always.setter
    def fsync_always(self, value: bool) -> None:
        self._fsync_always = self.books.fsync_always = bool(value)

    def __repr__(self) -> str:
        return f"<Node {self.name}>"

    def redact(self, text: str) -> str:
        return _redact(text, self._secrets)

    def _check_fork(self) -> None:
        if os.getpid() != self._pid:
            with self._mutex:
                if os.getpid() != self._pid:
                    self._reset()  # the parent's sockets are not ours to use

    def _drain_parked(self, now: float) -> None:
        """Read and book late replies that already arrived; the books drop connections overdue too long.

        ``now`` is the fan-out's start, which may be a while ago (a connect timeout to a node listed
        before this one): each reply is booked with the time it is read.
        """
        books = self.books
        for conn, since in list(books.parked.items()):
            try:
                while conn.expect and conn.can_read(0):
                    read_booked(books, conn)
                    since = now
            except (RedisError, OSError, ValueError):
                books.drop(conn, now)
                _disconnect(conn)
                continue
            if not books.after_drain(conn, since, now):
                _disconnect(conn)

    def checkout(
        self, rnd: Round, i: int, now: float, pid: int | None = None
    ) -> tuple[Any, float | None, list[Command]] | None:
        """Node ``i``'s connection for ``rnd``, booked: ``(conn, parked since, commands to send)``;
        None when the round has its result.

        ``pid``: the caller's ``os.getpid()``, read once per fan-out (a syscall).
        """
        if (os.getpid() if pid is None else pid) != self._pid:
            self._check_fork()
        with self._mutex:
            if self.books.parked:  # usually empty: only after an early decision or a silent node
                self._drain_parked(now)
            while True:
                choice = rnd.choose(i, now)
                if choice is None:
                    return None
                kind, conn, since = choice
                if kind == PARKED:
                    return conn, since, rnd.write(i, conn, now)
                if kind == NEW:
                    break
                # A connection idle for a while may have been closed by a restart: look first.
                if now - since < IDLE_CHECK or _idle_ok(conn):  # type: ignore[operator]
                    return conn, None, rnd.write(i, conn, now)
                _disconnect(conn)
        conn = None
        try:
            conn = self.connection_class(**self.kwargs)
            conn.connect()
            wire = Wire(conn, self.node_timeout)  # from here on the engine reads and writes the socket itself
        except Exception as exc:  # noqa: BLE001 - any connect failure makes the node unavailable
            if conn is not None:
                _disconnect(conn)
            with self._mutex:
                rnd.connect_failed(i, self.redact(describe(exc, self.node_timeout)), clock.now())
            return None
        with self._mutex:
            return wire, None, rnd.write(i, wire, now)

    def checkin(self, conn: Any, since: float, pid: int | None = None) -> None:
        if (os.getpid() if pid is None else pid) != self._pid:
            return
        with self._mutex:
            self.books.checkin(conn, since, clock.now())

    def drop(self, conn: Any) -> None:
        with self._mutex:
            self.books.drop(conn, clock.now())
        _disconnect(conn)

    def settle(self, deadline: float) -> None:
        """Read the replies still due on parked connections until ``deadline`` (monotonic), then
        close those connections.

        A release that ended at a quorum leaves the last nodes' replies coming. A socket closed
        with unread bytes is reset, and a command the node has not run yet may go with it, so
        closing (and exiting) reads them first.
        """
        if os.getpid() != self._pid:
            return
        with self._mutex:
            parked = list(self.books.parked)
            for conn in parked:
                del self.books.parked[conn]  # taken out: no other thread reads them now
        for conn in parked:
            try:
                while conn.expect and conn.can_read(max(0.0, deadline - clock.now())):
                    read_booked(self.books, conn, self._mutex)
            except (RedisError, OSError, ValueError):
                pass
            self.drop(conn)

    def close(self) -> None:
        self.settle(clock.now() + self.node_timeout)
        now = clock.now()
        with self._mutex:
            conns = [conn for conn, _ in self.books.idle] + list(self.books.parked)
            for conn in conns:
                self.books.drop(conn, now)
            self.books.idle.clear()
        for conn in conns:
            _disconnect(conn)


#: Every node of this process, reset in a forked child (its parent's sockets and mutexes are not its own).
_NODES: weakref.WeakSet[Node] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for node in list(_NODES):
        node._mutex = threading.Lock()
        node._reset()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


@atexit.register
def _settle_at_exit() -> None:
    """At interpreter exit, read the replies still due (at most one node timeout in all)."""
    nodes = list(_NODES)
    deadline = clock.now() + max((node.node_timeout for node in nodes), default=0.0)
    for node in nodes:
        try:
            node.settle(deadline)
        except Exception:  # noqa: BLE001 - never fail an exit
            pass


def _idle_ok(conn: Any) -> bool:
    """An idle connection has nothing to read; EOF or stray bytes mean it is unusable."""
    try:
        return not conn.can_read(0)
    except Exception:  # noqa: BLE001
        return False


def _disconnect(conn: Any) -> None:
    try:
        conn.disconnect()
    except Exception:  # noqa: BLE001 - closing a broken socket must not raise
        pass


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def describe(exc: BaseException, node_timeout: float) -> str:
    """A short, credential-free reason for a failed node call."""
    if isinstance(exc, AuthenticationError) or "AUTH" in str(exc) or "WRONGPASS" in str(exc):
        return "authentication failed"
    if isinstance(exc, RedisTimeoutError) or isinstance(exc, TimeoutError):
        return f"no reply within {_ms(node_timeout)}"
    if isinstance(exc, RedisConnectionError):
        text = str(exc).lower()
        if "refused" in text or "111" in text:
            return "connection refused"
        if "closed" in text or "reset" in text:
            return "connection lost"
        if "timeout" in text or "timed out" in text:
            return f"no reply within {_ms(node_timeout)}"
        return "connection failed"
    if isinstance(exc, ResponseError):
        return "error reply: " + str(exc).split("\n")[0][:120]
    if isinstance(exc, OSError):
        return f"socket error ({exc.__class__.__name__})"
    return f"error ({exc.__class__.__name__})"


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
        except socket.timeout:
            raise RedisTimeoutError("Timeout writing to socket") from None
        except OSError as exc:
            raise RedisConnectionError(f"Error writing to socket: {exc.__class__.__name__}") from None

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
        try:
            data = self._sock.recv(262144)
        except BlockingIOError:
            return False
        except OSError as exc:
            raise RedisConnectionError(f"Error reading from socket: {exc.__class__.__name__}") from None
        if not data:
            raise RedisConnectionError("Connection closed by server.")
        self._replies.feed(data)
        return True

    def read_response(self) -> Any:
        replies = self._replies
        if not replies.pending():
            # Nothing buffered: the usual case after a poll said the socket is readable. A read
            # that brings exactly one of the usual replies needs no buffer.
            data = self._recv()
            reply = _USUAL.get(data, _INCOMPLETE)
            if reply is not _INCOMPLETE:
                return reply
            replies.feed(data)
        while True:
            try:
                reply = replies.next()
            except ValueError as exc:
                raise RedisConnectionError(f"Protocol error: {exc}") from None
            if reply is not _INCOMPLETE:
                if isinstance(reply, ResponseError):
                    raise reply
                return reply
            self._fill()

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
        except socket.timeout:
            raise RedisTimeoutError("Timeout reading from socket") from None
        except OSError as exc:
            raise RedisConnectionError(f"Error reading from socket: {exc.__class__.__name__}") from None
        if not data:
            raise RedisConnectionError("Connection closed by server.")
        return data

    def disconnect(self) -> None:
        self.conn.disconnect()


def _ready(fd: int, events: int, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for ``events`` (or an error or hang-up) on ``fd``."""
    poller = select.poll()
    poller.register(fd, events | select.POLLERR | select.POLLHUP)
    return bool(poller.poll(max(0.0, timeout) * 1000))


# -- building nodes from specs ---------------------------------------------


def parse_nodes(specs: Any, node_timeout: float, argument: str = "nodes") -> list[Node]:
    """Turn URLs, redis-py clients or ``{"URL", "OPTIONS"}`` mappings into nodes."""
    if isinstance(specs, (str, bytes)) or not isinstance(specs, (Sequence, set, frozenset, tuple)):
        if isinstance(specs, Mapping) or isinstance(specs, (str, bytes)) or isinstance(specs, redis.Redis):
            raise ValueError(f"{argument} must be a list of nodes, not a single {type(specs).__name__}.")
        raise ValueError(f"{argument} must be a list of Redis URLs, clients or dicts; got {type(specs).__name__}.")
    specs = list(specs)
    if not specs:
        raise ValueError(f"{argument} is empty; Redlock needs at least one Redis master (three or more to be useful).")
    return [node_from_spec(spec, node_timeout, f"{argument}[{i}]") for i, spec in enumerate(specs)]


def node_from_spec(spec: NodeSpec, node_timeout: float, where: str) -> Node:
    if isinstance(spec, Node):
        return spec
    if isinstance(spec, str):
        return _node_from_url(spec, {}, node_timeout, where)
    if isinstance(spec, redis.Redis):
        pool = spec.connection_pool
        return Node(pool.connection_class, pool.connection_kwargs, node_timeout=node_timeout)
    if isinstance(spec, Mapping):
        lowered = {str(k).lower(): v for k, v in spec.items()}
        unknown = set(lowered) - {"url", "options", "fsync_always"}
        if unknown:
            raise ValueError(
                f"{where}: unknown key(s) {sorted(unknown)}; expected 'URL' and optional 'OPTIONS', 'FSYNC_ALWAYS'."
            )
        url = lowered.get("url")
        options = lowered.get("options") or {}
        fsync_always = lowered.get("fsync_always", False)
        if not isinstance(url, str):
            raise ValueError(f"{where}: 'URL' must be a Redis URL string.")
        if not isinstance(options, Mapping):
            raise ValueError(f"{where}: 'OPTIONS' must be a dict of redis-py connection options.")
        if not isinstance(fsync_always, bool):
            raise ValueError(
                f"{where}: 'FSYNC_ALWAYS' must be True or False (True: the node runs appendonly yes with "
                f"appendfsync always, so it may vote right after a restart); got {fsync_always!r}."
            )
        return _node_from_url(url, dict(options), node_timeout, where, fsync_always)
    raise ValueError(
        f"{where}: expected a Redis URL string, a redis.Redis client or a dict with 'URL'; got {type(spec).__name__}."
    )


def _node_from_url(
    url: str, options: dict[str, Any], node_timeout: float, where: str, fsync_always: bool = False
) -> Node:
    _check_url(url, where)
    try:
        pool = redis.ConnectionPool.from_url(url, **options)
    except (ValueError, TypeError) as exc:
        secrets = [url, str(options.get("password") or "")]
        raise ValueError(f"{where}: invalid Redis node {_display_url(url)!r}: {_redact(str(exc), secrets)}") from None
    kwargs = pool.connection_kwargs
    if "password" not in options and urlsplit(url).password:
        kwargs["password"] = unquote(urlsplit(url).password or "")
    try:
        return Node(pool.connection_class, kwargs, node_timeout=node_timeout, fsync_always=fsync_always)
    except ValueError as exc:  # options redis-py refuses (already redacted): say which entry
        raise ValueError(f"{where}: {exc}") from None


# -- the fan-out -----------------------------------------------------------

Command = tuple[Any, ...]
Done = Callable[[list[Any]], bool]


def read_booked(books: NodeBooks, conn: Any, mutex: Any = None, rnd: Round | None = None) -> bool:
    """Read the next reply on ``conn`` and book it; True when it was ``rnd``'s own, now taken.

    Every reply is booked with the time it was read (a probe's uptime is at
    least that old then), never with an earlier one. Error replies are booked
    as exceptions; a broken connection raises. After a NOSCRIPT the script's
    source is sent at once (the books wait for that reply instead). Pass the
    node's ``mutex`` when the caller does not hold it: booking, taking and the
    check-in happen under one acquisition.
    """
    try:
        reply = conn.read_response()
    except ResponseError as exc:
        reply = exc
    now = clock.now()
    if mutex is None:
        taken, resend = _book(books, conn, reply, now, rnd)
    else:
        with mutex:
            taken, resend = _book(books, conn, reply, now, rnd)
    if resend is not None:
        conn.send_packed_command(pack(resend))
    return taken


def _book(books: NodeBooks, conn: Any, reply: Any, now: float, rnd: Round | None) -> tuple[bool, Command | None]:
    try:
        entry, resend = books.read(conn, reply, now)
    except ValueError as exc:
        raise RedisConnectionError(f"Protocol error: {exc}") from None
    if resend is None and rnd is not None and entry.waiter is rnd:
        rnd.take(entry, reply, now)
        books.checkin(conn, rnd.sent_at, now)
        return True, None
    return False, resend


def fanout(
    nodes: Sequence[Node],
    commands: Sequence[Command | None],
    *,
    timeout: float,
    done: Done | None = None,
    script: Script | None = None,
    ordered_after_key: str | None = None,
    allow_lagging: bool = True,
    timings: list[float | None] | None = None,
    restart_window: float = 0.0,
    owe: tuple[str, str, float] | None = None,
    block: tuple[tuple[str, ...], float] | None = None,
) -> list[Any]:
    """Run one :class:`~django_redlock.core.rounds.Round` on real sockets: write everything, then poll.

    Returns one entry per node: the reply, or a :class:`Failure`. The round
    decides what is written, how long to wait and what each reply means;
    replies not read by the end stay booked on their connection and are read
    the next time the node is used.
    """
    now = clock.now()
    pid = os.getpid()  # once per fan-out: a syscall, and a fork cannot happen in the middle of one
    books = [node.books for node in nodes]
    if owe is not None:
        for node in nodes:
            if node._pid != pid:
                node._check_fork()
        with _all_mutexes(nodes):
            rnd = Round(books, commands, now=now, timeout=timeout, done=done, script=script,
                        ordered_after_key=ordered_after_key, allow_lagging=allow_lagging,
                        restart_window=restart_window, timings=timings, owe=owe)
    else:
        rnd = Round(books, commands, now=now, timeout=timeout, done=done, script=script,
                    ordered_after_key=ordered_after_key, allow_lagging=allow_lagging,
                    restart_window=restart_window, timings=timings, block=block)
    watched: dict[int, tuple[int, Any]] = {}  # fd -> (node index, connection)
    packed: dict[Any, bytes] = {}
    writing: tuple[Node, Any] | None = None
    try:
        for i, node in enumerate(nodes):
            got = node.checkout(rnd, i, now, pid)
            if got is None:
                continue
            conn, since, wire = got
            writing = (node, conn)
            error = None
            try:
                if len(wire) == 1:
                    data = packed.get(wire[0])  # the same command usually goes to every node: encode it once
                    if data is None:
                        data = packed[wire[0]] = pack(wire[0])
                else:
                    data = b"".join(pack(c) for c in wire)
                conn.send_packed_command(data)
            except (RedisError, OSError, ValueError) as exc:
                error = node.redact(describe(exc, node.node_timeout))
                _disconnect(conn)
            writing = None
            if error is None and since is None:
                wait = rnd.written(i, conn, since, now)  # the usual case touches no books
            else:
                with node._mutex:
                    wait = rnd.written(i, conn, since, now, error)
            if wait:
                watched[conn.fd] = (i, conn)
        if watched:
            # Each node gets the full timeout after its command went out (connects can take time).
            rnd.start(clock.now())
            _collect(nodes, rnd, watched)
    except BaseException:
        # Interrupted (a signal, KeyboardInterrupt): keep the books straight.
        if writing is not None:
            writing[0].drop(writing[1])
        _finish(nodes, rnd, pid)
        raise
    _finish(nodes, rnd, pid)
    return rnd.results


def _finish(nodes: Sequence[Node], rnd: Round, pid: int) -> None:
    now = clock.now()
    for i, conn in rnd.finish(now):
        nodes[i].checkin(conn, rnd.sent_at, pid)


class _all_mutexes:
    def __init__(self, nodes: Sequence[Node]) -> None:
        self.nodes = nodes

    def __enter__(self) -> None:
        for node in self.nodes:
            node._mutex.acquire()

    def __exit__(self, *exc: object) -> None:
        for node in self.nodes:
            node._mutex.release()


_POLL_READ = select.POLLIN | select.POLLERR | select.POLLHUP


def _collect(nodes: Sequence[Node], rnd: Round, watched: dict[int, tuple[int, Any]]) -> None:
    poller = select.poll()
    for fd in watched:
        poller.register(fd, _POLL_READ)
    tls = [fd for fd, (_, conn) in watched.items() if conn.tls]
    while watched:
        wait = rnd.wait_time(clock.now())
        if wait is None:
            break
        buffered = [fd for fd in tls if fd in watched and _has_buffered(watched[fd][1])] if tls else []
        ready = [fd for fd, _ in poller.poll(0 if buffered else wait * 1000)]
        for fd in buffered:
            if fd not in ready:
                ready.append(fd)
        for fd in ready:
            got = watched.get(fd)
            if got is None:
                continue
            i, conn = got
            node = nodes[i]
            try:
                taken = _read_ours(node, rnd, conn)
            except (RedisError, OSError, ValueError) as exc:
                with node._mutex:
                    rnd.broken(i, conn, node.redact(describe(exc, node.node_timeout)), clock.now())
                _disconnect(conn)
                taken = True
            if taken:
                del watched[fd]
                poller.unregister(fd)


def _read_ours(node: Node, rnd: Round, conn: Any) -> bool:
    """Read replies on ``conn`` until ours was taken (True) or nothing more has arrived (False)."""
    while True:
        if read_booked(node.books, conn, node._mutex, rnd):
            return True
        if not conn.can_read(0):
            return False


def _has_buffered(conn: Wire) -> bool:
    try:
        return conn.buffered()
    except Exception:  # noqa: BLE001
        return False
