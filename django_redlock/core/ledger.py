"""Each node's restart state: the probe, what it learned, the delayed-restart rule; the data-set token. No I/O.

No sockets, no clock reads, no threads here: callers pass the time in and
hold the node's mutex. The sync and asyncio drivers both keep their books
with these classes, so the rules are written once:

- **Replies in order** and **release debts**: see :mod:`django_redlock.core.entries`.
- **Restart state per connection.** A connection votes only once the probe
  sent on it (INFO server and replication, persistence) has been read: a node
  whose restart state is unknown does not vote (fail closed). What the probes
  of one node's connections learned is compared (:class:`History`): another
  server behind the same address (a promoted replica) sits out as a
  restarted one does. See :func:`vote_refusal`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django_redlock.core import forks
from django_redlock.core.scripts import REPLACED

__all__ = [
    "PROBE",
    "REPLACED_DATASET",
    "History",
    "Restart",
    "config_value",
    "denied",
    "history_for",
    "learn",
    "moved",
    "parse_info",
    "probe_info",
    "replaced_token",
    "sure_uptime",
    "token_of",
    "vote_refusal",
]

#: Sent ahead of the first vote on a new connection (one round trip): is this node freshly restarted,
#: or another server than before? The persistence it reports now only feeds warnings.
PROBE: tuple[tuple[Any, ...], ...] = (
    ("INFO", "server"),
    ("INFO", "replication"),  # a separate INFO: Redis before 7.0 takes one section per call
    ("CONFIG", "GET", "appendonly"),
    ("CONFIG", "GET", "appendfsync"),
)


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

    __slots__ = ("last", "heard", "moved_at", "config_told", "_mutex", "__weakref__")

    def __init__(self) -> None:
        self.last: Restart | None = None
        #: Monotonic time a reply was last read on a connection probed to ``last``'s server (the
        #: books set it: see ``NodeBooks.book``), None: only its probe.
        self.heard: float | None = None
        #: Monotonic time the last failover was noticed (it happened before), None: never.
        self.moved_at: float | None = None
        #: Whether the log said that this server refuses CONFIG (said once per address, per process).
        self.config_told = False
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

    def tell_config_refused(self) -> bool:
        """True the first time only: the one caller that logs that this server refuses CONFIG."""
        with self._mutex:
            told, self.config_told = self.config_told, True
            return not told

    def replaced(self, now: float) -> None:
        """The data set at this address was replaced behind open connections (see
        :func:`replaced_token`): noticed at ``now``, it sits out as after a failover."""
        with self._mutex:
            self.moved_at = max(self.moved_at or now, now)


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

CONFIG_REFUSED = (
    "CONFIG GET is refused to the lock user (as on most managed services): locks work without it; only the "
    "persistence it runs cannot be read (whether it votes right after a restart follows its FSYNC_ALWAYS "
    "declaration alone, as always)"
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
    """How a node that sits out after a failover or a replaced data set is described everywhere."""
    return (
        f"another server answers at its address, or its data set was replaced, since {since:.0f} s ago "
        f"(a failover, a full resync, a flush: it may lack the last locks written); sits out for "
        f"{math.ceil(left)} s more {DELAYED_RESTART}"
    )


# -- the data set a vote counts on ------------------------------------------------------

REPLACED_DATASET = (
    "its data set was replaced behind open connections (a full resync as a replica, FLUSHALL, FLUSHDB, "
    "SWAPDB or a reload: its marker token changed); it may lack locks that are still valid"
)


def replaced_token(reply: Any) -> str | None:
    """The token a vote's refusal by ``scripts._GUARD`` names (another data set than the one the vote
    was sent for), else None."""
    if isinstance(reply, Exception):
        head, _, token = str(reply).partition(" ")
        if head == REPLACED and token:
            return token
    return None


def token_of(reply: Any) -> str | None:
    """The data-set token in a reply to ``scripts.DATASET`` (None: an error, e.g. on a replica)."""
    if isinstance(reply, bytes):
        return reply.decode("ascii", "replace")
    return reply if isinstance(reply, str) else None
