"""A cancelled call leaves nothing behind and is not swallowed (async engine): acquire, release, the exit
of ``async with manager.lock()``. Real ``redis-server`` processes; the proxy of :mod:`tests.proxy` where
nodes must reconnect."""

from __future__ import annotations

import asyncio

import pytest

from django_redlock.core import AsyncLockManager
from django_redlock.exceptions import LockNotAcquired
from tests.proxy import Proxy
from tests.test_late_releases import quick


async def acquire_soon(mgr, resource, within):
    try:
        return await mgr.acquire(resource, timeout=within)
    except LockNotAcquired as exc:
        pytest.fail(f"{resource!r} still locked {within} s later, with no holder left: {exc}")


# -- a cancelled acquire or release leaves nothing behind ----------------------------------


async def test_cancelled_acquire_leaves_no_keys(servers):
    """``wait_for`` cancels the acquire while the SET fan-out waits on a paused majority."""
    mgr = quick(servers.urls, ttl=30, node_timeout=1.0)
    other = quick(servers.urls, ttl=30)
    try:
        await (await mgr.acquire("warm-up")).release()  # connections exist: the SETs go out at once
        for server in servers[2:]:
            server.pause()  # their sockets accept and queue the SET NX
        try:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(mgr.acquire("res"), 0.2)
        finally:
            for server in servers[2:]:
                server.resume()
        await (await mgr.acquire("unrelated")).release()  # the cancelled manager goes on serving
        lock = await acquire_soon(other, "res", 2.0)
        await lock.release()
    finally:
        await mgr.aclose()
        await other.aclose()


async def test_a_cancelled_release_is_still_reported_released(servers):
    """Its round goes on in the background: the ``released`` hook (hold time, the held-locks gauge
    of the metrics) hears of it once, as of any release."""
    from django_redlock.core import Hooks

    released = []

    class Record(Hooks):
        def released(self, lock):
            released.append(lock.resource)

    mgr = quick(servers.urls, ttl=30, node_timeout=1.0, hooks=Record())
    try:
        lock = await mgr.acquire("res")
        for server in servers[2:]:
            server.pause()
        try:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(lock.release(), 0.05)
        finally:
            for server in servers[2:]:
                server.resume()
        assert lock.released and released == ["res"]
    finally:
        await mgr.aclose()


async def test_cancelled_release_still_deletes_the_keys(servers):
    """``wait_for(lock.release(), tiny)`` while a majority is slow; the keys must still go."""
    mgr = quick(servers.urls, ttl=30, node_timeout=1.0)
    other = quick(servers.urls, ttl=30)
    try:
        lock = await mgr.acquire("res")
        for server in servers[2:]:
            server.pause()
        try:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(lock.release(), 0.05)
        finally:
            for server in servers[2:]:
                server.resume()
        await (await mgr.acquire("unrelated")).release()
        lock2 = await acquire_soon(other, "res", 2.0)
        await lock2.release()
    finally:
        await mgr.aclose()
        await other.aclose()


async def test_cancelled_release_on_reconnecting_nodes_still_deletes_the_keys(servers):
    """Item 5: the release is cancelled while it is still connecting to restarted (slow) nodes."""
    a, b, c = servers[0], servers[1], servers[2]
    with Proxy(b.port) as pb, Proxy(c.port) as pc:
        mgr = quick([a.url, pb.url, pc.url], ttl=30, node_timeout=1.0)
        other = quick([a.url, b.url, c.url], ttl=30)
        try:
            lock = await mgr.acquire("res")
            for proxy in (pb, pc):
                proxy.delay_requests = 0.5  # B and C are slow to take commands in
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(lock.release(), 0.05)
            for proxy in (pb, pc):
                proxy.delay_requests = 0.0
            await (await mgr.acquire("unrelated")).release()
            lock2 = await acquire_soon(other, "res", 2.0)
            await lock2.release()
        finally:
            await mgr.aclose()
            await other.aclose()


def test_cancel_during_context_exit_is_not_swallowed(servers):
    async def main():
        mgr = AsyncLockManager(servers.urls, ttl=5, retry_count=0, restart_window=0)
        reached = False

        async def user():
            nonlocal reached
            me = asyncio.current_task()
            async with mgr.lock("cx", auto_extend=True):
                asyncio.get_running_loop().call_soon(me.cancel)
            reached = True
            await asyncio.sleep(0)

        task = asyncio.ensure_future(user())
        try:
            await task
        except asyncio.CancelledError:
            pass
        free = not await mgr.is_locked("cx")
        await mgr.aclose()
        return reached, task.cancelled(), free

    reached, cancelled, free = asyncio.run(main())
    assert not reached and cancelled, f"cancellation swallowed ({reached=}, {cancelled=})"
    assert free, "the lock must still be released"
