"""Reading the live locks off every node: the walk behind ``lock_listing()`` and ``lock_record()``.

Nothing here does I/O: :func:`read_listing` and :func:`read_record` are
steps (see :mod:`django_redlock.core.steps`) that both managers drive.
"""

from __future__ import annotations

import functools
import gc
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple, TypeVar

from django_redlock.core.base import ManagerConfig, check_name, check_text, locked_of
from django_redlock.core.records import (
    STATE_WORDS,
    Holder,
    LockListing,
    LockRecord,
    main_copies,
    read_holders,
    state_of,
    ttl_of,
    waiting_of,
)
from django_redlock.core.books import Failure
from django_redlock.core.scripts import INSPECT, LIST
from django_redlock.core.steps import Fan, Step

__all__ = ["ORDERS", "Order", "Rows", "Scan", "read_listing", "read_locked", "read_record"]

#: How long a node gets to answer a reading's first call (or the node timeout, if longer). A node
#: silent that long is left out of the rest of the reading, so nodes that are down cost one such wait.
NODE_WAIT = 0.5
#: How long a node that answered gets for each later call (SCAN pages may take a while on a big node).
ADMIN_TIMEOUT = 2.0
SCAN_COUNT = 1000


_F = TypeVar("_F", bound=Callable[..., Any])


def without_gc(method: _F) -> _F:
    """Run ``method`` with the cyclic garbage collector paused: a listing of thousands of locks
    builds tens of thousands of objects that live on, and each of the collections they trigger
    walks every object of the process (a third of the listing's time, in a Django process).
    Nothing it builds is a cycle; the collector runs again as soon as it returns. The pause is the
    process's, as ``timeit``'s is: a thread that turns the collector off while a listing runs finds
    it on again when the listing ends."""

    @functools.wraps(method)
    def paused(*args: Any, **kwargs: Any) -> Any:
        if not gc.isenabled():  # paused already (by the caller, or another thread's listing)
            return method(*args, **kwargs)
        try:
            gc.disable()  # inside: a signal handler's exception as it returns still re-enables it
            return method(*args, **kwargs)
        finally:
            gc.enable()

    return paused  # type: ignore[return-value]


#: A sort key: from a lock's copies (values, ttls ms and live places, one per node holding its key),
#: the quorum and how many nodes did not answer.
SortKey = Callable[[tuple[str, ...], tuple[int, ...], tuple[int, ...], int, int], Any]


class Order(NamedTuple):
    """An order of the listing: what the walk reads of each lock key to sort by it, and the sort key."""

    #: "n" the key names, "v" their values too, "t" their ttls, "vt" values and ttls (see the LIST script).
    reads: str
    #: Whether the waiting lines are walked too (for the calls waiting).
    lines: bool
    key: SortKey
    #: For an order by holder: ``key`` gives the main holder's value, and this the sort key of the
    #: holder it decodes to (all are decoded at once).
    by_holder: Callable[[Holder], Any] | None = None


def _main_value(
    values: tuple[str, ...], pttls: tuple[int, ...], lives: tuple[int, ...], quorum: int, silent: int
) -> str:
    return values[main_copies(values)[0]]


#: The orders ``lock_listing()`` takes, by name (``"-name"``: descending). Equal keys stay in resource
#: order. The figures are the records' own (see :mod:`~django_redlock.core.records`); sorting by ttl
#: reads no values, so every copy counts as the main holder's: a lock sorts by the quorum-th longest
#: ttl of its keys, whoever holds them (its ``ttl`` unless its copies disagree).
ORDERS: dict[str, Order] = {
    "resource": Order("n", False, lambda values, pttls, lives, quorum, silent: None),  # the keys' own order
    "state": Order(
        "v",
        False,
        lambda values, pttls, lives, quorum, silent: state_of(len(main_copies(values)), len(values), quorum, silent),
    ),
    "nodes_holding": Order("v", False, lambda values, pttls, lives, quorum, silent: len(main_copies(values))),
    "ttl": Order("t", False, lambda values, pttls, lives, quorum, silent: ttl_of(pttls, quorum)),
    "waiting": Order("n", True, lambda values, pttls, lives, quorum, silent: waiting_of(lives, quorum)),
    "holder": Order("v", False, _main_value, str),
    "acquired_at": Order("v", False, _main_value, lambda holder: holder.acquired_at or 0),
}

#: Which records ``lock_listing()`` reads in full: a slice of the resources in the order asked, or a
#: function of how many there are that returns the slice (a page past the end can then be the last).
Rows = slice | Callable[[int], slice]


