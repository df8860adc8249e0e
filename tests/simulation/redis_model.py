"""A simulated Redis master: the commands and scripts the engine uses, nothing more.

Commands arrive as tuples exactly as the engine builds them (``str``, ``bytes``
or ``int`` arguments); keys and values are stored as bytes. Replies have the
shapes the engine's RESP2 parser produces: ``bytes`` for simple and bulk
strings, ``int``, ``None`` for nil, ``list`` for arrays, and error replies as
exception *instances* (``ResponseError``, ``NoScriptError``) that are returned,
not raised.

Values are strings (``bytes``), sorted sets (``dict`` member -> score) or
lists (``deque``); only the commands the engine's scripts and the tests need
exist for the latter two. Expiry is lazy and measured on the node's own
drifting clock; so is ``TIME`` inside the scripts (milliseconds).

Connections are :class:`Session` objects (the network opens one per accepted
connection and feeds it with :meth:`SimNode.serve`). ``BLPOP`` on an empty list
blocks its session: the commands written behind it wait, in order, until a push
to that list serves it (blocked sessions are served first come, first served
per key, once the pushing command or script is over) or its timeout passes on
the node's clock. Like Redis, a timeout is noticed at the next server tick
(``hz`` 10: up to 100 ms late) or as soon as the node handles other input,
whichever comes first. A session closed while blocked drops what was queued
behind the ``BLPOP`` (Redis frees the client with its query buffer).

Faults: :meth:`SimNode.crash` (connections reset; data, lists and sorted sets
lost unless ``fsync_always``), :meth:`SimNode.start` (new run id, uptime from 0,
empty script cache), :meth:`SimNode.fail_over` (a replica that lags is promoted
behind the address: connections reset, data lost, new run id and replication
id, the uptime of a long-running server), :meth:`SimNode.fsync_on` (``CONFIG
SET appendonly yes`` + ``appendfsync always``: durable from now on, whatever
its last restart lost), :meth:`SimNode.pause` / :meth:`SimNode.resume` (SIGSTOP:
input waits in the buffers and is processed in arrival order on resume; blocked
sessions' timeouts fire only once it runs again), :meth:`SimNode.resync` (a full sync as a replica
of another server and a promotion back: the data set is replaced, connections stay open).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Sequence

from redis.exceptions import NoScriptError, ResponseError

from django_redlock.core.scripts import (
    ACQUIRE,
    DATASET,
    EXTEND,
    FENCE_RAISE,
    FENCE_READ,
    INSPECT,
    RECREATED,
    RELEASE,
    REPLACED,
    VOTE,
)

from .clock import Clock

if TYPE_CHECKING:
    from .world import World

__all__ = ["Session", "SimNode", "parse_commands", "glob_to_regex"]

NOSCRIPT = "NOSCRIPT No matching script. Please use EVAL."
NOPERM_INFO = "NOPERM User lock has no permissions to run the 'info' command"
NOPERM_CONFIG = "NOPERM User lock has no permissions to run the 'config|get' command"
WRONGTYPE = "WRONGTYPE Operation against a key holding the wrong kind of value"
#: Redis' default ``hz``: blocked clients' timeouts are checked at least this often.
SERVER_TICK = 0.1


def _b(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value).encode()
    if isinstance(value, float):
        return repr(value).encode()
    raise TypeError(f"cannot send {type(value).__name__} to Redis")


def _s(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _int(value: Any) -> int:
    try:
        return int(_s(value))
    except ValueError:
        raise _Error("ERR value is not an integer or out of range") from None


class _Error(Exception):
    """Raised inside a command; turned into a returned ``ResponseError``."""


def glob_to_regex(pattern: bytes) -> re.Pattern[bytes]:
    """Redis glob (``*``, ``?``, ``[...]``, ``\\`` escapes) as a compiled regex."""
    out = []
    i = 0
    n = len(pattern)
    while i < n:
        c = pattern[i : i + 1]
        if c == b"\\" and i + 1 < n:
            out.append(re.escape(pattern[i + 1 : i + 2]))
            i += 2
            continue
        if c == b"*":
            out.append(b".*")
        elif c == b"?":
            out.append(b".")
        elif c == b"[":
            j = pattern.find(b"]", i + 1)
            if j < 0:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1 : j]
                if body.startswith(b"^"):
                    body = b"^" + body[1:].replace(b"\\", b"\\\\")
                else:
                    body = body.replace(b"\\", b"\\\\")
                out.append(b"[" + body + b"]")
                i = j + 1
                continue
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile(b"".join(out) + b"\\Z", re.DOTALL)


def parse_commands(data: bytes) -> list[tuple[bytes, ...]]:
    """Split packed RESP2 requests (what the engine writes to a socket) into tuples.

    For a driver that holds the engine's encoded bytes rather than tuples.
    """
    out: list[tuple[bytes, ...]] = []
    pos = 0
    while pos < len(data):
        end = data.index(b"\r\n", pos)
        if data[pos : pos + 1] != b"*":
            raise ValueError("not a RESP2 request")
        count = int(data[pos + 1 : end])
        pos = end + 2
        args = []
        for _ in range(count):
            end = data.index(b"\r\n", pos)
            size = int(data[pos + 1 : end])
            start = end + 2
            args.append(bytes(data[start : start + size]))
            pos = start + size + 2
        out.append(tuple(args))
    return out


class Session:
    """The node's side of one client connection: what it still has to run, and whether it is blocked."""

    __slots__ = ("node", "name", "reply", "backlog", "blocked", "deadline", "closed", "woken")

    def __init__(self, node: SimNode, name: str, reply: Callable[[list[Any]], None]) -> None:
        self.node = node
        self.name = name
        #: Sends a batch of replies to the client (in order, on this connection).
        self.reply = reply
        #: Commands received and not run yet, oldest first (behind a blocked BLPOP).
        self.backlog: deque[Sequence[Any]] = deque()
        #: The list keys a BLPOP is blocked on, or None.
        self.blocked: tuple[bytes, ...] | None = None
        #: When the blocked BLPOP times out (node clock; inf: never).
        self.deadline = math.inf
        self.closed = False
        #: Served by a push or a timeout: the rest of the backlog runs in the next event.
        self.woken = False

    def __repr__(self) -> str:
        return f"<Session {self.name} blocked={self.blocked!r} backlog={len(self.backlog)}>"


