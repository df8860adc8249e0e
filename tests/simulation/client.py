"""The simulated client driver: the engine's real core, run inside the simulated world.

A :class:`SimClient` is one client process. It runs the engine's own steps
(:mod:`django_redlock.core.steps`: acquire, extend, fence, release) and its own
rounds and books (:mod:`django_redlock.core.rounds`): every decision is the
engine's. This driver only does what the sync and asyncio drivers do: open
simulated connections, write the commands a round asks for, hand each reply to
the books, set timers on the process's own (drifting) clock, and tell the
checker what the caller would see.

What the engine normally takes from the machine comes from the world here:
the monotonic clock is the process's (drifting) clock, the wall clock is true
time plus a per-process error (hosts' clocks disagree a little), tokens and
retry jitter come from the seed.
"""

from __future__ import annotations

import functools
import itertools
import weakref
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import asyncio

from django_redlock.core import base, held, steps
from django_redlock.core.base import ManagerConfig
from django_redlock.core.extender import Watch, next_action, next_due, note_extend_error
from django_redlock.core.lock import LockBase
from django_redlock.core.records import Holder
from django_redlock.core.books import NodeBooks
from django_redlock.core.scripts import ACQUIRE, VOTE
from django_redlock.exceptions import LockError, LockNotAcquired

from .invariants import Call
from .sim_round import SimDriver
from .scenario import Sim

__all__ = ["SimClient"]


