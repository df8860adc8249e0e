"""The async twin of the engine: same steps, same rules, same errors, driven on the running loop
(the connections and the fan-out are :mod:`django_redlock.core.anodes`)."""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from types import TracebackType
from typing import Any, cast

from django_redlock.core import base, clock, ledger, steps
from django_redlock.core.anodes import AsyncNode, afanout, settle_and_close
from django_redlock.core.base import Resources
from django_redlock.core.lock import ContextBase, LockBase
from django_redlock.core.listing import Rows, read_listing, read_locked, read_record
from django_redlock.core.sync_manager import LockManager, ManagerBase, status_of
from django_redlock.core.records import ForcedRelease, LockListing, LockRecord, NodeStatus
from django_redlock.core.scripts import RELEASE
from django_redlock.exceptions import LockLost

__all__ = ["AsyncLock", "AsyncLockManager"]

#: Tasks that must finish even if whoever started them is cancelled (releases).
_BACKGROUND: set[asyncio.Task[Any]] = set()


class AsyncLock(LockBase):
    """An async Redlock: ``await lock.extend()``, ``await lock.release()``, ``async with``."""

    manager: AsyncLockManager

    async def extend(self, ttl: float | None = None) -> None:
        """Reset the ttl on a quorum within the current validity; see :meth:`Lock.extend`."""
        await self._extend(ttl, automatic=False)

    async def _extend(self, ttl: float | None, *, automatic: bool) -> None:
        manager = self.manager
        await manager._run(steps.extend(self, ttl, automatic, manager.quorum, len(manager.node_list)))

    async def release(self) -> bool:
        """Delete this holder's key on every node; idempotent; never raises. See :meth:`Lock.release`."""
        started = self._start_release()
        if started is None:
            return True
        if not started:
            return False
        self.manager._forget(self)
        results = await self.manager._release_keys(self.resources, self.value, place=self._place)
        return self._judge_release(results)

    async def owned(self) -> bool:
        """Ask the nodes whether this holder still holds the lock; see :meth:`Lock.owned`."""
        if not self._can_ask():
            return False
        results = await self._read_values()
        held = self._judge_owned(results)
        if held is None:
            raise self._owned_error(results)
        return held

    async def _read_values(self) -> list[Any]:
        """Read the keys on every node, in one fan-out."""
        total = len(self.manager.node_list)
        return await self.manager._fanout(
            [self._read_command()] * total,
            done=base.until_outcome(self.manager.quorum, total, self._is_ours),
        )

    async def get_fencing_token(self) -> int:
        """The fencing token (computed on first call, then cached); see :attr:`Lock.fencing_token`."""
        if self._fencing_token is None:
            self._fencing_token = await self.manager._fence(self)
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
        error = self._loss_to_report(exc_type is not None)
        if error is not None:
            raise error


