"""The ledger: what is due on each connection (entries) and owed to each node (release debts). No I/O.

- **Replies in order.** Every command written to a connection leaves an
  :class:`Entry` on that connection's queue; each reply read is matched to the
  oldest entry. A reply nobody waits for any more (the fan-out had already
  decided) is still read and booked: a late probe is learned, a late release
  settles its debt.
- **Release debts.** Before a value is released on the nodes, each node owes
  a release of it; a reply that proves the key gone settles the debt. Debts not
  settled (node down, reply lost, connection dropped) are paid again with the
  next command written to that node, until the key's ttl has surely passed.

No sockets, no clock reads, no threads here: callers pass the time in and
hold the node's mutex.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Protocol

__all__ = [
    "DEBTS_PER_WRITE",
    "EXTEND",
    "LATE_WORTH_RUNNING",
    "MARK",
    "MAX_DEBTS",
    "OTHER",
    "PART",
    "PROBE_REPLY",
    "RELEASE",
    "SET",
    "STAMP",
    "WAKE",
    "Debt",
    "Entry",
    "Kind",
    "Ledger",
    "Owing",
    "Waiter",
    "after_noscript",
    "debt_command",
    "entry_fields",
    "pair_of",
]


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
    MARK = 8  # the token of the node's data set, read with the restart probe (see scripts.DATASET)


OTHER, SET, RELEASE, PROBE_REPLY = Kind.OTHER, Kind.SET, Kind.RELEASE, Kind.PROBE_REPLY
WAKE, EXTEND, STAMP, PART = Kind.WAKE, Kind.EXTEND, Kind.STAMP, Kind.PART
MARK = Kind.MARK

#: Kinds worth running after their round has ended: a late release or extension only acts while
#: its value still holds the key (a late vote could leave a key nobody holds).
LATE_WORTH_RUNNING = (RELEASE, EXTEND)

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


@dataclass(slots=True, eq=False)
class Entry:
    """One command written to a connection whose reply has not been read yet."""

    kind: Kind
    key: str | None = None
    value: str | None = None
    #: For a SET: how long its key lives once it lands (seconds).
    ttl: float = 0.0
    #: Who waits for the reply (the driver's business), or None once nobody does.
    waiter: Waiter | None = None
    #: What to send instead if the reply is NOSCRIPT (the script's source), sent once.
    retry: tuple[Any, ...] | None = None
    #: For a RELEASE: a reply of 0 proves the key gone (see :meth:`Ledger.ordered`).
    proves: bool = field(default=True, init=False)

    def __repr__(self) -> str:
        return f"<Entry {self.kind.name} {self.key!r}>"


def pair_of(command: Sequence[Any]) -> tuple[str, str]:
    """(lock key, holder value) of an ACQUIRE, RELEASE or EXTEND script call: KEYS[1] and ARGV[1]."""
    return command[3], command[3 + command[2]]


def entry_fields(command: Sequence[Any], kind: Kind) -> tuple[Kind, str | None, str | None, float]:
    """The kind, key, value and ttl of the entry for a fan-out's own command: votes (SET, and an
    EXTEND that may re-create a key) and releases are booked, the rest not."""
    if kind == SET and command[0] == "SET":  # SET key value NX PX ttl
        return SET, command[1], command[2], command[5] / 1000.0
    if kind != SET and kind != RELEASE and kind != EXTEND:
        return kind, None, None, 0.0
    key, value = command[3], command[3 + command[2]]  # pair_of(command), without the call
    if kind == SET:  # ACQUIRE: KEYS in threes (lock, queue, places); ARGV value, ttl ms, ...
        return SET, key, value, command[4 + command[2]] / 1000.0
    # EXTEND: KEYS the lock keys; ARGV value, ttl ms, re-create ('1'), ...; a release of the value
    # goes behind it on its connection.
    if kind == EXTEND and command[5 + command[2]] == "1":  # it may set a key again: booked as a vote
        return SET, key, value, command[4 + command[2]] / 1000.0
    return kind, key, value, 0.0  # RELEASE, or an EXTEND that sets nothing again


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


class Owing:
    """The release round that owes a debt, while it runs (``over`` once it finished): until then the
    debt is its own business, never paid by another write (it would race the round's own release)."""

    #: True once the round finished (a class default: making one is no Python call).
    over = False


@dataclass(slots=True, eq=False)
class Debt:
    key: str
    value: str
    #: After this (monotonic) time the key has surely expired: forget the debt.
    until: float
    #: When a release for it was last written (not again while that one is in flight).
    paid_at: float
    #: The release to send (as EVAL: no NOSCRIPT to handle).
    command: tuple[Any, ...]
    #: The round that owes it, while that round may still write or wait for its own release here.
    owing: Owing | None = None
    #: A payment deleted the key while its round ran: that round's own 0 here counts as deleted.
    deleted: bool = field(default=False, init=False)

    def held(self) -> bool:
        """True while the round that owes it runs (its own release is written, or about to be)."""
        owing = self.owing
        if owing is None:
            return False
        if owing.over:
            self.owing = None
            return False
        return True


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

    def owe(
        self, key: str, value: str, until: float, now: float, command: tuple[Any, ...], owing: Owing | None = None
    ) -> None:
        """Record that a release of ``value`` (``command``, an EVAL) is owed: it is being written now, by
        the round ``owing`` (no other write pays it while that round runs).

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
            debts[(key, value)] = Debt(key, value, until, now, command, owing)
            self.next_due = min(self.next_due, now + self.retry_after) if len(self.debts) > 1 else now + self.retry_after
        else:
            debt.until = max(debt.until, until)
            debt.paid_at = now
            debt.owing = owing

    def ordered(self, expect: Sequence[Entry], key: str | None, value: str | None) -> bool:
        """Whether a release of ``value`` written now behind ``expect`` (its connection's unanswered
        entries) runs after every SET of that value still unanswered: they are all ahead of it on
        that connection. One on another connection may reach the node after the release, and its
        OK be read before the release's 0: that 0 then proves nothing."""
        pending = self.unanswered.get((key, value), 0)  # type: ignore[arg-type]
        return not pending or pending == sum(e.kind == SET and e.key == key and e.value == value for e in expect)

    def settle(self, entry: Entry, reply: Any, now: float) -> Any:
        """Book a release's reply: 1 deleted the key; 0 proves it gone unless a SET may still land.

        Returns the reply as its round counts it: a 0 where a release of ours already deleted the
        value (a payment, see below) is a 1."""
        pair = (entry.key, entry.value)
        debt = self.debts.get(pair)  # type: ignore[arg-type]
        if debt is None:
            return reply
        if debt.deleted:
            return 1 if reply == 0 else reply
        if reply == 1 and entry.waiter is None and debt.held():
            # A payment (written before its round began) deleted the key while the round runs: kept
            # until the round is over, so that the round's own 0 here is not taken for a loss.
            debt.deleted = True
        elif reply == 1 or (
            reply == 0
            and entry.proves
            and pair not in self.unanswered
            and self.lost_sets.get(pair, 0.0) <= now  # type: ignore[arg-type]
        ):
            del self.debts[pair]  # type: ignore[arg-type]
        return reply

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
            if debt.until <= now or (debt.deleted and not debt.held()):
                del self.debts[pair]
            elif debt.held():
                continue  # its own round still runs: it writes the release here itself
            elif now - debt.paid_at >= retry_after and len(out) < DEBTS_PER_WRITE:
                debt.paid_at = now
                out.append(debt)
        self.next_due = min((d.paid_at + retry_after for d in self.debts.values()), default=now)
        return out
