"""The held lock: its state, a record (validity on the monotonic clock, extensions, loss, release); the
plain functions that judge it and the nodes' replies about it; the locks a manager holds in this process.
No I/O.

:class:`LockBase` is what the steps act on and the hooks are told about; the handles
(:class:`~django_redlock.core.lock.Lock`, :class:`~django_redlock.core.async_manager.AsyncLock`) add the calls.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from django_redlock.core import base, forks, owners
from django_redlock.core.config import ManagerConfig
from django_redlock.core.records import Holder
from django_redlock.core.books import Failure
from django_redlock.exceptions import LockError, LockLost, LockNotAcquired, QuorumUnavailable

__all__ = [
    "HeldLocks",
    "LockBase",
    "Manager",
    "can_ask",
    "check_extendable",
    "check_fence_written",
    "extend_timeout",
    "forked",
    "gone_from_quorum",
    "is_ours",
    "judge_extend",
    "judge_owned",
    "judge_release",
    "lend",
    "loss_to_report",
    "mark_lost",
    "owned_error",
    "read_command",
    "start_release",
]

logger = logging.getLogger("django_redlock")


class Manager(Protocol):
    """What a held lock asks of the manager that granted it."""

    config: ManagerConfig
    quorum: int
    _held: HeldLocks

    @property
    def node_list(self) -> Sequence[Any]: ...

    def _forget(self, lock: Any) -> None: ...


_Self = TypeVar("_Self", bound="LockBase")


class LockBase:
    """A held lock's state: the record :class:`Lock` and :class:`~django_redlock.core.async_manager.AsyncLock`
    build on. The functions below this class judge it; it has no judgements of its own."""

    manager: Manager

    def __init__(
        self,
        manager: Any,
        resources: tuple[str, ...],
        holder: Holder,
        ttl: float,
        started: float,
        place: str = "",
        value: str | None = None,
        keys: tuple[str, ...] | None = None,
        resource: str | None = None,
        deadline: float | None = None,
    ) -> None:
        """``value``, ``keys``, ``resource`` and ``deadline``: the encoded holder, the resources' keys,
        their name and when the validity ends, when already known (by default, the ttl from
        ``started`` less the drift)."""
        self.manager = manager
        # The acquire call's place in the nodes' waiting lines: the release leaves it.
        self._place = place
        #: The resources held, sorted: one, or several taken all or nothing.
        self.resources = resources
        #: The name callers lock, e.g. ``"invoice-42"`` (several: ``"invoice-1, invoice-2"``).
        self.resource = resource or base.name_of(resources)
        #: The Redis key of each resource, on every node.
        self.keys: tuple[str, ...] = keys or tuple(manager.config.key(r) for r in resources)
        #: The Redis key of the (first) resource.
        self.key: str = self.keys[0]
        #: Who holds it (token, host, pid, label).
        self.holder = holder
        #: The value stored on the nodes (the encoded holder).
        self.value = value or holder.encode()
        #: Seconds the keys live on the nodes (the last ttl asked for).
        self.ttl = ttl
        self._deadline: float = started + ttl - manager.config.drift(ttl) if deadline is None else deadline
        #: How many times the lock was extended (by :meth:`extend` or automatically).
        self.extensions = 0
        # The caller's own extensions: only these count against max_extensions.
        self._counted_extensions = 0
        #: True once the lock is known to be expired or taken over.
        self.lost = False
        self.lost_reason: str | None = None
        #: Set by a holder that reports a loss itself (a management command's error line): the loss
        #: is then not logged as well, so it is told once.
        self.reports_own_loss = False
        #: True once :meth:`release` ran.
        self.released = False
        self.max_extensions: int | None = manager.config.max_extensions
        self._fencing_token: int | None = None
        self._state = threading.Lock()
        self._pid = os.getpid()
        self._clock: Callable[[], float] = manager.config.clock
        self._acquired_at = started
        # Who acquired it, and how many times it was entered (reentrant=True); see HeldLocks.
        owner, self._owner_name = owners.callers(True)[0]  # caller(), without the call
        self._owner = weakref.ref(owner)
        self._depth = 1
        # A call within the owner that entered it (lent to one such call at a time), and how often.
        self._borrower: weakref.ref[Any] | None = None
        self._borrowed = 0
        # What keeps it alive when acquired with auto_extend (the asyncio manager's task), if anything.
        self._keeper: Any = None
        # Set by the watchdog: called once with the lock when it is marked lost while held.
        self._lost_listener: Callable[[Any], None] | None = None

    @classmethod
    def granted(cls: type[_Self], manager: Any, plan: base.Attempts) -> _Self:
        """The lock an acquire call won (``plan``): valid until the plan says, which a grant in line
        that was not extended on a quorum bounds by its provisional ttl."""
        return cls(
            manager, plan.resources, plan.holder, plan.ttl, plan.started, plan.place, plan.value, plan.keys,
            plan.resource, plan.valid_until,
        )

    @property
    def token(self) -> str:
        """The unique random token of this holder (40 hex digits, 20 bytes from :func:`os.urandom`, as :mod:`secrets` reads them)."""
        return self.holder.token

    @property
    def validity(self) -> float:
        """Seconds this holder may still act as the owner (monotonic clock, 0.0 when expired)."""
        return max(0.0, self._deadline - self._clock())

    def locked(self) -> bool:
        """True while the lock is valid: not released, not lost, validity left.

        Always False in a forked child: the parent holds the lock, not the child.
        """
        return not (self.released or self.lost or forked(self)) and self.validity > 0

    def __repr__(self) -> str:
        state = "released" if self.released else "lost" if self.lost else f"valid {self.validity:.3f}s"
        return f"<{type(self).__name__} {self.resource!r} {state}>"


def forked(lock: LockBase) -> bool:
    """True in a child forked after ``lock`` was acquired."""
    return os.getpid() != lock._pid


def mark_lost(lock: LockBase, reason: str, *, while_held: bool = False) -> bool:
    """Record the loss once (logged, and told to the hooks); return True the first time.

    ``while_held``: the evidence predates a release only if the lock was not
    released yet, so a released lock is left alone.
    """
    if forked(lock):
        return False
    with lock._state:
        if lock.lost or (while_held and lock.released):
            return False
        lock.lost = True
        lock.lost_reason = reason
        listener = lock._lost_listener
    if not lock.reports_own_loss:
        logger.error("Lock %r was lost: %s (holder digest %s)", lock.resource, reason, lock.holder.digest)
    base.call_hook(lock.manager.config.hooks, "lost", lock, reason)
    if listener is not None:
        listener(lock)
    return True


def is_ours(lock: LockBase, reply: object) -> bool:
    """A node's read (see :func:`read_command`) shows this holder's value on every key."""
    if type(reply) is list:
        return all(is_ours(lock, r) for r in reply)
    return reply == lock.value.encode() or reply == lock.value


def read_command(lock: LockBase) -> tuple[Any, ...]:
    """The read :func:`is_ours` judges: every key's value."""
    return ("MGET", *lock.keys)


