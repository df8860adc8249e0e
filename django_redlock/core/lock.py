"""A held lock: validity on the monotonic clock, extension, release, fencing."""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from django_redlock.core import base, owners, steps
from django_redlock.core.rounds import Failure
from django_redlock.core.records import Holder
from django_redlock.exceptions import LockError, LockLost, QuorumUnavailable

if TYPE_CHECKING:
    from django_redlock.core.sync_manager import LockManager, ManagerBase

__all__ = ["Lock", "LockBase"]

logger = logging.getLogger("django_redlock")

_Self = TypeVar("_Self", bound="LockBase")


class LockBase:
    """State shared by :class:`Lock` and :class:`~django_redlock.core.async_manager.AsyncLock`."""

    manager: ManagerBase

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
    ) -> None:
        """``value`` and ``keys``: the encoded holder and the resources' keys, when already known."""
        self.manager = manager
        # The acquire call's place in the nodes' waiting lines: the release leaves it.
        self._place = place
        #: The resources held, sorted: one, or several taken all or nothing.
        self.resources = resources
        #: The name callers lock, e.g. ``"invoice-42"`` (several: ``"invoice-1, invoice-2"``).
        self.resource = base.name_of(resources)
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
        self._deadline: float = started + ttl - manager.config.drift(ttl)
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
        owner, self._owner_name = owners.caller()
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
        lock = cls(manager, plan.resources, plan.holder, plan.ttl, plan.started, plan.place, plan.value, plan.keys)
        lock._deadline = plan.valid_until
        return lock

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
        return not (self.released or self.lost or self._forked()) and self.validity > 0

    def _forked(self) -> bool:
        """True in a child forked after this lock was acquired."""
        return os.getpid() != self._pid

    def _mark_lost(self, reason: str, *, while_held: bool = False) -> bool:
        """Record the loss once (logged, and told to the hooks); return True the first time.

        ``while_held``: the evidence predates a release only if the lock was not
        released yet, so a released lock is left alone.
        """
        if self._forked():
            return False
        with self._state:
            if self.lost or (while_held and self.released):
                return False
            self.lost = True
            self.lost_reason = reason
            listener = self._lost_listener
        if not self.reports_own_loss:
            logger.error("Lock %r was lost: %s (holder digest %s)", self.resource, reason, self.holder.digest)
        base.call_hook(self.manager.config.hooks, "lost", self, reason)
        if listener is not None:
            listener(self)
        return True

    def _is_ours(self, reply: object) -> bool:
        """A node's read (see :meth:`_read_command`) shows this holder's value on every key."""
        if type(reply) is list:
            return all(self._is_ours(r) for r in reply)
        return reply == self.value.encode() or reply == self.value

    def _read_command(self) -> tuple[Any, ...]:
        return ("MGET", *self.keys)

    def _gone_from_quorum(self, gone: int) -> bool:
        """True when ``gone`` nodes answering "not ours" leave too few to make a quorum."""
        return gone > len(self.manager.node_list) - self.manager.quorum

    def _extend_timeout(self) -> float:
        # Waiting past the validity is useless: a late extension does not count.
        return max(0.001, min(self.manager.config.node_timeout, self.validity))

    def _can_ask(self) -> bool:
        """False when :meth:`owned` can answer without the nodes (released, lost, expired, forked)."""
        if self.released or self.lost or self._forked():
            return False
        if self.validity <= 0:
            self._mark_lost("it expired while held", while_held=True)
            return False
        return True

    def _judge_owned(self, results: list[Any]) -> bool | None:
        """Judge GET replies: True (a quorum stores our value), False (lost), None (too few answers)."""
        ours = base.count(results, self._is_ours)
        gone = sum(1 for r in results if not isinstance(r, Failure) and not self._is_ours(r))
        total = len(self.manager.node_list)
        if ours >= self.manager.quorum:
            if self.validity > 0:
                return True
            self._mark_lost("it expired while held", while_held=True)
            return False
        if self._gone_from_quorum(gone):
            reason = (
                f"{gone} of {total} nodes no longer store this holder's value "
                "(force-released, expired early or taken over)"
            )
            self._mark_lost(reason, while_held=True)
            return False
        return None

    def _owned_error(self, results: list[Any]) -> QuorumUnavailable:
        manager = self.manager
        total = len(manager.node_list)
        failures = base.failures_of(manager.node_list, results, "does not store this holder's value", self._is_ours)
        detail = "; ".join(f"{k}: {v}" for k, v in failures.items())
        ours = base.count(results, self._is_ours)
        return QuorumUnavailable(
            f"Cannot tell whether lock {self.resource!r} is still held: {ours} of {total} nodes store it, "
            f"{manager.quorum} needed, and too few answered to rule it out ({detail}).",
            resource=self.resource,
            granted=ours,
            quorum=manager.quorum,
            total=total,
            failures=failures,
        )

    def _loss_to_report(self, raised: bool = False) -> LockLost | None:
        """The one rule for reporting a loss, asked once the lock is released: the error telling the
        holder's caller it ran without its lock, or None.

        None when the lock was not lost, in a forked child (the parent holds it), and when the held
        code raised (``raised``): its own exception goes on, the loss was logged and sent to the
        ``lost`` hook. Every hold asks it (``with``, ``async with``, ``@redlock``, ``RedlockMixin``,
        ``@redlock_command``, ``@redlock_task``): a lost lock is never only a log line.
        """
        if raised or not self.lost or self._forked():
            return None
        return base.lost_error(self.resource, self.lost_reason or "it expired while held")

    def _check_extendable(self, ttl: Any, counted: bool) -> float:
        if self._forked():
            raise LockError(
                f"Lock {self.resource!r} belongs to process {self._pid}; a forked child does not hold it.",
                resource=self.resource,
            )
        if self.released:
            raise LockError(f"Lock {self.resource!r} was released; acquire it again.", resource=self.resource)
        if self.lost:
            raise base.lost_error(self.resource, self.lost_reason or "it was marked lost")
        limit = self.max_extensions
        if counted and limit is not None and self._counted_extensions >= limit:
            raise base.extension_limit_error(self, limit)
        new_ttl = self.manager.config.lock_ttl(ttl, self.ttl)  # never above max_ttl
        if self.validity <= 0:
            reason = "it expired before it could be extended"
            self._mark_lost(reason, while_held=True)
            raise base.lost_error(self.resource, reason)
        return new_ttl

    def _judge_extend(
        self, results: list[Any], started: float, old_deadline: float, ttl: float, counted: bool
    ) -> None:
        """Apply an EXTEND fan-out's replies; raise :class:`LockLost` when it did not hold."""
        manager = self.manager
        quorum = manager.quorum
        total = len(manager.node_list)
        if self.released:  # released while the EXTEND was on the wire: its replies mean nothing
            raise LockError(f"Lock {self.resource!r} was released during the extension.", resource=self.resource)
        extended = base.count(results, base.extended)
        if base.extension_held(results, quorum, self._clock(), old_deadline):
            self.ttl = ttl
            self._deadline = started + ttl - manager.config.drift(ttl)
            self.extensions += 1
            self._counted_extensions += int(counted)
            base.call_hook(manager.config.hooks, "extended", self)
            return
        gone = base.count(results, base.key_gone)
        detail = "; ".join(f"{k}: {v}" for k, v in base.failures_of(manager.node_list, results, "key gone", base.extended).items())
        if self._gone_from_quorum(gone) or self.validity <= 0:
            if self._gone_from_quorum(gone) and extended >= quorum:  # set again where lost: not kept
                reason = (
                    f"{gone} of {total} nodes no longer stored this holder's value "
                    "(force-released, expired early or taken over)"
                )
            elif extended >= quorum:
                reason = f"its validity ran out before the extension's replies were in ({extended} of {total} agreed)"
            else:
                reason = f"extension reached {extended} of {total} nodes, {quorum} needed ({detail})"
            if not self._mark_lost(reason, while_held=True) and self.released:
                raise LockError(f"Lock {self.resource!r} was released during the extension.", resource=self.resource)
            raise base.lost_error(self.resource, self.lost_reason or reason)
        raise LockLost(
            f"Could not extend lock {self.resource!r}: {extended} of {total} nodes agreed, {quorum} needed "
            f"({detail}); it stays valid for {self.validity * 1000:.0f} ms unless extended.",
            resource=self.resource,
        )

    def _judge_release(self, results: list[Any]) -> bool:
        """True when a quorum deleted the key. Only "not ours" from enough nodes marks it lost:
        a missing reply is no proof."""
        deleted = base.count(results, lambda r: r == 1)
        gone = sum(1 for r in results if not isinstance(r, Failure) and r == 0)
        if self._gone_from_quorum(gone):
            total = len(self.manager.node_list)
            self._mark_lost(
                f"at release {gone} of {total} nodes no longer stored this holder's value "
                "(force-released, expired early or taken over)"
            )
        base.call_hook(self.manager.config.hooks, "released", self)
        return deleted >= self.manager.quorum

    def _start_release(self) -> bool | None:
        """Leave one entry: None when an outer entry (``reentrant=True``) still holds the lock; else
        mark it released and return True, or False when it already was (or in a forked child).

        Both happen in one critical section with :meth:`HeldLocks.enter`'s check, so nobody
        enters a lock that is being released. Flags an expired lock as lost, at an inner entry's
        exit too. From here on the watchdog no longer reports losses.
        """
        if self._forked():
            return False
        with self._state:
            if self.released:
                return False
            inner = self._depth > 1
            if inner:
                self._depth -= 1
                if self._borrowed and self._owner() is not owners.caller()[0]:
                    self._borrowed -= 1  # only the one call it is lent to holds entries besides the owner
            else:
                self.released = True
        if inner:
            # The entry's code ran past the validity: its exit reports the loss, not only the outermost.
            if not self.lost and self._deadline <= self._clock():
                self._mark_lost("it expired while held", while_held=True)
            return None
        self._lost_listener = None
        self.manager._held.discard(self)
        if not self.lost and self._deadline <= self._clock():
            self._mark_lost("it expired before it was released")
        return True

    def _lend(self, caller: Any) -> bool:
        """May ``caller`` (the owner, or a call within it) enter now? A call within the owner (a view
        run for its middleware) borrows the lock; two such calls side by side (tasks gathered
        there) never hold it at once. Under ``self._state``."""
        if self._owner() is caller:
            return True
        if not self._borrowed:
            self._borrower, self._borrowed = weakref.ref(caller), 1
            return True
        if self._borrower is not None and self._borrower() is caller:
            self._borrowed += 1
            return True
        return False  # lent to another call until it releases (a call that ended keeps it till then)

    def __repr__(self) -> str:
        state = "released" if self.released else "lost" if self.lost else f"valid {self.validity:.3f}s"
        return f"<{type(self).__name__} {self.resource!r} {state}>"