class SimClient:
    """One client process running the real Redlock core against the simulated nodes."""

    def __init__(
        self,
        sim: Sim,
        name: str,
        *,
        ttl: float = 1.0,
        max_ttl: float | None = None,
        node_timeout: float = 0.05,
        retry_count: int | None = 3,
        retry_delay: float = 0.05,
        retry_jitter: float = 0.05,
        restart_window: float | None = None,
        clock_drift_factor: float | None = None,
        wall_offset: float = 0.0,
        fsync_declared: bool = False,
        max_extensions: int | None = 2,
    ) -> None:
        self.sim = sim
        self.world = sim.world
        self.proc = sim.client(name)
        self.name = name
        self.config = ManagerConfig(
            ttl=ttl,
            max_ttl=max_ttl if max_ttl is not None else ttl,
            node_timeout=node_timeout,
            retry_count=retry_count,
            retry_delay=retry_delay,
            retry_jitter=retry_jitter,
            restart_window=restart_window,
            clock_drift_factor=sim.drift if clock_drift_factor is None else clock_drift_factor,
            # Low: a caller extends once per hold, the watchdog up to three times (a hold of 2.5 ttls).
            max_extensions=max_extensions,
        )
        self.config.clock = self.proc.now
        self.config.wall_us = self.wall_us
        self.config.make_holder = self._holder
        config = self.config
        low = max(0.0, retry_delay - retry_jitter)
        high = retry_delay + retry_jitter
        config.retry_pause = (  # type: ignore[method-assign]
            (lambda: self.world.uniform(low, high, "retry pause")) if high > low else (lambda: low)
        )
        self.wall_offset = wall_offset
        self.books = [NodeBooks(node.name, node_timeout, fsync_declared) for node in sim.nodes]
        self.driver = SimDriver(sim, self.proc, self.books, node_timeout)
        self.fan = self.driver.fan
        self.names = [node.name for node in sim.nodes]
        self.total = len(sim.nodes)
        # The manager a lock knows about: configuration and quorum only.
        self.manager = SimpleNamespace(config=config, node_list=self.names, quorum=self.quorum, _forget=lambda lock: None)
        self.last_error: BaseException | None = None
        #: id(step) -> an exception to throw into that step instead of its round's results
        #: (a caller cancelled while it awaited the round).
        self.cancelled: dict[int, BaseException] = {}
        self.acquired = 0
        self.failed = 0
        #: acquire() calls under way, and the locks held (value -> (lock, its call)): what dies with the process.
        self.calls: set[_Watch] = set()
        self.holding: dict[str, tuple[LockBase, Call]] = {}

    @property
    def quorum(self) -> int:
        return base.quorum_of(self.total)  # looked up on every use: a mutant may change it

    def _holder(self, label: str | None) -> Holder:
        return Holder(self.world.token(8), self.name, None, label, None)

    def wall_us(self) -> int:
        # Wall clocks are set (NTP), not free-running: true time plus this host's error.
        return int((self.world.now + self.wall_offset) * 1_000_000)

    # -- driving steps -----------------------------------------------------------------

    def run(self, step: steps.Step, done: Callable[[Any, BaseException | None], None]) -> None:
        """Drive ``step`` to its end (a :class:`~django_redlock.core.steps.Run`, as the engine's drivers
        do), then call ``done(result, error)``."""
        try:
            run = steps.Run(step)
        except BaseException as exc:  # noqa: BLE001 - the operation's own outcome (LockNotAcquired...)
            done(None, exc)
            return
        self._drive(run, done)

    def _resume(self, run: steps.Run, done: Callable[..., None], value: Any) -> None:
        """Hand ``run`` the result of what it waited for, or the cancellation delivered meanwhile."""
        try:
            run.resume(value, self.cancelled.pop(id(run.step), None))
        except BaseException as exc:  # noqa: BLE001 - the operation's own outcome
            done(None, exc)
            return
        self._drive(run, done)

    def _drive(self, run: steps.Run, done: Callable[..., None]) -> None:
        """Perform ``run``'s effects until one must wait (a round, a sleep) or it ends."""
        while run.going:
            effect = run.effect
            kind = type(effect)
            value: Any = None
            if kind is steps.Sleep:
                self.proc.after_local(effect.seconds, self._resume, run, done, None)
                return
            elif kind is steps.Fan and effect.background:
                self.fan(effect, lambda results: None)
            elif kind is steps.Fan:
                self.fan(effect, lambda results: self._resume(run, done, results))
                return
            else:
                raise TypeError(f"unknown step effect {effect!r}")
            try:
                run.resume(value, None)
            except BaseException as exc:  # noqa: BLE001 - the operation's own outcome
                done(None, exc)
                return
        done(run.value, None)

    # -- a workload ---------------------------------------------------------------------------

    fencing = True
    #: The chance that a workload call locks several resources at once (all or nothing).
    multi = 0.0

    def acquire(self, resource: str | Sequence[str],
                then: Callable[[LockBase | None, BaseException | None], None], *,
                blocking: bool, timeout: float | None, cancel_after: float | None = None) -> None:
        """Acquire ``resource`` (one, or several together) through the engine's step; report the lock,
        every given-up attempt and the call's place in line to the checker. ``cancel_after`` (local
        seconds): the caller cancels the call then (delivered when its current round or sleep ends,
        as a CancelledError)."""
        checker = self.sim.checker
        watch: _Watch

        def done(result: Any, error: BaseException | None) -> None:
            self.calls.discard(watch)
            values = watch.values
            for value in values[:-1] if error is None else values:
                checker.gave_up(self.proc, resource, value, self.config.ttl)
            self.cancelled.pop(id(watch), None)
            if error is not None:
                checker.left_line(watch.call)
                self.failed += 1
                self.last_error = error
                if not isinstance(error, (LockNotAcquired, asyncio.CancelledError)):
                    raise error
                then(None, error)
                return
            plan = result
            lock = LockBase.granted(self.manager, plan)
            self.acquired += 1
            self.holding[lock.value] = (lock, watch.call)
            checker.acquired(self.proc, lock.resources, lock.value, lock.validity, deadline_local=lock._deadline,
                             call=watch.call)
            then(lock, None)

        request = self.config.request(resource, None, blocking, timeout, None)
        step = steps.acquire(self.config, self.quorum, self.names, request)
        watch = _Watch(step, checker.call(self.proc, resource), checker)
        self.calls.add(watch)
        if cancel_after is not None:
            self.proc.after_local(cancel_after, self._cancel, watch)
        self.run(watch, done)

    def _cancel(self, watch: _Watch) -> None:
        if watch in self.calls:
            self.cancelled[id(watch)] = asyncio.CancelledError()

    def release(self, lock: LockBase, then: Callable[[], None] = lambda: None) -> None:
        """The caller is done: report it, then release on every node (and leave the line)."""
        checker = self.sim.checker
        checker.released(self.proc, lock.resources, lock.value, self.config.ttl)
        _, call = self.holding.pop(lock.value, (None, None))
        if call is not None:
            checker.left_line(call)
        lock.released = True
        fan = steps.release_fan(self.config, self.total, lock.resources, lock.value, lock.ttl, lock._place, quorum=self.quorum)
        self.fan(fan, lambda _: then())

    def die(self) -> None:
        """The process is killed: what it held or was acquiring is given up (the checker's view)."""
        checker = self.sim.checker
        for watch in sorted(self.calls, key=lambda w: w.call.seq):
            for value in watch.values:
                checker.gave_up(self.proc, watch.call.resources, value, self.config.ttl)
            checker.left_line(watch.call)
        for lock, call in self.holding.values():
            checker.gave_up(self.proc, lock.resources, lock.value, self.config.ttl)
            checker.left_line(call)
        self.calls.clear()
        self.holding.clear()

    def pick(self, resources: Sequence[str]) -> str | tuple[str, ...]:
        """What one call locks: one of ``resources``, or (by chance :attr:`multi`) two or three of them."""
        world = self.world
        if self.multi and len(resources) > 1 and world.chance(self.multi, "several resources"):
            sets = [c for k in (2, 3) for c in itertools.combinations(resources, k)]
            return world.choose(sets, "resources")
        return world.choose(list(resources), "resource")

    def session(self, resources: list[str], until: float) -> None:
        """Loop until true time ``until``: acquire (one resource or several), maybe fence and extend,
        hold, release."""
        if self.world.now >= until or not self.proc.alive:
            return
        world = self.world
        resource = self.pick(resources)
        blocking = world.chance(0.5, "blocking")
        # Blocking calls wait in line (None: retry_count * retry_delay); some callers cancel theirs.
        timeout = world.choose([None, 0.05, 0.3, 1.0, 2.5], "timeout") if blocking else None
        cancel = world.uniform(0.0, 1.0, "cancel after") if blocking and world.chance(0.1, "cancel") else None

        def acquired(lock: LockBase | None, error: BaseException | None) -> None:
            if lock is None:
                self.proc.after_local(world.uniform(0.0, 0.05, "think"), self.session, resources, until)
            else:
                self._hold(lock, resources, until, self.fencing)

        self.acquire(resource, acquired, blocking=blocking, timeout=timeout, cancel_after=cancel)

    def contend(self, resource: str | Sequence[str], until: float, *, hold: float = 0.05, timeout: float = 5.0,
                once: float = 0.2) -> None:
        """Loop until true time ``until``: a blocking acquire (or, by chance ``once``, a non-blocking one)
        of ``resource``, a short hold, a release: callers queueing up for one lock. Given several
        resources, each call picks what it locks as :meth:`pick` does (with :attr:`multi`, overlapping
        sets of them)."""
        world = self.world
        if world.now >= until or not self.proc.alive:
            return

        def again() -> None:
            self.proc.after_local(world.uniform(0.0, 0.02, "think"),
                                  lambda: self.contend(resource, until, hold=hold, timeout=timeout, once=once))

        def acquired(lock: LockBase | None, error: BaseException | None) -> None:
            if lock is None:
                return again()
            self.proc.after_local(world.uniform(0.0, hold, "hold"), self.release, lock, again)

        blocking = not world.chance(once, "non-blocking")
        target = resource if isinstance(resource, str) else self.pick(resource)
        self.acquire(target, acquired, blocking=blocking, timeout=timeout if blocking else None)

    def _hold(self, lock: LockBase, resources: list[str], until: float, fencing: bool) -> None:
        world = self.world

        def release() -> None:
            self.release(lock, lambda: self.proc.after_local(world.uniform(0.0, 0.05, "think"),
                                                             self.session, resources, until))

        def work() -> None:
            if not lock.locked():
                return release()
            if world.chance(0.3, "auto-extend"):
                self.keep_alive(lock)
                self.proc.after_local(world.uniform(0.0, lock.ttl * 2.5, "long hold"), release)
                return
            if world.chance(0.3, "extend"):
                def extended(_: Any, error: BaseException | None) -> None:
                    if error is None:
                        self.sim.checker.extended(self.proc, lock.resources, lock.value, lock.validity,
                                                  deadline_local=lock._deadline)
                        self.proc.after_local(world.uniform(0.0, lock.ttl / 2, "hold"), release)
                    elif isinstance(error, LockError):
                        release()
                    else:
                        raise error

                self.run(steps.extend(lock, None, False, self.quorum, self.total), extended)
                return
            self.proc.after_local(world.uniform(0.0, lock.ttl / 2, "hold"), release)

        if fencing and world.chance(0.5, "fence"):
            def fenced(token: Any, error: BaseException | None) -> None:
                if error is None:
                    self.sim.checker.fenced(self.proc, lock.resources, lock.value, token)
                    work()
                elif isinstance(error, LockError):
                    release()
                else:
                    raise error

            self.run(steps.fence(lock, self.config, self.quorum, self.total), fenced)
        else:
            work()


    def keep_alive(self, lock: LockBase) -> None:
        """Auto-extension with the engine's own watchdog timing (``next_due``, ``next_action``)."""
        watch = Watch(self.manager, weakref.ref(lock), lock.resource, None, None)
        checker = self.sim.checker

        def schedule() -> None:
            if not (lock.released or lock.lost):
                self.proc.at_local(next_due(watch, lock, self.proc.now()), wake)

        def extended(_: Any, error: BaseException | None) -> None:
            if error is None:
                watch.failure = None
                if not lock.released:
                    checker.extended(self.proc, lock.resources, lock.value, lock.validity,
                                     deadline_local=lock._deadline)
            elif isinstance(error, Exception):
                note_extend_error(watch, lock, error)
                if watch.stopped is not None:  # there is no max_hold here: nothing else may stop it
                    checker.stopped_extending(self.proc, lock.resources, watch.stopped)
            schedule()

        def checked(results: list[Any]) -> None:
            if not lock.released:
                held.judge_owned(lock, results)  # marks the lock lost when enough nodes say "not ours"
            schedule()

        def wake() -> None:
            action = next_action(watch, lock)
            if action == "extend":
                self.run(steps.extend(lock, None, True, self.quorum, self.total), extended)
            elif action == "check" and held.can_ask(lock):
                done = base.until_outcome(self.quorum, self.total, functools.partial(held.is_ours, lock))
                self.fan(steps.Fan([held.read_command(lock)] * self.total, done=done), checked)
            elif action != "stop":
                schedule()

        schedule()


