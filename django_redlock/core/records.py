"""Plain records the engine hands out: holders, live locks, node status."""

from __future__ import annotations

import functools
import hashlib
import json
import json.scanner
import math
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, overload


#: The most resources one lock may take at once (all or nothing).
MAX_RESOURCES = 1000
#: The first second no :class:`~datetime.datetime` can show (year 10000): a holder's ``acquired_at``
#: is below it, at or after 0 (1970), or unknown.
LAST_DATE = 253402300800.0
#: Above any process id (Linux's limit is 2**22).
PID_LIMIT = 2**63


def printable(text: str) -> str:
    """``text`` as a terminal, a log line or a listing may show it: each character that is not printable
    (control characters, the ESC of terminal sequences, line breaks, bidirectional overrides, lone
    surrogates) written as its Python escape (``\\n``, ``\\x1b``, ``\\u202e``). For text the
    program did not write itself: resources and holders read from the nodes, what a node replies."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


#: How many hex digits of a token's SHA-256 its digest shows.
DIGEST_DIGITS = 12


def digest_of(token: str) -> str:
    """The digest that names a holder on every screen and log line: the first :data:`DIGEST_DIGITS` hex
    digits of the SHA-256 of its token. The token itself authorizes release, extension and ``adopt()``,
    so it is never shown; the digest tells nothing of it and is the same wherever the holder is seen."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()[:DIGEST_DIGITS]


def _text(value: Any) -> str | None:
    """A string read from a stored value, as UTF-8 can write it (a lone surrogate, which JSON's
    ``"\\ud800"`` makes, becomes U+FFFD); None for anything else."""
    if type(value) is not str:
        return None
    return value if value.isascii() else _SURROGATE.sub("\ufffd", value)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _when(value: Any) -> float | None:
    """A stored ``acquired_at``: a unix time a date can show, or None (damaged: NaN, 1e20, a huge integer)."""
    kind = type(value)
    if kind is float:
        return value if 0.0 <= value < LAST_DATE else None  # NaN compares false
    if kind is int:
        return float(value) if 0 <= value < LAST_DATE else None
    return None


@functools.lru_cache(maxsize=1)
def hostname() -> str:
    """This host's name, for display in holders (read on first use, so importing the engine loads no socket module)."""
    import socket

    return socket.gethostname()


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


#: Parses one JSON value at an offset: json.loads without its argument checks and whitespace scans.
_scan_json: Callable[[str, int], tuple[Any, int]] = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]


_new = object.__new__


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
        # The host and pid repeat from lock to lock: their JSON is cached (a C-level call when it is).
        text += ',"h":' + _json_cached(self.host) + ',"p":' + _json_cached(self.pid) + ',"a":' + _json(self.acquired_at)
        if self.label is not None:
            text += ',"l":' + _json(self.label)
        if self.members > 1:
            text += ',"n":' + str(self.members)
        return text + "}"

    @classmethod
    def new(cls, token: str, label: str | None = None) -> Holder:
        acquired_at = round(time.time(), 3)  # wall clock: shown to operators, never used for validity
        return cls(token, hostname(), _pid[0], label, acquired_at)

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
        """Parse a stored value; a foreign or damaged value becomes a bare token. Never raises: each field
        is kept only when it is what :meth:`encode` writes (text UTF-8 encodes, a pid, a unix time a date
        can show, a member count a lock may have), else it is left unknown."""
        if raw is None:
            return None
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):  # not JSON, or nested too deep to parse
            return cls(_text(text) or "")
        return cls._of(data, text)

    @classmethod
    def decode_many(cls, raws: Sequence[str]) -> list[Holder]:
        """:meth:`decode` of many stored values: the same holders, several times faster for thousands."""
        out = []
        for raw in raws:
            try:
                data, end = _scan_json(raw, 0)  # what json.loads does, less its per-call overhead
            except (StopIteration, ValueError, RecursionError):  # not JSON, or damaged: decode() says what it is
                data, end = None, -1
            out.append(cls._of(data, raw) if end == len(raw) else cls.decode(raw))
        return out

    @classmethod
    def _of(cls, data: Any, text: str) -> Holder:
        """The holder a parsed value describes; a bare token when it is not one of ours."""
        token = _text(data.get("t")) if type(data) is dict else None
        if token is None:
            return cls(_text(text) or "")
        pid = data.get("p")
        acquired = data.get("a")
        label = data.get("l")
        host = data.get("h")
        members = data.get("n")
        # What __init__ would do, without its one object.__setattr__ a field (a listing decodes thousands).
        holder = _new(cls)
        holder.__dict__.update(
            token=token,
            host=_text(host),
            pid=pid if type(pid) is int and 0 <= pid < PID_LIMIT else None,
            label=_text(label),
            acquired_at=_when(acquired),
            members=members if type(members) is int and 1 < members <= MAX_RESOURCES else 1,
        )
        return holder

    @property
    def digest(self) -> str:
        """What names this holder where its token must not be shown (see :func:`digest_of`)."""
        return digest_of(self.token)

    def __str__(self) -> str:
        where = f"{printable(self.host or '?')}:{self.pid if self.pid is not None else '?'}"
        return f"{where} ({printable(self.label)})" if self.label else where

    def __repr__(self) -> str:  # the token is a secret: its digest stands in for it
        return (
            f"Holder(digest={self.digest!r}, host={self.host!r}, pid={self.pid!r}, label={self.label!r}, "
            f"acquired_at={self.acquired_at!r}, members={self.members!r})"
        )


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


