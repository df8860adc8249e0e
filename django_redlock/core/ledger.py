"""What the engine must remember about each node and connection, without doing I/O.

No sockets, no clock reads, no threads here: callers pass the time in and
hold the node's mutex. The sync and asyncio drivers both keep their books
with these classes, so the rules are written once:

- **Replies in order.** Every command written to a connection leaves an
  :class:`Entry` on that connection's queue; each reply read is matched to the
  oldest entry. A reply nobody waits for any more (the fan-out had already
  decided) is still read and booked: a late probe is learned, a late release
  settles its debt.
- **Restart state per connection.** A connection votes only once the probe
  sent on it (INFO server and replication, persistence) has been read: a node
  whose restart state is unknown does not vote (fail closed). What the probes
  of one node's connections learned is compared (:class:`History`): another
  server behind the same address (a promoted replica) sits out as a
  restarted one does. See :func:`vote_refusal`.
- **Release debts.** Before a value is released on the nodes, each node owes
  a release of it; a reply that proves the key gone settles the debt. Debts not
  settled (node down, reply lost, connection dropped) are paid again with the
  next command written to that node, until the key's ttl has surely passed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Protocol

from django_redlock.core import forks

__all__ = [
    "MINE",
    "PROBE",
    "Debt",
    "Entry",
    "History",
    "Kind",
    "Ledger",
    "Restart",
    "config_value",
    "denied",
    "history_for",
    "learn",
    "moved",
    "parse_info",
    "probe_info",
    "sure_uptime",
    "vote_refusal",
    "Waiter",
]

#: Sent ahead of the first vote on a new connection (one round trip): is this node freshly restarted,
#: or another server than before? The persistence it reports now only feeds warnings.
PROBE: tuple[tuple[Any, ...], ...] = (
    ("INFO", "server"),
    ("INFO", "replication"),  # a separate INFO: Redis before 7.0 takes one section per call
    ("CONFIG", "GET", "appendonly"),
    ("CONFIG", "GET", "appendfsync"),
)


class Kind(IntEnum):
    """What a reply on a connection answers (an :class:`Entry`'s kind)."""

    OTHER = 0
    SET = 1  # SET key value NX PX: a vote
    RELEASE = 2  # the compare-and-delete script
    PROBE_REPLY = 3
    WAKE = 4  # BLPOP on a waiter's wake list, sent right before its vote
    EXTEND = 5  # the extension script
    STAMP = 6  # TIME on each side of a wait in line: how long the vote behind them waited, on the node's clock
    PART = 7  # a reply of several commands sent as one (see Round.write) before the last: kept for the round


OTHER, SET, RELEASE, PROBE_REPLY = Kind.OTHER, Kind.SET, Kind.RELEASE, Kind.PROBE_REPLY
WAKE, EXTEND, STAMP, PART = Kind.WAKE, Kind.EXTEND, Kind.STAMP, Kind.PART

#: Kinds worth running after their round has ended: a late release or extension only acts while
#: its value still holds the key (a late vote could leave a key nobody holds).
LATE_WORTH_RUNNING = (RELEASE, EXTEND)

#: Marks the entry whose reply the current caller waits for.
MINE = object()

#: How many debts ride along with one command, at most.
DEBTS_PER_WRITE = 32

#: How many release debts one node's books keep, at most (about 1 KB each). Past it the oldest is
#: dropped: a debt only frees a key before its ttl would, so a key whose debt is dropped still expires
#: by itself, at the latest ``MAX_TTL`` after it was written.
MAX_DEBTS = 4096


class Waiter(Protocol):
    """Who waits for an entry's reply (a round): the books hand it the reply when it is read."""

    def take(self, entry: Entry, reply: Any, now: float) -> object: ...

    def replaced(self, old: Entry, new: Entry, now: float) -> None: ...


class Entry:
    """One command written to a connection whose reply has not been read yet."""

    __slots__ = ("kind", "key", "value", "ttl", "waiter", "retry", "proves")

    def __init__(
        self,
        kind: Kind,
        key: str | None = None,
        value: str | None = None,
        ttl: float = 0.0,
        waiter: Waiter | None = None,
        retry: tuple[Any, ...] | None = None,
    ) -> None:
        self.kind = kind
        self.key = key
        self.value = value
        #: For a SET: how long its key lives once it lands (seconds).
        self.ttl = ttl
        #: What to send instead if the reply is NOSCRIPT (the script's source), sent once.
        self.retry = retry
        #: Who waits for the reply (the driver's business), or None once nobody does.
        self.waiter = waiter
        #: For a RELEASE: a reply of 0 proves the key gone (see :meth:`Ledger.ordered`).
        self.proves = True

    def __repr__(self) -> str:
        return f"<Entry {self.kind.name} {self.key!r}>"


def pair_of(command: Sequence[Any]) -> tuple[str, str]:
    """(lock key, holder value) of an ACQUIRE or RELEASE script call: KEYS[1] and ARGV[1]."""
    return command[3], command[3 + command[2]]


def entry_for(command: Sequence[Any], kind: Kind, waiter: Waiter | None, retry: tuple[Any, ...] | None = None) -> Entry:
    """The entry for a fan-out's own command: votes (SET) and releases are booked, the rest not."""
    if kind == SET and command[0] == "SET":  # SET key value NX PX ttl
        return Entry(SET, command[1], command[2], command[5] / 1000.0, waiter)
    if kind == SET:  # ACQUIRE: KEYS in threes (lock, queue, places); ARGV value, ttl ms, ...
        key, value = pair_of(command)
        return Entry(SET, key, value, command[4 + command[2]] / 1000.0, waiter, retry)
    if kind == RELEASE:
        key, value = pair_of(command)
        return Entry(RELEASE, key, value, waiter=waiter, retry=retry)
    return Entry(kind, waiter=waiter, retry=retry)


def debt_command(command: Sequence[Any], source: str) -> tuple[Any, ...]:
    """How a RELEASE (``command``, an EVALSHA) is paid again later: as an EVAL of its ``source``,
    deleting the value and waking the line, but never putting a place back (the call that kept it
    may be over by then; a place that is not restored only costs its call a rejoin)."""
    keys = command[2]
    args = list(command[2:])
    if args[1 + keys + 3] != "":  # ARGV[4], the ticket: a kept place
        args[1 + keys + 1] = ""  # ARGV[2], the place
        args[1 + keys + 3] = ""
    return ("EVAL", source, *args)


def after_noscript(entry: Entry) -> Entry:
    """The entry for the EVAL (``entry.retry``) sent after a NOSCRIPT reply."""
    again = Entry(entry.kind, entry.key, entry.value, entry.ttl, entry.waiter)
    again.proves = entry.proves
    return again


# -- restart state ------------------------------------------------------------------


def parse_info(reply: Any) -> dict[str, str]:
    text = reply.decode("utf-8", "replace") if isinstance(reply, bytes) else str(reply)
    info: dict[str, str] = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and ":" in line:
            name, _, value = line.partition(":")
            info[name.strip()] = value.strip()
    return info


#: INFO's ``uptime_in_seconds`` is the difference of two wall-clock seconds, each truncated: a
#: server started at x.9 s says "1" at (x+1).0 s. The uptime it gives may run this far ahead.
UPTIME_STEP = 1.0


def sure_uptime(uptime: float) -> float:
    """The least time a server has surely been up when INFO says ``uptime_in_seconds`` = ``uptime``."""
    return max(0.0, uptime - UPTIME_STEP)


@dataclass(frozen=True)
class Restart:
    """What a probe learned about the server behind one connection."""

    uptime: float | None  # seconds, None when INFO was denied or unreadable
    seen: float  # monotonic time the reply was read (uptime is at least that old)
    run_id: str  # "" when unknown
    #: INFO replication: the data set's replication id, the role, and whether this master was
    #: promoted from a replica since it started (``master_replid2`` set).
    replid: str = ""
    role: str = ""
    promoted: bool = False
    #: Whether INFO replication was read (an ACL may allow ``INFO server`` only): without it a
    #: promotion cannot be seen.
    replication: bool = True
    #: What CONFIG says now (appendonly yes + appendfsync always), None when unreadable. It says
    #: nothing about what the node kept across its last restart: warnings only, never a vote.
    reports_fsync: bool | None = None

    def age(self, now: float) -> float | None:
        """How long the server has surely been up at ``now`` (None: unknown)."""
        return None if self.uptime is None else sure_uptime(self.uptime) + (now - self.seen)


def config_value(reply: Any) -> str:
    # CONFIG may be renamed or denied: unknown counts as "not durable".
    if isinstance(reply, list) and len(reply) == 2:
        value = reply[1]
        return value.decode() if isinstance(value, bytes) else str(value)
    return ""


def denied(reply: Any) -> bool:
    """INFO refused for good: no permission, or the command renamed away."""
    text = str(reply)
    return text.startswith(("NOPERM", "ERR unknown command", "unknown command"))


def probe_info(replies: Sequence[Any]) -> dict[str, str]:
    """INFO server and INFO replication of the probe's replies, in one mapping (a refused one adds nothing)."""
    info: dict[str, str] = {}
    for reply in replies[:2]:
        if not isinstance(reply, Exception):
            info.update(parse_info(reply))
    return info


def learn(replies: Sequence[Any], received: float) -> Restart | None:
    """Turn the probe's replies (errors included) into a :class:`Restart`; ``received``: when the
    last of them was read.

    None when INFO failed for a passing reason (BUSY, LOADING...): the restart
    state stays unknown and the next vote probes again.
    """
    if any(isinstance(reply, Exception) and not denied(reply) for reply in replies[:2]):
        return None
    info = probe_info(replies)
    replication = "role" in info  # INFO replication always says the role
    config = (config_value(replies[2]), config_value(replies[3]))
    try:
        uptime: float | None = float(info["uptime_in_seconds"])
    except (KeyError, ValueError):
        uptime = None
    return Restart(
        uptime,
        received,
        info.get("run_id", ""),
        replid=info.get("master_replid", ""),
        role=info.get("role", ""),
        promoted=bool(info.get("master_replid2", "").strip("0")),
        replication=replication,
        reports_fsync=None if "" in config else config == ("yes", "always"),
    )


def moved(before: Restart | None, now: Restart, heard: float | None = None) -> bool:
    """True when the data set at a node's address may have been replaced between two probes: a
    failover put another server there (a promoted replica may lack the last locks written).

    Another run id alone is a restart, which :func:`vote_refusal` judges by uptime. It is a
    failover when the server now there was promoted from a replica since it started, changed
    role, or may have been up already when the one before last answered (``heard``: when this
    process last read a reply from it, else its probe's reading). Without INFO replication on
    either side a promotion cannot be seen: another run id then counts as a failover (fail closed).
    The same server with another replication id and promoted was a replica in between (its data
    set replaced by a full sync); a master that only dropped its backlog (no replica for an hour)
    gets a new id, but none second.
    """
    if before is None or not before.run_id or not now.run_id:
        return False
    if now.run_id == before.run_id:
        return now.role != before.role or (now.replid != before.replid and now.promoted)
    if not (now.replication and before.replication):
        return True
    last_answer = before.seen if heard is None else max(before.seen, heard)
    # The earliest it may have started: INFO's whole seconds may run up to one behind.
    up_since = now.seen - (now.uptime + UPTIME_STEP) if now.uptime is not None else -math.inf
    return now.promoted or now.role != before.role or up_since < last_answer


class History:
    """What this process learned of the server at one address, over all its connections, event
    loops and managers (see :func:`history_for`): the last probe, when that server last answered,
    and when a failover was last noticed."""

    __slots__ = ("last", "heard", "moved_at", "_mutex", "__weakref__")

    def __init__(self) -> None:
        self.last: Restart | None = None
        #: Monotonic time a reply was last read on a connection probed to ``last``'s server (the
        #: books set it: see ``NodeBooks.read``), None: only its probe.
        self.heard: float | None = None
        #: Monotonic time the last failover was noticed (it happened before), None: never.
        self.moved_at: float | None = None
        self._mutex = forks.mutex(self, "_mutex")  # nodes of several managers (sync, asyncio) share it

    def learned(self, restart: Restart) -> bool:
        """Note one connection's probe; True when it shows a failover (see :func:`moved`)."""
        with self._mutex:
            failover = moved(self.last, restart, self.heard)
            if failover:
                self.moved_at = max(self.moved_at or restart.seen, restart.seen)
            if restart.run_id:
                self.last = restart
            return failover


class _Histories:
    """Every :class:`History` of this process, by server address."""

    def __init__(self) -> None:
        self.by_address: dict[str, History] = {}
        self.mutex = forks.mutex(self, "mutex")


_HISTORIES = _Histories()


def history_for(address: str) -> History:
    """The one :class:`History` of this process for the server at ``address`` (host:port or a
    socket path): every manager, sync or asyncio, compares with what any of them learned.

    A forked child keeps its parent's: what the parent read of a server is still true of it.
    """
    with _HISTORIES.mutex:
        history = _HISTORIES.by_address.get(address)
        if history is None:
            history = _HISTORIES.by_address[address] = History()
        return history


UNKNOWN = "restart state unknown: its uptime has not been read yet on this connection, so it does not vote"
NO_REPLICATION = (
    "INFO replication is denied to the lock user, so a replica promoted behind its address cannot be "
    "told from a restart: every other server seen there counts as a failover and sits out "
    "(grant +info, or at least +info|server +info|replication)"
)
DENIED = (
    "restart state unknown: INFO is denied to the lock user, so it does not vote "
    "(grant +info and +config|get, or declare the node FSYNC_ALWAYS if it fsyncs every write)"
)

NOT_FSYNCING = (
    "declared FSYNC_ALWAYS, but CONFIG says it does not run 'appendonly yes' with 'appendfsync always': "
    "after a restart it votes at once although it may have lost locks"
)


def vote_refusal(
    restart: Restart | None, window: float, now: float, moved_at: float | None = None, declared: bool = False
) -> str | None:
    """Why a connection's vote does not count under the delayed-restart rule, or None.

    A node restarted without fsync-every-write persistence may have lost keys
    of locks that are still valid; it does not vote until it has been up for
    ``window`` seconds. Only the declaration (``declared``: ``FSYNC_ALWAYS``)
    waives that: what CONFIG says now tells nothing of the last restart. A node
    whose uptime is not known does not vote either. After a failover noticed at
    ``moved_at`` (see :class:`History`) the node sits out for ``window`` from
    then, declared or not.
    """
    if restart is None:
        return UNKNOWN
    if moved_at is not None and now - moved_at < window:
        return failed_over(now - moved_at, window - (now - moved_at))
    if declared:
        return None
    age = restart.age(now)
    if age is None:
        return DENIED
    left = window - age
    if left <= 0:
        return None
    return sits_out(age, left)


#: Ends every "sits out" reason, so a failure can tell it from the others.
DELAYED_RESTART = "(delayed-restart rule)"
#: What to do about nodes that sit out: said once at the end of a failure that met them.
RESTART_ADVICE = (
    "A node restarted (or started fresh) that is not declared FSYNC_ALWAYS may have forgotten locks, so it "
    "does not vote until the restart window has passed: wait, or for development and tests set "
    "REDLOCK['RESTART_WINDOW'] = 0 (restart_window=0), or run the nodes with 'appendonly yes' and "
    "'appendfsync always' and declare them {'URL': ..., 'FSYNC_ALWAYS': True} (then they vote at once)."
)


def sits_out(age: float, left: float) -> str:
    """How a node that sits out is described everywhere (failures, ``redlock status``, the admin)."""
    return (
        f"restarted {age:.0f} s ago and not declared FSYNC_ALWAYS; sits out for "
        f"{math.ceil(left)} s more {DELAYED_RESTART}"
    )


def failed_over(since: float, left: float) -> str:
    """How a node that sits out after a failover is described everywhere."""
    return (
        f"another server answers at its address since {since:.0f} s ago (a failover: a promoted replica "
        f"may lack the last locks written); sits out for {math.ceil(left)} s more {DELAYED_RESTART}"
    )


# -- release debts -------------------------------------------------------------------


class Debt:
    __slots__ = ("key", "value", "until", "paid_at", "command")

    def __init__(self, key: str, value: str, until: float, paid_at: float, command: tuple[Any, ...]) -> None:
        self.key = key
        self.value = value
        #: The release to send (as EVAL: no NOSCRIPT to handle).
        self.command = command
        #: After this (monotonic) time the key has surely expired: forget the debt.
        self.until = until
        #: When a release for it was last written (not again while that one is in flight).
        self.paid_at = paid_at


class Ledger:
    """One node's books: release debts and the SETs still in flight. Guard with the node's mutex.

    A release's reply of 1 settles its debt. A reply of 0 settles it only when
    no SET of that value can still land on the node: none unanswered on a
    live connection, none on a connection that was dropped unanswered, and
    none unanswered on another connection when the release was written (the
    node may have run the release first: see :meth:`ordered`).
    """

    def __init__(self, retry_after: float = 0.0, max_debts: int = MAX_DEBTS) -> None:
        #: A debt just paid is not paid again for this long (its release is still in flight).
        self.retry_after = retry_after
        self.max_debts = max_debts
        #: No debt can be due before this time (saves a walk over the debts on every write).
        self.next_due = 0.0
        self.debts: dict[tuple[str, str], Debt] = {}
        # (key, value) -> SETs written and not answered yet, on live connections
        self.unanswered: dict[tuple[str, str], int] = {}
        # (key, value) -> until: SETs written on a connection dropped before they were answered
        self.lost_sets: dict[tuple[str, str], float] = {}

    def set_sent(self, key: str, value: str) -> None:
        pair = (key, value)
        self.unanswered[pair] = self.unanswered.get(pair, 0) + 1

    def set_answered(self, key: str, value: str) -> None:
        pair = (key, value)
        left = self.unanswered.get(pair, 0) - 1
        if left > 0:
            self.unanswered[pair] = left
        else:
            self.unanswered.pop(pair, None)

    def owe(self, key: str, value: str, until: float, now: float, command: tuple[Any, ...]) -> None:
        """Record that a release of ``value`` (``command``, an EVAL) is owed: it is being written now.

        Debts are kept oldest first. Those whose keys have surely expired go
        now, not only when a command is next written to the node (a node that
        stays down is never written to); past :attr:`max_debts` the oldest goes.
        """
        debts = self.debts
        debt = debts.get((key, value))
        if debt is None:
            while debts:
                oldest = next(iter(debts.values()))
                if oldest.until > now and len(debts) < self.max_debts:
                    break
                del debts[(oldest.key, oldest.value)]
            debts[(key, value)] = Debt(key, value, until, now, command)
            self.next_due = min(self.next_due, now + self.retry_after) if len(self.debts) > 1 else now + self.retry_after
        else:
            debt.until = max(debt.until, until)
            debt.paid_at = now

    def ordered(self, expect: Sequence[Entry], key: str | None, value: str | None) -> bool:
        """Whether a release of ``value`` written now behind ``expect`` (its connection's unanswered
        entries) runs after every SET of that value still unanswered: they are all ahead of it on
        that connection. One on another connection may reach the node after the release, and its
        OK be read before the release's 0: that 0 then proves nothing."""
        pending = self.unanswered.get((key, value), 0)  # type: ignore[arg-type]
        return not pending or pending == sum(e.kind == SET and e.key == key and e.value == value for e in expect)

    def settle(self, entry: Entry, reply: Any, now: float) -> None:
        """Book a release's reply: 1 deleted the key; 0 proves it gone unless a SET may still land."""
        pair = (entry.key, entry.value)
        debt = self.debts.get(pair)  # type: ignore[arg-type]
        if debt is None:
            return
        if reply == 1 or (
            reply == 0
            and entry.proves
            and pair not in self.unanswered
            and self.lost_sets.get(pair, 0.0) <= now  # type: ignore[arg-type]
        ):
            del self.debts[pair]  # type: ignore[arg-type]

    def dropped(self, entries: Sequence[Entry], until: float) -> None:
        """A connection was dropped with these entries unanswered: their bytes may still arrive."""
        for entry in entries:
            if entry.kind == SET:
                pair = (entry.key, entry.value)
                self.set_answered(entry.key, entry.value)  # type: ignore[arg-type]
                self.lost_sets[pair] = max(self.lost_sets.get(pair, 0.0), until)  # type: ignore[index,arg-type]
                debt = self.debts.get(pair)  # type: ignore[arg-type]
                if debt is not None:
                    debt.until = max(debt.until, until)

    def due(self, now: float, retry_after: float) -> list[Debt]:
        """Debts to pay with the next write to this node (marked as paid now)."""
        if now < self.next_due:
            return []
        if self.lost_sets:
            for pair, until in list(self.lost_sets.items()):
                if until <= now:
                    del self.lost_sets[pair]
        out: list[Debt] = []
        for pair, debt in list(self.debts.items()):
            if debt.until <= now:
                del self.debts[pair]
            elif now - debt.paid_at >= retry_after and len(out) < DEBTS_PER_WRITE:
                debt.paid_at = now
                out.append(debt)
        self.next_due = min((d.paid_at + retry_after for d in self.debts.values()), default=now)
        return out