class SimNode:
    """One independent Redis master."""

    def __init__(
        self,
        world: World,
        name: str,
        clock: Clock | None = None,
        fsync_always: bool = False,
        deny_info: bool = False,
        deny_config: bool = False,
        flaky_info: float = 0.0,
        tick: float = SERVER_TICK,
    ) -> None:
        self.world = world
        #: Server tick (1 / hz): a blocked client's timeout is noticed at the next one at the latest.
        self.tick = tick
        #: Chance that INFO fails with a passing error (an overloaded node, a proxy hiccup).
        self.flaky_info = flaky_info
        self.name = name
        self.proc = world.process(name, clock)
        self.clock = self.proc.clock
        self.fsync_always = fsync_always
        self.deny_info = deny_info
        self.deny_config = deny_config
        #: key -> [value, expiry on the node's clock or None]; value: bytes, zset dict or list deque
        self.data: dict[bytes, list[Any]] = {}
        #: Open connections of this boot, and per list key the sessions blocked on it (first come first).
        self.sessions: list[Session] = []
        self.waiting: dict[bytes, deque[Session]] = {}
        #: List keys pushed to by the command running now, whose blocked sessions are served after it.
        self.ready: list[bytes] = []
        self.tick_phase = world.rng.uniform(0.0, tick) if tick > 0 else 0.0
        #: While down after a crash that lost data: what it lost (the checker's view).
        self.lost: dict[bytes, list[Any]] = {}
        self.scripts: set[str] = set()
        self.up = False
        self.run_id = ""
        #: INFO replication: this data set's replication id, and the one before a promotion.
        self.replid = ""
        self.replid2 = "0" * 40
        self.started_local = 0.0
        #: When (node clock) the data in ``lost`` was lost: a node sits out a window from then.
        self.lost_at = 0.0
        self.restarts = 0
        #: Called with no argument when the node crashes (the network resets connections)
        #: and when it resumes from a pause (the network delivers what waited).
        self.crash_listeners: list[Callable[[], None]] = []
        self.resume_listeners: list[Callable[[], None]] = []
        self.commands_run = 0
        self.start()

    # -- faults ------------------------------------------------------------------

    def crash(self) -> None:
        """Power loss: connections reset; keys survive only with fsync-always."""
        if not self.up:
            return
        self.up = False
        self.world.note(self.name, "CRASH", "(data kept: fsync always)" if self.fsync_always else "(data lost)")
        if not self.fsync_always:
            self.lost = self.data
            self.data = {}
        self.scripts.clear()
        for session in self.sessions:
            session.closed = True
        self.sessions = []
        self.waiting = {}
        if self.proc.frozen:  # a paused node that dies: its buffered input dies with it
            self.proc.frozen = False
            self.proc.deferred.clear()
            self.world.fault_end(f"frozen:{self.name}")
        self.world.fault_begin(f"down:{self.name}")
        for listener in list(self.crash_listeners):
            listener()

    def start(self) -> None:
        """Boot: new run id, uptime from zero, empty script cache."""
        if self.up:
            return
        self.up = True
        self.restarts += 1 if self.run_id else 0
        self.run_id = self.world.token(20)
        # From the run id, not the seed's stream: runs without failovers replay as before.
        self.replid, self.replid2 = hashlib.sha1(self.run_id.encode()).hexdigest(), "0" * 40
        self.started_local = self.lost_at = self.clock.now()
        self.world.note(self.name, "START", f"run_id={self.run_id[:8]}", f"keys={len(self.data)}")
        self.world.fault_end(f"down:{self.name}")

    def restart(self, down_for: float) -> None:
        """Crash now and start again ``down_for`` true seconds later."""
        self.crash()
        self.world.after(down_for, self.start)

    def fail_over(self) -> None:
        """A replica that lagged is promoted behind this node's address: what the master held is
        lost (the worst lag) but its data-set marker, written long before (so only the probe's run id
        and replication id can tell), and the server now answering has been up for a long while."""
        if not self.up:
            return
        uptime = self.clock.now() - self.started_local
        self.world.note(self.name, "FAILOVER", "(a replica that lagged is promoted)")
        lost, self.data = self.data, {}  # fsync on the old master does not help the replica
        self.crash()
        self.lost = lost
        # What it does have was written long before: the data-set marker (a copy of the master's).
        self.data = {k: list(e) for k, e in lost.items() if k.endswith(b"dataset")}
        old = self.replid
        self.start()
        self.replid2 = old  # as Redis does on a promotion
        self.started_local -= uptime + self.world.uniform(0.0, 100.0, "replica uptime")
        self.lost_at = self.clock.now()

    def resync(self, source: SimNode | None = None) -> None:
        """REPLICAOF another server, then REPLICAOF NO ONE: a full sync replaces the data set with a
        copy of ``source``'s (None: an empty server's); connections stay open, the run id stays,
        the replication id is new (as after a promotion). What it held is lost from now."""
        if not self.up:
            return
        self.world.note(self.name, "RESYNC", f"from {source.name if source else 'an empty server'}")
        self.lost, self.data = self.data, ({k: list(e) for k, e in source.data.items()} if source else {})
        self.lost_at = self.clock.now()
        self.replid2, self.replid = self.replid, hashlib.sha1((self.replid + "resync").encode()).hexdigest()

    def fsync_on(self) -> None:
        """CONFIG SET appendonly yes + appendfsync always: keys survive crashes from now on (what its
        last restart lost stays lost)."""
        self.world.note(self.name, "CONFIG SET appendfsync always")
        self.fsync_always = True

    def flush_scripts(self) -> None:
        """SCRIPT FLUSH: the node forgets its scripts; connections stay open."""
        self.world.note(self.name, "SCRIPT FLUSH")
        self.scripts.clear()

    def pause(self) -> None:
        """SIGSTOP: input is accepted and buffered, nothing is answered."""
        if self.up:
            self.world.freeze(self.proc)

    def resume(self) -> None:
        """SIGCONT: buffered commands are processed in arrival order."""
        if self.proc.frozen:
            self.world.thaw(self.proc)
            for listener in list(self.resume_listeners):
                listener()

    @property
    def paused(self) -> bool:
        return self.proc.frozen

    # -- state, for the checker and tests ----------------------------------------

    def _live(self, key: bytes) -> list[Any] | None:
        entry = self.data.get(key)
        if entry is not None and entry[1] is not None and self.clock.now() >= entry[1]:
            del self.data[key]
            return None
        return entry

    def peek(self, key: Any) -> tuple[bytes, float | None] | None:
        """``(value, true seconds left or None)`` of a live key, without side effects on time."""
        entry = self._live(_b(key))
        if entry is None:
            return None
        if entry[1] is None:
            return entry[0], None
        return entry[0], self.clock.true_duration(entry[1] - self.clock.now())

    def peek_lost(self, key: Any, window: float = 0.0) -> tuple[bytes, float | None] | None:
        """Like :meth:`peek`, for a key this node lost in a crash: while it is down, or up for
        less than ``window`` seconds of its own clock (a restarted node sits out that long)."""
        entry = self.lost.get(_b(key))
        if entry is None or (self.up and self.clock.now() - self.lost_at >= window):
            return None
        if entry[1] is None:
            return entry[0], None
        left = entry[1] - self.clock.now()
        return (entry[0], self.clock.true_duration(left)) if left > 0 else None

    def holders(self) -> dict[bytes, bytes]:
        """Every live string key and its value."""
        return {k: e[0] for k in list(self.data) if (e := self._live(k)) is not None and type(e[0]) is bytes}

    def holds_value(self, value: Any) -> bool:
        return bool(self.keys_holding(value))

    def keys_holding(self, value: Any) -> list[bytes]:
        """The live string keys whose value is ``value`` (every member of a lock on several resources)."""
        v = _b(value)
        return sorted(k for k, val in self.holders().items() if val == v)

    def in_line(self, queue: Any, places: Any, place: Any) -> bool:
        """Does ``place`` still count in this waiting line?

        In the order with a place not expired yet (an expired one is forgotten by the next script
        on the line, so it counts for nothing), in the order without a place at all (it would
        stay first until the whole key expires), or holding a place without being in the order.
        """
        p = _b(place)
        order = self._live(_b(queue))
        listed = order is not None and type(order[0]) is dict and p in order[0]
        live = self._live(_b(places))
        expiry = live[0].get(p) if live is not None and type(live[0]) is dict else None
        if expiry is None:
            return listed
        return expiry > self._now_ms()

    # -- connections ------------------------------------------------------------

    def open_session(self, name: str, reply: Callable[[list[Any]], None]) -> Session:
        """A client connection was accepted; ``reply(batch)`` sends replies back on it."""
        session = Session(self, name, reply)
        self.sessions.append(session)
        return session

    def close_session(self, session: Session) -> None:
        """The client end is gone (FIN or reset): a blocked BLPOP and what waits behind it are dropped."""
        if session.closed:
            return
        session.closed = True
        session.backlog.clear()
        self._unblock(session)
        if session in self.sessions:
            self.sessions.remove(session)

    def serve(self, session: Session, commands: Sequence[Sequence[Any]]) -> None:
        """Commands arrived on ``session``: run them in order, up to a BLPOP that blocks."""
        if session.closed:
            return
        session.backlog.extend(commands)
        if session.blocked is None and not session.woken:
            self._drain(session, [])
        self._expire_blocked()  # like beforeSleep: overdue blocked clients are noticed on any input

    def _drain(self, session: Session, out: list[Any]) -> None:
        backlog = session.backlog
        note = self.world.note
        while backlog and not session.closed:
            command = backlog.popleft()
            if _s(command[0]).upper() == "BLPOP":
                reply = self._blpop_or_block(session, command)
                if session.blocked is not None:
                    note(self.name, "<-", session.name, tuple(command), "-> blocks")
                    break
            else:
                reply = self.execute(command)
            out.append(reply)
            note(self.name, "<-", session.name, tuple(command), "->", reply)
        if out and not session.closed:
            session.reply(out)

    def _blpop_or_block(self, session: Session, command: Sequence[Any]) -> Any:
        self.commands_run += 1
        try:
            keys = [_b(k) for k in command[1:-1]]
            timeout = float(_s(command[-1]))
        except (IndexError, ValueError):
            return ResponseError("ERR timeout is not a float or out of range")
        if timeout < 0 or not keys:
            return ResponseError("ERR BLPOP needs keys and a timeout >= 0")
        for key in keys:
            popped = self._lpop(key)
            if popped is not None:
                return [key, popped]
        session.blocked = tuple(keys)
        for key in keys:
            self.waiting.setdefault(key, deque()).append(session)
        if timeout > 0:
            session.deadline = self.clock.now() + timeout
            fire = session.deadline
            if self.tick > 0:  # noticed at the next server tick (or earlier, on other input)
                fire = self.tick_phase + math.ceil((fire - self.tick_phase) / self.tick) * self.tick
            self.proc.at_local(fire, self._timed_out, session, session.deadline)
        else:
            session.deadline = math.inf
        return None

    def _timed_out(self, session: Session, deadline: float) -> None:
        if session.blocked is not None and session.deadline == deadline and not session.closed:
            self._wake(session, None)

    def _expire_blocked(self) -> None:
        if not self.waiting:
            return
        now = self.clock.now()
        for sessions in list(self.waiting.values()):
            for session in list(sessions):
                if session.deadline <= now:
                    self._wake(session, None)

    def _unblock(self, session: Session) -> None:
        keys = session.blocked
        if keys is None:
            return
        session.blocked = None
        session.deadline = math.inf
        for key in keys:
            sessions = self.waiting.get(key)
            if sessions is not None:
                if session in sessions:
                    sessions.remove(session)
                if not sessions:
                    del self.waiting[key]

    def _wake(self, session: Session, reply: Any) -> None:
        """Answer the blocked BLPOP; the commands behind it run in the next event (beforeSleep)."""
        key = session.blocked
        self._unblock(session)
        self.world.note(self.name, "BLPOP of", session.name, key, "->", reply if reply is not None else "timeout")
        session.reply([reply])
        session.woken = True
        self.world.at(self.world.now, self._resume_session, session, proc=self.proc)

    def _resume_session(self, session: Session) -> None:
        session.woken = False
        if not session.closed and session.blocked is None:
            self._drain(session, [])

    def _serve_ready(self) -> None:
        """Serve sessions blocked on the lists just pushed to, first come first served."""
        while self.ready:
            key = self.ready.pop(0)
            sessions = self.waiting.get(key)
            while sessions:
                value = self._lpop(key)
                if value is None:
                    break
                self._wake(sessions[0], [key, value])
                sessions = self.waiting.get(key)

    # -- commands ----------------------------------------------------------------

    def execute(self, command: Sequence[Any]) -> Any:
        """Run one command now; return its reply (errors as exception instances)."""
        self.commands_run += 1
        reply: Any
        try:
            name = _s(command[0]).upper()
            handler = _COMMANDS.get(name)
            if handler is None:
                raise _Error(f"ERR unknown command '{_s(command[0])}'")
            reply = handler(self, command[1:])
        except _Error as exc:
            text = str(exc)
            reply = NoScriptError(text) if text.startswith("NOSCRIPT") else ResponseError(text)
        except (IndexError, ValueError, TypeError) as exc:
            reply = ResponseError(f"ERR syntax error ({exc})")
        if self.ready:
            self._serve_ready()  # blocked clients are served once the pushing command (or script) is over
        return reply

    def _set(self, args: Sequence[Any]) -> Any:
        key, value = _b(args[0]), _b(args[1])
        nx = xx = False
        ttl_ms: int | None = None
        i = 2
        while i < len(args):
            opt = _s(args[i]).upper()
            if opt == "NX":
                nx = True
            elif opt == "XX":
                xx = True
            elif opt in ("PX", "EX"):
                amount = _int(args[i + 1])
                if amount <= 0:
                    raise _Error("ERR invalid expire time in 'set' command")
                ttl_ms = amount if opt == "PX" else amount * 1000
                i += 1
            else:
                raise _Error("ERR syntax error")
            i += 1
        exists = self._live(key) is not None
        if (nx and exists) or (xx and not exists):
            return None
        expiry = None if ttl_ms is None else self.clock.now() + ttl_ms / 1000.0
        self.data[key] = [value, expiry]
        return b"OK"

    def _get(self, args: Sequence[Any]) -> Any:
        entry = self._live(_b(args[0]))
        if entry is not None and type(entry[0]) is not bytes:
            raise _Error(WRONGTYPE)
        return None if entry is None else entry[0]

    def _mget(self, args: Sequence[Any]) -> list[Any]:
        """Each key's string value, nil for a missing key or another type (as Redis: no WRONGTYPE)."""
        if not args:
            raise _Error("ERR wrong number of arguments for 'mget' command")
        out = []
        for key in args:
            entry = self._live(_b(key))
            out.append(entry[0] if entry is not None and type(entry[0]) is bytes else None)
        return out

    def _typed(self, key: bytes, kind: type) -> Any:
        """The live value at ``key`` if it has type ``kind``; None if missing; WRONGTYPE otherwise."""
        entry = self._live(key)
        if entry is None:
            return None
        if type(entry[0]) is not kind:
            raise _Error(WRONGTYPE)
        return entry[0]

    def _now_ms(self) -> int:
        """``TIME`` as the scripts read it: the node's clock in whole milliseconds."""
        return math.floor(self.clock.now() * 1000)

    # sorted sets: dict member -> score; an emptied set is deleted, as in Redis

    def _zadd(self, args: Sequence[Any]) -> int:
        key = _b(args[0])
        zset = self._typed(key, dict)
        if zset is None:
            zset = {}
            self.data[key] = [zset, None]
        added = 0
        for i in range(1, len(args), 2):
            score, member = _float(args[i]), _b(args[i + 1])
            added += member not in zset
            zset[member] = score
        return added

    def _zrem(self, args: Sequence[Any]) -> int:
        key = _b(args[0])
        zset = self._typed(key, dict)
        if zset is None:
            return 0
        removed = sum(1 for m in args[1:] if zset.pop(_b(m), None) is not None)
        if not zset:
            del self.data[key]
        return removed

    def _zscore(self, args: Sequence[Any]) -> Any:
        zset = self._typed(_b(args[0]), dict)
        score = None if zset is None else zset.get(_b(args[1]))
        return None if score is None else _b(f"{score:.17g}")

    def _zrange(self, args: Sequence[Any]) -> list[bytes]:
        zset = self._typed(_b(args[0]), dict)
        if not zset:
            return []
        ordered = sorted(zset, key=lambda m: (zset[m], m))
        start, stop = _int(args[1]), _int(args[2])
        n = len(ordered)
        start, stop = (start + n if start < 0 else start), (stop + n if stop < 0 else stop)
        return ordered[max(0, start) : stop + 1]

    def _zrangebyscore(self, args: Sequence[Any]) -> list[bytes]:
        zset = self._typed(_b(args[0]), dict)
        if not zset:
            return []
        low, high = _float(args[1]), _float(args[2])
        return sorted((m for m, sc in zset.items() if low <= sc <= high), key=lambda m: (zset[m], m))

    def _zcard(self, args: Sequence[Any]) -> int:
        zset = self._typed(_b(args[0]), dict)
        return len(zset) if zset else 0

    # lists: deque; an emptied list is deleted

    def _rpush(self, args: Sequence[Any]) -> int:
        key = _b(args[0])
        items = self._typed(key, deque)
        if items is None:
            items = deque()
            self.data[key] = [items, None]
        items.extend(_b(v) for v in args[1:])
        if key in self.waiting:
            self.ready.append(key)
        return len(items)

    def _lpop(self, key: bytes) -> bytes | None:
        items = self._typed(key, deque)
        if not items:
            return None
        value = items.popleft()
        if not items:
            del self.data[key]
        return value

    def _llen(self, args: Sequence[Any]) -> int:
        items = self._typed(_b(args[0]), deque)
        return len(items) if items else 0

    def _blpop(self, args: Sequence[Any]) -> Any:
        """BLPOP outside a connection (a direct call): pop now, or nil; it never blocks."""
        for key in args[:-1]:
            value = self._lpop(_b(key))
            if value is not None:
                return [_b(key), value]
        return None

    def _pttl(self, args: Sequence[Any]) -> int:
        entry = self._live(_b(args[0]))
        if entry is None:
            return -2
        if entry[1] is None:
            return -1
        return max(0, int((entry[1] - self.clock.now()) * 1000))

    def _pexpire(self, args: Sequence[Any]) -> int:
        key = _b(args[0])
        ms = _int(args[1])
        entry = self._live(key)
        if entry is None:
            return 0
        if ms <= 0:
            del self.data[key]
        else:
            entry[1] = self.clock.now() + ms / 1000.0
        return 1

    def _del(self, args: Sequence[Any]) -> int:
        n = 0
        for key in args:
            k = _b(key)
            if self._live(k) is not None:
                del self.data[k]
                n += 1
        return n

    def _exists(self, args: Sequence[Any]) -> int:
        return sum(1 for key in args if self._live(_b(key)) is not None)

    def _ping(self, args: Sequence[Any]) -> bytes:
        return _b(args[0]) if args else b"PONG"

    def _info(self, args: Sequence[Any]) -> bytes:
        if self.deny_info:
            raise _Error(NOPERM_INFO)
        if self.flaky_info and self.world.chance(self.flaky_info, "flaky info"):
            raise _Error("ERR INFO failed for a passing reason")
        # As Redis does: the difference of two truncated clock seconds (ahead by up to 1 s).
        uptime = int(self.clock.now()) - int(self.started_local)
        sections = {_s(a).lower() for a in args} or {"server", "replication"}
        text = b""
        if "server" in sections:
            text += (
                b"# Server\r\nredis_version:7.0.0\r\nredis_mode:standalone\r\n"
                b"run_id:%s\r\nuptime_in_seconds:%d\r\n" % (self.run_id.encode(), uptime)
            )
        if "replication" in sections:
            text += b"# Replication\r\nrole:master\r\nconnected_slaves:0\r\nmaster_replid:%s\r\n" % (
                self.replid.encode()) + b"master_replid2:%s\r\n" % self.replid2.encode()
        return text

    def _config(self, args: Sequence[Any]) -> list[bytes]:
        if _s(args[0]).upper() != "GET":
            raise _Error("ERR CONFIG subcommand not supported by the simulator")
        if self.deny_config:
            raise _Error(NOPERM_CONFIG)
        name = _s(args[1]).lower()
        values = {
            "appendonly": b"yes" if self.fsync_always else b"no",
            "appendfsync": b"always" if self.fsync_always else b"everysec",
        }
        if name not in values:
            return []
        return [name.encode(), values[name]]

    def _time(self, args: Sequence[Any]) -> list[bytes]:
        micros = math.floor(self.clock.now() * 1_000_000)
        return [b"%d" % (micros // 1_000_000), b"%d" % (micros % 1_000_000)]

    def _scan(self, args: Sequence[Any]) -> list[Any]:
        pattern = b"*"
        i = 1
        while i < len(args):
            opt = _s(args[i]).upper()
            if opt == "MATCH":
                pattern = _b(args[i + 1])
            elif opt != "COUNT":
                raise _Error("ERR syntax error")
            i += 2
        rx = glob_to_regex(pattern)
        keys = sorted(k for k in self.holders() if rx.match(k))
        return [b"0", keys]

    def _eval(self, args: Sequence[Any]) -> Any:
        source = _s(args[0])
        sha = hashlib.sha1(source.encode()).hexdigest()
        if sha not in _SCRIPTS:
            raise _Error("ERR the simulator does not implement this script")
        self.scripts.add(sha)
        return self._run(sha, args[1:])

    def _evalsha(self, args: Sequence[Any]) -> Any:
        sha = _s(args[0]).lower()
        if sha not in self.scripts:
            raise _Error(NOSCRIPT)
        return self._run(sha, args[1:])

    def _run(self, sha: str, rest: Sequence[Any]) -> Any:
        numkeys = _int(rest[0])
        keys = [_b(k) for k in rest[1 : 1 + numkeys]]
        argv = [_b(a) for a in rest[1 + numkeys :]]
        if sha in _GUARDED:
            argv = self._guard(argv)
        group = _SCRIPT_KEYS.get(sha)
        if group is not None and (not keys or len(keys) % group):
            raise _Error(f"ERR Error running script: KEYS in groups of {group} expected, {len(keys)} given")
        return getattr(self, _SCRIPTS[sha])(keys, argv)

    # the engine's scripts, as their Lua does it (a mutant may replace one of these methods)

    def _forget_expired(self, queue: bytes, places: bytes, now: int) -> None:
        expired = self._zrangebyscore([places, "-inf", now])
        if expired:
            self._zrem([places, *expired])
            self._zrem([queue, *expired])

    def _waiting(self, queue: bytes, places: bytes, now: int) -> bool:
        """The scripts' ``waiting()``: forget expired places; True while anyone is in line."""
        if self._exists([queue]) == 0:
            return False
        self._forget_expired(queue, places, now)
        return self._exists([queue]) == 1

    def _guard(self, argv: list[bytes]) -> list[bytes]:
        """The vote scripts' data-set check (``scripts._GUARD``): takes its two ARGV off the end."""
        argv, (mark, known) = argv[:-2], argv[-2:]
        self._check_guard(argv, mark, known)
        return argv

    def _check_guard(self, argv: list[bytes], mark: bytes, known: bytes) -> None:
        """``scripts._GUARD_CHECK``: raises the refusal when the data set is not the one ``known``."""
        if known:
            found = self._get([mark])
            if found != known:
                if found is None:
                    found = dataset_token((argv[0] if argv else b"") + known)
                    self._set([mark, found])
                raise _Error(f"{REPLACED} {_s(found)}")

    def _dataset(self, keys: list[bytes], argv: list[bytes]) -> bytes:
        found = self._get([keys[0]])
        if found is None:
            found = dataset_token(argv[0])
            self._set([keys[0], found])
        return found  # type: ignore[no-any-return]

    def _fence_read(self, keys: list[bytes], argv: list[bytes]) -> list[Any]:
        return self._mget(keys)

    def _vote(self, keys: list[bytes], argv: list[bytes]) -> Any:
        return self._set([keys[0], argv[0], "NX", "PX", argv[1]])

    def _acquire(self, keys: list[bytes], argv: list[bytes]) -> Any:
        value, ttl_ms, mode, place, ticket, life_ms = argv[:6]
        wakes = argv[6:]
        triples = [keys[i : i + 3] for i in range(0, len(keys), 3)]
        now = self._now_ms()
        lines = [self._waiting(queue, places, now) for _, queue, places in triples]
        held = any(self._exists([lock]) == 1 for lock, _, _ in triples)
        if mode == b"wait":
            self._del(list(wakes))
            if not all(line and self._zscore([places, place]) is not None
                       for line, (_, _, places) in zip(lines, triples)):
                return -1
        if mode != b"once" and (held or any(lines)):
            life = _int(life_ms)
            for _, queue, places in triples:
                self._zadd([queue, ticket, place])
                self._zadd([places, now + life, place])
                if self._pttl([queue]) < life:
                    self._pexpire([queue, life])
                    self._pexpire([places, life])
            lines = [True] * len(triples)
        if held:
            return 0
        if any(line and self._zrange([queue, 0, 0])[:1] != [place] for line, (_, queue, _) in zip(lines, triples)):
            return -2
        for line, (lock, queue, places) in zip(lines, triples):
            if line:
                self._zrem([queue, place])
                self._zrem([places, place])
        for lock, _, _ in triples:
            self._set([lock, value, "PX", ttl_ms])
        return b"OK"

    def _release(self, keys: list[bytes], argv: list[bytes]) -> int:
        value, place, wake_life, ticket = argv[:4]
        released = 1
        for r, i in enumerate(range(0, len(keys), 3)):
            lock = keys[i]
            if self._get([lock]) == value:
                self._del([lock])
            else:
                released = 0
            self._leave_and_wake(keys[i : i + 3], place, argv[4 + r], wake_life, ticket)
        return released

    def _leave_and_wake(self, keys: list[bytes], place: bytes, prefix: bytes, wake_life: bytes,
                        ticket: bytes = b"") -> None:
        """RELEASE after the compare-and-delete: leave the line (or, with a ticket, keep the place);
        if the lock is free, wake the first."""
        lock, queue, places = keys
        line = self._exists([queue]) == 1
        if place != b"" and ticket != b"":
            life = _int(wake_life)
            self._zadd([queue, ticket, place])
            self._zadd([places, self._now_ms() + life, place])
            if self._pttl([queue]) < life:
                self._pexpire([queue, life])
                self._pexpire([places, life])
            line = True
        elif line and place != b"":
            self._zrem([queue, place])
            self._zrem([places, place])
        if line and self._exists([lock]) == 0 and self._waiting(queue, places, self._now_ms()):
            wake = prefix + self._zrange([queue, 0, 0])[0]
            self._rpush([wake, b"1"])
            self._pexpire([wake, wake_life])

    def _extend(self, keys: list[bytes], argv: list[bytes]) -> int:
        argv, (mark, known) = argv[:-2], argv[-2:]
        missing = [key for key in keys if self._live(key) is None]
        if any(entry is not None and entry[0] != argv[0] for entry in map(self._live, keys)):
            return 0
        if missing:
            if argv[2] != b"1":
                return 0
            self._check_guard(argv, mark, known)
            for key in missing:
                self._set([key, argv[0], "NX", "PX", argv[1]])
        for key in keys:
            if self._pttl([key]) < _int(argv[1]):  # never shorter than it already lives
                self._pexpire([key, argv[1]])
        return RECREATED if missing else 1

    def _fence_raise(self, keys: list[bytes], argv: list[bytes]) -> int:
        wanted = _lua_number(argv[0])
        lowest = math.inf
        for key in keys:
            entry = self._live(key)
            current = _lua_number(entry[0]) if entry is not None else 0
            if wanted > current:
                self.data[key] = [argv[0], None]  # plain SET: no ttl
                current = wanted
            lowest = min(lowest, current)
        return int(lowest)

    def _inspect(self, keys: list[bytes], argv: list[bytes]) -> list[Any]:
        head, places_head = argv[0], argv[1]
        after = self._now_ms()
        out: list[Any] = []
        waiting: list[int] = []
        for i, key in enumerate(keys, 1):
            out.append(self._get([key]))
            out.append(self._pttl([key]))
            places = self._typed(places_head + key[len(head):], dict)
            live = sum(1 for expiry in (places or {}).values() if expiry > after)
            if live > 0:
                waiting += [i, live]
        out.append(waiting)
        return out

    def __repr__(self) -> str:
        state = "up" if self.up else "down"
        if self.paused:
            state = "paused"
        return f"<SimNode {self.name} {state} keys={len(self.data)}>"


def _float(value: Any) -> float:
    text = _s(value).lower()
    if text in ("-inf", "+inf", "inf"):
        return -math.inf if text == "-inf" else math.inf
    try:
        return float(text)
    except ValueError:
        raise _Error("ERR value is not a valid float") from None


def _lua_number(value: bytes) -> float:
    try:
        return float(value)
    except ValueError:
        raise _Error("ERR Error running script: attempt to compare nil with number") from None


_COMMANDS: dict[str, Callable[[SimNode, Sequence[Any]], Any]] = {
    "SET": SimNode._set,
    "GET": SimNode._get,
    "MGET": SimNode._mget,
    "PTTL": SimNode._pttl,
    "PEXPIRE": SimNode._pexpire,
    "DEL": SimNode._del,
    "EXISTS": SimNode._exists,
    "PING": SimNode._ping,
    "INFO": SimNode._info,
    "CONFIG": SimNode._config,
    "SCAN": SimNode._scan,
    "TIME": SimNode._time,
    "EVAL": SimNode._eval,
    "EVALSHA": SimNode._evalsha,
    "ZADD": SimNode._zadd,
    "ZREM": SimNode._zrem,
    "ZSCORE": SimNode._zscore,
    "ZRANGE": SimNode._zrange,
    "ZRANGEBYSCORE": SimNode._zrangebyscore,
    "ZCARD": SimNode._zcard,
    "RPUSH": SimNode._rpush,
    "LLEN": SimNode._llen,
    "BLPOP": SimNode._blpop,
}

#: sha -> the SimNode method that does what the script's Lua does (looked up per call).
_SCRIPTS: dict[str, str] = {
    VOTE.sha: "_vote",
    FENCE_READ.sha: "_fence_read",
    DATASET.sha: "_dataset",
    ACQUIRE.sha: "_acquire",
    RELEASE.sha: "_release",
    EXTEND.sha: "_extend",
    FENCE_RAISE.sha: "_fence_raise",
    INSPECT.sha: "_inspect",
}
#: sha -> the KEYS come in groups of this many (at least one group).
_SCRIPT_KEYS: dict[str, Any] = {
    ACQUIRE.sha: 3, RELEASE.sha: 3, EXTEND.sha: 1, FENCE_RAISE.sha: 1, VOTE.sha: 1, DATASET.sha: 1, FENCE_READ.sha: 1,
}
#: The vote scripts: their last two ARGV are the data-set check's (see :meth:`SimNode._guard`).
_GUARDED = frozenset((ACQUIRE.sha, VOTE.sha, FENCE_READ.sha, FENCE_RAISE.sha))


def dataset_token(seed: bytes) -> bytes:
    """The token a missing data-set marker is created with, as the scripts' Lua makes it."""
    return hashlib.sha1(seed).hexdigest()[:16].encode()
