"""Both managers behind one blocking face, so a behaviour is tested once for the sync and asyncio engines.

The ``engine`` fixture is parametrized: ``engine.manager(urls, **options)`` returns a
:class:`~django_redlock.core.LockManager` as it is, or an
:class:`~django_redlock.core.AsyncLockManager` wrapped so that the test calls it like the sync
one. The wrapped manager runs on an event loop of its own thread, which keeps running between
calls (its keep-alive tasks work while the test waits). Every coroutine a call returns is run
there to its end, an ``AsyncLock`` it returns is wrapped the same way, and ``lock()`` gives a
plain ``with`` block whose ``async with`` runs in one task, entry and exit, as in user code.

Behaviour that is the driver's own (a cancelled task, a stalled loop, reentrancy by task, a
patched ``_perform``) is tested on that driver alone.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django_redlock.core import AsyncLockManager, LockManager
from django_redlock.core.async_manager import AsyncLock, AsyncLockContext

#: How long one call on the loop may take before the test fails rather than hangs.
CALL_TIMEOUT = 30.0


class Blocking:
    """An asyncio object called like its sync twin: awaitables are run on ``loop``'s thread."""

    def __init__(self, target: Any, loop: asyncio.AbstractEventLoop) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_loop", loop)

    def __getattr__(self, name: str) -> Any:
        if name == "close":
            return lambda: self._run(self._target.aclose())
        if name == "fencing_token" and isinstance(self._target, AsyncLock):
            return self._run(self._target.get_fencing_token())
        value = getattr(self._target, name)
        if not callable(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._wrap(value(*args, **kwargs))

        return call

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._target, name, value)

    def __eq__(self, other: object) -> bool:
        return self._target == (other._target if isinstance(other, Blocking) else other)

    def __hash__(self) -> int:
        return hash(self._target)

    def __repr__(self) -> str:
        return f"Blocking({self._target!r})"

    def _run(self, awaitable: Any) -> Any:
        async def run() -> Any:  # a task of its own, as a call of user code would be
            return await awaitable

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(CALL_TIMEOUT)

    def _wrap(self, out: Any) -> Any:
        if isinstance(out, AsyncLockContext):
            return self._hold(out)
        if inspect.isasyncgen(out):
            return iter(self._run(_collect(out)))
        if inspect.isawaitable(out):
            out = self._run(out)
        if isinstance(out, AsyncLock):
            return Blocking(out, self._loop)
        return out

    @contextmanager
    def _hold(self, context: AsyncLockContext) -> Iterator[Any]:
        """``async with context`` in one task; the test's block runs while that task waits."""
        entered: concurrent.futures.Future[Any] = concurrent.futures.Future()
        leave = threading.Event()
        body_error: list[BaseException] = []

        async def hold() -> None:
            try:
                async with context as lock:
                    entered.set_result(lock)
                    await asyncio.get_running_loop().run_in_executor(None, leave.wait)
                    if body_error:
                        raise body_error[0]
            except BaseException as exc:
                if not entered.done():
                    entered.set_exception(exc)
                raise

        task = asyncio.run_coroutine_threadsafe(hold(), self._loop)
        lock = entered.result(CALL_TIMEOUT)
        try:
            yield Blocking(lock, self._loop)
        except BaseException as exc:
            body_error.append(exc)
        finally:
            leave.set()
        try:
            task.result(CALL_TIMEOUT)
        except BaseException as exc:
            if body_error and exc is body_error[0]:
                raise exc.with_traceback(exc.__traceback__) from None
            raise


async def _collect(items: Any) -> list[Any]:
    return [item async for item in items]


class Engine:
    """Makes managers of one kind (``kind``: ``"sync"`` or ``"async"``) and closes them at the end."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.is_async = kind == "async"
        self._made: list[Any] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        if self.is_async:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, name="engine-loop", daemon=True)
            self._thread.start()

    def manager(self, urls: Any, **options: Any) -> Any:
        """A manager of this kind on ``urls``; every call on it blocks until done."""
        if self.is_async:
            assert self._loop is not None
            made: Any = Blocking(AsyncLockManager(urls, **options), self._loop)
        else:
            made = LockManager(urls, **options)
        self._made.append(made)
        return made

    def books_of(self, manager: Any) -> list[Any]:
        """Each node's books (``NodeBooks``): of the engine's loop for the asyncio manager."""
        if self.is_async:
            return [anode.books_for(self._loop, os.getpid()) for anode in manager.anodes]
        return [node.books for node in manager.node_list]

    def close(self) -> None:
        for made in self._made:
            made.close()
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
            self._loop.close()
