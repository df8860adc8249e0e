"""One node's connections and one fan-out round, without I/O.

:class:`NodeBooks` decides which connection a command goes on (an idle one, a
parked one that still carries a command for the same key, or a new one), what
rides along with it (release debts, the restart probe), how each reply is
booked, and when a connection with overdue replies is given up.

:class:`Round` is one fan-out: a command per node, written to every node
before any reply is awaited, judged reply by reply until the outcome is
certain or the node timeout passes. It says what to write, how long to wait,
and what each node's result is; the drivers (sockets + poll, asyncio, the
simulator) move the bytes and read the clock::

    rnd = Round(books, commands, now=now, timeout=0.05, done=...)
    for i in range(len(books)):
        choice = rnd.choose(i, now)            # (kind, conn, since) or None
        ...connect if kind is NEW...
        wire = rnd.write(i, conn, now)          # commands to send, in order
        ...send... ; rnd.written(i, conn, since, now, error)
    rnd.start(now)
    while (wait := rnd.wait_time(now)) is not None:
        ...wait up to `wait` for replies; for each: entry, resend = books.read(conn, reply, now)
        ...send `resend` if any; rnd.take(entry, reply, now) if entry.waiter is rnd
    results = rnd.finish(now)                   # connections still owing replies are parked

Nothing here reads a clock, touches a socket, sleeps or starts a thread;
callers that share books between threads hold a lock around these calls.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django_redlock.core import ledger
from django_redlock.core.ledger import PROBE, Entry, Ledger, Restart, entry_for, pair_of
from django_redlock.core.scripts import ACQUIRE, EXTEND, RELEASE, Script

__all__ = [
    "COOL_OFF",
    "IDLE",
    "IDLE_CHECK",
    "MAX_PENDING",
    "NEW",
    "PARKED",
    "ConnState",
    "Failure",
    "Granted",
    "NodeBooks",
    "NodeUnavailable",
    "Round",
]

logger = logging.getLogger("django_redlock")

Command = tuple[Any, ...]

#: A node whose earlier reply is overdue by this long is dropped and reconnected.
STALE_LIMIT_MIN = 1.0
#: After a failed connect, leave the node alone this long.
COOL_OFF = 0.5
#: Idle connections older than this are checked for a close by the server before use.
IDLE_CHECK = 0.5
#: Redis notices a BLPOP timeout at its next server tick (``hz 10``): up to this much late.
SERVER_TICK = 0.1
#: At most this many unread replies are queued on one parked connection.
MAX_PENDING = 256

# What NodeBooks.choose() hands out.
IDLE, PARKED, NEW = "idle", "parked", "new"


@dataclass(frozen=True)
class Failure:
    """Why a node did not give a usable reply (never contains credentials)."""

    reason: str
    answered: bool = False  # the node answered (e.g. with an error), it is not down

    def __str__(self) -> str:
        return self.reason


class NodeUnavailable(Exception):
    pass


class Granted(bytes):
    """A vote's +OK that waited in line first, with how long it waited on its node's clock."""

    waited: float

    def __new__(cls, reply: bytes, waited: float) -> Granted:
        granted = super().__new__(cls, reply)
        #: Seconds between the node's TIME before the ``BLPOP`` and its TIME after it, at most
        #: the time between the write and the reply on our clock (see :meth:`Round.take`).
        granted.waited = waited
        return granted

    def __repr__(self) -> str:
        return f"{bytes(self)!r} after {self.waited * 1000:.1f} ms in line"


def node_wait(stamps: Sequence[Any]) -> float:
    """Seconds between a vote's two TIME replies (``[seconds, microseconds]``); 0.0 unless both are there."""
    if len(stamps) != 2:
        return 0.0
    try:
        (s1, us1), (s2, us2) = stamps
        return max(0.0, int(s2) - int(s1) + (int(us2) - int(us1)) / 1_000_000)
    except (TypeError, ValueError):  # an error reply (TIME denied by an ACL): nothing is known
        return 0.0


