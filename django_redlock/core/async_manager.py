"""The async twin of the engine: same steps, same rules, same errors, driven on the running loop
(the connections and the fan-out are :mod:`django_redlock.core.anodes`)."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine
from types import TracebackType
from typing import Any, cast

from django_redlock.core import base, held, steps
from django_redlock.core.anodes import AsyncNode, afanout, settle_and_close
from django_redlock.core.base import Request, Resources
from django_redlock.core.held import LockBase
from django_redlock.core.lock import ContextBase
from django_redlock.core.listing import Rows
from django_redlock.core.sync_manager import LockManager, ManagerBase
from django_redlock.core.records import ForcedRelease, LockListing, LockRecord, NodeStatus
from django_redlock.exceptions import LockLost

__all__ = ["AsyncLock", "AsyncLockManager"]

#: Tasks that must finish even if whoever started them is cancelled (releases).
_BACKGROUND: set[asyncio.Task[Any]] = set()
#: The keep-alive tasks, held until they end (the loop holds its tasks weakly).
_KEEPERS: set[asyncio.Task[None]] = set()


class AsyncLock(LockBase):
    """An async Redlock: ``await lock.extend()``, ``await lock.release()``, ``async with``."""

    manager: AsyncLockManager

    async def extend(self, ttl: float | None = None) -> None:
        """Reset the ttl on a quorum within the current validity; see :meth:`Lock.extend`."""
        await self._extend(ttl, automatic=False)

    async def _extend(self, ttl: float | None, *, automatic: bool) -> None:
        await self.manager._run(self.manager._extending(self, ttl, automatic))

    async def release(self) -> bool:
        """Delete this holder's key on every node; idempotent; never raises. See :meth:`Lock.release`.

        A cancelled caller leaves the release to a background task, which runs it to its end."""
        released: bool = await self.manager._run(steps.release(self))  # not cast(): a Python call per release
        return released

    async def owned(self) -> bool:
        """Ask the nodes whether this holder still holds the lock; see :meth:`Lock.owned`."""
        return cast(bool, await self.manager._run(steps.owned(self)))

    async def _check_owned(self) -> None:
        """The keep-alive's look (:func:`~django_redlock.core.steps.check_owned`)."""
        await self.manager._run(steps.check_owned(self))

    async def get_fencing_token(self) -> int:
        """The fencing token (computed on first call, then cached); see :attr:`Lock.fencing_token`."""
        if self._fencing_token is None:
            self._fencing_token = cast(int, await self.manager._run(self.manager._fencing(self)))
        return self._fencing_token

    @property
    def fencing_token(self) -> int:
        """The fencing token once ``await lock.get_fencing_token()`` has computed it."""
        if self._fencing_token is None:
            raise RuntimeError("Call 'await lock.get_fencing_token()' first: computing it needs the event loop.")
        return self._fencing_token

    async def __aenter__(self) -> AsyncLock:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.release()
        error = held.loss_to_report(self, exc_type is not None)
        if error is not None:
            raise error


class AsyncLockContext(ContextBase[AsyncLock]):
    """``async with manager.lock(...) as lock:``; auto-extension runs as a task on the loop.

    Code that cannot use an ``async with`` block (a response streamed after its
    view returned) awaits :meth:`__aenter__` and, later, :meth:`leave`, or
    :meth:`leave_from_thread` from a thread the loop does not run.
    """

    manager: AsyncLockManager

    async def __aenter__(self) -> AsyncLock:
        lock = await self.manager._acquire(self.request)
        self._entered(lock)
        return lock

    async def leave(self, raised: bool = False) -> LockLost | None:
        """Stop keeping the lock alive and release it (this entry of it); return the loss to report,
        or None (see :func:`~django_redlock.core.held.loss_to_report`). Each call leaves one entry: once all are
        left, a call does nothing."""
        entry = self._leaving()
        if entry is None:
            return None
        lock, task = entry
        try:
            if task is not None:
                task.cancel()
                # wait() does not raise the keep-alive's own cancellation; a cancellation
                # of the caller still propagates, after the release below.
                await asyncio.wait({task})
        finally:
            await lock.release()
        return held.loss_to_report(lock, raised)

    def leave_from_thread(self, via: LockManager) -> LockLost | None:
        """:meth:`leave` from a thread without this lock's loop (a server closing a streamed
        response): the release goes through ``via``, a manager of the same nodes."""
        entry = self._leaving()
        if entry is None:
            return None
        lock, task = entry
        if task is not None and not task.done():
            try:
                task.get_loop().call_soon_threadsafe(task.cancel)
            except RuntimeError:  # its loop is closed
                pass
        via._release(lock)
        return held.loss_to_report(lock)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        error = await self.leave(exc_type is not None)
        if error is not None:
            raise error


