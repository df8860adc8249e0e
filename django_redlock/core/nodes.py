"""Nodes and the one-round-trip fan-out.

A :class:`Node` is one independent Redis master. It keeps its own small set of
redis-py connections, built with the node timeout as socket timeout, no retries
and no handshake round trips that are not needed, so that a dead or paused
node costs at most ``node_timeout`` and usually nothing.

:func:`fanout` writes one command to every node before it reads any reply,
then waits for the replies with ``poll()`` until the caller's ``done`` test is
satisfied or the node timeout passes. Replies that had not arrived by then are
left on their connection ("pending"); the connection is parked and its late
replies are read, without waiting, the next time the node is used. A command
that must stay ordered after a pending one (a release after a delayed ``SET``)
is written to the same connection.
"""

from __future__ import annotations

import inspect
import logging
import os
import select
import socket
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
from redis.exceptions import (
    AuthenticationError,
    NoScriptError,
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

from django_redlock.core import ledger
from django_redlock.core.ledger import PROBE, Entry, Ledger, Restart, entry_for, parse_info
from django_redlock.core.scripts import RELEASE, Script

__all__ = ["Failure", "Node", "NodeSpec", "fanout", "parse_nodes"]

logger = logging.getLogger("django_redlock")

SCHEMES = ("redis", "rediss", "unix")

#: A node whose earlier reply is overdue by this long is dropped and reconnected.
STALE_LIMIT_MIN = 1.0
#: After a failed connect, leave the node alone this long.
COOL_OFF = 0.5
#: Idle connections older than this are checked for a close by the server before use.
IDLE_CHECK = 0.5
#: At most this many unread replies are queued on one parked connection.
MAX_PENDING = 256

NodeSpec = Any  # str URL | redis.Redis | Mapping with "URL"/"OPTIONS"


@dataclass(frozen=True)
class Failure:
    """Why a node did not give a usable reply (never contains credentials)."""

    reason: str
    answered: bool = False  # the node answered (e.g. with an error), it is not down

    def __str__(self) -> str:
        return self.reason


class NodeUnavailable(Exception):
    pass


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
        #: Declared to fsync every write: votes at once after a restart, never probed.
        self.fsync_always = bool(fsync_always)
        self.stale_limit = max(STALE_LIMIT_MIN, 20 * node_timeout)
        self._secrets = [s for s in secrets if s]
        self._mutex = threading.Lock()
        self._reset()
        _NODES.add(self)
        try:
            connection_class(**kwargs)  # fail now on bad options, not on the first lock
        except (TypeError, ValueError) as exc:
            raise ValueError(f"node {self.name}: invalid connection options: {self.redact(str(exc))}") from None

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._idle: deque[Any] = deque()
        # parked connections (entries still unanswered) -> when the last reply was read or the oldest sent
        self._parked: dict[Any, float] = {}
        self._down_until = 0.0
        self._down_reason = ""
        self._books = threading.Lock()  # guards the ledger (never held during I/O)
        self.ledger = Ledger()
        #: The last restart state a probe learned (for status and logs).
        self.restart: Restart | None = None
        self._denied_warned = False
        self.announced = ""  # run id of the restart last logged

    def __repr__(self) -> str:
        return f"<Node {self.name}>"

    # -- connections -------------------------------------------------------

    def redact(self, text: str) -> str:
        return _redact(text, self._secrets)

    def _check_fork(self) -> None:
        if os.getpid() != self._pid:
            with self._mutex:
                if os.getpid() != self._pid:
                    self._reset()  # the parent's sockets are not ours to use

    def _drain_parked(self, now: float) -> None:
        """Read and book late replies that already arrived; drop connections overdue too long."""
        for conn, since in list(self._parked.items()):
            try:
                while conn.expect and conn.can_read(0):
                    read_booked(self, conn)
                    since = now
            except (RedisError, OSError, ValueError):
                self._parked.pop(conn, None)
                self.drop(conn, now)
                continue
            if not conn.expect:
                self._parked.pop(conn, None)
                self._idle.append((conn, now))
            elif now - since > self.stale_limit:
                self._parked.pop(conn, None)
                self.drop(conn, now)
            else:
                self._parked[conn] = since

    # -- books -------------------------------------------------------------

    def book(self, conn: Any, entry: Entry, reply: Any, now: float) -> None:
        """Book one reply read from ``conn`` (whoever waits for it)."""
        kind = entry.kind
        if kind == ledger.RELEASE:
            with self._books:
                self.ledger.settle(entry.key, entry.value, reply)
        elif kind == ledger.PROBE_REPLY:
            conn.probe_replies.append(reply)
            if len(conn.probe_replies) == len(PROBE):
                conn.restart = self.restart = ledger.learn(conn.probe_replies, now)
                conn.probe_replies = []
                conn.probing = False
                if conn.restart.uptime is None and not conn.restart.durable and not self._denied_warned:
                    self._denied_warned = True
                    logger.warning("Node %s: %s.", self.name, ledger.DENIED)

    def owe(self, key: str, value: str, ttl: float) -> None:
        """A release of ``value`` is about to be written: owe it until it is proven done."""
        now = time.monotonic()
        with self._books:
            self.ledger.owe(key, value, now + ttl + self.stale_limit, now)

    def prepare(self, conn: Any, wire: bytes, mine: Entry, window: float, now: float) -> bytes:
        """Bytes to write for one command: debts due first, a restart probe if needed, then it."""
        expect = conn.expect
        parts: list[bytes] = []
        if self.ledger.debts:
            with self._books:
                due = self.ledger.due(now, self.node_timeout)
            for debt in due:  # sent as EVAL: no NOSCRIPT to handle
                parts.append(pack(("EVAL", RELEASE.source, 1, debt.key, debt.value)))
                expect.append(Entry(ledger.RELEASE, debt.key, debt.value))
        if window > 0 and not self.fsync_always and conn.restart is None and not conn.probing:
            parts.append(PROBE_WIRE)
            conn.probing = True
            expect.extend(Entry(ledger.PROBE_REPLY) for _ in PROBE)
        expect.append(mine)
        if not parts:
            return wire
        parts.append(wire)
        return b"".join(parts)

    def vote_failure(self, conn: Any, window: float) -> Failure | None:
        """A failure for a vote that must not count under the delayed-restart rule, else None."""
        if window <= 0 or self.fsync_always:
            return None
        reason = ledger.vote_refusal(conn.restart, window, time.monotonic(), False)
        if reason is None:
            return None
        restart = conn.restart
        if restart is not None and restart.uptime is not None and self.announced != restart.run_id:
            self.announced = restart.run_id  # one log line per restart, not per vote
            logger.warning("Node %s %s.", self.name, reason)
        return Failure(reason)

    def lagging(self, now: float) -> bool:
        """True while a reply from this node is overdue by more than the node timeout."""
        return any(conn.expect and now - since > self.node_timeout for conn, since in self._parked.items())

    def checkout(self, *, for_key: str | None = None, allow_lagging: bool = True) -> tuple[Any, float | None]:
        """Return ``(connection, parked since)``; the second is None unless replies are still pending on it.

        With ``for_key``, a parked connection that still carries a command for that key
        is returned, so the new command stays ordered after it.
        """
        if os.getpid() != self._pid:
            self._check_fork()
        now = time.monotonic()
        with self._mutex:
            if self._parked:  # usually empty: only after an early decision or a silent node
                self._drain_parked(now)
                if for_key is not None:
                    for conn, since in self._parked.items():
                        if len(conn.expect) < MAX_PENDING and any(e.key == for_key for e in conn.expect):
                            del self._parked[conn]
                            return conn, since
                if not allow_lagging and self.lagging(now):
                    raise NodeUnavailable(f"no reply to an earlier command for over {_ms(self.node_timeout)}")
            if now < self._down_until:
                raise NodeUnavailable(self._down_reason)
            while self._idle:
                conn, idle_since = self._idle.pop()
                # A connection idle for a while may have been closed by a restart: look first.
                if now - idle_since < IDLE_CHECK or _idle_ok(conn):
                    return conn, None
                _disconnect(conn)  # closed by the server: make a new one
        conn = None
        try:
            conn = self.connection_class(**self.kwargs)
            conn.connect()
            conn = Wire(conn)  # from here on the engine reads and writes the socket itself
        except Exception as exc:  # noqa: BLE001 - any connect failure makes the node unavailable
            reason = self.redact(describe(exc, self.node_timeout))
            with self._mutex:
                self._down_until = time.monotonic() + COOL_OFF
                self._down_reason = reason
            if conn is not None:
                _disconnect(conn)
            raise NodeUnavailable(reason) from None
        return conn, None

    def checkin(self, conn: Any, since: float) -> None:
        """Give a connection back: idle when nothing is pending on it, else parked."""
        if os.getpid() != self._pid:
            return
        if conn.expect and len(conn.expect) > MAX_PENDING:
            self.drop(conn, time.monotonic())
            return
        with self._mutex:
            if conn.expect:
                self._parked[conn] = since
            else:
                self._idle.append((conn, time.monotonic()))

    def drop(self, conn: Any, now: float, *, close: bool = True) -> None:
        """Give up a connection; what was unanswered on it may still reach the node."""
        entries = list(getattr(conn, "expect", ()))
        if entries:
            with self._books:
                self.ledger.dropped(entries, now + max(e.ttl for e in entries) + self.stale_limit)
            conn.expect.clear()
        if close:
            _disconnect(conn)

    def close(self) -> None:
        with self._mutex:
            conns = [conn for conn, _ in self._idle] + list(self._parked)
            self._idle.clear()
            self._parked.clear()
        now = time.monotonic()
        for conn in conns:
            self.drop(conn, now)


#: Every node of this process, reset in a forked child (its parent's sockets and mutexes are not its own).
_NODES: weakref.WeakSet[Node] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for node in list(_NODES):
        node._mutex = threading.Lock()
        node._reset()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


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


# -- the wire: RESP2 on the connected socket -----------------------------------

_INCOMPLETE = object()
_ERRORS = {
    "NOSCRIPT": NoScriptError,
    "WRONGPASS": AuthenticationError,
    "NOAUTH": AuthenticationError,
}


def _error(line: bytes) -> ResponseError:
    text = line.decode("utf-8", "replace")
    return _ERRORS.get(text.split(" ", 1)[0], ResponseError)(text)


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
    for value in args:
        data = _arg(value)
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


class Wire:
    """A connected redis-py connection, read and written directly.

    redis-py makes the connection (TCP or TLS, AUTH, SELECT); after that the
    engine writes pre-encoded commands to the socket and parses the replies
    itself, which keeps a fan-out cheap enough to cost about one round trip.
    """

    __slots__ = ("conn", "_sock", "_buf", "_pos", "expect", "restart", "probe_replies", "probing")

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self._sock = conn._sock
        self._buf = bytearray()
        self._pos = 0
        #: Commands written whose replies have not been read, oldest first.
        self.expect: deque[Entry] = deque()
        #: What the restart probe sent on this connection learned (None: not yet).
        self.restart: Restart | None = None
        self.probe_replies: list[Any] = []
        self.probing = False

    encoder = None

    @staticmethod
    def pack_command(*args: Any) -> bytes:
        return pack(args)

    @staticmethod
    def pack_commands(commands: Sequence[Sequence[Any]]) -> bytes:
        return b"".join(pack(c) for c in commands)

    def send_packed_command(self, data: bytes, check_health: bool = False) -> None:
        try:
            self._sock.sendall(data)
        except socket.timeout:
            raise RedisTimeoutError("Timeout writing to socket") from None
        except OSError as exc:
            raise RedisConnectionError(f"Error writing to socket: {exc.__class__.__name__}") from None

    def buffered(self) -> bool:
        """True when reply bytes are already buffered (poll() would not report them)."""
        if self._pos < len(self._buf):
            return True
        pending = getattr(self._sock, "pending", None)  # TLS: decrypted bytes poll() cannot see
        return bool(pending and pending())

    def can_read(self, timeout: float = 0) -> bool:
        if self.buffered():
            return True
        poller = select.poll()
        poller.register(self._sock.fileno(), select.POLLIN | select.POLLERR | select.POLLHUP)
        if not poller.poll(timeout * 1000):
            return False
        self._fill()
        return True

    def read_response(self) -> Any:
        while True:
            # A whole reply always ends with CRLF: do not re-parse a partial one after every recv.
            if self._pos < len(self._buf) and self._buf.endswith(b"\r\n"):
                try:
                    reply, after = _parse(self._buf, self._pos)
                except ValueError as exc:
                    raise RedisConnectionError(f"Protocol error: {exc}") from None
                if reply is not _INCOMPLETE:
                    self._pos = after
                    if after == len(self._buf):
                        self._buf.clear()
                        self._pos = 0
                    if isinstance(reply, ResponseError):
                        raise reply
                    return reply
            self._fill()

    def _fill(self) -> None:
        try:
            data = self._sock.recv(262144)
        except socket.timeout:
            raise RedisTimeoutError("Timeout reading from socket") from None
        except OSError as exc:
            raise RedisConnectionError(f"Error reading from socket: {exc.__class__.__name__}") from None
        if not data:
            raise RedisConnectionError("Connection closed by server.")
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    def disconnect(self) -> None:
        self.conn.disconnect()


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
    return Node(pool.connection_class, kwargs, node_timeout=node_timeout, fsync_always=fsync_always)


# -- the fan-out -----------------------------------------------------------

Command = tuple[Any, ...]
Done = Callable[[list[Any]], bool]

PROBE_WIRE = b"".join(pack(c) for c in PROBE)


class _Call:
    __slots__ = ("index", "node", "conn", "command", "script", "mine", "settled")

    def __init__(self, index: int, node: Node, conn: Any, command: Command, script: Script | None, mine: Entry) -> None:
        self.index = index
        self.node = node
        self.conn = conn
        self.command = command
        self.script = script
        self.mine = mine
        self.settled = False


def script_command(script: Script, keys: Sequence[str], args: Sequence[Any]) -> Command:
    return ("EVALSHA", script.sha, len(keys), *keys, *args)


def read_booked(node: Node, conn: Any) -> tuple[Entry, Any]:
    """Read the next reply on ``conn``, match it to the oldest entry and book it.

    Error replies are returned as exceptions; a broken connection raises.
    A script answered NOSCRIPT is sent again as EVAL (the returned entry is
    then the new one and the reply ``_RESENT``).
    """
    try:
        reply = conn.read_response()
    except ResponseError as exc:
        reply = exc
    if not conn.expect:
        raise RedisConnectionError("Protocol error: a reply nobody asked for")
    entry = conn.expect.popleft()
    node.book(conn, entry, reply, time.monotonic())
    if isinstance(reply, NoScriptError) and entry.retry is not None:
        # The node forgot the script (a restart): send its source, once, in the same order.
        again = ledger.after_noscript(entry)
        assert again is not None
        conn.send_packed_command(entry.retry)
        conn.expect.append(again)
        return again, _RESENT
    return entry, reply


def fanout(
    nodes: Sequence[Node],
    commands: Sequence[Command | None],
    *,
    timeout: float,
    done: Done | None = None,
    script: Script | None = None,
    keys: Sequence[str] = (),
    ordered_after_key: str | None = None,
    allow_lagging: bool = True,
    timings: list[float | None] | None = None,
    restart_window: float = 0.0,
) -> list[Any]:
    """Send ``commands[i]`` to ``nodes[i]`` (all before reading), then collect replies.

    Returns one entry per node: the reply, or a :class:`Failure`. Stops waiting
    when ``done(results)`` is true (results still pending are ``None`` in the
    list passed to it) or when ``timeout`` has passed; replies not read by then
    are left on their connection and become ``Failure("no reply ...")`` here
    (they are read and booked later). With ``ordered_after_key``, a node whose
    earlier command on that key is still unanswered gets this command on the
    same connection, unawaited. ``timings``, when given, receives each node's
    reply time in seconds. With ``restart_window``, the replies are votes: a
    node restarted less than that many seconds ago (without fsync-every-write
    persistence), or whose restart state is unknown, does not vote; a new
    connection asks the node for its uptime in the same write. ``keys`` is
    accepted for compatibility; the connection's entries carry the keys.
    """
    results: list[Any] = [None] * len(nodes)
    calls: dict[int, _Call] = {}
    packed: dict[Any, Any] = {}
    is_release = script is RELEASE
    sent_at = time.monotonic()
    writing: tuple[Node, Any] | None = None
    try:
        for i, (node, command) in enumerate(zip(nodes, commands)):
            if command is None:
                results[i] = Failure("skipped")
                continue
            try:
                conn, parked = node.checkout(for_key=ordered_after_key, allow_lagging=allow_lagging)
            except NodeUnavailable as exc:
                results[i] = Failure(str(exc))
                continue
            except Exception as exc:  # noqa: BLE001 - a node's failure is a vote, never an error
                results[i] = Failure(node.redact(describe(exc, node.node_timeout)))
                continue
            if parked is not None and script is not None and command[0] == "EVALSHA":
                # A late reply on this connection is not retried for NOSCRIPT: send the source.
                command = ("EVAL", script.source, *command[2:])
            writing = (node, conn)
            try:
                # The same command usually goes to every node: encode it once.
                wire = packed.get(command)
                if wire is None:
                    wire = packed[command] = pack(command)
                retry = None
                if script is not None and command[0] == "EVALSHA":
                    retry = packed.get((script, command))
                    if retry is None:
                        retry = packed[(script, command)] = pack(("EVAL", script.source, *command[2:]))
                mine = entry_for(command, is_release, i, retry)
                conn.send_packed_command(node.prepare(conn, wire, mine, restart_window, sent_at))
            except (RedisError, OSError, ValueError) as exc:
                writing = None
                node.drop(conn, time.monotonic())
                results[i] = Failure(node.redact(describe(exc, node.node_timeout)))
                continue
            writing = None
            if parked is not None and sent_at - parked > node.node_timeout:
                # Ordered behind a command that is overdue: queue it, do not wait for it.
                mine.waiter = None
                node.checkin(conn, parked)
                results[i] = Failure("queued behind an unanswered command")
                continue
            calls[i] = _Call(i, node, conn, command, script, mine)
        if calls:
            # Each node gets the full timeout after its command went out (connects can take time).
            _collect(calls, results, sent_at, time.monotonic() + timeout, done, timings, restart_window)
    except BaseException:
        # Interrupted (a signal, an exception from a hook): keep the books straight.
        if writing is not None:
            writing[0].drop(writing[1], time.monotonic())
        for call in calls.values():
            if not call.settled:
                call.mine.waiter = None
                call.settled = True
                call.node.checkin(call.conn, sent_at)
        raise
    return results


def _collect(
    calls: dict[int, _Call],
    results: list[Any],
    sent_at: float,
    deadline: float,
    done: Done | None,
    timings: list[float | None] | None,
    window: float = 0.0,
) -> None:
    poller = select.poll()
    waiting: dict[int, tuple[int, _Call]] = {}
    by_fd: dict[int, _Call] = {}
    for call in calls.values():
        fd = _fileno(call.conn)
        if fd is None:
            call.settled = True
            call.node.drop(call.conn, time.monotonic())
            results[call.index] = Failure("connection lost")
            continue
        by_fd[fd] = call
        waiting[call.index] = (fd, call)
        poller.register(fd, select.POLLIN | select.POLLERR | select.POLLHUP)

    def settle(call: _Call, result: Any, keep: bool) -> None:
        results[call.index] = result
        call.settled = True
        fd, _ = waiting.pop(call.index)
        poller.unregister(fd)
        if keep:
            call.node.checkin(call.conn, sent_at)
        else:
            call.node.drop(call.conn, time.monotonic())

    grace = False
    while waiting:
        if not grace and done is not None and done(results):
            grace = True  # outcome known: read what has already arrived, then stop
        remaining = 0.0 if grace else max(0.0, deadline - time.monotonic())
        ready = [by_fd[fd] for fd, _ in poller.poll(remaining * 1000)]
        for _, call in waiting.values():
            if call not in ready and _has_buffered(call.conn):
                ready.append(call)
        if not ready:
            if grace or remaining == 0.0 or time.monotonic() >= deadline:
                break
            continue
        for call in ready:
            if call.index not in waiting:
                continue
            node = call.node
            try:
                reply = _read_mine(call)
            except (RedisError, OSError, ValueError) as exc:
                settle(call, Failure(node.redact(describe(exc, node.node_timeout))), keep=False)
                continue
            if reply is _NOT_YET:
                continue
            if isinstance(reply, ResponseError):
                settle(call, Failure(node.redact(describe(reply, node.node_timeout)), answered=True), keep=True)
                continue
            if timings is not None:
                timings[call.index] = time.monotonic() - sent_at
            settle(call, (window > 0 and node.vote_failure(call.conn, window)) or reply, keep=True)
    late = time.monotonic() - sent_at >= min(call.node.node_timeout for call in calls.values())
    for _, call in waiting.values():
        call.mine.waiter = None  # read and booked later, when the connection is next used
        call.settled = True
        call.node.checkin(call.conn, sent_at)
        if grace and not late:
            results[call.index] = Failure("not awaited: the outcome was already known", answered=True)
        else:
            results[call.index] = Failure(f"no reply within {_ms(call.node.node_timeout)}")


_NOT_YET = object()


_RESENT = object()


def _read_mine(call: _Call) -> Any:
    """Read replies up to this call's own; ``_NOT_YET`` when it has not fully arrived."""
    conn = call.conn
    while True:
        entry, reply = read_booked(call.node, conn)
        if reply is _RESENT:
            if entry.waiter is not None:
                call.mine = entry  # our script went again as EVAL: wait for that reply
        elif entry is call.mine:
            return reply
        if not conn.can_read(0):
            return _NOT_YET


def _fileno(conn: Any) -> int | None:
    sock = getattr(conn, "_sock", None)
    try:
        return sock.fileno() if sock is not None else None
    except OSError:
        return None


def _has_buffered(conn: Any) -> bool:
    try:
        return conn.buffered()
    except Exception:  # noqa: BLE001
        return False