class AsyncLockContext(ContextBase[AsyncLock]):
    """``async with manager.lock(...) as lock:``; auto-extension runs as a task on the loop.

    Code that cannot use an ``async with`` block (a response streamed after its
    view returned) awaits :meth:`__aenter__` and, later, :meth:`leave`, or
    :meth:`leave_from_thread` from a thread the loop does not run.
    """

    manager: AsyncLockManager
    _task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> AsyncLock:
        lock = await self.manager.acquire(self.resource, **self.kwargs)
        self._task = None
        if self._entered(lock):
            self._task = asyncio.ensure_future(_keep_alive(lock, self.max_hold, self.on_lost))
        return lock

    async def leave(self, raised: bool = False) -> LockLost | None:
        """Stop keeping the lock alive and release it (this entry of it); return the loss to report,
        or None (see :meth:`LockBase._loss_to_report`). Idempotent: only the first call releases."""
        lock = self._leaving()
        if lock is None:
            return None
        try:
            if self._task is not None:
                self._task.cancel()
                # wait() does not raise the keep-alive's own cancellation; a cancellation
                # of the caller still propagates, after the release below.
                await asyncio.wait({self._task})
        finally:
            await lock.release()
        return lock._loss_to_report(raised)

    def leave_from_thread(self, via: LockManager) -> LockLost | None:
        """:meth:`leave` from a thread without this lock's loop (a server closing a streamed
        response): the release goes through ``via``, a manager of the same nodes."""
        lock = self._leaving()
        if lock is None:
            return None
        task = self._task
        if task is not None and not task.done():
            try:
                task.get_loop().call_soon_threadsafe(task.cancel)
            except RuntimeError:  # its loop is closed
                pass
        if lock._start_release():
            lock._judge_release(via._release_keys(lock.resources, lock.value, place=lock._place))
        return lock._loss_to_report()

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

    stop_at = clock.now() + max_hold if max_hold is not None else None
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
    from django_redlock.core.extender import next_action, next_due, note_extend_error

    while True:
        lock = watch.ref()
        action = next_action(watch, lock)
        if action == "extend":
            try:
                await lock._extend(None, automatic=True)
                watch.failure = None
            except Exception as exc:  # noqa: BLE001 - judged by note_extend_error
                note_extend_error(watch, lock, exc)
        elif action == "check" and lock._can_ask():
            lock._judge_owned(await lock._read_values())
        if action == "stop" or lock.lost or lock.released:
            return
        now = clock.now()
        delay = next_due(watch, lock, now) - now
        del lock  # hold it weakly while asleep: a dropped lock stops here and expires
        await asyncio.sleep(max(0.0, delay))


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

    async def _fanout(self, commands: Sequence[Any], timeout: float | None = None, **kwargs: Any) -> list[Any]:
        return await afanout(self.anodes, commands, timeout=timeout or self.config.node_timeout, **kwargs)

    async def acquire(
        self,
        resource: Resources,
        ttl: float | None = None,
        *,
        blocking: bool = True,
        timeout: float | None = None,
        label: str | None = None,
        reentrant: bool = False,
    ) -> AsyncLock:
        """Acquire ``resource`` on a quorum; see :meth:`LockManager.acquire`."""
        held, step = self._acquiring(resource, ttl, blocking, timeout, label, reentrant)
        if step is None:
            return cast(AsyncLock, held)
        return self._granted(await self._run(step), AsyncLock)

    async def adopt(
        self, resource: Resources, token: str, *, ttl: float | None = None, fencing_token: int | None = None
    ) -> AsyncLock:
        """A handle on a lock acquired elsewhere; see :meth:`LockManager.adopt`."""
        step = self._adopting(resource, token, ttl, fencing_token)
        return self._adopted(await self._run(step), AsyncLock, ttl, fencing_token)

    async def _run(self, step: steps.Step) -> Any:
        """Drive a step on the running loop; an exception (a cancellation) is thrown into it."""
        send: Any = None
        error: BaseException | None = None
        while True:
            try:
                effect = step.throw(error) if error is not None else step.send(send)
            except StopIteration as stop:
                return stop.value
            error = None
            try:
                send = await self._perform(effect)
            except BaseException as exc:  # noqa: BLE001 - handed to the step, which re-raises
                send, error = None, exc

    async def _perform(self, effect: Any) -> Any:
        """Do what a step asks for, on the running loop."""
        kind = type(effect)
        if kind is steps.Fan:
            return await self._fanout(effect.commands, effect.timeout, **effect.options())
        if effect is steps.NOW:
            return self.config.clock()
        if kind is steps.Sleep:
            await asyncio.sleep(effect.seconds)
            return None
        if kind is steps.Background:
            # Runs to its end even if the caller is being cancelled.
            task = asyncio.ensure_future(self._perform(effect.fan))
            _BACKGROUND.add(task)
            task.add_done_callback(_BACKGROUND.discard)
            return None
        if effect is steps.WALL:
            return time.time_ns() // 1000
        raise TypeError(f"unknown step effect {effect!r}")

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
        base.check_wait(blocking, timeout)
        kwargs = {"ttl": ttl, "blocking": blocking, "timeout": timeout, "label": label, "reentrant": reentrant}
        return AsyncLockContext(self, resource, kwargs, auto_extend, max_hold, on_lost)

    async def is_locked(self, resource: str) -> bool:
        """Async version of :meth:`LockManager.is_locked`; raises ``QuorumUnavailable`` when it cannot tell."""
        step = read_locked(self.config, self.node_list, self.quorum, resource)
        return cast(bool, await self._run(step))

    async def force_release(self, resource: str) -> int:
        return (await self.force_release_detail(resource)).deleted

    async def force_release_detail(self, resource: str) -> ForcedRelease:
        key = self.key(resource)
        timeout = max(self.config.node_timeout, 0.5)
        results = await self._fanout([("DEL", key)] * len(self.node_list), timeout)
        wake = self.config.release_command((resource,), "")  # wake whoever waits in line
        await self._fanout([wake] * len(self.node_list), timeout, script=RELEASE)
        return base.forced_release(resource, self.node_list, results)

    async def live_locks(self, match: str | None = None) -> AsyncIterator[LockRecord]:
        """Async version of :meth:`LockManager.live_locks`."""
        for record in (await self.lock_listing(match)).records:
            yield record

    async def lock_listing(
        self, match: str | None = None, rows: Rows | None = None, order: str = "resource"
    ) -> LockListing:
        """Async version of :meth:`LockManager.lock_listing`."""
        step = read_listing(self.config, self.node_list, self.quorum, match, rows, order)
        return cast(LockListing, await self._run(step))

    async def lock_record(self, resource: str) -> LockRecord | None:
        """Async version of :meth:`LockManager.lock_record`."""
        step = read_record(self.config, self.node_list, self.quorum, resource)
        return cast("LockRecord | None", await self._run(step))

    async def node_status(self, timeout: float = 1.0) -> list[NodeStatus]:
        timings: list[float | None] = [None] * len(self.node_list)
        results = await self._fanout([ledger.PROBE] * len(self.node_list), timeout, timings=timings)
        window, read = self.config.restart_window, clock.now()
        return [status_of(*row, window, read) for row in zip(self.node_list, results, timings)]

    async def ping(self, timeout: float | None = None) -> dict[str, float | None]:
        timings: list[float | None] = [None] * len(self.node_list)
        await self._fanout([("PING",)] * len(self.node_list), timeout, timings=timings)
        return {node.name: t for node, t in zip(self.node_list, timings)}

    async def aclose(self) -> None:
        """Close every connection made on the running loop, once the replies still due were read
        (at most the node timeout; see :meth:`LockManager.close`). The loop's shutdown
        (``asyncio.run`` ending) does the same for a program that does not call this."""
        await settle_and_close(self.anodes)

    async def __aenter__(self) -> AsyncLockManager:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- internals used by AsyncLock -------------------------------------

    async def _release_keys(
        self, resources: tuple[str, ...], value: str, ttl: float | None = None, place: str = ""
    ) -> list[Any]:
        """Release ``value`` on every node; a cancelled caller leaves the release to a background task."""
        fan = steps.release_fan(self.config, len(self.node_list), resources, value, ttl, place, quorum=self.quorum)
        try:
            result: list[Any] = await self._perform(fan)
        except asyncio.CancelledError:
            await self._perform(steps.Background(fan))
            raise
        return result

    async def _fence(self, lock: AsyncLock) -> int:
        token: int = await self._run(steps.fence(lock, self.config, self.quorum, len(self.node_list)))
        return token

    def _forget(self, lock: AsyncLock) -> None:
        """Auto-extension tasks watch ``lock.released`` themselves."""