def gone_from_quorum(lock: LockBase, gone: int) -> bool:
    """True when ``gone`` nodes answering "not ours" leave too few to make a quorum."""
    return gone > len(lock.manager.node_list) - lock.manager.quorum


def extend_timeout(lock: LockBase) -> float:
    # Waiting past the validity is useless: a late extension does not count.
    return max(0.001, min(lock.manager.config.node_timeout, lock.validity))


def can_ask(lock: LockBase) -> bool:
    """False when ``lock.owned()`` can answer without the nodes (released, lost, expired, forked)."""
    if lock.released or lock.lost or forked(lock):
        return False
    if lock.validity <= 0:
        mark_lost(lock, "it expired while held", while_held=True)
        return False
    return True


def judge_owned(lock: LockBase, results: list[Any]) -> bool | None:
    """Judge GET replies: True (a quorum stores our value), False (lost), None (too few answers)."""
    ours = gone = 0
    for reply in results:  # one pass: each reply judged once
        if isinstance(reply, Failure):
            continue
        if is_ours(lock, reply):
            ours += 1
        else:
            gone += 1
    total = len(lock.manager.node_list)
    if ours >= lock.manager.quorum:
        if lock.validity > 0:
            return True
        mark_lost(lock, "it expired while held", while_held=True)
        return False
    if gone_from_quorum(lock, gone):
        reason = (
            f"{gone} of {total} nodes no longer store this holder's value "
            "(force-released, expired early or taken over)"
        )
        mark_lost(lock, reason, while_held=True)
        return False
    return None


