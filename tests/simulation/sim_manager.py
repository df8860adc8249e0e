"""Simulated client processes that run the real :class:`~django_redlock.core.LockManager`.

A :class:`SimProcess` is one client process. Its callers are greenlets running
plain code on the public API (``with manager.lock(...)``, ``acquire`` and
``release``, ``extend``, ``fencing_token``, ``owned()``, ``adopt()``); the
manager, its locks, their holds, reentrancy and the keep-alive watchdog
(:class:`~django_redlock.core.extender.Extender`, its real loop) are the
engine's own. The one seam is the manager's ``_perform(effect)``: here it runs a
``Fan`` as a simulated round (:class:`.sim_round.SimDriver` on the manager's own
``node.books``), a ``Sleep`` as a timer on the process's drifting clock, a
background ``Fan`` as a round nobody waits for, and blocks the calling
greenlet until the world's scheduler resumes it. A greenlet switch is a plain
function call, so a run stays a pure function of its seed.

What the checker is told, and when: an acquisition when ``acquire()`` or the
hold returns a new lock, an extension through the manager's ``extended`` hook
(the caller's and the watchdog's), a release the moment its round is handed to
``_perform`` (the caller stopped using the lock then), each caller's entry into
and exit from a held lock, and whether its exit reported a loss.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from greenlet import GreenletExit, getcurrent, greenlet

from django_redlock.core import ledger, nodes, steps
from django_redlock.core.base import Hooks
from django_redlock.core.extender import Extender
from django_redlock.core.lock import LockBase
from django_redlock.core.records import Holder
from django_redlock.core.scripts import EXTEND, RELEASE
from django_redlock.core.sync_manager import LockManager
from django_redlock.exceptions import LockError, LockLost, LockNotAcquired

from .client import vote_argv, vote_of
from .invariants import Call, Violation
from .scenario import Sim
from .sim_round import SimDriver

__all__ = ["SimProcess"]


class _Caller:
    """What one greenlet's acquire() call under way has shown: its call and the values it voted with."""

    __slots__ = ("call", "values", "voting")

    def __init__(self, call: Call) -> None:
        self.call = call
        self.values: list[str] = []
        self.voting = False


class _Report(Hooks):
    """The manager's hooks: extensions (the caller's and the watchdog's) and a watchdog that stopped."""

    def __init__(self, process: SimProcess) -> None:
        self.process = process

    def extended(self, lock: LockBase) -> None:
        p = self.process
        if p._in_watchdog():
            p.stats["automatic extensions"] += 1
        p._checked(p.sim.checker.extended, p.proc, lock.resources, lock.value, lock.validity,
                   deadline_local=lock._deadline)

    def lost(self, lock: LockBase, reason: str) -> None:
        p = self.process
        if reason.startswith("at release"):  # (m): judged from the replies of its release round
            p._checked(p.sim.checker.loss_at_release, p.proc, lock.resources, lock.value)
        # (i): without max_hold, nothing but a loss or the release may end the automatic extensions.
        if lock.value in p.kept_alive and reason.startswith("it was no longer extended"):
            p._checked(p.sim.checker.stopped_extending, p.proc, lock.resources, reason)


class _Condition:
    """What the watchdog's loop waits on: a timer on the process's clock, or a notify."""

    def __init__(self, process: SimProcess) -> None:
        self.process = process
        self.waiter: Callable[[Any], None] | None = None

    def __enter__(self) -> bool:
        return True  # one greenlet runs at a time: nothing to exclude

    def __exit__(self, *exc: object) -> None:
        return None

    def wait(self, timeout: float | None = None) -> bool:
        proc = self.process.proc
        timer: list[int] = []

        def start(wake: Callable[[Any], None]) -> None:
            self.waiter = wake
            if timeout is not None:
                timer.append(proc.after_local(timeout, wake, False))

        woken = self.process._block(start)
        self.waiter = None
        if timer:
            proc.world.cancel(timer[0])
        return bool(woken)

    def notify(self, n: int = 1) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None:
            waiter(True)


class _Started:
    """The watchdog's loop, started as a greenlet (what ``Extender`` asks of its thread)."""

    def __init__(self, glet: greenlet) -> None:
        self.glet = glet

    def is_alive(self) -> bool:
        return not self.glet.dead