def read_record(config: ManagerConfig, nodes: Sequence[Any], quorum: int, resource: str) -> Step:
    """One resource's record (None when no node holds its key), reading that key alone."""
    listing = yield from read_listing(Scan(config, nodes, quorum, keys=[config.key(check_name(resource))]))
    return listing.records[0] if listing.records else None


def read_locked(config: ManagerConfig, nodes: Sequence[Any], quorum: int, resource: str) -> Step:
    """``is_locked()``: each node's PTTL of the lock key, judged by :func:`~django_redlock.core.base.locked_of`."""
    key = config.key(check_name(resource))
    replies = yield Fan([("PTTL", key)] * len(nodes), restart_window=config.restart_window)
    return locked_of(resource, nodes, replies, quorum)


def read_listing(scan: Scan) -> Step:
    """The live locks ``scan`` reads, as :meth:`~django_redlock.core.LockManager.lock_listing` describes
    them: walk, then inspect. Nodes that are down cost one wait: the first call waits
    :data:`NODE_WAIT` for every node, a node silent by then is left out of the
    later calls, and a node whose earlier reply is still overdue is not waited
    for at all (``allow_lagging=False``). A node that sits out after a restart
    counts as silent: it may have forgotten keys of locks that are held."""
    config = scan.config
    timeout = max(config.node_timeout, NODE_WAIT)
    window = config.restart_window
    while scan.running:
        commands = scan.commands()
        fan = Fan(commands, timeout=timeout, script=LIST, allow_lagging=False, restart_window=window)
        scan.take(commands, (yield fan))
        timeout = max(config.node_timeout, ADMIN_TIMEOUT)
    commands = scan.inspect_commands()
    if any(commands):
        fan = Fan(commands, timeout=timeout, script=INSPECT, allow_lagging=False, restart_window=window)
        scan.take_inspected(commands, (yield fan))
    return scan.listing()


class Reads:
    """What one node told about lock keys: each key it holds as a lock, with its value (``""`` when only
    names were read) and its ttl ms (when read); and the live places in each line.
    """

    __slots__ = ("values", "pttls", "lives")

    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        self.pttls: dict[str, int] = {}
        self.lives: dict[str, int] = {}

    def add(self, names: list[str], values: list[str] | None, pttls: list[int] | None) -> None:
        # SCAN may return a key twice: the later reading wins.
        self.values.update(dict.fromkeys(names, "") if values is None else zip(names, values))
        if pttls is not None:
            self.pttls.update(zip(names, pttls))
        if values is not None and "" in values:  # not a string: no copy of a lock
            for name, value in zip(names, values):
                if not value:
                    del self.values[name]

    def column(self, keys: Sequence[str]) -> tuple[Iterable[str | None], Iterable[int]]:
        """The value (None where the node holds no copy) and ttl (0 when not read) of each key."""
        if not self.values:
            return itertools.repeat(None), itertools.repeat(0)
        pttls = map(self.pttls.get, keys, itertools.repeat(0)) if self.pttls else itertools.repeat(0)
        return map(self.values.get, keys), pttls