def owned_error(lock: LockBase, results: list[Any]) -> QuorumUnavailable:
    manager = lock.manager
    total = len(manager.node_list)
    ours_here = functools.partial(is_ours, lock)
    failures = base.failures_of(manager.node_list, results, "does not store this holder's value", ours_here)
    detail = "; ".join(f"{k}: {v}" for k, v in failures.items())
    ours = base.count(results, ours_here)
    return QuorumUnavailable(
        f"Cannot tell whether lock {lock.resource!r} is still held: {ours} of {total} nodes store it, "
        f"{manager.quorum} needed, and too few answered to rule it out ({detail}).",
        resource=lock.resource,
        granted=ours,
        quorum=manager.quorum,
        total=total,
        failures=failures,
    )


def loss_to_report(lock: LockBase, raised: bool = False) -> LockLost | None:
    """The one rule for reporting a loss, asked once the lock is released: the error telling the
    holder's caller it ran without its lock, or None.

    None when the lock was not lost, in a forked child (the parent holds it), and when the held
    code raised (``raised``): its own exception goes on, the loss was logged and sent to the
    ``lost`` hook. Every hold asks it (``with``, ``async with``, ``@redlock``, ``RedlockMixin``,
    ``@redlock_command``, ``@redlock_task``): a lost lock is never only a log line.
    """
    if raised or not lock.lost or forked(lock):
        return None
    return base.lost_error(lock.resource, lock.lost_reason or "it expired while held")


def check_extendable(lock: LockBase, ttl: Any, counted: bool) -> float:
    if forked(lock):
        raise LockError(
            f"Lock {lock.resource!r} belongs to process {lock._pid}; a forked child does not hold it.",
            resource=lock.resource,
        )
    if lock.released:
        raise LockError(f"Lock {lock.resource!r} was released; acquire it again.", resource=lock.resource)
    if lock.lost:
        raise base.lost_error(lock.resource, lock.lost_reason or "it was marked lost")
    limit = lock.max_extensions
    if counted and limit is not None and lock._counted_extensions >= limit:
        raise extension_limit_error(lock, limit)
    new_ttl = lock.manager.config.lock_ttl(ttl, lock.ttl)  # never above max_ttl
    if lock.validity <= 0:
        reason = "it expired before it could be extended"
        mark_lost(lock, reason, while_held=True)
        raise base.lost_error(lock.resource, reason)
    return new_ttl


