"""The asyncio lock's life on real servers: loss found at release, owned(), dropped contexts, on_lost."""

from __future__ import annotations

import asyncio
import gc
import time

import pytest
import redis

from django_redlock.core import AsyncLockManager, Hooks
from django_redlock.core import steps
from django_redlock.core.scripts import EXTEND
from django_redlock.exceptions import LockLost, QuorumUnavailable


@pytest.fixture
async def amanager(servers):
    mgr = AsyncLockManager(servers.urls, ttl=10.0, retry_count=0, restart_window=0, node_timeout=0.2)
    yield mgr
    await mgr.aclose()


def nodes_with_key(servers, key):
    return sum(1 for s in servers if s.running and not s.paused and redis.Redis.from_url(s.url).exists(key))


async def test_async_with_exit_raises_lock_lost_after_a_takeover(amanager, servers):
    with pytest.raises(LockLost, match="no longer stored"):
        async with amanager.lock("taken", ttl=5) as lock:
            assert await amanager.force_release("taken") == 5
            thief = await amanager.acquire("taken", ttl=5)
    assert lock.lost
    assert await thief.release() is True


async def test_async_release_with_silent_nodes_is_not_a_loss(amanager, servers):
    async with amanager.lock("silent", ttl=5) as lock:
        for server in servers[:3]:
            server.pause()
    assert lock.released and not lock.lost


async def test_async_owned_asks_the_nodes(amanager, servers):
    lock = await amanager.acquire("own", ttl=5)
    assert await lock.owned() is True
    for server in servers[:2]:
        redis.Redis.from_url(server.url).delete("redlock:lock:own")
    assert await lock.owned() is True
    servers[2].kill()
    servers[3].kill()
    with pytest.raises(QuorumUnavailable):
        await lock.owned()
    assert not lock.lost
    servers[2].start()
    servers[3].start()
    assert await lock.owned() is False
    # Four nodes lack the key; the round stops once three (a quorum) said so, and counts the
    # fourth only if its reply came with them.
    assert lock.lost and ("3 of 5" in lock.lost_reason or "4 of 5" in lock.lost_reason), lock.lost_reason


async def test_keep_alive_notices_a_force_release_before_the_next_extension(amanager, servers):
    lost = asyncio.Event()
    with pytest.raises(LockLost):
        async with amanager.lock("watched", ttl=3.0, auto_extend=True, on_lost=lambda lock: lost.set()) as lock:
            await amanager.force_release("watched")
            await asyncio.wait_for(lost.wait(), 1.5)  # the first extension is due after 2 s
            assert lock.lost and lock.extensions == 0


async def test_dropped_async_context_expires(amanager, servers):
    ctx = amanager.lock("dropped", ttl=0.3, auto_extend=True)
    lock = await ctx.__aenter__()
    await asyncio.sleep(0.5)  # past the ttl: it is being extended
    assert lock.extensions >= 1 and nodes_with_key(servers, "redlock:lock:dropped") >= 3  # a quorum, at least
    del lock, ctx
    gc.collect()
    deadline = time.monotonic() + 1.0
    while nodes_with_key(servers, "redlock:lock:dropped") and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert nodes_with_key(servers, "redlock:lock:dropped") == 0, "a dropped lock is still being extended"


async def test_async_loss_found_by_a_manual_extend_calls_on_lost_once(amanager, servers):
    calls = []
    fired = asyncio.Event()

    async def on_lost(lock):
        calls.append(lock)
        fired.set()

    with pytest.raises(LockLost):
        async with amanager.lock("manual", ttl=5, auto_extend=True, on_lost=on_lost) as lock:
            await amanager.force_release("manual")
            with pytest.raises(LockLost):
                await lock.extend()
    await asyncio.wait_for(fired.wait(), 2.0)  # also when the block ends right after
    assert calls == [lock]


async def test_async_extension_landing_after_a_clean_release_is_not_a_loss(servers):
    lost_hook = []

    class Record(Hooks):
        def lost(self, lock, reason):
            lost_hook.append(reason)

    mgr = AsyncLockManager(servers.urls, retry_count=0, restart_window=0, hooks=Record())
    extending, released, judged = asyncio.Event(), asyncio.Event(), asyncio.Event()
    real_perform = mgr._perform

    async def perform(effect):
        if isinstance(effect, steps.Fan) and effect.script is EXTEND and not extending.is_set():
            extending.set()
            await released.wait()  # the release runs while this EXTEND is "on the wire"
            try:
                return await real_perform(effect)
            finally:
                asyncio.get_running_loop().call_soon(judged.set)
        return await real_perform(effect)

    mgr._perform = perform
    on_lost = []
    try:
        ctx = mgr.lock("inflight", ttl=0.3, auto_extend=True, on_lost=on_lost.append)
        lock = await ctx.__aenter__()
        await asyncio.wait_for(extending.wait(), 2.0)
        assert await lock.release() is True  # the keep-alive task is still waiting in the fan-out
        released.set()
        await asyncio.wait_for(judged.wait(), 2.0)
        await ctx.__aexit__(None, None, None)
        assert not lock.lost and on_lost == [] and lost_hook == []
    finally:
        released.set()
        await mgr.aclose()


async def test_async_on_lost_fires_by_the_validity_deadline(servers):
    mgr = AsyncLockManager(servers.urls, retry_count=0, restart_window=0, node_timeout=0.4)
    fired_at = []
    fired = asyncio.Event()

    def on_lost(lock):
        fired_at.append(time.monotonic())
        fired.set()

    try:
        with pytest.raises(LockLost):
            async with mgr.lock("deadline", ttl=0.9, auto_extend=True, on_lost=on_lost) as lock:
                deadline = time.monotonic() + lock.validity
                for server in servers[:3]:
                    server.pause()
                await asyncio.wait_for(fired.wait(), 5.0)
        assert len(fired_at) == 1
        late = fired_at[0] - deadline
        assert -0.02 <= late <= 0.05, f"on_lost fired {late * 1000:.0f} ms after the validity ended"
    finally:
        for server in servers[:3]:
            server.resume()
        await mgr.aclose()


async def test_aclose_reads_the_replies_a_release_left_coming(servers):
    """The async twin of the sync close test: aclose() reads the last nodes' replies first."""
    from django_redlock.core import AsyncLockManager
    from tests.proxy import Proxy

    with Proxy(servers[3].port) as p3, Proxy(servers[4].port) as p4:
        mgr = AsyncLockManager([s.url for s in servers[:3]] + [p3.url, p4.url], ttl=5, retry_count=0,
                               restart_window=0)
        lock = await mgr.acquire("closing", blocking=False)
        for proxy in (p3, p4):
            proxy.hold_replies()
        assert await lock.release() is True  # three nodes confirmed; two replies are held
        assert all(anode.books.ledger.debts for anode in mgr.anodes[3:])
        for proxy in (p3, p4):
            proxy.pass_replies()
            proxy.flush_replies()
        await mgr.aclose()
        assert not any(anode.books.ledger.debts for anode in mgr.anodes)
        assert not any(anode.books.parked or anode.books.idle for anode in mgr.anodes)
