"""The handles: :class:`Lock` (extend, release, owned, fencing token) and the hold both managers share
(:class:`ContextBase`: acquire, keep alive, release, report a loss)."""

from __future__ import annotations

from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar, cast

from django_redlock.core import base, held, owners, steps
from django_redlock.core.config import Request
from django_redlock.core.held import LockBase, Manager
from django_redlock.exceptions import LockLost

__all__ = ["ContextBase", "Lock", "LockBase", "LockContext", "SyncManager"]


class SyncManager(Manager, Protocol):
    """What a :class:`Lock` and its hold ask of the sync manager."""

    def _run(self, step: steps.Step) -> Any: ...

    def _extending(self, lock: LockBase, ttl: Any, automatic: bool) -> steps.Step: ...

    def _fencing(self, lock: LockBase) -> steps.Step: ...

    def _release(self, lock: LockBase) -> bool: ...

    def _acquire(self, request: Request) -> Lock: ...


class Lock(LockBase):
    """A Redlock held on a quorum of nodes. Use as a context manager or call :meth:`release`.

    Nothing is released from ``__del__``: a lock that is dropped without
    release simply expires after its ttl.
    """

    manager: SyncManager

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
        error = held.loss_to_report(self, exc_type is not None)
        if error is not None:
            raise error


_L = TypeVar("_L", bound="LockBase")


class ContextBase(Generic[_L]):
    """A hold: ``manager.lock(...)``'s arguments, checked before anything is acquired, and the lock
    once entered. It owns the lock's whole life: acquire (waiting, reentrancy, several resources),
    keep-alive (``auto_extend``, ``max_hold``, ``on_lost``), release, and the loss report
    (:func:`~django_redlock.core.held.loss_to_report`)."""

    def __init__(self, manager: Any, request: Request) -> None:
        """``request``: the arguments as the manager checked them (``ManagerConfig.request``); every entry
        acquires with them, unchecked."""
        self.manager = manager
        self.request = request
        self.resource = request.resources
        #: The lock, once entered.
        self.lock: _L | None = None
        # The entries not left yet, innermost last: this hold may be entered again within itself
        # (reentrant=True), and by several callers (one hold shared by threads or tasks, as one
        # would share a threading.Lock); each exit leaves one. With each, what keeps it alive.
        self._entries: list[tuple[_L, Any]] = []

    def _entered(self, lock: _L) -> None:
        """Note the lock just acquired (``acquire()`` started its keep-alive, if asked): the entry
        that started it stops it (an async task) when it is left."""
        self.lock = lock
        self._entries.append((lock, lock._keeper if self.request.keep is not None and lock._depth == 1 else None))

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

    manager: SyncManager

    def __enter__(self) -> Lock:
        return steps.handing_over(self._enter)

    def _enter(self) -> Lock:
        lock = self.manager._acquire(self.request)
        self._entered(lock)
        return lock

    def leave(self, raised: bool = False) -> LockLost | None:
        """Release the lock (this entry of it) and stop keeping it alive; return the loss to report,
        or None (see :func:`~django_redlock.core.held.loss_to_report`). Each call leaves one entry: once all are
        left, a call does nothing."""
        entry = self._leaving()
        if entry is None:
            return None
        lock = entry[0]
        lock.release()
        return held.loss_to_report(lock, raised)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        error = self.leave(exc_type is not None)
        if error is not None:
            raise error
