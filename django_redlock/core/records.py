"""Plain records the engine hands out: holders, live locks, node status."""

from __future__ import annotations

import functools
import json
import math
import os
import socket
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from typing import overload

HOSTNAME = socket.gethostname()
#: This process's id, for display in holders (kept current across forks, without a syscall per lock).
_pid = [os.getpid()]
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _pid.__setitem__(0, os.getpid()))


def _json(value: object) -> str:
    if type(value) is float:
        return repr(value) if math.isfinite(value) else json.dumps(value)
    if value is None:
        return "null"
    return _json_cached(value)


@functools.lru_cache(maxsize=1024)
def _json_cached(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


@dataclass(frozen=True)
class Holder:
    """Who holds a lock: the unique token plus where it was taken, for operators."""

    token: str
    host: str | None = None
    pid: int | None = None
    label: str | None = None
    acquired_at: float | None = None  # unix time, for display only
    members: int = 1  # how many resources the lock holds (all with this value)

    def encode(self) -> str:
        """The value stored on the nodes: compact JSON (``t`` token, ``h`` host, ``p`` pid, ``a``
        acquired at, ``l`` label and ``n`` members when set), built field by field: it is made for
        every attempt."""
        token = self.token
        text = '{"t":"' + token + '"' if token.isalnum() else '{"t":' + _json(token)
        text += ',"h":' + _json(self.host) + ',"p":' + _json(self.pid) + ',"a":' + _json(self.acquired_at)
        if self.label is not None:
            text += ',"l":' + _json(self.label)
        if self.members > 1:
            text += ',"n":' + str(self.members)
        return text + "}"

    @classmethod
    def new(cls, token: str, label: str | None = None) -> Holder:
        acquired_at = round(time.time(), 3)  # wall clock: shown to operators, never used for validity
        return cls(token, HOSTNAME, _pid[0], label, acquired_at)

    @overload
    @classmethod
    def decode(cls, raw: bytes | str) -> Holder: ...
    @overload
    @classmethod
    def decode(cls, raw: None) -> None: ...
    @overload
    @classmethod
    def decode(cls, raw: bytes | str | None) -> Holder | None: ...
    @classmethod
    def decode(cls, raw: bytes | str | None) -> Holder | None:
        """Parse a stored value; a foreign or damaged value becomes a bare token."""
        if raw is None:
            return None
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        try:
            data = json.loads(text)
            token = data["t"]
            if not isinstance(token, str):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            return cls(text)
        pid = data.get("p")
        acquired = data.get("a")
        label = data.get("l")
        host = data.get("h")
        return cls(
            token,
            host if isinstance(host, str) else None,
            pid if isinstance(pid, int) else None,
            label if isinstance(label, str) else None,
            float(acquired) if isinstance(acquired, (int, float)) else None,
            members if isinstance(members := data.get("n"), int) and members > 1 else 1,
        )

    def __str__(self) -> str:
        where = f"{self.host or '?'}:{self.pid if self.pid is not None else '?'}"
        return f"{where} ({self.label})" if self.label else where


@dataclass(frozen=True)
class NodeEntry:
    """One node's copy of a lock key."""

    node: str
    holder: Holder | None
    ttl: float  # seconds left on that node; -1.0 when the key has no expiry
    waiting: int = 0  # live places in the resource's waiting line on that node


def seconds(pttl: int) -> float:
    """A PTTL reply in seconds; -1.0 for a key without expiry."""
    return pttl / 1000.0 if pttl >= 0 else -1.0


@dataclass(frozen=True)
class LockRecord:
    """A resource with a live lock key on at least one node.

    Built from each node's raw copy; the holder is decoded, and every figure
    worked out, on first use only: a listing of thousands sorts and shows
    few of them in full.
    """

    resource: str
    key: str
    #: One per node holding the key, in node order: (node name, stored value, ttl ms, live places).
    copies: tuple[tuple[str, str, int, int], ...]
    total: int
    quorum: int
    down: tuple[str, ...] = field(default=())

    @cached_property
    def entries(self) -> tuple[NodeEntry, ...]:
        """Each node's copy; equal values share one decoded :class:`Holder`."""
        holders: dict[str, Holder] = {}
        out = []
        for node, value, pttl, live in self.copies:
            holder = holders.get(value)
            if holder is None:
                holder = holders[value] = Holder.decode(value)
            out.append(NodeEntry(node, holder, seconds(pttl), live))
        return tuple(out)

    @cached_property
    def _main(self) -> tuple[Holder | None, tuple[int, ...]]:
        """The holder seen on the most nodes (on a tie, the first such node's), and which copies store it."""
        values = [c[1] for c in self.copies]
        if not values:
            return None, ()
        if values.count(values[0]) == len(values):  # the usual case: one value everywhere
            return Holder.decode(values[0]), tuple(range(len(values)))
        entries = self.entries
        token = Counter(e.holder.token for e in entries if e.holder).most_common(1)[0][0]
        mine = tuple(i for i, e in enumerate(entries) if e.holder and e.holder.token == token)
        return entries[mine[0]].holder, mine

    @property
    def holder(self) -> Holder | None:
        """The holder seen on the most nodes."""
        return self._main[0]

    @property
    def nodes_holding(self) -> int:
        return len(self._main[1])

    @cached_property
    def ttl(self) -> float:
        """Seconds until fewer than a quorum of the main holder's keys remain (max ttl without quorum)."""
        ttls = sorted((seconds(self.copies[i][2]) for i in self._main[1]), reverse=True)
        if not ttls:
            return 0.0
        if len(ttls) >= self.quorum:
            return ttls[self.quorum - 1]
        return ttls[0]

    @cached_property
    def waiting(self) -> int:
        """Calls waiting in line: the most that a quorum of the nodes holding the key agree on.

        Each node holding the lock key reports its live places; this is the
        quorum-th highest report (every report, the lowest, when fewer than a
        quorum of nodes hold the key). A granted vote takes the caller's place
        out of that node's line; a node that did not grant it keeps the place
        until the release (or about 1.5 s), so it may be counted there.
        """
        counts = sorted((c[3] for c in self.copies), reverse=True)
        if not counts:
            return 0
        return counts[min(self.quorum, len(counts)) - 1]

    @cached_property
    def state(self) -> str:
        """``held`` (one holder on a quorum), ``split`` (several holders, none with a quorum) or ``minority``."""
        if self.nodes_holding >= self.quorum:
            return "held"
        if self.nodes_holding == len(self.copies):
            return "minority"
        tokens = {e.holder.token for e in self.entries if e.holder}
        return "split" if len(tokens) > 1 else "minority"


#: What each state of a :class:`LockRecord` is called wherever locks are listed (command, admin).
STATE_WORDS = {
    "held": "held by a quorum",
    "split": "split between holders",
    "minority": "minority left-over",
}


@dataclass(frozen=True)
class LockListing:
    """The live locks (all, or a slice of them in resource order), and the nodes whose keys could not be read (name -> why)."""

    records: tuple[LockRecord, ...]
    down: dict[str, str]
    total: int
    quorum: int
    #: How many resources have a live lock key: more than ``records`` when only a slice was read.
    count: int

    @property
    def trustworthy(self) -> bool:
        """False when too few nodes answered: a lock held on a quorum may be missing from the listing."""
        return self.total - len(self.down) >= self.quorum


@dataclass(frozen=True)
class ForcedRelease:
    """What ``force_release()`` did: how many nodes had the key, and which did not answer (name -> why)."""

    resource: str
    deleted: int
    total: int
    unreachable: dict[str, str]


@dataclass(frozen=True)
class NodeStatus:
    """What ``node_status()`` learned about one node."""

    name: str
    reachable: bool
    latency: float | None = None
    role: str | None = None
    run_id: str | None = None
    version: str | None = None
    uptime: float | None = None
    host: str | None = None
    port: int | None = None
    path: str | None = None
    error: str | None = None
    persistence: dict[str, bool | str] = field(default_factory=dict)
    #: Seconds this node still sits out after a restart (delayed-restart rule); 0 when it votes.
    sits_out_for: float = 0.0
    #: Whether the node can vote now (reachable master whose restart state is known and past the window).
    votes: bool = True
    #: Why it cannot vote (None when it votes): down, not a master, INFO refused, restarted.
    not_voting_reason: str | None = None
    #: Declared ``"FSYNC_ALWAYS": True`` in its settings: it votes right after a restart.
    fsync_declared: bool = False