class SimProcess:
    """One client process running the real ``LockManager`` against the simulated nodes.

    ``callers`` greenlets work side by side on the same resources (one process, several threads of
    a web server); each is an owner of its own for ``reentrant=True``.
    """

    #: The manager this process runs (the async process runs AsyncLockManager).
    manager_class: type[Any] = LockManager

    def __init__(
        self,
        sim: Sim,
        name: str,
        *,
        ttl: float = 1.0,
        node_timeout: float = 0.05,
        retry_count: int | None = 3,
        retry_delay: float = 0.05,
        retry_jitter: float = 0.05,
        restart_window: float | None = None,
        wall_offset: float = 0.0,
        max_extensions: int | None = 2,
    ) -> None:
        self.sim = sim
        self.world = sim.world
        self.proc = sim.client(name)
        self.name = name
        self.wall_offset = wall_offset
        self.hub = getcurrent()  # the world's scheduler runs here
        self.node_timeout = node_timeout
        self.low, self.high = max(0.0, retry_delay - retry_jitter), retry_delay + retry_jitter
        self.options: dict[str, Any] = dict(
            ttl=ttl, max_ttl=ttl, node_timeout=node_timeout, retry_count=retry_count, retry_delay=retry_delay,
            retry_jitter=retry_jitter, restart_window=restart_window, clock_drift_factor=sim.drift,
            max_extensions=max_extensions,
        )
        #: What this process learned of each node (ledger.history_for): one process, its own.
        self.histories = ledger._Histories()
        #: Every greenlet started: kept until :meth:`close`, so none is collected (and unwound) mid-run.
        self.greenlets: list[greenlet] = []
        self.callers: dict[Any, _Caller] = {}
        self.cancels: dict[Any, BaseException] = {}
        #: value -> (lock, its call): what this process holds (dies with it).
        self.holding: dict[str, tuple[LockBase, Call | None]] = {}
        #: Values whose release this process wrote.
        self.released: set[str] = set()
        #: Values kept alive by the watchdog without max_hold.
        self.kept_alive: set[str] = set()
        #: Per greenlet: the values it is inside (a with block), and how deep.
        self.inside: dict[Any, dict[str, int]] = {}
        self.gone = False  # killed, or the run is over: nothing more is reported
        self.acquired = 0
        self.failed = 0
        self.watchdogs: set[greenlet] = set()
        #: The processes a lock may be handed to (adopt()).
        self.peers: list[SimProcess] = []
        #: What the workload did: acquired, nested, automatic extensions, losses reported, adopted...
        self.stats: Counter[str] = Counter()
        self.manager = self.new_manager()

    # -- the manager and its seam ---------------------------------------------------------

    def new_manager(self) -> LockManager:
        """A real LockManager whose effects happen in the simulated world."""
        saved = ledger._HISTORIES
        ledger._HISTORIES = self.histories
        try:
            manager = self.manager_class([f"redis://{node.name}:6379" for node in self.sim.nodes],
                                         hooks=_Report(self), **self.options)
        finally:
            ledger._HISTORIES = saved
        for node in manager.node_list:
            nodes._NODES.discard(node)  # no real socket to close at exit
        config = manager.config
        config.clock = self.proc.now
        config.wall_us = self.wall_us
        config.make_holder = self._holder
        world, low, high = self.world, self.low, self.high
        config.retry_pause = (  # type: ignore[method-assign]
            (lambda: world.uniform(low, high, "retry pause")) if high > low else (lambda: low)
        )
        self._seam(manager, SimDriver(self.sim, self.proc, [node.books for node in manager.node_list],
                                      self.node_timeout))
        return manager

    def _seam(self, manager: Any, driver: SimDriver) -> None:
        """Give the manager its ``_perform`` in the simulated world, and its watchdog."""
        manager._perform = lambda effect: self._perform(driver, effect)
        manager._extender_instance = Extender(now=self.proc.now, condition=lambda: _Condition(self),
                                              start=self._start_watchdog)

    def _me(self) -> Any:
        """The caller running now (its greenlet)."""
        return getcurrent()

    def _in_watchdog(self) -> bool:
        return getcurrent() in self.watchdogs

    def wall_us(self) -> int:
        # Wall clocks are set (NTP), not free-running: true time plus this host's error.
        return int((self.world.now + self.wall_offset) * 1_000_000)

    def _holder(self, label: str | None) -> Holder:
        return Holder(self.world.token(8), self.name, None, label, None)

    def _perform(self, driver: SimDriver, effect: Any) -> Any:
        if self.gone or not self.proc.alive:
            raise GreenletExit  # a dead process does nothing more: its callers unwind
        kind = type(effect)
        if kind is steps.Fan and effect.background:
            driver.fan(effect, lambda results: None)
            return None
        me = getcurrent()
        if kind is steps.Fan:
            self._see(me, effect)
            value = self._block(lambda wake: driver.fan(effect, wake))
            caller = self.callers.get(me)
            if caller is not None and caller.voting:
                caller.voting = False
                self.sim.checker.vote_answered(caller.call)
        elif kind is steps.Sleep:
            value = self._block(lambda wake: self.proc.after_local(effect.seconds, wake, None))
        else:
            raise TypeError(f"unknown step effect {effect!r}")
        error = self.cancels.pop(me, None)
        if error is not None:
            raise error
        return value

    def _see(self, me: greenlet, fan: steps.Fan) -> None:
        """Report what a round shows before it is written: a vote, a release, an extension."""
        checker = self.sim.checker
        vote = vote_of(fan)
        caller = self.callers.get(me)
        if vote is not None and caller is not None:
            value, _, mode, place, ticket, life = vote_argv(vote)[:6]
            if not caller.values or caller.values[-1] != value:
                caller.values.append(value)
            checker.voted(caller.call, mode, place, ticket, life)
            caller.voting = True
            return
        command = next((c for c in fan.commands if c is not None), None)
        if command is None:
            return
        if fan.script is RELEASE:
            value = command[3 + int(command[2])]  # EVALSHA sha numkeys keys... value
            held = self.holding.pop(value, None)
            if held is not None:
                lock, call = held
                self.released.add(value)
                checker.released(self.proc, lock.resources, value, lock.ttl)
                if call is not None:
                    checker.left_line(call)
        elif fan.script is EXTEND:
            value = command[3 + int(command[2])]
            if value in self.released:
                # Reported through the scheduler: the watchdog's loop survives any exception.
                self._checked(checker.extended_after_release, self.proc, value)

    def _block(self, start: Callable[[Callable[[Any], None]], Any]) -> Any:
        """Start something that calls ``wake(value)`` once; return that value, the greenlet blocked until then."""
        me = getcurrent()
        assert me is not self.hub, "the scheduler never blocks"
        box: list[Any] = []
        waiting = [False]

        def wake(value: Any) -> None:
            if box:
                return
            box.append(value)
            if waiting[0]:
                self._resume(me)

        start(wake)
        if not box:
            waiting[0] = True
            self.hub.switch()
        return box[0]

    def _resume(self, glet: greenlet) -> None:
        if getcurrent() is self.hub:
            glet.switch()
        else:  # from another greenlet: the scheduler resumes it at this instant
            self.world.at(self.world.now, glet.switch, proc=self.proc)

    def _checked(self, report: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Call the checker from inside the engine (hooks and the watchdog's loop swallow exceptions):
        a violation goes to the scheduler."""
        if self.gone:
            return
        try:
            report(*args, **kwargs)
        except Violation as exc:
            self.world.at(self.world.now, _raise, exc)

    def spawn(self, fn: Callable[..., Any], *args: Any) -> greenlet:
        """Start a caller: ``fn(*args)`` on a greenlet of its own, at this instant."""
        glet = greenlet(fn, parent=self.hub)
        self.greenlets.append(glet)
        self.world.at(self.world.now, glet.switch, *args, proc=self.proc)
        return glet

    def _start_watchdog(self, run: Callable[[], None]) -> _Started:
        glet = self.spawn(run)
        self.watchdogs.add(glet)
        return _Started(glet)

    def die(self) -> None:
        """The process is killed: what it held or was acquiring is given up (the checker's view)."""
        checker = self.sim.checker
        for caller in sorted(self.callers.values(), key=lambda c: c.call.seq):
            for value in caller.values:
                checker.gave_up(self.proc, caller.call.resources, value, self.options["ttl"])
            checker.left_line(caller.call)
        for lock, call in self.holding.values():
            checker.gave_up(self.proc, lock.resources, lock.value, lock.ttl)
            if call is not None:
                checker.left_line(call)
        self.callers.clear()
        self.holding.clear()
        self.gone = True

    def close(self) -> None:
        """The run is over: unwind every greenlet still blocked (reporting nothing)."""
        self.gone = True
        for glet in self.greenlets:
            if glet and not glet.dead:
                glet.throw(GreenletExit)
        self.greenlets.clear()

    # -- the caller's side: acquire calls, entries, exits ---------------------------------

    def _begin(self, resource: str | Sequence[str], cancel_after: float | None) -> _Caller:
        me = self._me()
        caller = self.callers[me] = _Caller(self.sim.checker.call(self.proc, resource))
        if cancel_after is not None:
            self.proc.after_local(cancel_after, self._cancel, me, caller)
        return caller

    def _cancel(self, me: greenlet, caller: _Caller) -> None:
        if self.callers.get(me) is caller:
            self.stats["cancelled"] += 1
            self.cancels[me] = asyncio.CancelledError()

    def _end(self, caller: _Caller, lock: LockBase | None) -> bool:
        """The acquire call returned ``lock`` (None: it raised). True for a new acquisition."""
        checker = self.sim.checker
        me = self._me()
        self.callers.pop(me, None)
        self.cancels.pop(me, None)
        values = caller.values
        new = lock is not None and bool(values) and values[-1] == lock.value
        ttl = self.options["ttl"]
        for value in values[:-1] if new else values:
            checker.gave_up(self.proc, caller.call.resources, value, ttl)
        if not new:
            checker.left_line(caller.call)
            if lock is None:
                self.failed += 1
            return False
        assert lock is not None
        self.acquired += 1
        self.stats["acquired"] += 1
        self.holding[lock.value] = (lock, caller.call)
        checker.acquired(self.proc, lock.resources, lock.value, lock.validity, deadline_local=lock._deadline,
                         call=caller.call)
        return True

    def _enter(self, lock: LockBase) -> None:
        me = self._me()
        depth = self.inside.setdefault(me, {})
        depth[lock.value] = depth.get(lock.value, 0) + 1
        self.stats["nested"] += lock._depth > 1
        self.sim.checker.entered(self.proc, id(me), lock.value)

    def _leaving(self, lock: LockBase) -> bool:
        """The with block ends now: True when it is the outermost entry and the lock's validity
        ran out before this moment (its exit must report the loss)."""
        me = self._me()
        depth = self.inside[me]
        depth[lock.value] -= 1
        outer = not depth[lock.value]
        if outer:
            del depth[lock.value]
        return self.sim.checker.leaving(self.proc, id(me), lock.value, outer)

    def _left(self, lock: LockBase, due: bool, reported: bool) -> None:
        self.stats["losses reported"] += reported
        if due and not reported:
            self.sim.checker.loss_unreported(self.proc, lock.resources, lock.value)

    def sleep(self, seconds: float) -> None:
        self._block(lambda wake: self.proc.after_local(seconds, wake, None))

    # -- the workload -----------------------------------------------------------------------

    def pick(self, resources: Sequence[str], multi: float) -> str | tuple[str, ...]:
        world = self.world
        if multi and len(resources) > 1 and world.chance(multi, "several resources"):
            return tuple(sorted(world.choose([(a, b) for a in resources for b in resources if a < b],
                                             "resources")))
        return world.choose(list(resources), "resource")

    def start(self, resources: Sequence[str], until: float, callers: int = 2, multi: float = 0.2) -> None:
        """Start ``callers`` greenlets working on ``resources`` until true time ``until``."""
        for _ in range(callers):
            self.spawn(self.session, list(resources), until, multi)

    def session(self, resources: list[str], until: float, multi: float) -> None:
        world = self.world
        while world.now < until:
            resource = self.pick(resources, multi)
            if world.chance(0.6, "hold"):
                self.hold(resource)
            else:
                self.acquire_release(resource)
            self.sleep(world.uniform(0.0, 0.05, "think"))

    def _wait_options(self) -> tuple[bool, float | None, float | None]:
        world = self.world
        blocking = world.chance(0.5, "blocking")
        timeout = world.choose([None, 0.05, 0.3, 1.0], "timeout") if blocking else None
        cancel = world.uniform(0.0, 1.0, "cancel after") if blocking and world.chance(0.1, "cancel") else None
        return blocking, timeout, cancel

    def hold(self, resource: str | Sequence[str], depth: int = 0) -> None:
        """``with manager.lock(...)``: maybe kept alive, maybe reentrant, maybe entered again inside."""
        blocking, timeout, cancel, auto, reentrant = self._hold_options(depth)
        caller = self._begin(resource, cancel)
        entered: LockBase | None = None
        due = False
        try:
            with self.manager.lock(resource, blocking=blocking, timeout=timeout, auto_extend=auto,
                                   reentrant=reentrant) as lock:
                entered = self._entered_hold(caller, lock, auto)
                self._work(lock, resource, auto, depth)
                due = self._leaving(lock)
        except (LockNotAcquired, asyncio.CancelledError, LockLost) as exc:
            self._exited(caller, entered, due, exc)
            return
        self._exited(caller, entered, due, None)

    def _hold_options(self, depth: int) -> tuple[bool, float | None, float | None, bool, bool]:
        """A hold's blocking, timeout, cancel-after, auto_extend and reentrant."""
        world = self.world
        blocking, timeout, cancel = self._wait_options()
        auto = depth == 0 and world.chance(0.4, "auto-extend")
        return blocking, timeout, cancel, auto, depth > 0 or world.chance(0.5, "reentrant")

    def _entered_hold(self, caller: _Caller, lock: LockBase, auto: bool) -> LockBase:
        if self._end(caller, lock) and auto:
            self.kept_alive.add(lock.value)
        self._enter(lock)
        return lock

    def _exited(self, caller: _Caller, entered: LockBase | None, due: bool, error: BaseException | None) -> None:
        """A hold is over: refused or cancelled before its block, or left (``error``: the LockLost
        its exit raised); anything else goes on."""
        lost = isinstance(error, LockLost)
        if entered is None and error is not None and not lost:
            self._end(caller, None)
        elif entered is not None and (error is None or lost):
            self._left(entered, due, lost)
        elif error is not None:
            raise error

    def _work(self, lock: LockBase, resource: str | Sequence[str], auto: bool, depth: int) -> None:
        world = self.world
        ttl = lock.ttl
        if world.chance(0.3, "fence") and not self._fence(lock):
            return
        what = world.choose(["hold", "extend", "owned", "nest"], "in the block")
        if what == "extend" and not auto:
            try:
                lock.extend()
            except LockError:
                return
        elif what == "owned":
            try:
                lock.owned()
            except LockError:
                pass
        elif what == "nest" and depth == 0:
            try:
                self.hold(lock.resources[:1] if world.chance(0.5, "a member") else resource, depth + 1)
            except LockLost:
                return  # the inner exit reported it; the outer one will too
        longest = ttl * 2.5 if auto else ttl * (1.3 if world.chance(0.2, "overrun") else 0.5)
        self.sleep(world.uniform(0.0, longest, "hold"))

    def _fence(self, lock: Any) -> bool:
        try:
            token = lock.fencing_token
        except LockError:
            return False
        self._fenced(lock, token)
        return True

    def _fenced(self, lock: LockBase, token: int) -> None:
        if lock.value in self.holding:
            self.stats["fenced"] += 1
            self.sim.checker.fenced(self.proc, lock.resources, lock.value, token)

    def acquire_release(self, resource: str | Sequence[str]) -> None:
        """``acquire()``, maybe a fencing token and an extension, a hold, ``release()``."""
        world = self.world
        blocking, timeout, cancel = self._wait_options()
        caller = self._begin(resource, cancel)
        try:
            lock = self.manager.acquire(resource, blocking=blocking, timeout=timeout)
        except (LockNotAcquired, asyncio.CancelledError):
            self._end(caller, None)
            return
        self._end(caller, lock)
        if world.chance(0.3, "fence") and not self._fence(lock):
            lock.release()
            return
        peers = [p for p in self.peers if p is not self and not p.gone]
        if peers and world.chance(0.15, "hand off"):
            self._hand_off(lock, caller.call, world.choose(peers, "adopter"))
            return
        self._use(lock)

    def _use(self, lock: Any) -> None:
        world = self.world
        if world.chance(0.3, "extend"):
            try:
                lock.extend()
            except LockError:
                lock.release()
                return
        self.sleep(world.uniform(0.0, lock.ttl / 2, "hold"))
        lock.release()

    def _hand_off(self, lock: LockBase, call: Call, peer: SimProcess) -> None:
        """Hand the lock to ``peer`` (a message on its way for a moment) and forget it here."""
        del self.holding[lock.value]
        self.sim.checker.left_line(call)  # a granted call's place goes; what is left expires by itself
        fencing = lock._fencing_token
        self.world.after(self.world.uniform(0.001, 0.05, "hand-off delay"), peer.spawn, peer.adopt,
                         lock.resources, lock.token, fencing, lock.value, lock.ttl, proc=peer.proc)

    def _adopted(self, lock: LockBase, value: str) -> None:
        self.stats["adopted"] += 1
        self.holding[value] = (lock, None)
        self.sim.checker.adopted(self.proc, value, lock.validity, deadline_local=lock._deadline)

    def adopt(self, resources: tuple[str, ...], token: str, fencing: int | None, value: str, ttl: float) -> None:
        """``adopt()`` a lock handed over by another process, then use it as its holder would."""
        checker = self.sim.checker
        try:
            lock = self.manager.adopt(list(resources), token, fencing_token=fencing)
        except LockError:
            checker.gave_up(self.proc, resources, value, ttl)
            return
        self._adopted(lock, value)
        if self.world.chance(0.3, "fence") and not self._fence(lock):
            lock.release()
            return
        self._use(lock)


def _raise(exc: BaseException) -> None:
    raise exc