def judge_extend(
    lock: LockBase, results: list[Any], started: float, old_deadline: float, ttl: float, counted: bool
) -> None:
    """Apply an EXTEND fan-out's replies; raise :class:`LockLost` when it did not hold."""
    manager = lock.manager
    quorum = manager.quorum
    total = len(manager.node_list)
    if lock.released:  # released while the EXTEND was on the wire: its replies mean nothing
        raise LockError(f"Lock {lock.resource!r} was released during the extension.", resource=lock.resource)
    extended = base.count(results, base.extended)
    if base.extension_held(results, quorum, lock._clock(), old_deadline):
        lock.ttl = ttl
        lock._deadline = started + ttl - manager.config.drift(ttl)
        lock.extensions += 1
        lock._counted_extensions += int(counted)
        base.call_hook(manager.config.hooks, "extended", lock)
        return
    gone = base.count(results, base.key_gone)
    detail = "; ".join(f"{k}: {v}" for k, v in base.failures_of(manager.node_list, results, "key gone", base.extended).items())
    if gone_from_quorum(lock, gone) or lock.validity <= 0:
        if gone_from_quorum(lock, gone) and extended >= quorum:  # set again where lost: not kept
            reason = (
                f"{gone} of {total} nodes no longer stored this holder's value "
                "(force-released, expired early or taken over)"
            )
        elif extended >= quorum:
            reason = f"its validity ran out before the extension's replies were in ({extended} of {total} agreed)"
        else:
            reason = f"extension reached {extended} of {total} nodes, {quorum} needed ({detail})"
        if not mark_lost(lock, reason, while_held=True) and lock.released:
            raise LockError(f"Lock {lock.resource!r} was released during the extension.", resource=lock.resource)
        raise base.lost_error(lock.resource, lock.lost_reason or reason)
    raise LockLost(
        f"Could not extend lock {lock.resource!r}: {extended} of {total} nodes agreed, {quorum} needed "
        f"({detail}); it stays valid for {lock.validity * 1000:.0f} ms unless extended.",
        resource=lock.resource,
    )


def judge_release(lock: LockBase, results: list[Any]) -> bool:
    """True when a quorum deleted the key. Only "not ours" from enough nodes marks it lost:
    a missing reply is no proof."""
    deleted = gone = 0
    for reply in results:  # one loop, no call per reply
        if reply is None or isinstance(reply, Failure):
            continue
        if reply == 1:
            deleted += 1
        elif reply == 0:
            gone += 1
    if gone_from_quorum(lock, gone):
        total = len(lock.manager.node_list)
        mark_lost(
            lock,
            f"at release {gone} of {total} nodes no longer stored this holder's value "
            "(force-released, expired early or taken over)"
        )
    hooks = lock.manager.config.hooks
    if hooks is not None:  # no call when there are none: this is every release
        base.call_hook(hooks, "released", lock)
    return deleted >= lock.manager.quorum


def start_release(lock: LockBase) -> bool | None:
    """Leave one entry: None when an outer entry (``reentrant=True``) still holds the lock; else
    mark it released and return True, or False when it already was (or in a forked child).

    Both happen in one critical section with :meth:`HeldLocks.enter`'s check, so nobody
    enters a lock that is being released. Flags an expired lock as lost, at an inner entry's
    exit too. From here on the watchdog no longer watches it nor reports its losses.
    """
    if forked(lock):
        return False
    with lock._state:
        if lock.released:
            return False
        inner = lock._depth > 1
        if inner:
            lock._depth -= 1
            if lock._borrowed and lock._owner() is not owners.caller()[0]:
                lock._borrowed -= 1  # only the one call it is lent to holds entries besides the owner
        else:
            lock.released = True
    if inner:
        # The entry's code ran past the validity: its exit reports the loss, not only the outermost.
        if not lock.lost and lock._deadline <= lock._clock():
            mark_lost(lock, "it expired while held", while_held=True)
        return None
    if lock._lost_listener is not None:  # the watchdog watches it (auto_extend): it stops
        lock._lost_listener = None
        lock.manager._forget(lock)
    lock.manager._held.discard(lock)
    if not lock.lost and lock._deadline <= lock._clock():
        mark_lost(lock, "it expired before it was released")
    return True


def lend(lock: LockBase, caller: Any) -> bool:
    """May ``caller`` (the owner, or a call within it) enter now? A call within the owner (a view
    run for its middleware) borrows the lock; two such calls side by side (tasks gathered
    there) never hold it at once. Under ``lock._state``."""
    if lock._owner() is caller:
        return True
    if not lock._borrowed:
        lock._borrower, lock._borrowed = weakref.ref(caller), 1
        return True
    if lock._borrower is not None and lock._borrower() is caller:
        lock._borrowed += 1
        return True
    return False  # lent to another call until it releases (a call that ended keeps it till then)


