"""One node's books: its connections, what is due on each, and how each reply is booked. No I/O.

:class:`NodeBooks` decides which connection a command goes on (an idle one, a
parked one that still carries a command for the same key, or a new one), what
rides along with it (release debts, the restart probe, a wait in line), how
each reply is booked (:meth:`NodeBooks.book`, the one place for it: every
driver hands it each reply it reads), and where a connection is filed
afterwards: idle (nothing due), parked (replies still due) or dropped (given
up: broken, or overdue beyond the stale limit). Drivers never file a
connection themselves.

Nothing here reads a clock, touches a socket, sleeps or starts a thread;
callers that share books between threads hold a lock around these calls.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Generic, Literal, TypeVar

from django_redlock.core import entries, ledger
from django_redlock.core.entries import MARK, Entry, Ledger, Waiter
from django_redlock.core.ledger import PROBE, Restart
from django_redlock.core.scripts import DATASET, EXTEND

__all__ = [
    "COOL_OFF",
    "IDLE",
    "IDLE_CHECK",
    "MAX_PENDING",
    "NEW",
    "PARKED",
    "Choice",
    "ConnState",
    "Failure",
    "NodeBooks",
    "NodeUnavailable",
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

#: What :meth:`NodeBooks.choose` hands out: an idle connection, a parked one, or none (connect a new one).
Choice = Literal["idle", "parked", "new"]
IDLE: Final = "idle"
PARKED: Final = "parked"
NEW: Final = "new"


@dataclass(frozen=True)
class Failure:
    """Why a node did not give a usable reply (never contains credentials)."""

    reason: str
    answered: bool = False  # the node answered (e.g. with an error), it is not down
    broken: bool = False  # the connection broke under the command (closed, reset): a new one may do

    def __str__(self) -> str:
        return self.reason


class NodeUnavailable(Exception):
    pass


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

    __slots__ = (
        "expect", "restart", "probe_replies", "probing", "quiet_until", "scripts", "stamps", "waited", "parts", "demoted"
    )

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
        #: Its server answered READONLY: a replica now (a Sentinel node connects to the master anew).
        self.demoted = False


C = TypeVar("C", bound=ConnState)


def plain_extension(command: Command) -> Command | None:
    """An EXTEND's ``EVAL`` that may set a lost key again (booked as a vote) as one that may not, to
    send late (nobody waits for it; a release of its value may already have run): None for any other
    command."""
    if command[0] != "EVAL" or command[1] != EXTEND.source or command[-3] != "1":
        return None
    return _setting_nothing(command)


def _setting_nothing(command: Command) -> Command:
    """An EXTEND call with its ARGV[3] cleared: it extends keys that hold the value, sets none again."""
    return (*command[:-3], "", *command[-2:])


def quiet_for(block: tuple[tuple[str, ...], float]) -> float:
    """How long a wait in line (``BLPOP wake seconds``) may hold the replies behind it back."""
    return block[1] + SERVER_TICK


def overdue(conn: ConnState, since: float, now: float) -> float:
    """How long ``conn``'s replies have been overdue (not counting a wait in line)."""
    return now - max(since, conn.quiet_until)


