"""Automatic extension is bounded by ``max_hold`` only: ``max_extensions`` bounds manual extension.

Every path that keeps a lock alive is run past the limit on real servers: ``lock(auto_extend=True)``
(sync and asyncio), ``@redlock(auto_extend=True)`` (sync and async), ``@redlock_command`` and
``@redlock_task``. Scaled down: a ttl of 0.4 s is extended about every 0.27 s, and the limit is 2.
"""

from __future__ import annotations

import threading
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import BaseCommand

from django_redlock import redlock, redlock_command, signals
from django_redlock.core import AsyncLockManager, LockManager
from django_redlock.exceptions import LockError

from tests.conftest import eventually, eventually_async

TTL = 0.4
LIMIT = 2  # max_extensions
WANTED = 5  # automatic extensions each test waits for: well past the limit
WAIT = 30.0  # seconds any wait may take on a busy machine


@pytest.fixture
def limited(redlock_settings):
    """The Django managers with ``MAX_EXTENSIONS`` = :data:`LIMIT` (and a node timeout that a loaded
    machine's first connections meet)."""
    redlock_settings.REDLOCK = {**redlock_settings.REDLOCK, "MAX_EXTENSIONS": LIMIT, "NODE_TIMEOUT": 0.5}
    return redlock_settings


class Extensions:
    """Count the ``lock_extended`` signals of one resource until :data:`WANTED` came or the lock was lost."""

    def __init__(self, resource: str) -> None:
        self.resource = resource
        self.count = 0
        self.lost: str | None = None
        self.done = threading.Event()

    def extended(self, sender, lock, **kwargs) -> None:
        if lock.resource == self.resource:
            self.count += 1
            if self.count >= WANTED:
                self.done.set()

    def was_lost(self, sender, lock, reason, **kwargs) -> None:
        if lock.resource == self.resource:
            self.lost = reason
            self.done.set()

    def outcome(self) -> str:
        return f"lost after {self.count} extensions: {self.lost}" if self.lost else f"extended {self.count} times"

    def wait(self) -> str:
        """In the body: until the lock was extended WANTED times, or lost."""
        assert self.done.wait(WAIT), self.outcome()
        return self.outcome()

    async def wait_async(self) -> str:
        await eventually_async(self.done.is_set, WAIT, self.outcome)
        return self.outcome()

    def __enter__(self) -> Extensions:
        signals.lock_extended.connect(self.extended, weak=False)
        signals.lock_lost.connect(self.was_lost, weak=False)
        return self

    def __exit__(self, *exc: object) -> None:
        signals.lock_extended.disconnect(self.extended)
        signals.lock_lost.disconnect(self.was_lost)


def extended_enough(outcome: str) -> bool:
    return outcome.startswith("extended") and int(outcome.split()[1]) >= WANTED


def test_lock_auto_extend_goes_past_max_extensions_and_manual_ones_stay_bounded(servers):
    manager = LockManager(servers.urls, max_extensions=LIMIT, retry_count=0, restart_window=0)
    try:
        with manager.lock("auto-sync", ttl=TTL, auto_extend=True) as lock:
            eventually(lambda: lock.extensions >= WANTED or lock.lost, WAIT)
            assert not lock.lost, lock.lost_reason
            for _ in range(LIMIT):
                lock.extend()  # the caller's own extensions are counted from zero...
            with pytest.raises(LockError, match="max_extensions"):
                lock.extend()  # ...and bounded
            assert lock.locked()
    finally:
        manager.close()


async def test_async_lock_auto_extend_goes_past_max_extensions(servers):
    manager = AsyncLockManager(servers.urls, max_extensions=LIMIT, retry_count=0, restart_window=0)
    try:
        async with manager.lock("auto-async", ttl=TTL, auto_extend=True) as lock:
            await eventually_async(lambda: lock.extensions >= WANTED or lock.lost, WAIT)
            assert not lock.lost, lock.lost_reason
            for _ in range(LIMIT):
                await lock.extend()
            with pytest.raises(LockError, match="max_extensions"):
                await lock.extend()
            assert lock.locked()
    finally:
        await manager.aclose()


def test_redlock_auto_extend_goes_past_max_extensions(limited):
    with Extensions("auto-view") as seen:

        @redlock("auto-view", ttl=TTL, auto_extend=True)
        def job() -> str:
            return seen.wait()

        assert extended_enough(job()), seen.outcome()


async def test_async_redlock_auto_extend_goes_past_max_extensions(limited):
    with Extensions("auto-async-view") as seen:

        @redlock("auto-async-view", ttl=TTL, auto_extend=True)
        async def job() -> str:
            return await seen.wait_async()

        assert extended_enough(await job()), seen.outcome()


def test_redlock_command_goes_past_max_extensions(limited):
    with Extensions("auto-command") as seen:

        @redlock_command(key="auto-command", ttl=TTL)
        class Command(BaseCommand):
            def handle(self, *args, **options):
                self.stdout.write(seen.wait())

        out = StringIO()
        call_command(Command(), stdout=out, stderr=StringIO())
        assert extended_enough(out.getvalue()), seen.outcome()


def test_redlock_task_goes_past_max_extensions(limited):
    celery = pytest.importorskip("celery", minversion="5.3")
    from django_redlock.celery import redlock_task

    app = celery.Celery("auto-extension", set_as_current=False)  # run eagerly: no broker, no backend
    with Extensions("auto-task") as seen:

        @app.task(name="tests.auto_extended_task")
        @redlock_task("auto-task", ttl=TTL, when_locked="fail")
        def task() -> str:
            return seen.wait()

        result = task.apply()
        assert result.state == "SUCCESS", repr(result.result)
        assert extended_enough(result.result), seen.outcome()


def test_max_hold_still_ends_automatic_extension(servers):
    manager = LockManager(servers.urls, retry_count=0, restart_window=0)
    try:
        lock = manager.acquire("held-long", ttl=TTL)
        manager._watch(lock, 0.5, None)
        eventually(lambda: lock.lost, WAIT)
        assert "max_hold" in (lock.lost_reason or ""), lock.lost_reason
        assert lock.extensions >= 1
        lock.release()
    finally:
        manager.close()