class HeldLocks:
    """The locks a manager holds in this process, and who acquired each (held weakly).

    It answers two questions an ``acquire()`` asks before it votes: does the
    caller itself already hold one of these resources (then waiting would be
    waiting for itself), and does another thread or task of this process?
    """

    def __init__(self) -> None:
        self._locks: weakref.WeakSet[LockBase] = weakref.WeakSet()
        self._mutex = forks.mutex(self, "_mutex")

    def add(self, lock: LockBase) -> None:
        with self._mutex:
            self._locks.add(lock)

    def discard(self, lock: LockBase) -> None:
        with self._mutex:
            self._locks.discard(lock)

    def overlapping(self, resources: tuple[str, ...]) -> list[LockBase]:
        """Valid locks of this process that hold any of ``resources``."""
        wanted = set(resources)
        with self._mutex:
            held = list(self._locks)
        return [lock for lock in held if lock.locked() and not wanted.isdisjoint(lock.resources)]

    @staticmethod
    def _mine(held: list[LockBase]) -> tuple[list[LockBase], Any, str]:
        """Those of ``held`` the caller or a call it runs within owns (a sync view under a sync
        middleware, through async_to_sync), the caller and its name; looked up only when some are held."""
        if not held:
            return [], None, ""
        calling = list(owners.callers())
        mine = [lock for lock in held if any(lock._owner() is owner for owner, _ in calling)]
        return mine, calling[0][0], calling[0][1]

    def enter(self, resources: tuple[str, ...]) -> LockBase | None:
        """The caller's own lock on ``resources``, entered once more (``reentrant=True``); else None.

        Raises :class:`~django_redlock.exceptions.LockNotAcquired` when the
        caller holds only part of the set: it would wait for itself.
        """
        mine, me, name = self._mine(self.overlapping(resources))
        if not mine:
            return None
        covering = [lock for lock in mine if set(resources) <= set(lock.resources)]
        for lock in covering:
            with lock._state:  # entered only while still held: a release may have just begun
                if not (lock.released or lock.lost) and lock.validity > 0 and lend(lock, me):
                    lock._depth += 1
                    return lock
        if covering:
            return None  # released meanwhile: acquire it as anyone would
        lock = mine[0]
        wanted = base.name_of(resources)
        raise LockNotAcquired(
            f"Could not lock {wanted!r}: this very {name} holds {lock.resource!r}, which covers only part of it, and would "
            "wait for itself. Lock the whole set in one call from the start.",
            resource=wanted,
            quorum=lock.manager.quorum,
            total=len(lock.manager.node_list),
            retry_after=lock.validity,
        )

    def note(self, resources: tuple[str, ...]) -> str:
        """For a failure: who in this process holds any of ``resources`` ("" when nobody)."""
        held = self.overlapping(resources)
        if not held:
            return ""
        mine, _me, name = self._mine(held)
        if mine:
            lock = mine[0]
            return (
                f"It is held by this very {name} (lock {lock.resource!r}, acquired "
                f"{lock._clock() - lock._acquired_at:.3f} s ago). Locks are not reentrant: use the Lock you "
                "hold, or pass reentrant=True to enter it again (only the outermost release then releases it)."
            )
        return f"This process holds {held[0].resource!r}, in {held[0]._owner_name}."


def check_fence_written(lock: LockBase, writes: Sequence[Any], token: int, quorum: int) -> None:
    """Accept ``token`` only if a quorum now stores it (or more) and the lock is still valid."""
    acked = base.count(writes, lambda r: isinstance(r, int) and r >= token)
    if acked < quorum:
        raise base.lost_error(
            lock.resource, f"the fencing token reached {acked} nodes, {quorum} needed; no token was issued"
        )
    if not lock.locked():
        reason = "it expired while its fencing token was written"
        mark_lost(lock, reason)
        raise base.lost_error(lock.resource, reason)


def extension_limit_error(lock: LockBase, limit: int) -> LockError:
    return LockError(
        f"Lock {lock.resource!r} has been extended {limit} times, the limit (max_extensions); "
        "release it and acquire again, or raise the limit.",
        resource=lock.resource,
    )
