"""Who is calling: the owner a ``reentrant=True`` lock is entered by, and the locks a manager holds
in this process (:class:`HeldLocks`)."""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Iterator
from concurrent.futures.thread import _WorkItem
from types import CodeType, FrameType
from typing import TYPE_CHECKING, Any

from django_redlock.core import base, forks
from django_redlock.exceptions import LockNotAcquired

if TYPE_CHECKING:
    from django_redlock.core.lock import LockBase

__all__ = ["HeldLocks", "caller"]


class _ThreadOwner:
    """Stands for one thread: kept in thread-local storage, so it goes when the thread's state goes.

    A thread started by C code has no :class:`threading.Thread` of its own: a later one that gets
    the same id shares its ``_DummyThread`` object (which never dies), but never its state.
    """

    __slots__ = ("__weakref__",)


_thread_owner = threading.local()


_POOL_CALL: CodeType = _WorkItem.run.__code__


def _executor_calls() -> tuple[CodeType, ...]:
    """The code that runs one call submitted to a pool (``concurrent.futures``, and asgiref's executor
    that runs ``sync_to_async`` calls on the thread of an outer ``async_to_sync``)."""
    current = sys.modules.get("asgiref.current_thread_executor")
    run = getattr(getattr(current, "_WorkItem", None), "run", None)
    return (_POOL_CALL,) if run is None else (_POOL_CALL, run.__code__)


def _greenlet() -> Any:
    """The running greenlet (gevent, eventlet) when it is not its thread's first one, else None."""
    module = sys.modules.get("greenlet")
    if module is None:
        return None
    current = module.getcurrent()
    return current if current.parent is not None else None


def _owners() -> Iterator[tuple[Any, str]]:
    """Who is calling, innermost first, each with a name for messages: the running asyncio task; the
    executor calls this thread runs, from the innermost out (an outer one is blocked beneath, e.g.
    in ``async_to_sync``, while an inner one runs for it); the running greenlet, else the thread."""
    aio = sys.modules.get("asyncio")  # a program that never imported asyncio runs no task
    loop = aio._get_running_loop() if aio is not None else None  # None outside a loop
    task = aio.current_task(loop) if aio is not None and loop is not None else None
    if task is not None:
        yield task, f"asyncio task {task.get_name()!r}"
    thread = threading.current_thread()
    calls = _executor_calls()
    frame: FrameType | None = sys._getframe()
    while frame is not None:
        if frame.f_code in calls:
            yield frame.f_locals.get("self"), f"executor call in thread {thread.name!r}"
        frame = frame.f_back
    glet = _greenlet()
    if glet is not None:
        yield glet, f"greenlet {getattr(glet, 'name', None) or hex(id(glet))}"
        return
    owner = getattr(_thread_owner, "owner", None)
    if owner is None:
        owner = _thread_owner.owner = _ThreadOwner()
    yield owner, f"thread {thread.name!r}"


def caller() -> tuple[Any, str]:
    """Who is calling, for ``reentrant=True``: the object and a name for messages.

    The running asyncio task; else the innermost executor call this thread runs (a pooled thread
    serves many callers: ``loop.run_in_executor``, asgiref's ``sync_to_async``, which does not tell
    the thread which task launched the call); else the running greenlet, unless it is the thread's
    first; else the thread. Locks keep a weak reference to it, never an id: ids of finished threads
    and tasks are reused, and a lock must never be entered by whoever comes next.
    """
    return next(_owners())


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
        owners = list(_owners())
        mine = [lock for lock in held if any(lock._owner() is owner for owner, _ in owners)]
        return mine, owners[0][0], owners[0][1]

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
                if not (lock.released or lock.lost) and lock.validity > 0 and lock._lend(me):
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
