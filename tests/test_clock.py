"""The engine's clock counts the time a host spends suspended (real servers).

A suspend cannot be caused here. Instead: a Linux time namespace whose boot-time clock runs
1000 s ahead of its monotonic clock (as if the host had slept 1000 s since boot) shows which
clock the engine reads, and that validity, node timeouts and the watchdog work there; and a
jump of the engine's clock must show in a held lock's validity.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from django_redlock.core import AsyncLockManager, LockManager
from django_redlock.exceptions import LockLost

ROOT = Path(__file__).resolve().parent.parent
AHEAD = 1000  # seconds the boot-time clock is ahead of the monotonic one in the namespace

IN_NAMESPACE = """
import asyncio, json, sys, time
from django_redlock.core import AsyncLockManager, LockManager

m = LockManager(sys.argv[1:], ttl=0.6, node_timeout=0.1, restart_window=0)
out = {
    "engine - boottime": m.config.clock() - time.clock_gettime(time.CLOCK_BOOTTIME),
    "engine - monotonic": m.config.clock() - time.monotonic(),
}
started = time.monotonic()
with m.lock("namespaced", auto_extend=True) as lock:  # a node is paused: every fan-out waits for it
    out["validity"] = lock.validity
    time.sleep(1.5)  # 2.5 ttls: only the watchdog keeps it
    out["extensions"] = lock.extensions
    out["held"] = lock.owned()
out["sync seconds"] = time.monotonic() - started


async def main():
    am = AsyncLockManager(sys.argv[1:], ttl=0.6, node_timeout=0.1, restart_window=0)
    async with am.lock("namespaced-async", auto_extend=True) as lock:
        out["async validity"] = lock.validity
        await asyncio.sleep(1.5)
        out["async extensions"] = lock.extensions
    await am.aclose()


started = time.monotonic()
asyncio.run(main())
out["async seconds"] = time.monotonic() - started
m.close()
print(json.dumps(out))
"""


def time_namespace() -> list[str]:
    """The command prefix that runs a program in a new time namespace, boot time ``AHEAD`` s on."""
    prefix = ["unshare", "--time", "--boottime", str(AHEAD)]
    try:
        subprocess.run([*prefix, "true"], check=True, capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        pytest.skip("no Linux time namespaces here (unshare --time)")
    return prefix


@pytest.mark.skipif(not hasattr(time, "CLOCK_BOOTTIME"), reason="Linux's CLOCK_BOOTTIME")
def test_the_engine_reads_the_boot_time_clock_and_only_that_one(servers):
    servers[4].pause()  # node timeouts are deadlines too
    try:
        result = subprocess.run(
            [*time_namespace(), sys.executable, "-c", IN_NAMESPACE, *servers.urls],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    finally:
        servers.heal()
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert abs(out["engine - boottime"]) < 0.05, out  # not the monotonic clock, 1000 s behind
    assert abs(out["engine - monotonic"] - AHEAD) < 0.05, out
    # Nothing compares a time on one clock with a time on the other: validity, node timeouts and
    # the watchdog's schedule all work, in both engines.
    assert 0.4 < out["validity"] <= 0.6 and 0.4 < out["async validity"] <= 0.6, out
    assert out["extensions"] >= 2 and out["async extensions"] >= 2 and out["held"] is True, out
    assert out["sync seconds"] < 5 and out["async seconds"] < 5, out


@pytest.fixture
def jumping_clock(monkeypatch):
    """The engine's clock, moved forward by hand (as a suspend moves it); returns the list whose
    first item is how far."""
    from django_redlock.core import clock

    ahead = [0.0]
    now = clock.now
    monkeypatch.setattr(clock, "now", lambda: now() + ahead[0])
    return ahead


def test_a_jump_of_the_engine_clock_takes_it_off_a_held_locks_validity(servers, jumping_clock):
    m = LockManager(servers.urls, ttl=5.0, restart_window=0)
    with pytest.raises(LockLost, match="expired"):
        with m.lock("slept-through") as lock:
            before = lock.validity
            jumping_clock[0] = 3.0  # the host slept 3 s
            assert before - 3.1 < lock.validity < before - 2.9
            assert lock.locked()
            jumping_clock[0] = 6.0  # longer than what was left: the keys have expired on the nodes
            assert not lock.locked() and lock.validity == 0.0
    m.close()


async def test_a_jump_of_the_engine_clock_takes_it_off_a_held_async_locks_validity(servers, jumping_clock):
    am = AsyncLockManager(servers.urls, ttl=5.0, restart_window=0)
    with pytest.raises(LockLost, match="expired"):
        async with am.lock("slept-through-async") as lock:
            before = lock.validity
            jumping_clock[0] = 3.0
            assert before - 3.1 < lock.validity < before - 2.9
            jumping_clock[0] = 6.0
            assert not lock.locked()
    await am.aclose()


def test_the_extender_sees_a_jump_of_the_engine_clock_within_seconds(servers, jumping_clock):
    """The watchdog sleeps on a timer the OS runs on the monotonic clock, which stops during a
    suspend: it wakes at least once a second, so a resumed host extends in time (a 30 s ttl's
    watchdog slept on to its 10 s tick, past a lock that had 5 s left)."""
    from tests.conftest import eventually

    m = LockManager(servers.urls, ttl=30.0, restart_window=0)
    try:
        with m.lock("suspended-extender", auto_extend=True) as lock:
            extender = m._extender
            eventually(lambda: extender._cond._waiters, 5.0)  # its thread sleeps until the next tick
            jumping_clock[0] = 25.0  # the host slept 25 s: 5 s left, the extension is due
            eventually(lambda: lock.extensions >= 1, 3.0)
    finally:
        m.close()


def _asleep(task):
    """True while the keep-alive task waits in its own sleep (not in a fan-out)."""
    awaited = task.get_coro().cr_await
    return getattr(awaited, "__qualname__", "") == "sleep"


async def test_the_async_keep_alive_sees_a_jump_of_the_engine_clock_within_seconds(servers, jumping_clock):
    """The asyncio keep-alive follows the same rule as the sync watchdog: ``asyncio.sleep`` runs on
    the monotonic clock, which stops during a suspend, so it wakes at least once a second and a
    resumed host extends in time (it slept on to its 10 s tick, past a lock with 5 s left)."""
    from tests.conftest import eventually_async

    am = AsyncLockManager(servers.urls, ttl=30.0, restart_window=0)
    try:
        async with am.lock("suspended-keep-alive", auto_extend=True) as lock:
            await eventually_async(lambda: _asleep(lock._keeper), 5.0)  # until its next tick
            jumping_clock[0] = 25.0  # the host slept 25 s: 5 s left, the extension is due
            await eventually_async(lambda: lock.extensions >= 1, 3.0, show=lambda: (lock.extensions, lock.validity))
            assert lock.locked() and lock.validity > 20
    finally:
        await am.aclose()
