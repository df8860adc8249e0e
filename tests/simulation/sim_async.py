"""Simulated client processes that run the real :class:`~django_redlock.core.AsyncLockManager`.

An :class:`AsyncSimProcess` is one asyncio program. Its callers are asyncio tasks running plain
async code on the public API (``async with manager.lock(...)``, kept alive by the engine's
keep-alive task, entered again by the same task; ``acquire`` and ``release``, ``extend``,
``get_fencing_token``, ``owned()``, ``adopt()``; a task cancelled at an await). The tasks run
on :class:`SimLoop`, an event loop whose clock is the process's drifting clock and whose ready
queue is run by the world's scheduler, so a run stays a pure function of its seed. The one
seam is ``AsyncLockManager._perform``: a ``Fan`` is a simulated round whose results complete
a future of the loop. What the checker is told, and when, is as for :mod:`.sim_manager`.
"""

from __future__ import annotations

import asyncio
import contextvars
from asyncio import events
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from django_redlock.core import steps
from django_redlock.core.async_manager import AsyncLockManager, _keep_alive_loop
from django_redlock.core.lock import LockBase
from django_redlock.exceptions import LockError, LockLost, LockNotAcquired

from .invariants import Violation
from .sim_manager import SimProcess, _raise
from .sim_round import SimDriver

__all__ = ["AsyncSimProcess", "SimLoop"]


class SimLoop(asyncio.AbstractEventLoop):
    """What asyncio's tasks, futures, ``sleep`` and ``wait`` ask of a loop, on simulated time.

    ``time()`` is the process's clock; a timer is a world event on that clock; the ready
    callbacks run in one world event at the instant they became ready. A dead or finished
    process's loop runs nothing more.
    """

    def __init__(self, process: AsyncSimProcess) -> None:
        self.process = process
        self.proc = process.proc
        self.world = process.world
        self.ready: deque[asyncio.Handle] = deque()
        self.timers: dict[asyncio.TimerHandle, int] = {}
        self.due = False  # a world event runs the ready queue at this instant
        #: What the loop's exception handler was given (a callback that raised).
        self.errors: list[dict[str, Any]] = []
        #: Every task made on this loop, until :meth:`AsyncSimProcess.close` unwinds those left.
        self.tasks: list[asyncio.Task[Any]] = []

    def time(self) -> float:
        return self.proc.now()

    def call_soon(self, callback: Callable[..., Any], *args: Any,
                  context: contextvars.Context | None = None) -> asyncio.Handle:
        handle = asyncio.Handle(callback, args, self, context)
        self.ready.append(handle)
        if not self.due and not self.process.gone:
            self.due = True
            self.world.at(self.world.now, self.run_ready, proc=self.proc)
        return handle

    call_soon_threadsafe = call_soon  # one thread

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any,
                context: contextvars.Context | None = None) -> asyncio.TimerHandle:
        handle = asyncio.TimerHandle(when, callback, args, self, context)
        if not self.process.gone:
            self.timers[handle] = self.proc.at_local(when, self._fire, handle)
        return handle

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any,
                   context: contextvars.Context | None = None) -> asyncio.TimerHandle:
        return self.call_at(self.time() + delay, callback, *args, context=context)

    def _fire(self, handle: asyncio.TimerHandle) -> None:
        if self.timers.pop(handle, None) is not None and not handle.cancelled():
            self.ready.append(handle)
            self.run_ready()

    def _timer_handle_cancelled(self, handle: asyncio.TimerHandle) -> None:
        event = self.timers.pop(handle, None)
        if event is not None:
            self.world.cancel(event)

    def run_ready(self) -> None:
        """Run the callbacks ready now (and those they make ready), as the running loop."""
        self.due = False
        previous = events._get_running_loop()
        events._set_running_loop(self)
        try:
            while self.ready and not self.process.gone:
                handle = self.ready.popleft()
                if not handle.cancelled():
                    handle._run()
        finally:
            events._set_running_loop(previous)

    def create_future(self) -> asyncio.Future[Any]:
        return asyncio.Future(loop=self)

    def create_task(self, coro: Coroutine[Any, Any, Any], *, name: str | None = None,
                    context: contextvars.Context | None = None) -> asyncio.Task[Any]:
        if context is None:  # Python 3.10's Task takes no context
            task = asyncio.Task(coro, loop=self, name=name)
        else:
            task = asyncio.Task(coro, loop=self, name=name, context=context)
        self.tasks.append(task)
        return task

    def call_exception_handler(self, context: dict[str, Any]) -> None:
        self.errors.append(context)
        error = context.get("exception")
        if isinstance(error, Violation) and not self.process.gone:
            self.world.at(self.world.now, _raise, error)

    def get_debug(self) -> bool:
        return False

    def is_running(self) -> bool:
        return True

    def is_closed(self) -> bool:
        return False