class Lock(LockBase):
    """A Redlock held on a quorum of nodes. Use as a context manager or call :meth:`release`.

    Nothing is released from ``__del__``: a lock that is dropped without
    release simply expires after its ttl.
    """

    manager: LockManager

    def extend(self, ttl: float | None = None) -> None:
        """Make the keys live ``ttl`` more seconds (default: the current ttl) on a quorum.

        A key that already lives longer is left as it is: another handle on
        the same lock (:meth:`LockManager.adopt`) may count on that.

        The extension counts only if a quorum of nodes still held this holder's
        key and agreed before the current validity ran out. Raises
        :class:`~django_redlock.exceptions.LockLost` otherwise (``lost`` is set
        when a quorum no longer holds the key or the validity is gone).
        """
        self._extend(ttl, automatic=False)

    def _extend(self, ttl: float | None, *, automatic: bool) -> None:
        self.manager._run(self.manager._extending(self, ttl, automatic))

    def release(self) -> bool:
        """Delete this holder's key on every node (never another holder's).

        Idempotent. Returns True when a quorum of nodes still held the key, as
        soon as a quorum confirmed the deletion (or every node answered): the
        other nodes' replies are read on their next use, and a node that does
        not confirm owes the release until its key has surely expired.
        Never raises: a key that could not be deleted expires. When enough
        nodes answer that they no longer store this holder's value (the lock
        was force-released, expired or taken over), ``lost`` is set with a
        ``lost_reason``, and leaving a ``with`` block raises
        :class:`~django_redlock.exceptions.LockLost`. Nodes that do not answer
        are no such proof. In a forked child it does nothing and returns False.
        A lock entered again with ``reentrant=True`` is released by its
        outermost release; the inner ones return True and keep it.
        """
        # The whole step, its hooks' log lines too, is one engine call: a command's stop waits for it
        # (one landing in a log line's ``with`` can leave the logging module's mutex held).
        return self.manager._release(self)

    def owned(self) -> bool:
        """Ask the nodes whether this holder still holds the lock.

        One GET on every node: True when a quorum stores this holder's value
        and validity is left. False when released, expired, or enough nodes
        answer without it; that also sets ``lost`` (and calls ``on_lost`` of
        an auto-extended lock). Raises
        :class:`~django_redlock.exceptions.QuorumUnavailable` when too few
        nodes answer to tell.
        """
        return cast(bool, self.manager._run(steps.owned(self)))

    def _check_owned(self) -> None:
        """The watchdog's look (:func:`~django_redlock.core.steps.check_owned`)."""
        self.manager._run(steps.check_owned(self))

    @property
    def fencing_token(self) -> int:
        """A number that strictly increases with each acquisition of this resource.

        Computed on first access (two fan-outs), then cached. Pass it to the
        storage you protect and have the storage reject writes that carry a
        token lower than the highest it has seen. A lock on several
        resources has one token, higher than every earlier token of each
        member. A handle from :meth:`~django_redlock.core.LockManager.adopt` returns the token
        passed to it as ``fencing_token``, else issues a new, higher one.

        How: read the resource's counter on the nodes and take the highest
        value from any quorum, plus one; write it back to a quorum with a
        "raise, never lower" script; then check this lock is still valid.
        A later holder acquires only after this lock's validity ended, so after
        the write reached a quorum; any quorum it reads from shares a node with
        that one, so it reads at least this token and picks a higher one.

        Tokens are also never below the wall clock in microseconds, so if
        counters are lost with nodes restarted empty, later tokens still move
        forward as long as client clocks do not step back by more than the
        time between the two acquisitions. Store them in a 64-bit column.
        Raises :class:`~django_redlock.exceptions.LockLost` when the lock
        expired before the token was safely written.
        """
        if self._fencing_token is None:
            self._fencing_token = cast(int, self.manager._run(self.manager._fencing(self)))
        return self._fencing_token

    def __enter__(self) -> Lock:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()
        error = self._loss_to_report(exc_type is not None)
        if error is not None:
            raise error


