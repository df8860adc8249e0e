"""Who is calling: the owner a lock is acquired and a ``reentrant=True`` lock entered by (an asyncio task,
an executor call, a greenlet or a thread)."""

from __future__ import annotations

import sys
import threading
from concurrent.futures.thread import _WorkItem
from types import CodeType, FrameType
from typing import Any

__all__ = ["caller", "callers"]


class _ThreadOwner:
    """Stands for one thread: kept in thread-local storage, so it goes when the thread's state goes.

    A thread started by C code has no :class:`threading.Thread` of its own: a later one that gets
    the same id shares its ``_DummyThread`` object (which never dies), but never its state.
    """

    __slots__ = ("__weakref__", "thread")

    def __init__(self) -> None:
        self.thread = threading.current_thread()

    def __str__(self) -> str:
        """Its name in messages: the thread's name when the message is made (it may be renamed)."""
        return f"thread {self.thread.name!r}"


_thread_owner = threading.local()


_POOL_CALL: CodeType = _WorkItem.run.__code__


def callers(first: bool = False) -> list[tuple[Any, Any]]:
    """Who is calling, innermost first, each with a name for messages (a str, or for a thread an
    object whose str() is its name then): the running asyncio task; the
    executor calls this thread runs, from the innermost out (an outer one is blocked beneath, e.g.
    in ``async_to_sync``, while an inner one runs for it); the running greenlet, else the thread.
    With ``first``, the innermost only (no more is looked up)."""
    found: list[tuple[Any, Any]] = []
    aio = sys.modules.get("asyncio")  # a program that never imported asyncio runs no task
    loop = aio._get_running_loop() if aio is not None else None  # None outside a loop
    task = aio.current_task(loop) if aio is not None and loop is not None else None
    if task is not None:
        found.append((task, f"asyncio task {task.get_name()!r}"))
        if first:
            return found
    # The code that runs one call submitted to a pool (concurrent.futures, and asgiref's executor
    # that runs sync_to_async calls on the thread of an outer async_to_sync).
    current = sys.modules.get("asgiref.current_thread_executor")
    run = getattr(getattr(current, "_WorkItem", None), "run", None)
    calls = (_POOL_CALL,) if run is None else (_POOL_CALL, run.__code__)
    frame: FrameType | None = sys._getframe()
    while frame is not None:
        if frame.f_code in calls:
            found.append((frame.f_locals.get("self"), f"executor call in thread {threading.current_thread().name!r}"))
            if first:
                return found
        frame = frame.f_back
    module = sys.modules.get("greenlet")  # the running greenlet (gevent, eventlet), unless the thread's first
    glet = module.getcurrent() if module is not None else None
    if glet is not None and glet.parent is not None:
        found.append((glet, f"greenlet {getattr(glet, 'name', None) or hex(id(glet))}"))
        return found
    owner = getattr(_thread_owner, "owner", None)
    if owner is None:
        owner = _thread_owner.owner = _ThreadOwner()
    found.append((owner, owner))  # its str() is the name: read only when a message needs it
    return found


def caller() -> tuple[Any, Any]:
    """Who is calling, for ``reentrant=True``: the object and a name for messages.

    The running asyncio task; else the innermost executor call this thread runs (a pooled thread
    serves many callers: ``loop.run_in_executor``, asgiref's ``sync_to_async``, which does not tell
    the thread which task launched the call); else the running greenlet, unless it is the thread's
    first; else the thread. Locks keep a weak reference to it, never an id: ids of finished threads
    and tasks are reused, and a lock must never be entered by whoever comes next.
    """
    return callers(True)[0]
