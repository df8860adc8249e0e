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


@dataclass(frozen=True)
class LockRecord:
    """A resource with a live lock key on at least one node."""

    resource: str
    key: str
    entries: tuple[NodeEntry, ...]
    total: int
    quorum: int
    down: tuple[str, ...] = field(default=())

    @property
    def holder(self) -> Holder | None:
        """The holder seen on the most nodes."""
        counts = Counter(e.holder.token for e in self.entries if e.holder)
        if not counts:
            return None
        token = counts.most_common(1)[0][0]
        return next(e.holder for e in self.entries if e.holder and e.holder.token == token)

    @property
    def nodes_holding(self) -> int:
        holder = self.holder
        return sum(1 for e in self.entries if holder and e.holder and e.holder.token == holder.token)

    @property
    def ttl(self) -> float:
        """Seconds until fewer than a quorum of the main holder's keys remain (max ttl without quorum)."""
        holder = self.holder
        ttls = sorted(
            (e.ttl for e in self.entries if holder and e.holder and e.holder.token == holder.token),
            reverse=True,
        )
        if not ttls:
            return 0.0
        if len(ttls) >= self.quorum:
            return ttls[self.quorum - 1]
        return ttls[0]

    @property
    def waiting(self) -> int:
        """Calls waiting in line: the most that a quorum of the nodes holding the key agree on.

        Each node holding the lock key reports its live places; this is the
        quorum-th highest report (every report, the lowest, when fewer than a
        quorum of nodes hold the key). A granted vote takes the caller's place
        out of that node's line; a node that did not grant it keeps the place
        until the release (or about 1.5 s), so it may be counted there.
        """
        counts = sorted((e.waiting for e in self.entries), reverse=True)
        if not counts:
            return 0
        return counts[min(self.quorum, len(counts)) - 1]

    @property
    def state(self) -> str:
        """``held`` (one holder on a quorum), ``split`` (several holders, none with a quorum) or ``minority``."""
        tokens = {e.holder.token for e in self.entries if e.holder}
        if self.nodes_holding >= self.quorum:
            return "held"
        return "split" if len(tokens) > 1 else "minority"


#: What each state of a :class:`LockRecord` is called wherever locks are listed (command, admin).
STATE_WORDS = {
    "held": "held by a quorum",
    "split": "split between holders",
    "minority": "minority left-over",
}


@dataclass(frozen=True)
class LockListing:
    """The live locks, and the nodes whose keys could not be read (name -> why)."""

    records: tuple[LockRecord, ...]
    down: dict[str, str]
    total: int
    quorum: int

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