def vote_of(effect: Any) -> tuple[Any, ...] | None:
    """The ACQUIRE command of an acquire step's vote (EVALSHA sha numkeys, the keys in threes: lock queue
    places per resource, then value ttl mode place ticket life and a wake list per resource), or None
    for any other effect. :func:`vote_argv` reads its arguments."""
    if type(effect) is not steps.Fan:
        return None
    command = next((c for c in effect.commands if c is not None), None)
    if effect.script is ACQUIRE:
        return command
    if command is not None and command[0] == "SET":  # a non-blocking call's plain SET NX PX, in that shape
        return ("EVALSHA", ACQUIRE.sha, 3, command[1], "", "", command[2], command[5], "once", "", 0, 0, "")
    if command is not None and effect.script is VOTE:  # its SET NX PX behind the data-set check: the same
        return ("EVALSHA", ACQUIRE.sha, 3, command[3], "", "", command[4], command[5], "once", "", 0, 0, "")
    return None


def vote_argv(vote: tuple[Any, ...]) -> tuple[Any, ...]:
    """A vote's ARGV (value, ttl ms, mode, place, ticket, life ms, wake lists...), past its KEYS."""
    return vote[3 + int(vote[2]):]


class _Watch:
    """Wrap an acquire step to note every attempt's value and the call's place in line (from its votes)."""

    def __init__(self, step: steps.Step, call: Call, checker: Any) -> None:
        self.step = step
        self.call = call
        self.checker = checker
        self.values: list[str] = []
        self.voting = False

    def _see(self, effect: Any) -> Any:
        vote = vote_of(effect)
        if vote is not None:
            value, _, mode, place, ticket, life = vote_argv(vote)[:6]
            if not self.values or self.values[-1] != value:
                self.values.append(value)
            self.checker.voted(self.call, mode, place, ticket, life)
            self.voting = True
        return effect

    def send(self, value: Any) -> Any:
        if self.voting:
            self.voting = False
            self.checker.vote_answered(self.call)
        return self._see(self.step.send(value))

    def throw(self, error: BaseException) -> Any:
        return self._see(self.step.throw(error))