def ms_text(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


class ConnState:
    """What the books keep per connection: replies still due, and what its probe learned."""

    __slots__ = ("expect", "restart", "probe_replies", "probing", "quiet_until", "scripts", "stamps", "waited", "parts")

    def __init__(self) -> None:
        #: Commands written whose replies have not been read, oldest first.
        self.expect: deque[Entry] = deque()
        #: What the restart probe sent on this connection learned (None: not yet).
        self.restart: Restart | None = None
        self.probe_replies: list[Any] = []
        self.probing = False
        #: A wait in line (BLPOP) written here may keep the replies back until then.
        self.quiet_until = 0.0
        #: Scripts whose source went out on this connection: its server has them (a restart closes it).
        self.scripts: set[str] = set()
        #: TIME replies read since the last vote's reply, and how long that vote waited by them.
        self.stamps: list[Any] = []
        self.waited = 0.0
        #: Replies read of several commands sent as one, before the last (see :meth:`Round.write`).
        self.parts: list[Any] = []


def quiet_for(block: tuple[tuple[str, ...], float]) -> float:
    """How long a wait in line (``BLPOP wake seconds``) may hold the replies behind it back."""
    return block[1] + SERVER_TICK


def overdue(conn: ConnState, since: float, now: float) -> float:
    """How long ``conn``'s replies have been overdue (not counting a wait in line)."""
    return now - max(since, conn.quiet_until)


class NodeBooks:
    """One node's connections, restart knowledge and release debts."""

    def __init__(
        self, name: str, node_timeout: float, fsync_always: bool = False, history: ledger.History | None = None
    ) -> None:
        self.name = name
        self.node_timeout = node_timeout
        self.stale_limit = max(STALE_LIMIT_MIN, 20 * node_timeout)
        #: Declared to fsync every write: votes at once after a restart (still probed: a failover is not a restart).
        self.fsync_always = fsync_always
        #: What the probes learned of the server at this address (shared by a node's books in every event loop).
        self.history = history if history is not None else ledger.History()
        self.reset()

    def reset(self) -> None:
        self.ledger = Ledger(self.node_timeout)
        self.idle: list[tuple[Any, float]] = []  # (connection, idle since), most recent last
        self.parked: dict[Any, float] = {}  # connection -> last progress (a reply read, or the write)
        self.down_until = 0.0
        self.down_reason = ""
        self.announced = ""  # run id (and replication id) of the restart or failover last logged
        self.denied_warned = False
        self.replication_warned = False
        self.fsync_warned = False

    # -- choosing a connection ----------------------------------------------------

    def lagging(self, now: float) -> bool:
        """True while a reply from this node is overdue by more than the node timeout."""
        return any(conn.expect and overdue(conn, since, now) > self.node_timeout for conn, since in self.parked.items())

    def choose(
        self, after: tuple[str, str] | None, allow_lagging: bool, now: float
    ) -> tuple[str, Any, float | None]:
        """``(PARKED, conn, since)``, ``(IDLE, conn, idle since)`` or ``(NEW, None, None)``.

        With ``after=(key, value)``, a parked connection that still carries a
        command for that key and value (its SET) comes first, so the new command
        (its release) stays ordered after it. Raises
        :class:`NodeUnavailable` for a node that is lagging (when not allowed)
        or cooling off after a failed connect.
        """
        if self.parked:
            if after is not None:
                key, value = after
                for conn, since in self.parked.items():
                    if len(conn.expect) < MAX_PENDING and any(e.key == key and e.value == value for e in conn.expect):
                        del self.parked[conn]
                        return PARKED, conn, since
            if not allow_lagging and self.lagging(now):
                raise NodeUnavailable(f"no reply to an earlier command for over {ms_text(self.node_timeout)}")
        if now < self.down_until:
            raise NodeUnavailable(self.down_reason)
        if self.idle:
            conn, since = self.idle.pop()
            return IDLE, conn, since
        # None idle: queue behind replies still in flight (less than a quarter of the node timeout
        # since the last progress) rather than open a connection: a release that ended at a quorum
        # leaves its last replies coming. Never behind a wait in line.
        for conn, since in self.parked.items():
            if len(conn.expect) < MAX_PENDING and conn.quiet_until <= now and now - since < self.node_timeout / 4:
                del self.parked[conn]
                return PARKED, conn, since
        return NEW, None, None

    def connect_failed(self, reason: str, now: float) -> None:
        self.down_until = now + COOL_OFF
        self.down_reason = reason

    def checkin(self, conn: Any, since: float, now: float) -> None:
        """Take a connection back: idle when nothing is pending on it, else parked."""
        if len(conn.expect) > MAX_PENDING:
            self.drop(conn, now)
        elif conn.expect:
            self.parked[conn] = since
        else:
            self.idle.append((conn, now))

    def after_drain(self, conn: Any, since: float, now: float) -> bool:
        """Re-file a parked connection after its ready replies were read; False: give it up (stale)."""
        if not conn.expect:
            self.parked.pop(conn, None)
            self.idle.append((conn, now))
        elif self._stale(conn, since, now):
            self.drop(conn, now)
            return False
        else:
            self.parked[conn] = since
        return True

    def stale(self, now: float) -> list[Any]:
        """Parked connections whose replies are overdue beyond the stale limit: to be given up."""
        return [conn for conn, since in self.parked.items() if self._stale(conn, since, now)]

    def _stale(self, conn: Any, since: float, now: float) -> bool:
        return bool(conn.expect) and overdue(conn, since, now) > self.stale_limit

    def drop(self, conn: Any, now: float) -> None:
        """Forget a connection; what was unanswered on it may still reach the node."""
        self.parked.pop(conn, None)
        if self.idle:
            self.idle = [(c, t) for c, t in self.idle if c is not conn]
        entries = list(conn.expect)
        if entries:
            self.ledger.dropped(entries, now + max(e.ttl for e in entries) + self.stale_limit)
            conn.expect.clear()

    # -- writing and reading -------------------------------------------------------

    def owe(self, key: str, value: str, ttl: float, now: float, debt: Command) -> None:
        """A release of ``value`` is about to be written: owe it (as ``debt``, see
        :func:`~django_redlock.core.ledger.debt_command`) until it is proven done."""
        self.ledger.owe(key, value, now + ttl + self.stale_limit, now, debt)

    def prepare(
        self, conn: Any, mine: Entry, window: float, now: float, block: tuple[tuple[str, ...], float] | None = None
    ) -> list[Command]:
        """Commands to send before ``mine`` (debts due, a restart probe, a wait in line); books them all."""
        expect = conn.expect
        extra: list[Command] = []
        if self.ledger.debts:
            for debt in self.ledger.due(now, self.node_timeout):
                extra.append(debt.command)
                paid = Entry(ledger.RELEASE, debt.key, debt.value)
                paid.proves = self.ledger.ordered(expect, debt.key, debt.value)
                expect.append(paid)
        if window > 0 and conn.restart is None and not conn.probing:
            extra.extend(PROBE)
            conn.probing = True
            expect.extend(Entry(ledger.PROBE_REPLY) for _ in PROBE)
        if block is not None:
            # TIME on each side of the BLPOP: the vote behind it runs no earlier than the second.
            wakes, seconds = block
            extra += [("TIME",), ("BLPOP", *wakes, f"{seconds:.3f}"), ("TIME",)]
            expect += [Entry(ledger.STAMP), Entry(ledger.WAKE), Entry(ledger.STAMP)]
            conn.quiet_until = max(conn.quiet_until, now + quiet_for(block))
        if mine.kind == ledger.SET:
            self.ledger.set_sent(mine.key, mine.value)  # type: ignore[arg-type]
        elif mine.kind == ledger.RELEASE:
            mine.proves = self.ledger.ordered(expect, mine.key, mine.value)
        expect.append(mine)
        return extra

    def read(self, conn: Any, reply: Any, now: float) -> tuple[Entry, Command | None]:
        """Match a reply to the oldest entry on ``conn`` and book it.

        Returns the entry and, when the reply was NOSCRIPT for a script, the
        command to send now instead (its source; already booked as the new
        entry, which is then returned). Raises :class:`ValueError` for a reply
        nobody asked for.
        """
        if not conn.expect:
            raise ValueError("a reply nobody asked for")
        entry: Entry = conn.expect.popleft()
        kind = entry.kind
        restart, last = conn.restart, self.history.last
        if restart is not None and last is not None and restart.run_id == last.run_id:
            self.history.heard = now  # that server still answers (see ledger.moved)
        if kind == ledger.RELEASE:
            self.ledger.settle(entry, reply, now)
        elif kind == ledger.SET:
            self.ledger.set_answered(entry.key, entry.value)  # type: ignore[arg-type]
            # Only its own write's two stamps come since the last vote on this connection (a vote
            # sent again after NOSCRIPT has none: it counts no wait).
            conn.waited, conn.stamps = node_wait(conn.stamps), []
        elif kind == ledger.STAMP:
            conn.stamps.append(reply)
        elif kind == ledger.PROBE_REPLY:
            self._learn(conn, reply, now)
        elif kind == ledger.PART:
            conn.parts.append(reply)
        elif kind == ledger.WAKE:
            conn.quiet_until = 0.0  # woken (or the wait ran out): the vote behind it is due now
        if entry.retry is not None and type(reply).__name__ == "NoScriptError":
            conn.scripts.clear()  # the server forgot its scripts (SCRIPT FLUSH): sources go out again
            if entry.waiter is None and kind not in ledger.LATE_WORTH_RUNNING:
                return entry, None
            # Send the script's source, once, in the same order (also when nobody waits any more).
            again = ledger.after_noscript(entry)
            conn.expect.append(again)
            if entry.waiter is not None:
                entry.waiter.replaced(entry, again, now)
            return again, entry.retry
        return entry, None

    def _learn(self, conn: Any, reply: Any, now: float) -> None:
        conn.probe_replies.append(reply)
        if len(conn.probe_replies) < len(PROBE):
            return
        restart = ledger.learn(conn.probe_replies, now)
        conn.probe_replies = []
        conn.probing = False
        if restart is None:
            return  # a passing error (BUSY, LOADING): still unknown; the next vote probes again
        conn.restart = restart
        self.history.learned(restart)
        if restart.uptime is None and not self.fsync_always and not self.denied_warned:
            self.denied_warned = True
            logger.warning("Node %s: %s.", self.name, ledger.DENIED)
        if not restart.replication and restart.run_id and not self.replication_warned:
            self.replication_warned = True
            logger.warning("Node %s: %s.", self.name, ledger.NO_REPLICATION)
        if self.fsync_always and restart.reports_fsync is False and not self.fsync_warned:
            self.fsync_warned = True
            logger.warning("Node %s: %s.", self.name, ledger.NOT_FSYNCING)

    def vote(self, conn: Any, window: float, now: float) -> Failure | None:
        """A failure for a vote that must not count under the delayed-restart rule, else None."""
        if window <= 0:
            return None
        reason = ledger.vote_refusal(conn.restart, window, now, self.history.moved_at, self.fsync_always)
        if reason is None:
            return None
        restart = conn.restart
        if restart is not None and restart.run_id and self.announced != restart.run_id + restart.replid:
            self.announced = restart.run_id + restart.replid  # one log line per restart or failover, not per vote
            logger.warning("Node %s %s.", self.name, reason)
        return Failure(reason)


Done = Callable[[list[Any]], bool]


class Round:
    """One fan-out: a command per node, all written before any reply is awaited.

    ``done(results)`` says when the outcome is certain (results still pending
    are None); then the replies already there are read and the rest is left to
    the books. With ``restart_window``, replies are votes and the
    delayed-restart rule applies. With ``owe=(key, value, ttl)``, every node
    owes the release of that value first (see :class:`~django_redlock.core.ledger.Ledger`).
    """

    def __init__(
        self,
        books: Sequence[NodeBooks],
        commands: Sequence[Command | None],
        *,
        now: float,
        timeout: float,
        done: Done | None = None,
        script: Script | None = None,
        ordered_after_key: str | None = None,
        allow_lagging: bool = True,
        restart_window: float = 0.0,
        timings: list[float | None] | None = None,
        owe: tuple[str, str, float] | None = None,
        block: tuple[tuple[str, ...], float] | None = None,
    ) -> None:
        self.books = books
        self.commands = commands
        self.sent_at = now
        if block is not None:
            timeout += quiet_for(block)  # each node's vote comes after its wait in line
        self.done = done
        self.script = script
        first = next((c for c in commands if c is not None), None)
        if script is RELEASE:
            self.kind = ledger.RELEASE
        elif script is EXTEND:
            self.kind = ledger.EXTEND
        elif script is ACQUIRE or (first is not None and first[0] == "SET"):
            self.kind = ledger.SET  # a vote
        else:
            self.kind = ledger.OTHER
        self.block = block
        self.ordered_after_key = ordered_after_key
        self.allow_lagging = allow_lagging
        self.window = restart_window
        self.timings = timings
        self.results: list[Any] = [None] * len(books)
        self.waiting: dict[Entry, tuple[int, Any]] = {}  # our entry -> (node index, connection)
        self._mine: list[Entry | None] = [None] * len(books)  # node index -> the entry write() booked
        self.timeout = timeout
        self.deadline = now + timeout
        self.grace = False
        self.looked = False  # the last look at what arrived, once the time is up
        self.changed = True  # results moved since ``done`` was last asked
        self._sources: dict[Command, Command] = {}  # EVALSHA -> the EVAL of its source, per command
        #: Called (by the books) whenever one of our replies was taken; drivers may set it.
        self.on_reply: Callable[[], None] | None = None
        if owe is not None:
            key, value, ttl = owe
            debts: dict[int, Command] = {}  # the same command usually goes to every node
            for book, command in zip(books, commands):
                if command is not None:
                    debt = debts.get(id(command))
                    if debt is None:
                        debt = debts[id(command)] = ledger.debt_command(command, RELEASE.source)
                    book.owe(key, value, ttl, now, debt)

    def choose(self, i: int, now: float) -> tuple[str, Any, float | None] | None:
        """Where node ``i``'s command goes; None when the node already has its result."""
        if self.commands[i] is None:
            self.results[i] = Failure("skipped")
            return None
        after = None
        if self.ordered_after_key is not None and self.kind == ledger.RELEASE:
            after = pair_of(self.commands[i])  # type: ignore[arg-type]
        try:
            return self.books[i].choose(after, self.allow_lagging, now)
        except NodeUnavailable as exc:
            self.results[i] = Failure(str(exc))
            return None

    def connect_failed(self, i: int, reason: str, now: float) -> None:
        self.books[i].connect_failed(reason, now)
        self.results[i] = Failure(reason)

    def write(self, i: int, conn: Any, now: float) -> list[Command]:
        """The commands to send on ``conn`` for node ``i``, in order (all booked)."""
        command = self.commands[i]
        assert command is not None
        if isinstance(command[0], tuple):
            return self._write_several(i, conn, command, now)
        script = self.script
        retry = None
        if script is not None and command[0] == "EVALSHA":
            retry = self._sources.get(command)
            if retry is None:
                retry = self._sources[command] = ("EVAL", script.source, *command[2:])
            if script.sha not in conn.scripts:
                # A round may end at a quorum, and a NOSCRIPT read after that is answered with the
                # source only where that is worth it (see NodeBooks.read): on a connection that
                # never sent this script (a node that restarted has forgotten it), send the source.
                command, retry = retry, None
                conn.scripts.add(script.sha)
        mine = entry_for(command, self.kind, self, retry)
        extra = self.books[i].prepare(conn, mine, self.window, now, self.block)
        self.waiting[mine] = (i, conn)
        self._mine[i] = mine
        if extra:
            extra.append(command)
            return extra
        return [command]

    def _write_several(self, i: int, conn: Any, commands: Command, now: float) -> list[Command]:
        """Several commands (e.g. ``ledger.PROBE``) for node ``i`` in one write: its result is the list
        of their replies, error replies included."""
        extra = self.books[i].prepare(conn, Entry(ledger.PART), self.window, now, self.block)
        conn.expect.extend(Entry(ledger.PART) for _ in commands[2:])
        mine = Entry(ledger.OTHER, waiter=self)
        conn.expect.append(mine)
        self.waiting[mine] = (i, conn)
        self._mine[i] = mine
        return [*extra, *commands]

    def written(self, i: int, conn: Any, parked_since: float | None, now: float, error: str | None = None) -> bool:
        """After the write; returns True when the driver should wait for this node's reply.

        Only a failed write (``error``) or a write behind a parked connection's
        commands (``parked_since``) touches the books: the caller holds the
        node's lock for those, and may skip it otherwise.
        """
        mine = self._mine[i]
        self._mine[i] = None  # no cycle round -> entry -> round left behind
        assert mine is not None and mine in self.waiting
        if error is not None:
            del self.waiting[mine]
            self.books[i].drop(conn, now)
            self.results[i] = Failure(error)
            return False
        if parked_since is not None and self._queued(i, conn, parked_since, now):
            # Ordered behind a command that is overdue, or behind a wait in line: queue it, do not wait for it.
            del self.waiting[mine]
            mine.waiter = None
            self.books[i].checkin(conn, parked_since, now)
            self.results[i] = Failure("queued behind an unanswered command")
            return False
        return True

    def _queued(self, i: int, conn: Any, parked_since: float, now: float) -> bool:
        """True when a command behind ``conn``'s unanswered ones is not waited for (they are overdue,
        or a wait in line holds them back)."""
        return self.sent_at - parked_since > self.books[i].node_timeout or conn.quiet_until > now

    def start(self, now: float) -> None:
        """All writes are out: each node gets ``timeout`` from now."""
        self.deadline = now + self.timeout

    def replaced(self, old: Entry, new: Entry, now: float) -> None:
        """Our script went again as EVAL after NOSCRIPT: wait for that reply instead, a node timeout
        from now (each node gets the timeout from its command's write)."""
        where = self.waiting.pop(old, None)
        if where is not None:
            self.waiting[new] = where
            self.deadline = max(self.deadline, now + self.timeout)

    def take(self, entry: Entry, reply: Any, now: float) -> int | None:
        """Judge our reply for one node; returns that node's index (None if not ours any more)."""
        where = self.waiting.pop(entry, None)
        if where is None:
            return None
        i, conn = where
        book = self.books[i]
        command = self.commands[i]
        several = len(command) - 1 if command and isinstance(command[0], tuple) else 0  # see _write_several
        if isinstance(reply, Failure):
            self.results[i] = reply
        elif isinstance(reply, Exception) and not several:
            self.results[i] = Failure(describe_error(reply), answered=True)
        else:
            if self.timings is not None:
                self.timings[i] = now - self.sent_at
            if self.block is not None and reply == b"OK" and conn.waited > 0:
                # A node cannot have waited longer than we saw pass since the write: a step of its
                # clock during the wait (NTP, a resumed VM) is not counted as waiting.
                reply = Granted(reply, min(conn.waited, now - self.sent_at))
            if several:  # the earlier replies came first (a round that ended early may have left some)
                reply, conn.parts = [*conn.parts[-several:], reply], []
            self.results[i] = (self.window > 0 and book.vote(conn, self.window, now)) or reply
        self.changed = True
        if self.on_reply is not None:
            self.on_reply()
        return i

    def broken(self, i: int, conn: Any, reason: str, now: float) -> None:
        """Node ``i``'s connection failed while we waited: the books drop it."""
        for entry, (j, _) in list(self.waiting.items()):
            if j == i:
                del self.waiting[entry]
        self.results[i] = Failure(reason)
        self.changed = True
        self.books[i].drop(conn, now)

    def wait_time(self, now: float) -> float | None:
        """How long to wait for more replies: None to stop, 0.0 to read only what is already there."""
        if not self.waiting:
            return None
        if self.grace:
            return None
        if self.changed and self.done is not None:
            self.changed = False
            if self.done(self.results):
                self.grace = True  # outcome known: read what has already arrived, then stop
                return 0.0
        remaining = self.deadline - now
        if remaining > 0:
            return remaining
        if not self.looked:
            # The time ran out while this process did not run (a long garbage collection, a busy
            # host): replies that came meanwhile came in time. Read them before judging any missing.
            self.looked = True
            return 0.0
        return None

    def finish(self, now: float) -> list[tuple[int, Any]]:
        """Stop waiting. Returns the (node index, connection) pairs whose reply is still due."""
        if not self.waiting:
            return []
        late = now - self.sent_at >= min((b.node_timeout for b in self.books), default=0.0)
        left = []
        for entry, (i, conn) in self.waiting.items():
            entry.waiter = None  # read and booked later, when the connection is next used
            if self.grace and not late:
                self.results[i] = Failure("not awaited: the outcome was already known", answered=True)
            else:
                self.results[i] = Failure(f"no reply within {ms_text(self.timeout)}")  # this round's own wait
            left.append((i, conn))
        self.waiting = {}
        return left


def describe_error(exc: BaseException) -> str:
    return "error reply: " + str(exc).split("\n")[0][:120]