# The figures of a lock, from its copies (one per node holding the key, in node order). Each rule
# lives here once: LockRecord shows them, and a listing sorts by them without building records.


def same_everywhere(items: Sequence[Any]) -> bool:
    """True when every copy is the first one (the usual case: one holder on every node)."""
    return items.count(items[0]) == len(items)


def main_copies(values: Sequence[str]) -> tuple[int, ...]:
    """Which copies store the main holder's value: the holder seen on the most nodes (on a tie, the first such node's)."""
    if same_everywhere(values):
        return _every(len(values))
    holders = _holders(values)
    token = Counter(h.token for h in holders).most_common(1)[0][0]
    return tuple(i for i, h in enumerate(holders) if h.token == token)


def agreed_holder(values: Sequence[Any], quorum: int) -> tuple[Holder, int] | None:
    """The holder a quorum of nodes store (each node's value of one key: a string, bytes, or anything
    else for none), and on how many nodes; None when no value is on a quorum."""
    texts = [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in values]
    found = Counter(v for v in texts if type(v) is str and v)
    if not found:
        return None
    value, nodes = found.most_common(1)[0]
    return (Holder.decode(value), nodes) if nodes >= quorum else None


def ttl_of(pttls: Sequence[int], quorum: int) -> float:
    """Seconds until fewer than a quorum of these keys remain (the longest ttl when fewer than a quorum hold one)."""
    ttls = sorted(pttls)
    return seconds(ttls[-quorum] if len(ttls) >= quorum else ttls[-1])


def waiting_of(lives: Sequence[int], quorum: int) -> int:
    """Calls waiting in line: the most that a quorum of the nodes holding the key agree on.

    Each node holding the lock key reports its live places; this is the
    quorum-th highest report (every report, the lowest, when fewer than a
    quorum of nodes hold the key). A granted vote takes the caller's place
    out of that node's line; a node that did not grant it keeps the place
    until the release (or about 1.5 s), so it may be counted there.
    """
    return sorted(lives)[-min(quorum, len(lives))] if any(lives) else 0


def state_of(holding: int, copies: int, quorum: int, silent: int = 0) -> str:
    """``held`` (one holder on a quorum), ``unknown`` (the ``silent`` nodes, which did not answer or sit out
    after a restart, could make it a quorum), ``split`` (several holders, none with a quorum) or ``minority``."""
    if holding >= quorum:
        return "held"
    if holding + silent >= quorum:
        return "unknown"
    return "minority" if holding == copies else "split"  # the copies not holding the main value hold others


@functools.cache
def _every(count: int) -> tuple[int, ...]:
    return tuple(range(count))


def _holders(values: Sequence[str]) -> tuple[Holder, ...]:
    """Each value's holder; equal values share one decoded :class:`Holder`."""
    decoded: dict[str, Holder] = {}
    for value in values:
        if value not in decoded:
            decoded[value] = Holder.decode(value)
    return tuple(decoded[value] for value in values)