class _Gone(BaseException):
    """Thrown into the tasks still waiting when the run is over: they unwind, reporting nothing."""


class AsyncSimProcess(SimProcess):
    """One client process running the real ``AsyncLockManager``; its callers are asyncio tasks,
    each an owner of its own for ``reentrant=True``."""

    manager_class = AsyncLockManager

    def _seam(self, manager: Any, driver: SimDriver) -> None:
        self.loop = SimLoop(self)

        async def perform(effect: Any) -> Any:
            return await self._aperform(driver, effect)

        manager._perform = perform

    def _me(self) -> Any:
        return asyncio.current_task(self.loop)

    def _in_watchdog(self) -> bool:
        task = self._me()
        return task is not None and task.get_coro().cr_code is _keep_alive_loop.__code__

    async def _aperform(self, driver: SimDriver, effect: Any) -> Any:
        if self.gone:
            raise _Gone  # a dead process does nothing more; nor does one whose run is over
        kind = type(effect)
        if kind is steps.Fan and effect.background:
            driver.fan(effect, lambda results: None)
            return None
        if kind is steps.Sleep:
            await asyncio.sleep(effect.seconds)
            return None
        if kind is not steps.Fan:
            raise TypeError(f"unknown step effect {effect!r}")
        self._see(self._me(), effect)
        done: asyncio.Future[Any] = self.loop.create_future()
        driver.fan(effect, lambda results: done.done() or done.set_result(results))
        return await done  # a cancellation lands here, the round going on without its caller

    def spawn(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Start a caller: the coroutine ``fn(*args)`` as a task of its own, at this instant."""
        self.world.at(self.world.now, self._task, fn, args, proc=self.proc)

    def _task(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.loop.create_task(fn(*args)).add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        """A caller's task ended: anything it raised but a cancellation is the scheduler's."""
        if not task.cancelled() and task.exception() is not None and not self.gone:
            self.world.at(self.world.now, _raise, task.exception())

    def _cancel(self, me: Any, caller: Any) -> None:
        if self.callers.get(me) is caller:
            self.stats["cancelled"] += 1
            me.cancel()

    def close(self) -> None:
        """The run is over: its loop runs nothing more, and every task still waiting unwinds now."""
        self.gone = True
        for task in self.loop.tasks:
            coro = task.get_coro()
            for _ in range(1000):  # each throw passes one await: a step's cleanup yields a few more
                if task.done() or coro.cr_frame is None:
                    break
                try:
                    coro.throw(_Gone())
                except BaseException:  # noqa: BLE001 - _Gone, or what unwinding it raised: the run is over
                    break
        self.loop.tasks.clear()

    async def asleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    # -- the workload ------------------------------------------------------------------------

    async def session(self, resources: list[str], until: float, multi: float) -> None:  # type: ignore[override]
        world = self.world
        while world.now < until:
            resource = self.pick(resources, multi)
            try:
                if world.chance(0.6, "hold"):
                    await self.hold(resource)
                else:
                    await self.acquire_release(resource)
            except asyncio.CancelledError:
                pass  # this task was cancelled at an await: it carries on with the next call
            await self.asleep(world.uniform(0.0, 0.05, "think"))

    async def hold(self, resource: str | Sequence[str], depth: int = 0) -> None:  # type: ignore[override]
        """``async with manager.lock(...)``: maybe kept alive, reentrant, entered again inside, released
        early, or cancelled inside."""
        blocking, timeout, cancel, auto, reentrant = self._hold_options(depth)
        caller = self._begin(resource, cancel)
        entered: LockBase | None = None
        due = False
        try:
            async with self.manager.lock(resource, blocking=blocking, timeout=timeout, auto_extend=auto,
                                         reentrant=reentrant) as lock:
                entered = self._entered_hold(caller, lock, auto)
                try:
                    left = await self._work(lock, resource, auto, depth)
                except asyncio.CancelledError:
                    if lock.value in self.inside[self._me()]:  # not left early
                        self._leaving(lock)
                    raise
                due = not left and self._leaving(lock)
        except (LockNotAcquired, asyncio.CancelledError, LockLost) as exc:
            self._exited(caller, entered, due, exc)
            return
        self._exited(caller, entered, due, None)

    async def _work(self, lock: Any, resource: str | Sequence[str], auto: bool, depth: int) -> bool:  # type: ignore[override]
        """The with block's body; True when it released the lock before the block's end."""
        world = self.world
        ttl = lock.ttl
        if world.chance(0.3, "fence") and not await self._afence(lock):
            return False
        left = False
        what = world.choose(["hold", "extend", "owned", "nest", "release early"], "in the block")
        if what == "extend" and not auto:
            try:
                await lock.extend()
            except LockError:
                return False
        elif what == "owned":
            try:
                await lock.owned()
            except LockError:
                pass
        elif what == "nest" and depth == 0:
            try:
                await self.hold(lock.resources[:1] if world.chance(0.5, "a member") else resource, depth + 1)
            except LockLost:
                return False  # the inner exit reported it; the outer one will too
        elif what == "release early" and depth == 0:
            self._leaving(lock)  # its holder is done with it: the hold's exit releases nothing more
            left = True
            self.stats["released early"] += 1
            self.kept_alive.discard(lock.value)
            await lock.release()
        if depth == 0 and world.chance(0.05, "cancel inside"):
            self.stats["cancelled in the block"] += 1
            self._me().cancel()  # lands at the next await
        longest = ttl * 2.5 if auto else ttl * (1.3 if world.chance(0.2, "overrun") else 0.5)
        await self.asleep(world.uniform(0.0, longest, "hold"))
        return left

    async def _afence(self, lock: Any) -> bool:
        try:
            token = await lock.get_fencing_token()
        except LockError:
            return False
        self._fenced(lock, token)
        return True

    async def acquire_release(self, resource: str | Sequence[str]) -> None:  # type: ignore[override]
        """``await acquire()``, maybe a fencing token and an extension, a hold, ``await release()``."""
        world = self.world
        blocking, timeout, cancel = self._wait_options()
        caller = self._begin(resource, cancel)
        try:
            lock = await self.manager.acquire(resource, blocking=blocking, timeout=timeout)
        except (LockNotAcquired, asyncio.CancelledError):
            self._end(caller, None)
            return
        self._end(caller, lock)
        if world.chance(0.3, "fence") and not await self._afence(lock):
            await lock.release()
            return
        peers = [p for p in self.peers if p is not self and not p.gone]
        if peers and world.chance(0.15, "hand off"):
            self._hand_off(lock, caller.call, world.choose(peers, "adopter"))
            return
        await self._use(lock)

    async def _use(self, lock: Any) -> None:  # type: ignore[override]
        world = self.world
        if world.chance(0.3, "extend"):
            try:
                await lock.extend()
            except LockError:
                await lock.release()
                return
        await self.asleep(world.uniform(0.0, lock.ttl / 2, "hold"))
        await lock.release()

    async def adopt(self, resources: tuple[str, ...], token: str, fencing: int | None,  # type: ignore[override]
                    value: str, ttl: float) -> None:
        """``await adopt()`` a lock handed over by another process, then use it as its holder would."""
        checker = self.sim.checker
        try:
            lock = await self.manager.adopt(list(resources), token, fencing_token=fencing)
        except LockError:
            checker.gave_up(self.proc, resources, value, ttl)
            return
        self._adopted(lock, value)
        if self.world.chance(0.3, "fence") and not await self._afence(lock):
            await lock.release()
            return
        await self._use(lock)
