"""One background thread that keeps auto-extended locks alive.

Each watched lock is extended when about a third of its ttl is left. A failed
extension that leaves validity is retried soon; one that fails on a quorum, or
a lock whose validity runs out, is marked lost and its ``on_lost`` callback runs.
After ``max_hold`` seconds the lock is no longer extended, and when its
validity ends it is reported lost too: never silently.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django_redlock.exceptions import LockError, LockLost

logger = logging.getLogger("django_redlock")

#: Extend when this fraction of the ttl is left.
EXTEND_AT = 1 / 3
#: Retry a failed (but not yet fatal) extension after this fraction of the validity left.
RETRY_FRACTION = 0.2


@dataclass
class Watch:
    manager: Any
    lock: Any
    stop_extending_at: float | None
    on_lost: Callable[[Any], Any] | None
    active: bool = True
    seq: int = field(default=0)


class Extender:
    """Schedule extensions for locks from a single daemon thread (restarted after fork)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Watch]] = []
        self._watches: dict[int, Watch] = {}
        self._counter = itertools.count()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def add(self, manager: Any, lock: Any, max_hold: float | None, on_lost: Callable[[Any], Any] | None) -> None:
        stop_at = time.monotonic() + max_hold if max_hold is not None else None
        watch = Watch(manager, lock, stop_at, on_lost, seq=next(self._counter))
        with self._cond:
            self._ensure_thread()
            self._watches[id(lock)] = watch
            self._push(watch, self._due(lock))

    def remove(self, lock: Any) -> None:
        with self._cond:
            watch = self._watches.pop(id(lock), None)
            if watch is not None:
                watch.active = False

    def clear(self, manager: Any) -> None:
        with self._cond:
            for key, watch in list(self._watches.items()):
                if watch.manager is manager:
                    watch.active = False
                    del self._watches[key]
            self._cond.notify()

    # -- the thread --------------------------------------------------------

    @staticmethod
    def _due(lock: Any) -> float:
        return time.monotonic() + max(0.0, lock.validity - lock.ttl * EXTEND_AT)

    def _push(self, watch: Watch, due: float) -> None:
        heapq.heappush(self._heap, (due, next(self._counter), watch))
        self._cond.notify()

    def _ensure_thread(self) -> None:
        if self._pid != os.getpid():  # forked: the parent's thread does not exist here
            self._pid = os.getpid()
            self._thread = None
            self._heap.clear()
            self._watches.clear()
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="redlock-extender", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    while self._heap and not self._heap[0][2].active:
                        heapq.heappop(self._heap)
                    if not self._heap:
                        self._cond.wait(timeout=30.0)
                        continue
                    due = self._heap[0][0]
                    wait = due - time.monotonic()
                    if wait <= 0:
                        _, _, watch = heapq.heappop(self._heap)
                        break
                    self._cond.wait(timeout=wait)
            self._step(watch)

    def _step(self, watch: Watch) -> None:
        lock = watch.lock
        if not watch.active or lock.released or lock.lost:
            self._drop(watch)
            return
        now = time.monotonic()
        if lock.validity <= 0:
            self._lose(watch, "it expired before it could be extended")
            return
        if watch.stop_extending_at == float("-inf"):
            self._lose(watch, "it was no longer extended (max_hold or the extension limit) and expired")
            return
        if watch.stop_extending_at is not None and now >= watch.stop_extending_at:
            # Hold time used up: no more extensions; report the loss when it expires.
            watch.stop_extending_at = float("-inf")
            with self._cond:
                if watch.active:
                    self._push(watch, now + lock.validity)
            return
        try:
            lock._extend(None, counted=watch.stop_extending_at is None)
        except LockLost as exc:
            if lock.lost or lock.validity <= 0:
                self._lose(watch, str(exc))
                return
            retry = max(0.01, lock.validity * RETRY_FRACTION)
            logger.warning("Extending lock %r failed, retrying in %.0f ms: %s", lock.resource, retry * 1000, exc)
            with self._cond:
                if watch.active:
                    self._push(watch, time.monotonic() + retry)
            return
        except LockError as exc:  # e.g. the extension limit: let it expire, then report
            logger.warning("Lock %r is no longer extended: %s", lock.resource, exc)
            watch.stop_extending_at = float("-inf")
            with self._cond:
                if watch.active:
                    self._push(watch, time.monotonic() + lock.validity)
            return
        except Exception:  # noqa: BLE001 - the thread must survive anything
            logger.exception("Unexpected error extending lock %r", lock.resource)
            with self._cond:
                if watch.active:
                    self._push(watch, time.monotonic() + max(0.001, lock.validity * RETRY_FRACTION))
            return
        with self._cond:
            if watch.active:
                self._push(watch, self._due(lock))

    def _drop(self, watch: Watch) -> None:
        with self._cond:
            watch.active = False
            if self._watches.get(id(watch.lock)) is watch:
                del self._watches[id(watch.lock)]

    def _lose(self, watch: Watch, reason: str) -> None:
        lock = watch.lock
        self._drop(watch)
        if lock._mark_lost(reason):
            logger.error("Lock %r was lost: %s", lock.resource, reason)
        if watch.on_lost is not None:
            try:
                watch.on_lost(lock)
            except Exception:  # noqa: BLE001
                logger.exception("on_lost callback for lock %r failed", lock.resource)
