"""The engine's hooks: :class:`Hooks` (callbacks on lock events and measurements), what the
measurements carry, and how the engine calls them (a hook never breaks locking). No I/O."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol

from django_redlock.core.records import Holder

if TYPE_CHECKING:
    from django_redlock.exceptions import LockNotAcquired

__all__ = ["AcquireReport", "CombinedHooks", "HeldLock", "Hooks", "NodeSeen", "Outcome", "call_hook", "wants"]

#: How an ``acquire()`` call ended, in :class:`AcquireReport`.
Outcome = Literal["acquired", "locked", "no_quorum", "error"]


@dataclass(frozen=True)
class AcquireReport:
    """How one ``acquire()`` call that asked the nodes went (:meth:`Hooks.acquire_finished`)."""

    #: The lock's name (several resources: joined by ``", "``) and its resources.
    resource: str
    resources: tuple[str, ...]
    #: ``"acquired"``; ``"locked"`` (held elsewhere, or the validity ran out: ``LockNotAcquired``);
    #: ``"no_quorum"`` (too few nodes answered, or could vote: ``QuorumUnavailable``); ``"error"``
    #: (anything else ended the call: a cancellation, an interrupt).
    outcome: Outcome
    #: Seconds from the call's start to its end.
    seconds: float
    #: Of those, the seconds after a first vote that did not win: waiting in line, or for the nodes
    #: between retries (0.0 when the first vote won, and for a call that does not wait).
    waited: float
    #: The first vote found the lock held, or others ahead in line (enough nodes refused it).
    contended: bool
    #: Votes made.
    attempts: int


class NodeSeen(NamedTuple):
    """What one fan-out round showed of one node (:meth:`Hooks.nodes_seen`)."""

    #: The node's name (never with credentials).
    name: str
    #: It answered (a reply, an error reply, or a vote that does not count); False: it did not.
    up: bool
    #: True: its vote did not count under the delayed-restart rule (a restart or a failover);
    #: False: its vote counted, or the rule is off; None: this round does not tell.
    sitting_out: bool | None
    #: The round trip in seconds, when measured (not for a vote that waited in line).
    seconds: float | None


class HeldLock(Protocol):
    """What a hook is told about a lock: a :class:`~django_redlock.core.Lock` or an
    :class:`~django_redlock.core.AsyncLock`, as far as a hook may read it."""

    #: The lock's name (several resources: joined by ``", "``), its resources and its (first) key.
    resource: str
    resources: tuple[str, ...]
    key: str
    #: Who holds it (token, host, pid, label).
    holder: Holder
    #: The last ttl asked for, and how many times it was extended.
    ttl: float
    extensions: int
    lost: bool
    lost_reason: str | None
    released: bool

    @property
    def validity(self) -> float: ...

    def locked(self) -> bool: ...


class Hooks:
    """Callbacks the engine runs on lock events. Subclass and override what you need.

    A hook must be quick and must not raise; exceptions from hooks are swallowed
    so that they can never leave a lock behind. A hook runs on the thread that saw the
    event: ``extended`` and ``lost`` of an auto-extended lock on the watchdog thread, which
    extends no other lock while a hook runs.

    The last three report measurements (for metrics, see :doc:`metrics`). The engine does the
    extra work they need (a clock read, timing each node's reply) only for hooks that override
    them.
    """

    def acquired(self, lock: HeldLock) -> None:
        """A lock was acquired on a quorum."""

    def released(self, lock: HeldLock) -> None:
        """A lock was released."""

    def extended(self, lock: HeldLock) -> None:
        """A lock's ttl was extended on a quorum."""

    def recreated(self, lock: HeldLock, nodes: Sequence[str]) -> None:
        """An extension that held set the lock's key again on these nodes (by name): each had lost it
        (a restart, an expiry while it was stopped) and may vote again. Runs before ``extension_finished``."""

    def lost(self, lock: HeldLock, reason: str) -> None:
        """A held lock was found expired or taken over."""

    def not_acquired(self, resource: str, error: LockNotAcquired) -> None:
        """An acquisition gave up."""

    def acquire_finished(self, report: AcquireReport) -> None:
        """An ``acquire()`` call that asked the nodes ended: right before ``acquired`` runs, or right
        after ``not_acquired``.

        Not called for a ``reentrant=True`` call that entered a lock already held, which asks no node.
        """

    def extension_finished(self, lock: HeldLock, automatic: bool, extended: bool) -> None:
        """An extension's replies were judged: by the keep-alive (``automatic``) or by ``extend()``;
        ``extended``: it held on a quorum (then ``extended`` ran first)."""

    def nodes_seen(self, seen: Sequence[NodeSeen]) -> None:
        """A fan-out round ended: what it showed of each node it heard from, or failed to.

        A node the round did not wait for (the outcome was known first) is left out.
        """


class CombinedHooks(Hooks):
    """Several hooks as one: each event goes to each of them in turn, and one that raises does not
    keep the others from running (its exception is logged)."""

    def __init__(self, *hooks: Hooks) -> None:
        for item in hooks:
            if not isinstance(item, Hooks):
                raise ValueError(f"CombinedHooks takes Hooks instances; got {type(item).__name__}.")
        self.hooks = hooks

    def _each(self, name: str, *args: Any) -> None:
        for item in self.hooks:
            call_hook(item, name, *args)

    def acquired(self, lock: HeldLock) -> None:
        self._each("acquired", lock)

    def released(self, lock: HeldLock) -> None:
        self._each("released", lock)

    def extended(self, lock: HeldLock) -> None:
        self._each("extended", lock)

    def recreated(self, lock: HeldLock, nodes: Sequence[str]) -> None:
        self._each("recreated", lock, nodes)

    def lost(self, lock: HeldLock, reason: str) -> None:
        self._each("lost", lock, reason)

    def not_acquired(self, resource: str, error: LockNotAcquired) -> None:
        self._each("not_acquired", resource, error)

    def acquire_finished(self, report: AcquireReport) -> None:
        self._each("acquire_finished", report)

    def extension_finished(self, lock: HeldLock, automatic: bool, extended: bool) -> None:
        self._each("extension_finished", lock, automatic, extended)

    def nodes_seen(self, seen: Sequence[NodeSeen]) -> None:
        self._each("nodes_seen", seen)


def wants(hooks: Hooks | None, name: str) -> bool:
    """Whether ``hooks`` does anything on the event ``name`` (overrides it, or combines hooks that do)."""
    if hooks is None:
        return False
    if isinstance(hooks, CombinedHooks):
        return any(wants(item, name) for item in hooks.hooks)
    return getattr(type(hooks), name, None) is not getattr(Hooks, name)


def call_hook(hooks: Hooks | None, name: str, *args: Any) -> None:
    if hooks is None:
        return
    try:
        getattr(hooks, name)(*args)
    except Exception:  # noqa: BLE001 - a hook must never break locking
        import logging

        logging.getLogger("django_redlock").exception("redlock hook %s failed", name)
