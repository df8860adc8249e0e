"""What the exporters share: the hooks that turn lock events into measurements, and the
bookkeeping behind the gauges (the locks this process holds, by group)."""

from __future__ import annotations

import os
import threading
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from django_redlock.core.config import AcquireReport, Hooks, NodeSeen
from django_redlock.core.hooks import HeldLock

if TYPE_CHECKING:
    from django_redlock.core.held import LockBase

__all__ = [
    "ACQUIRE_BUCKETS",
    "HOLD_BUCKETS",
    "NODE_BUCKETS",
    "OUTCOMES",
    "HeldLocks",
    "MetricsHooks",
    "missing_library",
]


def missing_library(exporter: str, library: str, error: ImportError) -> ImportError:
    """What ``django_redlock.metrics.<exporter>`` raises when its library is not installed: what to install."""
    return ImportError(
        f"django_redlock.metrics.{exporter} needs {library} ({error}): pip install 'django-redlock[{exporter}]'"
    )


#: How an ``acquire()`` call ends (the ``outcome`` label).
OUTCOMES = ("acquired", "locked", "no_quorum", "error")
#: Seconds: an acquire (one round trip to several ms; waits in line up to a minute).
ACQUIRE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: Seconds a lock is held (a request to a long job kept alive).
HOLD_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
#: Seconds: one node's round trip.
NODE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class HeldLocks:
    """Counts the locks acquired through the hooks and not released yet, by group (or None):
    ``change(group, +1)`` at each acquire, ``change(group, -1)`` at its release.

    A lock dropped without release (it expires on the nodes by itself) is taken off at the next lock
    event after it was collected: never from the garbage collector, which may run while a metric's
    own lock is held. A forked child does not hold its parent's locks: it neither counts them nor
    takes them off.
    """

    def __init__(self, change: Callable[[str | None, int], None]) -> None:
        self._change = change
        self._locks: weakref.WeakKeyDictionary[HeldLock, weakref.finalize[Any, Any]] = weakref.WeakKeyDictionary()
        self._dropped: deque[str | None] = deque()
        self._mutex = threading.Lock()

    def add(self, lock: HeldLock, group: str | None) -> None:
        self._settle()
        with self._mutex:
            if lock in self._locks:
                return
            watch = self._locks[lock] = weakref.finalize(lock, self._collected, os.getpid(), group)
            watch.atexit = False
        self._change(group, 1)

    def discard(self, lock: HeldLock) -> bool:
        """Take ``lock`` off; True when it was counted."""
        self._settle()
        with self._mutex:
            watch = self._locks.pop(lock, None)
        if watch is None:
            return False
        found = watch.detach()
        if found is not None and found[2][0] == os.getpid():  # detach() returns (lock, callback, args, kwargs)
            self._change(found[2][1], -1)
        return True

    def _collected(self, pid: int, group: str | None) -> None:
        if pid == os.getpid():  # not a parent's lock, dropped in a forked child
            self._dropped.append(group)

    def _settle(self) -> None:
        while self._dropped:
            try:
                group = self._dropped.popleft()
            except IndexError:  # another thread took it
                return
            self._change(group, -1)


def check_group(group: Any) -> Callable[[str], str] | None:
    if group is not None and not callable(group):
        raise ValueError(
            f"group must be a function that maps a resource name to a group name (a short string), or None; "
            f"got {type(group).__name__}."
        )
    return cast("Callable[[str], str] | None", group)


class MetricsHooks(Hooks):
    """Hooks that measure: the base of :class:`~django_redlock.metrics.PrometheusHooks` and
    :class:`~django_redlock.metrics.OpenTelemetryHooks`.

    ``group``: a function that maps a lock's resource name (several resources: joined by ``", "``) to a
    group name; the lock metrics are then labelled ``group`` by it. Without it they carry no
    resource label at all: resource names are unbounded (``invoice-42``), and each label value is a
    time series. Keep the groups few (``lambda r: r.split("-")[0]``).
    """

    #: The locks held, counted in the instruments this instance records into (shared with others that do).
    held: HeldLocks

    def __init__(self, group: Callable[[str], str] | None = None) -> None:
        self.group = check_group(group)

    def group_of(self, resource: str) -> str | None:
        return None if self.group is None else str(self.group(resource))

    # -- the engine's events -------------------------------------------------

    def acquired(self, lock: HeldLock) -> None:
        self.held.add(lock, self.group_of(lock.resource))

    def released(self, lock: HeldLock) -> None:
        if self.held.discard(lock):  # held since acquire() here (not a handle adopted from elsewhere)
            held = cast("LockBase", lock)
            seconds = max(0.0, held.manager.config.clock() - held._acquired_at)
            self.record_hold(self.group_of(lock.resource), seconds)

    def lost(self, lock: HeldLock, reason: str) -> None:
        self.record_lost(self.group_of(lock.resource))

    def acquire_finished(self, report: AcquireReport) -> None:
        self.record_acquire(report, self.group_of(report.resource))

    def extension_finished(self, lock: HeldLock, automatic: bool, extended: bool) -> None:
        kind = "automatic" if automatic else "manual"
        self.record_extension(self.group_of(lock.resource), kind, "extended" if extended else "failed")

    def recreated(self, lock: HeldLock, nodes: Sequence[str]) -> None:
        for node in nodes:
            self.record_recreated(node)

    def nodes_seen(self, seen: Sequence[NodeSeen]) -> None:
        for node in seen:
            self.record_node(node)

    # -- what an exporter records --------------------------------------------

    def record_acquire(self, report: AcquireReport, group: str | None) -> None:
        raise NotImplementedError

    def record_extension(self, group: str | None, kind: str, outcome: str) -> None:
        raise NotImplementedError

    def record_lost(self, group: str | None) -> None:
        raise NotImplementedError

    def record_hold(self, group: str | None, seconds: float) -> None:
        raise NotImplementedError

    def record_node(self, node: NodeSeen) -> None:
        raise NotImplementedError

    def record_recreated(self, node: str) -> None:
        raise NotImplementedError
