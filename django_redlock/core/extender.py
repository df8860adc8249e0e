"""One background thread that keeps auto-extended locks alive.

Each watched lock is extended when about a third of its ttl is left, and in
between the thread reads its key on every node (one GET fan-out every third of
the ttl), so a force-release is noticed within a third of the ttl. A failed
extension that leaves validity is retried soon, and the thread always wakes
when the validity ends: a lock that could not be extended is reported lost
then, not later. After ``max_hold`` seconds the lock is no longer extended,
and when its validity ends it is reported lost too: never silently.

``on_lost`` runs exactly once, on a thread of its own, for a loss found while the lock
is watched (by this thread, ``extend()``, ``owned()`` or the fencing token);
never for a clean release. Locks are held weakly: one dropped without release
stops being extended and expires. A forked child starts with an empty extender.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

from django_redlock.core import clock, held
from django_redlock.exceptions import LockError, LockLost

logger = logging.getLogger("django_redlock")

#: Extend when this fraction of the ttl is left.
EXTEND_AT = 1 / 3
#: Between extensions, check that the nodes still hold the lock this often (fraction of the ttl).
CHECK_EVERY = 1 / 3
#: Retry a failed (but not yet fatal) extension after this fraction of the validity left.
RETRY_FRACTION = 0.2
#: Shortest pause between two wake-ups of one lock, however small its ttl.
MIN_TICK = 0.005
#: Longest sleep of a keep-alive (this thread, the asyncio task) before it reads the engine's clock
#: again: their timers (a condition's wait, ``asyncio.sleep``) run on ``time.monotonic()``, which
#: stops while the host is suspended, and the deadlines are on :func:`clock.now`, which does not.
#: A resumed host's due extension is seen within this long.
LONGEST_SLEEP = 1.0


@dataclass(eq=False)
class Watch:
    manager: Any
    ref: weakref.ref[Any]
    resource: str
    stop_extending_at: float | None
    on_lost: Callable[[Any], Any] | None
    #: Still scheduled on the thread.
    active: bool = True
    #: A loss marked from now on is reported to ``on_lost``.
    listening: bool = True
    #: Why it is no longer extended (max_hold, the extension limit), once it is not.
    stopped: str | None = None
    #: The last failed extension, while retries are pending.
    failure: str | None = None


def next_due(watch: Watch, lock: Any, now: float) -> float:
    """The next wake-up: a check tick, the extension or its retry, and never past the validity."""
    due: float = min(lock._deadline, now + max(MIN_TICK, lock.ttl * CHECK_EVERY))
    if watch.stopped is None:
        if watch.failure is not None:
            due = min(due, now + max(0.01, lock.validity * RETRY_FRACTION))
        else:
            due = min(due, lock._deadline - lock.ttl * EXTEND_AT)
    return due


def sleep_for(due: float, now: float) -> float:
    """How long a keep-alive sleeps toward ``due`` from ``now`` (the engine's clock): never past it,
    and never longer than :data:`LONGEST_SLEEP` (the sync and async keep-alives share it)."""
    return min(max(0.0, due - now), LONGEST_SLEEP)


def next_action(watch: Watch, lock: Any) -> str:
    """What a wake-up does: ``"stop"``, ``"extend"`` or ``"check"`` (the sync and async keep-alives share it).

    A lock whose validity is over is marked lost here; a loss found elsewhere
    was already reported through the lock's listener.
    """
    if lock is None:
        logger.warning(
            "Lock %r was dropped without being released: it is no longer extended and expires within its ttl.",
            watch.resource,
        )
        return "stop"
    if not watch.active or lock.released or lock.lost:
        return "stop"
    now = lock._clock()
    if now >= lock._deadline:
        if watch.stopped is not None:
            reason = watch.stopped
        elif watch.failure is not None:
            reason = f"it expired while extensions failed (last: {watch.failure})"
        else:
            reason = "it expired before it could be extended"
        held.mark_lost(lock, reason, while_held=True)
        return "stop"
    if watch.stopped is None and watch.stop_extending_at is not None and now >= watch.stop_extending_at:
        watch.stopped = "it was no longer extended (max_hold reached) and expired"
    if watch.stopped is None and (watch.failure is not None or lock.validity <= lock.ttl * EXTEND_AT):
        return "extend"
    return "check"


def note_extend_error(watch: Watch, lock: Any, exc: Exception) -> None:
    """Record why an automatic extension failed: retry, stop extending, or nothing (already lost)."""
    if isinstance(exc, LockLost):
        if not lock.lost:
            watch.failure = str(exc)
            logger.warning("Extending lock %r failed, retrying: %s", lock.resource, exc)
    elif isinstance(exc, LockError):  # the extension limit (or released meanwhile): let it expire, then report
        if not lock.released:
            logger.warning("Lock %r is no longer extended: %s", lock.resource, exc)
            watch.stopped = f"it was no longer extended ({exc}) and expired"
    else:
        logger.error("Unexpected error extending lock %r", lock.resource, exc_info=exc)
        watch.failure = repr(exc)


class Condition(Protocol):
    """What the extender waits on and notifies (``threading.Condition``; the simulator's cooperative one)."""

    def __enter__(self) -> Any: ...

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Any: ...

    def wait(self, timeout: float | None = None) -> bool: ...

    def notify(self, n: int = 1) -> None: ...


class Runner(Protocol):
    """A started run of the extender's loop (a ``threading.Thread``)."""

    def is_alive(self) -> bool: ...


def _engine_now() -> float:
    return clock.now()  # looked up on each call, as everywhere in the engine


def start_thread(run: Callable[[], None]) -> Runner:
    """Run the extender's loop on a daemon thread."""
    thread = threading.Thread(target=run, name="redlock-extender", daemon=True)
    thread.start()
    return thread


_extenders: weakref.WeakSet[Extender] = weakref.WeakSet()


def _reset_after_fork() -> None:
    for extender in list(_extenders):
        extender._reset()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


class Extender:
    """Schedule extensions and ownership checks for locks from a single daemon thread.

    ``now`` (the clock its deadlines are read on; the engine's ``clock.now``), ``condition`` (makes what the loop waits on) and
    ``start`` (runs the loop) are the real ones by default; the simulator drives the same loop on its
    own clock and scheduler.
    """

    def __init__(
        self,
        now: Callable[[], float] | None = None,
        condition: Callable[[], Condition] = threading.Condition,
        start: Callable[[Callable[[], None]], Runner] = start_thread,
    ) -> None:
        self._now = now or _engine_now
        self._condition = condition
        self._start = start
        self._reset()
        _extenders.add(self)

    def _reset(self) -> None:
        # Also run in a forked child: the parent's thread, its condition and its locks stay behind.
        self._cond = self._condition()
        self._heap: list[tuple[float, int, Watch]] = []
        self._watches: weakref.WeakKeyDictionary[Any, Watch] = weakref.WeakKeyDictionary()
        self._reports: deque[tuple[Watch, Any]] = deque()
        self._counter = itertools.count()
        self._thread: Runner | None = None

    def add(self, manager: Any, lock: Any, max_hold: float | None, on_lost: Callable[[Any], Any] | None) -> None:
        stop_at = self._now() + max_hold if max_hold is not None else None
        watch = Watch(manager, weakref.ref(lock), lock.resource, stop_at, on_lost)

        def listener(lost: Any) -> None:
            with self._cond:
                if watch.listening:
                    watch.listening = False
                    self._reports.append((watch, lost))
                    self._cond.notify()

        with self._cond:
            self._ensure_thread()
            previous = self._watches.get(lock)
            if previous is not None:
                previous.active = previous.listening = False
            self._watches[lock] = watch
            lock._lost_listener = listener
            self._push(watch, next_due(watch, lock, self._now()))

    def remove(self, lock: Any) -> None:
        with self._cond:
            watch = self._watches.pop(lock, None)
            if watch is not None:
                watch.active = watch.listening = False

    def clear(self, manager: Any) -> None:
        with self._cond:
            for lock, watch in list(self._watches.items()):
                if watch.manager is manager:
                    watch.active = watch.listening = False
                    del self._watches[lock]
            self._cond.notify()

    # -- the thread --------------------------------------------------------

    def _push(self, watch: Watch, due: float) -> None:
        heapq.heappush(self._heap, (due, next(self._counter), watch))
        self._cond.notify()

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = self._start(self._run)

    def _run(self) -> None:
        while True:
            report = None
            with self._cond:
                while True:
                    if self._reports:
                        report = self._reports.popleft()
                        break
                    while self._heap and not self._heap[0][2].active:
                        heapq.heappop(self._heap)
                    if not self._heap:
                        self._cond.wait(timeout=30.0)
                        continue
                    wait = sleep_for(self._heap[0][0], self._now())
                    if wait <= 0:
                        _, _, watch = heapq.heappop(self._heap)
                        break
                    self._cond.wait(timeout=wait)
            try:
                if report is not None:
                    self._report(*report)
                else:
                    self._step(watch)
            except Exception:  # noqa: BLE001 - the thread must survive anything
                logger.exception("Unexpected error in the lock extender")

    def _step(self, watch: Watch) -> None:
        lock: Any = watch.ref()
        action = next_action(watch, lock)
        if action == "extend":
            try:
                lock._extend(None, automatic=True)
                watch.failure = None
            except Exception as exc:  # noqa: BLE001 - judged by note_extend_error
                note_extend_error(watch, lock, exc)
        elif action == "check" and held.can_ask(lock):
            lock._check_owned()  # marks it lost when enough nodes say "not ours"
        if action == "stop" or lock.lost or lock.released:
            self._drop(watch, lock)
            return
        with self._cond:
            if watch.active:
                self._push(watch, next_due(watch, lock, self._now()))

    def _drop(self, watch: Watch, lock: Any) -> None:
        with self._cond:
            watch.active = False
            if lock is not None and self._watches.get(lock) is watch:
                del self._watches[lock]

    def _report(self, watch: Watch, lock: Any) -> None:
        self._drop(watch, lock)
        on_lost = watch.on_lost
        if on_lost is None:
            return

        def report() -> None:
            try:
                on_lost(lock)
            except Exception:  # noqa: BLE001
                logger.exception("on_lost callback for lock %r failed", lock.resource)

        # A run of its own: while a slow callback (an alert sent over the network) runs, this
        # thread goes on extending the process's other locks, which would otherwise expire.
        try:
            self._start(report)
        except RuntimeError:  # no thread can be started: report here
            report()
