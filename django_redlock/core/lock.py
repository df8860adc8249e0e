"""A held lock: validity on the monotonic clock, extension, release, fencing."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from django_redlock.core import base
from django_redlock.core.nodes import Failure, fanout, script_command
from django_redlock.core.records import Holder
from django_redlock.core.scripts import EXTEND
from django_redlock.exceptions import LockError, LockLost

if TYPE_CHECKING:
    from django_redlock.core.manager import LockManager

__all__ = ["Lock", "LockBase"]


class LockBase:
    """State shared by :class:`Lock` and :class:`~django_redlock.core.aio.AsyncLock`."""

    def __init__(
        self,
        manager: Any,
        resource: str,
        holder: Holder,
        ttl: float,
        started: float,
    ) -> None:
        self.manager = manager
        #: The name callers lock, e.g. ``"invoice-42"``.
        self.resource = resource
        #: The Redis key on every node.
        self.key: str = manager.config.key(resource)
        #: Who holds it (token, host, pid, label).
        self.holder = holder
        #: The value stored on the nodes (the encoded holder).
        self.value = holder.encode()
        #: Seconds the keys live on the nodes (the last ttl asked for).
        self.ttl = ttl
        self._deadline = started + ttl - manager.config.drift(ttl)
        #: How many times :meth:`extend` succeeded.
        self.extensions = 0
        #: True once the lock is known to be expired or taken over.
        self.lost = False
        self.lost_reason: str | None = None
        #: True once :meth:`release` ran.
        self.released = False
        self.max_extensions: int | None = manager.config.max_extensions
        self._fencing_token: int | None = None
        self._state = threading.Lock()

    @property
    def token(self) -> str:
        """The unique random token of this holder (40 hex digits, 20 bytes from :mod:`secrets`)."""
        return self.holder.token

    @property
    def validity(self) -> float:
        """Seconds this holder may still act as the owner (monotonic clock, 0.0 when expired)."""
        return max(0.0, self._deadline - time.monotonic())

    def locked(self) -> bool:
        """True while the lock is valid: not released, not lost, validity left."""
        return not (self.released or self.lost) and self.validity > 0

    def _mark_lost(self, reason: str) -> bool:
        """Record the loss once; return True the first time."""
        with self._state:
            if self.lost:
                return False
            self.lost = True
            self.lost_reason = reason
        base.call_hook(self.manager.config.hooks, "lost", self, reason)
        return True

    def _check_extendable(self, ttl: Any, counted: bool) -> float:
        if self.released:
            raise LockError(f"Lock {self.resource!r} was released; acquire it again.", resource=self.resource)
        if self.lost:
            raise base.lost_error(self.resource, self.lost_reason or "it was marked lost")
        limit = self.max_extensions
        if counted and limit is not None and self.extensions >= limit:
            raise base.extension_limit_error(self, limit)
        new_ttl = base.check_ttl(ttl, self.ttl)
        self.manager.config.window(new_ttl)  # a longer ttl lengthens the restart window
        if self.validity <= 0:
            reason = "it expired before it could be extended"
            self._mark_lost(reason)
            raise base.lost_error(self.resource, reason)
        return new_ttl

    def _judge_extend(self, results: list[Any], started: float, old_deadline: float, ttl: float) -> None:
        """Apply an EXTEND fan-out's replies; raise :class:`LockLost` when it did not hold."""
        manager = self.manager
        quorum = manager.quorum
        total = len(manager.node_list)
        extended = base.count(results, lambda r: r == 1)
        finished = time.monotonic()
        if extended >= quorum and finished < old_deadline:
            self.ttl = ttl
            self._deadline = started + ttl - manager.config.drift(ttl)
            self.extensions += 1
            base.call_hook(manager.config.hooks, "extended", self)
            return
        refused = sum(1 for r in results if not isinstance(r, Failure) and r == 0)
        detail = "; ".join(f"{k}: {v}" for k, v in base.failures_of(manager.node_list, results, "key gone", lambda r: r == 1).items())
        if refused > total - quorum or self.validity <= 0:
            reason = f"extension reached {extended} of {total} nodes, {quorum} needed ({detail})"
            self._mark_lost(reason)
            raise base.lost_error(self.resource, reason)
        raise LockLost(
            f"Could not extend lock {self.resource!r}: {extended} of {total} nodes agreed, {quorum} needed "
            f"({detail}); it stays valid for {self.validity * 1000:.0f} ms unless extended.",
            resource=self.resource,
        )

    def _judge_release(self, results: list[Any]) -> bool:
        deleted = base.count(results, lambda r: r == 1)
        base.call_hook(self.manager.config.hooks, "released", self)
        return deleted >= self.manager.quorum

    def _start_release(self) -> bool:
        """Mark released; return False when it already was. Flag an expired lock as lost."""
        with self._state:
            if self.released:
                return False
            self.released = True
        if not self.lost and self._deadline <= time.monotonic():
            self._mark_lost("it expired before it was released")
        return True

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
        """Reset the keys' ttl to ``ttl`` (default: the current ttl) on a quorum.

        The extension counts only if a quorum of nodes still held this holder's
        key and agreed before the current validity ran out. Raises
        :class:`~django_redlock.exceptions.LockLost` otherwise (``lost`` is set
        when a quorum no longer holds the key or the validity is gone).
        """
        self._extend(ttl, counted=True)

    def _extend(self, ttl: float | None, *, counted: bool) -> None:
        new_ttl = self._check_extendable(ttl, counted)
        manager = self.manager
        nodes = manager.node_list
        old_deadline = self._deadline
        started = time.monotonic()
        command = script_command(EXTEND, [self.key], [self.value, base.ms(new_ttl)])
        results = fanout(
            nodes,
            [command] * len(nodes),
            timeout=manager.config.node_timeout,
            done=base.until_outcome(manager.quorum, len(nodes), lambda r: r == 1),
            script=EXTEND,
            keys=[self.key],
            allow_lagging=False,
        )
        self._judge_extend(results, started, old_deadline, new_ttl)

    def release(self) -> bool:
        """Delete this holder's key on every node (never another holder's).

        Idempotent. Returns True when a quorum of nodes still held the key.
        Never raises for node failures: a key that could not be deleted expires.
        """
        if not self._start_release():
            return False
        self.manager._forget(self)
        results = self.manager._release_keys(self.key, self.value)
        return self._judge_release(results)

    @property
    def fencing_token(self) -> int:
        """A number that strictly increases with each acquisition of this resource.

        Computed on first access (two fan-outs), then cached. Pass it to the
        storage you protect and have the storage reject writes that carry a
        token lower than the highest it has seen.

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
            self._fencing_token = self.manager._fence(self)
        return self._fencing_token

    def __enter__(self) -> Lock:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()
        if self.lost and exc_type is None:
            raise base.lost_error(self.resource, self.lost_reason or "it expired while held")


class ContextBase:
    """Arguments of ``manager.lock(...)``, checked before anything is acquired."""

    def __init__(
        self,
        manager: Any,
        resource: str,
        kwargs: dict[str, Any],
        auto_extend: bool,
        max_hold: float | None,
        on_lost: Callable[[Any], Any] | None,
    ) -> None:
        self.manager = manager
        self.resource = resource
        self.kwargs = kwargs
        self.auto_extend = auto_extend
        self.max_hold = base.check_seconds(max_hold, "max_hold", allow_none=True)
        if on_lost is not None and not callable(on_lost):
            raise ValueError("on_lost must be a callable taking the lock, or None.")
        self.on_lost = on_lost
        self.lock: Any = None


class LockContext(ContextBase):
    """``with manager.lock(...) as lock:`` acquires on entry and releases on exit.

    If the lock was lost while the block ran (expired, or auto-extension failed)
    and the block raised nothing, exiting raises
    :class:`~django_redlock.exceptions.LockLost`: a lost lock is never silent.
    """

    manager: LockManager

    def __enter__(self) -> Lock:
        lock = self.manager.acquire(self.resource, **self.kwargs)
        self.lock = lock
        if self.auto_extend:
            self.manager._watch(lock, self.max_hold, self.on_lost)
        return lock

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        lock = self.lock
        if lock is None:
            return
        lock.__exit__(exc_type, exc, tb)