def _keep_alive(
    lock: AsyncLock, max_hold: float | None, on_lost: Callable[[AsyncLock], Any] | None
) -> Coroutine[Any, Any, None]:
    """The keep-alive task's coroutine: same schedule as the sync extender, holding the lock weakly.

    ``on_lost`` (a function or a coroutine function) runs once, in a task of
    its own, when the lock is marked lost while held: also when the loss is
    found by ``extend()`` or ``owned()``, and also if this task was cancelled.
    """
    from django_redlock.core.extender import Watch

    stop_at = lock._clock() + max_hold if max_hold is not None else None
    watch = Watch(lock.manager, weakref.ref(lock), lock.resource, stop_at, on_lost)
    if on_lost is not None:
        loop = asyncio.get_running_loop()

        def listener(lost: Any) -> None:
            if watch.listening:
                watch.listening = False
                loop.call_soon_threadsafe(_report_lost, lost, on_lost)

        lock._lost_listener = listener
    return _keep_alive_loop(watch)


async def _keep_alive_loop(watch: Any) -> None:
    from django_redlock.core.extender import next_action, next_due, note_extend_error, sleep_for

    while True:
        lock = watch.ref()
        action = next_action(watch, lock)
        if action == "extend":
            try:
                await lock._extend(None, automatic=True)
                watch.failure = None
            except Exception as exc:  # noqa: BLE001 - judged by note_extend_error
                note_extend_error(watch, lock, exc)
        elif action == "check" and held.can_ask(lock):
            await lock._check_owned()
        if action == "stop" or lock.lost or lock.released:
            return
        clock = lock._clock
        due = next_due(watch, lock, clock())
        del lock  # hold it weakly while asleep: a dropped lock stops here and expires
        while (nap := sleep_for(due, clock())) > 0:
            await asyncio.sleep(nap)


_reports: set[asyncio.Task[None]] = set()


def _report_lost(lock: AsyncLock, on_lost: Callable[[AsyncLock], Any]) -> None:
    async def report() -> None:
        from django_redlock.core.extender import logger

        try:
            result = on_lost(lock)
            if asyncio.iscoroutine(result):
                await result
        except Exception:  # noqa: BLE001
            logger.exception("on_lost callback for lock %r failed", lock.resource)

    task = asyncio.ensure_future(report())
    _reports.add(task)  # keep it alive until it ran
    task.add_done_callback(_reports.discard)