class Scan:
    """The state of one reading: every node walked in lockstep, a LIST call a round, then the rows shown.

    The full listing walks the lock keys reading values and ttls, then the
    waiting lines. With ``rows``, the walk reads only what the order needs
    (for the resource order, names alone); :meth:`inspect_commands` then
    picks the rows and INSPECT reads just their keys in full. With ``keys``
    there is no walk: INSPECT reads those keys. With ``state``, only the locks
    in that state are kept (the walk then reads every key's values, which the
    state is judged from).
    """

    def __init__(
        self,
        config: ManagerConfig,
        nodes: Sequence[Any],
        quorum: int,
        match: str | None = None,
        rows: Rows | None = None,
        order: str = "resource",
        keys: Sequence[str] | None = None,
        state: str | None = None,
    ) -> None:
        name = order[1:] if isinstance(order, str) and order.startswith("-") else order
        if name not in ORDERS:
            raise ValueError(f"order must be one of {', '.join(ORDERS)} (or one of them after '-'); got {order!r}.")
        if state is not None and state not in STATE_WORDS:
            raise ValueError(f"state must be one of {', '.join(STATE_WORDS)} (or None for all); got {state!r}.")
        if match is not None:
            check_text(match, "match")
        self.state = state
        self.order = ORDERS[name]
        self.by_resource = name == "resource"  # the order of the keys themselves: nothing to sort
        self.descending = order != name
        self.full = rows is None and keys is None
        self.config = config
        self.nodes = nodes
        self.quorum = quorum
        self.rows = rows
        self.head, _, places_head = config.line_keys("")
        reads, lines = ("vt", True) if rows is None else (self.order.reads, self.order.lines)
        if state is not None and "v" not in reads:  # a state is judged from the values
            reads = "v" if reads == "n" else "vt"
        self.walks = [(config.pattern(self.head, match), reads)]
        if lines:
            self.walks.append((config.pattern(places_head, match), "w"))
        #: Per node: the walk it is on, its SCAN cursor (None once done), and whether its page is read again safely.
        self.walk = [0] * len(nodes)
        self.cursors: list[str | None] = [None if keys is not None else "0"] * len(nodes)
        self.safe = [False] * len(nodes)
        self.down: dict[str, str] = {}
        self.reads = [Reads() for _ in nodes]
        #: The keys read in full (with ``rows`` or ``keys``), and how many keys name a resource in all.
        self.page: list[str] = list(keys or ())
        self.count = len(self.page)

    @property
    def running(self) -> bool:
        return any(c is not None for c in self.cursors)

    def commands(self) -> list[tuple[Any, ...] | None]:
        out: list[tuple[Any, ...] | None] = []
        for i, cursor in enumerate(self.cursors):
            if cursor is None:
                out.append(None)
            else:
                pattern, reads = self.walks[self.walk[i]]
                out.append(self.config.list_command(cursor, pattern, SCAN_COUNT, reads, self.safe[i]))
        return out

    def _failed(self, i: int, reply: Any) -> bool:
        if isinstance(reply, Failure):
            self.down[self.nodes[i].name] = reply.reason
            self.cursors[i] = None
            return True
        return False

    @without_gc
    def take(self, commands: Sequence[Any], replies: Sequence[Any]) -> None:
        for i, reply in enumerate(replies):
            if commands[i] is None or self._failed(i, reply):
                continue
            cursor, count, names, values, ttls = reply
            reads = self.walks[self.walk[i]][1]
            names = _texts(names, count)
            texts = reads in ("v", "vt")
            if texts:
                values = _texts(values, count)
            if len(names) != count or (texts and len(values) != count):
                self.safe[i] = True  # a NUL in a name or value: the same page again, as arrays
                continue
            self.safe[i] = False
            self._keep(self.reads[i], reads, names, values, ttls)
            if cursor in (b"0", "0"):
                self.walk[i] += 1
                self.cursors[i] = "0" if self.walk[i] < len(self.walks) else None
            else:
                self.cursors[i] = cursor.decode() if isinstance(cursor, bytes) else cursor

    @staticmethod
    def _keep(node: Reads, reads: str, names: list[str], values: Any, ttls: Any) -> None:
        count = len(names)
        if reads == "w":
            node.lives.update(zip(names, _numbers(values, count)))
        else:
            node.add(names, values if "v" in reads else None, _numbers(ttls, count) if "t" in reads else None)

    def keys(self) -> list[str]:
        """Every lock key some node holds, in resource order."""
        return sorted(set().union(*(node.values for node in self.reads)))

    @without_gc
    def inspect_commands(self) -> list[tuple[Any, ...] | None]:
        """After a walk for ``rows``: pick the rows in the order asked; INSPECT their keys on every node that answered."""
        if self.rows is not None:
            keys = self.keys()
            if self.state is not None:
                keys = self.in_state(keys)
            self.count = len(keys)
            if not self.by_resource:
                keys = self.in_order(keys)
            elif self.descending:
                keys.reverse()
            self.page = keys[self.rows(self.count) if callable(self.rows) else self.rows]
        command = self.config.inspect_command(self.page) if self.page else None
        return [command if node.name not in self.down else None for node in self.nodes]

    def in_state(self, keys: list[str]) -> list[str]:
        """The ``keys`` whose lock is in the state asked, from the values the walk read."""
        quorum, silent, state = self.quorum, len(self.down), self.state
        return [
            key
            for key, _nodes, values, _pttls, _lives in self.copies(keys, self.reads)
            if state_of(len(main_copies(values)), len(values), quorum, silent) == state
        ]

    def in_order(self, keys: list[str]) -> list[str]:
        """``keys`` in the order asked, from what the walk read."""
        rows = list(self.copies(keys, self.reads))
        return [rows[i][0] for i in self.ranked([row[2:] for row in rows])]

    def ranked(self, copies: Sequence[tuple[tuple[str, ...], tuple[int, ...], tuple[int, ...]]]) -> list[int]:
        """The positions of locks (their values, ttls and live places) in the order asked; ties keep their place."""
        order = self.order
        silent = len(self.down)
        ranks = [order.key(values, pttls, lives, self.quorum, silent) for values, pttls, lives in copies]
        if order.by_holder is not None:
            ranks = list(map(order.by_holder, Holder.decode_many(ranks)))
        return sorted(range(len(ranks)), key=ranks.__getitem__, reverse=self.descending)

    @without_gc
    def take_inspected(self, commands: Sequence[Any], replies: Sequence[Any]) -> None:
        keys = self.page
        self.reads = [Reads() for _ in self.nodes]  # the rows are read again on every node that answers
        for i, reply in enumerate(replies):
            if commands[i] is None or self._failed(i, reply):
                continue
            node = self.reads[i]
            tail = reply[2 * len(keys)]  # (1-based index, live places) for keys with a line
            node.lives = {keys[j - 1]: live for j, live in zip(tail[::2], tail[1::2])}
            node.add(keys, _texts(reply[: 2 * len(keys) : 2], len(keys)), reply[1 : 2 * len(keys) : 2])

    @without_gc
    def listing(self) -> LockListing:
        """The records read: every one in the order asked, or the rows' (``count`` still tells how many there are)."""
        if self.full:
            records = self.records(self.keys(), self.reads)
            if self.state is not None:
                records = [r for r in records if r.state == self.state]
            read_holders(records)  # a full listing shows every holder
            if not self.by_resource:
                records = [records[i] for i in self.ranked([(r.values, r.pttls, r.lives) for r in records])]
            elif self.descending:
                records.reverse()
            return LockListing(tuple(records), dict(self.down), len(self.nodes), self.quorum, len(records))
        records = self.records(self.page, self.reads)
        if self.state is not None:  # read again: a lock whose state changed since the walk is left out
            records = [r for r in records if r.state == self.state]
        return LockListing(tuple(records), dict(self.down), len(self.nodes), self.quorum, self.count)

    def records(self, keys: Sequence[str], reads: Sequence[Reads]) -> list[LockRecord]:
        """A record for each key some node holds, from the nodes' reads."""
        down = tuple(sorted(self.down))
        total, quorum, cut = len(self.nodes), self.quorum, len(self.head)
        return [
            LockRecord(key[cut:], key, nodes, values, pttls, lives, total, quorum, down)
            for key, nodes, values, pttls, lives in self.copies(keys, reads)
        ]

    def copies(
        self, keys: Sequence[str], reads: Sequence[Reads]
    ) -> Iterator[tuple[str, tuple[str, ...], tuple[str, ...], tuple[int, ...], tuple[int, ...]]]:
        """Each key some node holds, with the nodes holding it and their values, ttls and live places (node order)."""
        names = tuple(node.name for node in self.nodes)
        columns = [node.column(keys) for node in reads]
        values, pttls = zip(*[c[0] for c in columns]), zip(*[c[1] for c in columns])
        for key, copies, ttls, lives in zip(keys, values, pttls, _lives(keys, [node.lives for node in reads])):
            if None not in copies:
                yield key, names, copies, ttls, lives
                continue
            held = [i for i, value in enumerate(copies) if value is not None]  # some nodes lack the key (or are down)
            if held:
                yield (
                    key,
                    tuple(names[i] for i in held),
                    tuple(copies[i] for i in held),
                    tuple(ttls[i] for i in held),
                    tuple(lives[i] for i in held),
                )


def _lives(keys: Sequence[str], found: Sequence[dict[str, int]]) -> Iterator[tuple[int, ...]]:
    """Each key's live places in line on every node (0 where it has none)."""
    none = (0,) * len(found)
    lines = set().union(*found)  # the few resources anyone waits for
    if not lines:
        return itertools.repeat(none)
    waiting = {key: tuple(lives.get(key, 0) for lives in found) for key in lines}
    return map(waiting.get, keys, itertools.repeat(none))


def _texts(raw: Any, count: int) -> list[str]:
    """A column of ``count`` texts: a NUL-separated string, or an array (a safe reply; nil is ``""``)."""
    if isinstance(raw, list):
        return ["" if i is None else i.decode("utf-8", "replace") if isinstance(i, bytes) else i for i in raw]
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    return text.split("\0") if count else []


def _numbers(raw: Any, count: int) -> list[int]:
    """A column of LIST's reply of ``count`` keys as integers."""
    if isinstance(raw, list):
        return [int(item) for item in raw]
    return list(map(int, raw.split(b"\0" if isinstance(raw, bytes) else "\0"))) if count else []
