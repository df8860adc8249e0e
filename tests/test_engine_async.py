"""The async engine: same rules as the sync one, on redis.asyncio."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

from django_redlock.core import AsyncLockManager
from django_redlock.exceptions import LockLost, LockNotAcquired, QuorumUnavailable
from tests.conftest import eventually_async


@pytest.fixture
async def amanager(servers):
    mgr = AsyncLockManager(servers.urls, ttl=10.0, retry_count=0, restart_window=0)
    yield mgr
    await mgr.aclose()


def count_keys(servers):
    total = 0
    for server in servers:
        if server.running:
            total += len(redis.Redis.from_url(server.url).keys("redlock:lock:*"))
    return total


async def test_acquire_refuse_release(amanager, servers):
    lock = await amanager.acquire("a")
    assert lock.locked()
    await eventually_async(lambda: count_keys(servers) == 5)  # the last votes may still be on their way
    with pytest.raises(LockNotAcquired) as info:
        await amanager.acquire("a", blocking=False)
    assert "0 of 5 nodes agreed" in str(info.value) and info.value.retry_after > 9
    assert await lock.release() is True
    assert await lock.release() is False
    await eventually_async(lambda: count_keys(servers) == 0)  # release() returns once a quorum deleted the key


async def test_two_killed_ok_three_killed_unavailable(amanager, servers):
    servers[0].kill()
    servers[1].kill()
    async with amanager.lock("k") as lock:
        assert lock.locked()
    servers[2].kill()
    with pytest.raises(QuorumUnavailable):
        await amanager.acquire("k", blocking=False)
    assert count_keys(servers) == 0


async def test_paused_majority_fails_fast(amanager, servers):
    for server in servers[:3]:
        server.pause()
    started = time.monotonic()
    with pytest.raises(QuorumUnavailable):
        await amanager.acquire("p", blocking=False)
    assert time.monotonic() - started < 0.25


async def test_paused_node_does_not_stall_and_loop_stays_free(amanager, servers):
    await (await amanager.acquire("warm-up")).release()  # connections made before the fault
    servers[4].pause()
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.001)
            ticks += 1

    task = asyncio.ensure_future(ticker())
    worst = 0.0
    for i in range(20):
        started = time.monotonic()
        lock = await amanager.acquire(f"s{i}")
        await lock.release()
        worst = max(worst, time.monotonic() - started)
    task.cancel()
    assert worst < 0.15
    assert ticks > 0  # the event loop kept running other tasks


async def test_extend_fencing_and_expiry(amanager):
    lock = await amanager.acquire("e", ttl=0.3)
    first = await lock.get_fencing_token()
    assert lock.fencing_token == first
    for _ in range(5):
        await asyncio.sleep(0.1)
        await lock.extend()
    assert lock.locked()
    await lock.release()
    second = await amanager.acquire("e", ttl=0.05)
    assert await second.get_fencing_token() > first
    await asyncio.sleep(0.08)
    with pytest.raises(LockLost):
        await second.extend()


async def test_auto_extend_and_loss(amanager, servers):
    lost = asyncio.Event()
    with pytest.raises(LockLost):
        async with amanager.lock("auto", ttl=0.3, auto_extend=True, on_lost=lambda lock: lost.set()) as lock:
            await asyncio.sleep(0.8)
            assert lock.locked() and lock.extensions >= 2
            for server in servers[:3]:
                server.kill()
            await asyncio.wait_for(lost.wait(), 2.0)


async def test_live_locks_and_force_release(amanager, servers):
    await amanager.acquire("x")
    await amanager.acquire("y")
    assert [r.resource async for r in amanager.live_locks()] == ["x", "y"]
    assert await amanager.force_release("x") == 5
    assert [r.resource async for r in amanager.live_locks()] == ["y"]
    assert await amanager.is_locked("y")
    status = await amanager.node_status()
    assert all(s.reachable for s in status)


async def test_live_locks_count_waiters_and_drop_those_that_give_up(amanager):
    held = await amanager.acquire("busy", ttl=10)

    async def waiting() -> int | None:
        async for record in amanager.live_locks():
            if record.resource == "busy":
                return record.waiting
        return None

    async def wait_for(count: int) -> None:
        deadline = time.monotonic() + 5
        while await waiting() != count:
            assert time.monotonic() < deadline, f"never {count} waiting"
            await asyncio.sleep(0.05)

    quitters = [asyncio.create_task(amanager.acquire("busy", timeout=0.8)) for _ in range(2)]
    stayer = asyncio.create_task(amanager.acquire("busy", timeout=8))
    await wait_for(3)
    for task in quitters:
        with pytest.raises(LockNotAcquired):
            await task
    assert await waiting() == 1  # they left the line with their release
    await held.release()
    lock = await stayer
    assert await lock.release() is True


async def test_connects_that_finished_while_the_loop_stalled_count(servers):
    """The loop stops for two node timeouts while a fresh manager connects (a long garbage
    collection): the connections were made meanwhile, so nodes are not written off."""
    mgr = AsyncLockManager(servers.urls, ttl=10.0, retry_count=0, restart_window=0)
    try:
        asyncio.get_running_loop().call_later(0, time.sleep, 0.05 * 2)  # runs once the connects began
        lock = await mgr.acquire("stalled-connect", blocking=False)  # was: "only 0 of 5 nodes answered"
        assert lock.locked()
        await lock.release()
    finally:
        await mgr.aclose()