class AsyncLockManager(ManagerBase):
    """:class:`~django_redlock.core.LockManager` for asyncio code (async views, ASGI)."""

    _anodes: list[AsyncNode] | None = None

    @property
    def anodes(self) -> list[AsyncNode]:
        if self._anodes is None:
            self._anodes = [AsyncNode(node) for node in self.node_list]
        return self._anodes

    async def acquire(
        self,
        resource: Resources,
        ttl: float | None = None,
        *,
        blocking: bool = True,
        timeout: float | None = None,
        label: str | None = None,
        reentrant: bool = False,
        auto_extend: bool = False,
        max_hold: float | None = None,
        on_lost: Callable[[AsyncLock], Any] | None = None,
    ) -> AsyncLock:
        """Acquire ``resource`` on a quorum; see :meth:`LockManager.acquire`. With ``auto_extend``
        a task on the running loop keeps the lock alive until it is released."""
        request = self.config.request(resource, ttl, blocking, timeout, label, reentrant, auto_extend, max_hold, on_lost)
        return await self._acquire(request)

    async def _acquire(self, request: Request) -> AsyncLock:
        """:meth:`acquire` with its arguments checked."""
        entered, step = self._acquiring(request)
        if step is None:
            return cast(AsyncLock, entered)
        lock = self._granted(await self._run(step), AsyncLock)
        keep = request.keep
        if keep is not None:
            try:
                lock._keeper = task = asyncio.ensure_future(_keep_alive(lock, *keep))
            except BaseException:
                await lock.release()  # the keep-alive could not start: the caller never owned it
                raise
            _KEEPERS.add(task)
            task.add_done_callback(_KEEPERS.discard)
        return lock

    async def adopt(
        self, resource: Resources, token: str, *, ttl: float | None = None, fencing_token: int | None = None
    ) -> AsyncLock:
        """A handle on a lock acquired elsewhere; see :meth:`LockManager.adopt`."""
        step = self._adopting(resource, token, ttl, fencing_token)
        return self._adopted(await self._run(step), AsyncLock, ttl, fencing_token)

    async def _run(self, step: steps.Step) -> Any:
        """Drive a step on the running loop; an exception (a cancellation) is thrown into it."""
        try:
            effect = step.send(None)  # what steps.Run does, inline: this loop is the hot path
            while True:
                error: BaseException | None = None
                try:
                    result = await self._perform(effect)
                except BaseException as exc:  # noqa: BLE001 - handed to the step, which re-raises
                    error = exc
                effect = step.send(result) if error is None else step.throw(error)
        except StopIteration as stop:
            return stop.value

    async def _perform(self, effect: Any) -> Any:
        """Do what a step asks for, on the running loop: the one place the async engine meets I/O."""
        kind = type(effect)
        if kind is steps.Fan:
            if effect.background:
                # Runs to its end even if the caller is being cancelled.
                task = asyncio.ensure_future(self._background(effect))
                _BACKGROUND.add(task)
                task.add_done_callback(_BACKGROUND.discard)
                return None
            watching = self.config.watches_nodes
            if watching:
                self._watched(effect)
            anodes = self._anodes if self._anodes is not None else self.anodes  # no property call once made
            results = await afanout(anodes, effect, effect.timeout or self.config.node_timeout)
            if watching:
                self._fanned(effect, results)
            return results
        if kind is steps.Sleep:
            await asyncio.sleep(effect.seconds)
            return None
        raise TypeError(f"unknown step effect {effect!r}")

    async def _background(self, fan: steps.Fan) -> None:
        """Run a background round to its end; nobody waits for its replies."""
        if self.config.watches_nodes:
            self._watched(fan)
            self._fanned(fan, await afanout(self.anodes, fan, fan.timeout or self.config.node_timeout))
        else:
            await afanout(self.anodes, fan, fan.timeout or self.config.node_timeout)

    def lock(
        self,
        resource: Resources,
        ttl: float | None = None,
        *,
        blocking: bool = True,
        timeout: float | None = None,
        label: str | None = None,
        auto_extend: bool = False,
        max_hold: float | None = None,
        on_lost: Callable[[AsyncLock], Any] | None = None,
        reentrant: bool = False,
    ) -> AsyncLockContext:
        """``async with manager.lock("x") as lock:``; see :meth:`LockManager.lock`."""
        return AsyncLockContext(
            self, self.config.request(resource, ttl, blocking, timeout, label, reentrant, auto_extend, max_hold, on_lost)
        )

    async def is_locked(self, resource: str) -> bool:
        """Async version of :meth:`LockManager.is_locked`; raises ``QuorumUnavailable`` when it cannot tell."""
        return cast(bool, await self._run(self._locked(resource)))

    async def force_release(self, resource: str) -> int:
        """Async version of :meth:`LockManager.force_release`."""
        return (await self.force_release_detail(resource)).deleted

    async def force_release_detail(self, resource: str) -> ForcedRelease:
        """Async version of :meth:`LockManager.force_release_detail`."""
        return cast(ForcedRelease, await self._run(self._forcing(resource)))

    async def live_locks(self, match: str | None = None) -> AsyncIterator[LockRecord]:
        """Async version of :meth:`LockManager.live_locks`."""
        for record in (await self.lock_listing(match)).records:
            yield record

    async def lock_listing(
        self, match: str | None = None, rows: Rows | None = None, order: str = "resource", state: str | None = None
    ) -> LockListing:
        """Async version of :meth:`LockManager.lock_listing`."""
        return cast(LockListing, await self._run(self._listing(match, rows, order, state)))

    async def lock_record(self, resource: str) -> LockRecord | None:
        """Async version of :meth:`LockManager.lock_record`."""
        return cast("LockRecord | None", await self._run(self._record(resource)))

    async def node_status(self, timeout: float = 1.0) -> list[NodeStatus]:
        """Async version of :meth:`LockManager.node_status`."""
        return cast("list[NodeStatus]", await self._run(self._status(timeout)))

    async def ping(self, timeout: float | None = None) -> dict[str, float | None]:
        """Async version of :meth:`LockManager.ping`."""
        return cast("dict[str, float | None]", await self._run(self._ping(timeout)))

    async def aclose(self) -> None:
        """Close every connection made on the running loop, once the replies still due were read
        (at most the node timeout; see :meth:`LockManager.close`). The loop's shutdown
        (``asyncio.run`` ending) does the same for a program that does not call this."""
        await settle_and_close(self.anodes)

    async def __aenter__(self) -> AsyncLockManager:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