@dataclass(slots=True)
class LockRecord:
    """A resource with a live lock key on at least one node.

    Built from the copies the nodes hold, one column per figure; the figures
    are worked out when it is built, the holders decoded on first use only
    (a listing of thousands sorts by a figure and shows few of them in full).
    """

    resource: str
    key: str
    #: The nodes holding the key, in node order, and each one's stored value, ttl (ms) and live places in line.
    nodes: tuple[str, ...]
    values: tuple[str, ...] = field(repr=False)  # secrets: each holds its holder's token
    pttls: tuple[int, ...]
    lives: tuple[int, ...]
    total: int
    quorum: int
    down: tuple[str, ...] = ()
    #: How many nodes hold the main holder's value (see :func:`main_copies`).
    nodes_holding: int = field(init=False)
    #: Seconds until fewer than a quorum of the main holder's keys remain (see :func:`ttl_of`).
    ttl: float = field(init=False)
    #: Calls waiting in line (see :func:`waiting_of`).
    waiting: int = field(init=False)
    #: ``held``, ``unknown``, ``split`` or ``minority`` (see :func:`state_of`).
    state: str = field(init=False)
    _main: tuple[int, ...] = field(init=False, repr=False, compare=False)  # the copies storing the main value
    _holders: tuple[Holder, ...] | None = field(init=False, default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._main = main = main_copies(self.values)
        self.nodes_holding = len(main)
        self.ttl = ttl_of(self.pttls if len(main) == len(self.pttls) else [self.pttls[i] for i in main], self.quorum)
        self.waiting = waiting_of(self.lives, self.quorum)
        self.state = state_of(len(main), len(self.values), self.quorum, len(self.down))

    def holders(self) -> tuple[Holder, ...]:
        """Each copy's holder, in node order; equal values share one decoded :class:`Holder`."""
        if self._holders is None:
            self._holders = _holders(self.values)
        return self._holders

    @property
    def holder(self) -> Holder:
        """The holder seen on the most nodes."""
        return self.holders()[self._main[0]]

    @property
    def entries(self) -> tuple[NodeEntry, ...]:
        """Each node's copy."""
        return tuple(map(NodeEntry, self.nodes, self.holders(), map(seconds, self.pttls), self.lives))

    @property
    def copies(self) -> tuple[tuple[str, str, int, int], ...]:
        """One per node holding the key, in node order: (node name, stored value, ttl ms, live places)."""
        return tuple(zip(self.nodes, self.values, self.pttls, self.lives))


def read_holders(records: Sequence[LockRecord]) -> None:
    """Decode the holders of many records at once: a listing that shows them all gets them several times faster."""
    single = [r for r in records if r._holders is None and same_everywhere(r.values)]
    for record, holder in zip(single, Holder.decode_many([r.values[0] for r in single])):
        record._holders = (holder,) * len(record.values)


def gettext_noop(message: str) -> str:
    """Mark ``message`` for Django's ``makemessages`` (the admin translates it; the engine imports no Django)."""
    return message


#: What each state of a :class:`LockRecord` is called wherever locks are listed (command, admin).
STATE_WORDS = {
    "held": gettext_noop("held by a quorum"),
    "split": gettext_noop("split between holders"),
    "minority": gettext_noop("minority left-over"),
    "unknown": gettext_noop("unknown: may be held"),
}


@dataclass(frozen=True)
class LockListing:
    """The live locks (all, or the rows asked, in the order asked), and the nodes whose keys could not be read
    or cannot be trusted, sitting out after a restart (name -> why)."""

    records: tuple[LockRecord, ...]
    down: dict[str, str]
    total: int
    quorum: int
    #: How many resources have a live lock key: more than ``records`` when only a slice was read.
    count: int

    @property
    def answered(self) -> int:
        """How many nodes answered and may be trusted (a node that sits out after a restart may have forgotten keys)."""
        return self.total - len(self.down)

    @property
    def trustworthy(self) -> bool:
        """False when too few nodes answered: every lock's state is unknown, and a lock held on a
        quorum may be missing from the listing."""
        return self.answered >= self.quorum


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
    #: The server's own version (Valkey's, not the Redis version Valkey also reports).
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
    #: What weakens the rule at this node although it votes (INFO replication refused), None: nothing.
    warning: str | None = None
    #: Which server answers: "redis" or "valkey" (None when INFO was not read).
    server: str | None = None