class NodeBooks(Generic[C]):
    """One node's connections, restart knowledge and release debts.

    A connection is either handed out (by :meth:`choose`, to the driver that
    writes on it), idle (nothing due), parked (replies still due) or dropped.
    With ``background_reads`` (asyncio, the simulator), every reply is read
    and booked the moment it arrives, whoever waits for it: a connection
    written on stays parked until nothing is due on it. Without (the sync
    driver, whose caller reads its own socket), the round's connection stays
    handed out until its reply is taken, then comes back.
    """

    def __init__(
        self,
        name: str,
        node_timeout: float,
        fsync_always: bool = False,
        history: ledger.History | None = None,
        background_reads: bool = False,
    ) -> None:
        self.name = name
        self.background_reads = background_reads
        self.node_timeout = node_timeout
        self.stale_limit = max(STALE_LIMIT_MIN, 20 * node_timeout)
        #: Declared to fsync every write: votes at once after a restart (still probed: a failover is not a restart).
        self.fsync_always = fsync_always
        #: What the probes learned of the server at this address (shared by a node's books in every event loop).
        self.history = history if history is not None else ledger.History()
        self.reset()

    def reset(self) -> None:
        self.ledger = Ledger(self.node_timeout)
        self.idle: list[tuple[C, float]] = []  # (connection, idle since), most recent last
        self.parked: dict[C, float] = {}  # connection -> last progress (a reply read, or the write)
        self.down_until = 0.0
        self.down_reason = ""
        self.announced = ""  # run id (and replication id) of the restart or failover last logged
        self.denied_warned = False
        self.replication_warned = False
        self.fsync_warned = False
        #: The marker key of the data-set check and the token this node's data set was last seen
        #: with (None: not yet); see :meth:`guarded`.
        self.dataset_key: str | None = None
        self.dataset: str | None = None
        self.dataset_run = ""  # the run id of the server the token was read from ("": unknown)

    # -- choosing a connection ----------------------------------------------------

    def lagging(self, now: float) -> bool:
        """True while a reply from this node is overdue by more than the node timeout."""
        limit = self.node_timeout
        for conn, since in self.parked.items():  # a loop: a generator's every step is a Python call
            # overdue() is at most now - since: replies in flight for less than the limit need no call.
            if conn.expect and now - since > limit and overdue(conn, since, now) > limit:
                return True
        return False

    def choose(
        self, after: tuple[str, str] | None, allow_lagging: bool, now: float
    ) -> tuple[Choice, C | None, float | None]:
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

    # -- filing connections ----------------------------------------------------------

    def checkin(self, conn: C, since: float, now: float) -> None:
        """Take a connection back: idle when nothing is pending on it, else parked (``since``: its
        last progress); one with too many unread replies is dropped."""
        if len(conn.expect) > MAX_PENDING:
            self.drop(conn, now)
        elif conn.expect:
            self.parked[conn] = since
        else:
            self.idle.append((conn, now))

    def give_up_stale(self, now: float) -> list[C]:
        """Drop the parked connections whose replies are overdue beyond the stale limit; returns
        them (for the driver to close)."""
        return [conn for conn in list(self.parked) if self.give_up_if_stale(conn, now)]

    def give_up_if_stale(self, conn: C, now: float) -> bool:
        """Drop ``conn`` if it is parked with replies overdue beyond the stale limit (True: close it)."""
        since = self.parked.get(conn)
        if since is None or not (conn.expect and overdue(conn, since, now) > self.stale_limit):
            return False
        self.broken(conn, f"no reply for over {self.stale_limit:.1f} s", now, broke=False)
        return True

    def take_parked(self) -> list[C]:
        """Hand out every parked connection (to read what is due on it before closing it)."""
        parked = list(self.parked)
        self.parked.clear()
        return parked

    def close_all(self, now: float) -> list[C]:
        """Drop every idle and parked connection; returns them (for the driver to close)."""
        conns = [conn for conn, _ in self.idle] + list(self.parked)
        for conn in conns:
            self.drop(conn, now)
        self.idle.clear()
        return conns

    def broken(self, conn: C, reason: str, now: float, broke: bool = True) -> None:
        """``conn`` failed (``broke``) or is given up: whoever waits on it gets ``reason``; the books drop it."""
        failure = Failure(reason, broken=broke)
        for entry in list(conn.expect):
            if entry.waiter is not None:
                entry.waiter.take(entry, failure, now)
        self.drop(conn, now)

    def drop(self, conn: C, now: float) -> None:
        """Forget a connection; what was unanswered on it may still reach the node."""
        self.parked.pop(conn, None)
        if self.idle:
            self.idle = [(c, t) for c, t in self.idle if c is not conn]
        entries = list(conn.expect)
        if entries:
            self.ledger.dropped(entries, now + max(e.ttl for e in entries) + self.stale_limit)
            conn.expect.clear()

    # -- writing and reading -------------------------------------------------------

    def prepare(
        self, conn: C, mine: Entry, window: float, now: float, block: tuple[tuple[str, ...], float] | None = None
    ) -> list[Command]:
        """Commands to send before ``mine`` (debts due, a restart probe, a wait in line); books them all."""
        expect = conn.expect
        extra: list[Command] = []
        ledger = self.ledger
        if ledger.debts and now >= ledger.next_due:  # none can be due before next_due: no call
            for debt in ledger.due(now, self.node_timeout):
                extra.append(debt.command)
                paid = Entry(entries.RELEASE, debt.key, debt.value)
                paid.proves = ledger.ordered(expect, debt.key, debt.value)
                expect.append(paid)
        if window > 0 and conn.restart is None and not conn.probing:
            extra.extend(PROBE)
            conn.probing = True
            expect.extend(Entry(entries.PROBE_REPLY) for _ in PROBE)
            if self.dataset_key is not None and mine.value is not None:
                seed = f"{mine.value}@{self.name}"  # one vote probes every node: the name tells them apart
                extra.append(("EVAL", DATASET.source, 1, self.dataset_key, seed))
                expect.append(Entry(MARK))
        if block is not None:
            # TIME on each side of the BLPOP: the vote behind it runs no earlier than the second.
            wakes, seconds = block
            extra += [("TIME",), ("BLPOP", *wakes, f"{seconds:.3f}"), ("TIME",)]
            expect += [Entry(entries.STAMP), Entry(entries.WAKE), Entry(entries.STAMP)]
            conn.quiet_until = max(conn.quiet_until, now + quiet_for(block))
        if mine.kind == entries.SET:  # Ledger.set_sent, inline: once per vote and node
            sets = ledger.unanswered
            pair: Any = (mine.key, mine.value)  # a SET's entry has both
            sets[pair] = sets.get(pair, 0) + 1
        elif mine.kind == entries.RELEASE:  # with no SET in flight at all, it is ordered (no call)
            mine.proves = not ledger.unanswered or ledger.ordered(expect, mine.key, mine.value)
        expect.append(mine)
        return extra

    def book(self, conn: C, reply: Any, now: float, reader: Waiter | None = None) -> tuple[bool, Command | None]:
        """Book a reply read on ``conn`` at ``now`` (the time it was read: a probe's uptime is at
        least that old then, never an earlier time): match it to the oldest entry on ``conn``,
        settle, learn and note what it says, file the connection and hand the reply to whoever
        waits for it.

        Returns whether it was ``reader``'s own reply, taken (the connection ``reader`` had
        handed out then comes back), and the command to send now when the reply was NOSCRIPT
        for a script (its source, already booked; nobody is handed that reply). Raises
        :class:`ValueError` for a reply nobody asked for.
        """
        if not conn.expect:
            raise ValueError("a reply nobody asked for")
        entry: Entry = conn.expect.popleft()
        kind = entry.kind
        restart, last = conn.restart, self.history.last
        if restart is not None and last is not None and restart.run_id == last.run_id:
            self.history.heard = now  # that server still answers (see ledger.moved)
        if kind == entries.RELEASE:
            reply = self.ledger.settle(entry, reply, now)  # as the round counts it (a 0 may count as a 1)
        elif kind == entries.SET:
            sets = self.ledger.unanswered  # Ledger.set_answered, inline: once per vote and node
            pair: Any = (entry.key, entry.value)  # a SET's entry has both
            left = sets.get(pair, 0) - 1
            if left > 0:
                sets[pair] = left
            else:
                sets.pop(pair, None)
            # Only its own write's two stamps come since the last vote on this connection (a vote
            # sent again after NOSCRIPT has none: it counts no wait).
            if conn.stamps:
                conn.waited, conn.stamps = node_wait(conn.stamps), []
            else:
                conn.waited = 0.0
        elif kind == entries.STAMP:
            conn.stamps.append(reply)
        elif kind == entries.PROBE_REPLY:
            self._learn(conn, reply, now)
        elif kind == MARK:
            self._learn_dataset(conn, ledger.token_of(reply), now)
        elif kind == entries.PART:
            conn.parts.append(reply)
        elif kind == entries.WAKE:
            conn.quiet_until = 0.0  # woken (or the wait ran out): the vote behind it is due now
        if isinstance(reply, Exception) and kind in (entries.SET, entries.OTHER):
            self._refused(conn, reply, now)
        waiter = entry.waiter
        resend = None
        if entry.retry is not None and type(reply).__name__ == "NoScriptError":
            conn.scripts.clear()  # the server forgot its scripts (SCRIPT FLUSH): sources go out again
            if waiter is None and kind not in entries.LATE_WORTH_RUNNING:
                resend = plain_extension(entry.retry)
                if resend is not None:
                    conn.expect.append(Entry(entries.EXTEND, entry.key, entry.value))  # a vote is never sent late
            else:
                # Send the script's source, once, in the same order (also when nobody waits any more).
                again = entries.after_noscript(entry)
                conn.expect.append(again)
                if kind == entries.SET:  # the vote is in flight again: a release elsewhere may run before it
                    self.ledger.set_sent(entry.key, entry.value)  # type: ignore[arg-type]
                if waiter is not None:
                    waiter.replaced(entry, again, now)
                    waiter = None  # it waits for the source's reply instead
                resend = entry.retry
        taken = waiter is not None and waiter is reader
        # Filed first: a round that ends on this reply may start the next one at once.
        parked = self.parked
        if conn in parked:
            if conn.expect:
                parked[conn] = now  # progress
            else:
                del parked[conn]
                self.idle.append((conn, now))
        elif taken:
            if conn.expect:
                self.checkin(conn, now, now)
            else:
                self.idle.append((conn, now))  # the usual case: nothing more due on it
        if waiter is not None:
            waiter.take(entry, reply, now)
        return taken, resend

    def _learn(self, conn: C, reply: Any, now: float) -> None:
        conn.probe_replies.append(reply)
        if len(conn.probe_replies) < len(PROBE):
            return
        replies, conn.probe_replies = conn.probe_replies, []
        restart = ledger.learn(replies, now)
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
        if any(ledger.denied(r) for r in replies[2:4] if isinstance(r, Exception)) and self.history.tell_config_refused():
            logger.info("Node %s: %s.", self.name, ledger.CONFIG_REFUSED)
        if self.fsync_always and restart.reports_fsync is False and not self.fsync_warned:
            self.fsync_warned = True
            logger.warning("Node %s: %s.", self.name, ledger.NOT_FSYNCING)

    # -- the data set a vote counts on ---------------------------------------------------

    def guarded(self, command: Command) -> Command:
        """A command of a ``scripts.GUARDED`` script (its last ARGV the data-set token, ``""``) with
        the token this node's data set was last seen with: it counts only on that data set (see
        ``scripts._GUARD``). Notes the marker key, for the probes of new connections."""
        self.dataset_key = command[-2]
        return command if self.dataset is None else (*command[:-1], self.dataset)

    def _refused(self, conn: C, reply: Exception, now: float) -> None:
        """A vote (or a fencing read or write) answered with an error: another data set (learn it),
        or a replica's READONLY (the node changed role: probe this connection again before its
        next vote counts)."""
        token = ledger.replaced_token(reply)
        if token is not None:
            self._learn_dataset(conn, token, now)
        elif str(reply).startswith("READONLY"):
            conn.restart = None
            conn.demoted = True

    def _learn_dataset(self, conn: C, token: str | None, now: float) -> None:
        """Note the token a probe or a refused vote read on ``conn``; another one than before, from the
        same server (a restart is judged by the restart rule), means the data set was replaced under
        this node's address: it sits out as after a failover."""
        if token is None:
            return
        run = conn.restart.run_id if conn.restart is not None else ""
        restarted = bool(run and self.dataset_run and run != self.dataset_run)
        if self.dataset is not None and token != self.dataset and not restarted:
            self.history.replaced(now)
            logger.warning("Node %s: %s.", self.name, ledger.REPLACED_DATASET)
        self.dataset, self.dataset_run = token, run or self.dataset_run

    def refusal(self, conn: C, window: float, now: float) -> str | None:
        """Why a vote on ``conn`` would not count now under the delayed-restart rule, or None."""
        if window <= 0:
            return None
        return ledger.vote_refusal(conn.restart, window, now, self.history.moved_at, self.fsync_always)

    def recreating(self, conn: C, command: Command, window: float, now: float) -> Command:
        """An EXTEND ``command`` as ``conn`` may carry it: a re-created key is a fresh vote for the same
        value, so it may re-create a key this node lost only where a vote written now would count
        (the node's restart state known, and no window to sit out); elsewhere its ARGV[3] is cleared.
        Its data set is checked by the script, as a vote's (see :meth:`guarded`)."""
        if command[-3] != "1" or self.refusal(conn, window, now) is None:
            return command
        return _setting_nothing(command)

    def vote(self, conn: C, window: float, now: float) -> Failure | None:
        """A failure for a vote that must not count under the delayed-restart rule, else None."""
        reason = self.refusal(conn, window, now)
        if reason is None:
            return None
        restart = conn.restart
        if restart is not None and restart.run_id and self.announced != restart.run_id + restart.replid:
            self.announced = restart.run_id + restart.replid  # one log line per restart or failover, not per vote
            logger.warning("Node %s %s.", self.name, reason)
        return Failure(reason)