_L = TypeVar("_L", bound="LockBase")


class ContextBase(Generic[_L]):
    """A hold: ``manager.lock(...)``'s arguments, checked before anything is acquired, and the lock
    once entered. It owns the lock's whole life: acquire (waiting, reentrancy, several resources),
    keep-alive (``auto_extend``, ``max_hold``, ``on_lost``), release, and the loss report
    (:meth:`LockBase._loss_to_report`)."""

    def __init__(
        self,
        manager: Any,
        resource: Any,
        kwargs: dict[str, Any],
        auto_extend: bool,
        max_hold: float | None,
        on_lost: Callable[[Any], Any] | None,
    ) -> None:
        self.manager = manager
        self.resource = base.check_resources(resource)
        self.kwargs = kwargs
        self.max_hold = base.check_keep_alive(auto_extend, max_hold, on_lost)
        self.auto_extend = auto_extend
        self.on_lost = on_lost
        #: The lock, once entered.
        self.lock: _L | None = None
        # The entries not left yet, innermost last: this hold may be entered again within itself
        # (reentrant=True), and by several callers (one hold shared by threads or tasks, as one
        # would share a threading.Lock); each exit leaves one. With each, what keeps it alive.
        self._entries: list[tuple[_L, Any]] = []

    def _acquire_options(self) -> dict[str, Any]:
        """What ``manager.acquire()`` is asked: this hold's arguments, keep-alive included."""
        return {**self.kwargs, "auto_extend": self.auto_extend, "max_hold": self.max_hold, "on_lost": self.on_lost}

    def _entered(self, lock: _L) -> None:
        """Note the lock just acquired (``acquire()`` started its keep-alive, if asked): the entry
        that started it stops it (an async task) when it is left."""
        self.lock = lock
        self._entries.append((lock, lock._keeper if self.auto_extend and lock._depth == 1 else None))

    def _leaving(self) -> tuple[_L, Any] | None:
        """The entry to leave now (its lock, its keeper), once: None when none is left. The caller's
        innermost one: a holder whose lock expired must not leave the lock of whoever took it next
        through the same hold. A caller that entered none (a streamed response closed by the
        server's thread) leaves the innermost."""
        entries = self._entries
        while entries:
            try:
                entry = entries[-1]
                if len(entries) > 1:
                    me = owners.caller()[0]
                    entry = next((e for e in reversed(entries) if e[0]._owner() is me), entry)
                entries.remove(entry)
                return entry
            except (IndexError, ValueError):  # taken by an exit on another thread meanwhile: look again
                continue
        return None


class LockContext(ContextBase[Lock]):
    """``with manager.lock(...) as lock:`` acquires on entry and releases on exit.

    If the lock was lost while the block ran (expired, or auto-extension failed)
    and the block raised nothing, exiting raises
    :class:`~django_redlock.exceptions.LockLost`: a lost lock is never silent.
    Code that cannot use a ``with`` block (a response streamed after its view
    returned) calls :meth:`__enter__` and, later, :meth:`leave`.
    """

    manager: LockManager

    def __enter__(self) -> Lock:
        return steps.handing_over(self._enter)

    def _enter(self) -> Lock:
        lock = self.manager.acquire(self.resource, **self._acquire_options())
        self._entered(lock)
        return lock

    def leave(self, raised: bool = False) -> LockLost | None:
        """Release the lock (this entry of it) and stop keeping it alive; return the loss to report,
        or None (see :meth:`LockBase._loss_to_report`). Each call leaves one entry: once all are
        left, a call does nothing."""
        entry = self._leaving()
        if entry is None:
            return None
        lock = entry[0]
        lock.release()
        return lock._loss_to_report(raised)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        error = self.leave(exc_type is not None)
        if error is not None:
            raise error
