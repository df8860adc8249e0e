"""Late and stale replies leave no lock behind (async engine): stale releases, a busy loop, long pauses,
a partition, a release behind its own unanswered SET.

Real ``redis-server`` processes only; the TCP proxy of :mod:`tests.proxy`
stands in for a network that delivers late. Public API only.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis

from django_redlock.core import AsyncLockManager
from django_redlock.exceptions import LockNotAcquired
from tests.proxy import Proxy


def raw(server):
    return redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=5)


async def assert_not_acquired(mgr, resource, first):
    try:
        second = await mgr.acquire(resource, blocking=False)
    except LockNotAcquired as exc:
        return exc
    both = first.locked() and second.locked()
    seen = f"{first!r} and {second!r}"
    await second.release()
    assert not both, f"two holders of {resource!r} at once: {seen}"
    pytest.fail(f"{resource!r} was acquired although {first!r} was still held (it expired meanwhile: too slow)")


async def acquire_soon(mgr, resource, within):
    try:
        return await mgr.acquire(resource, timeout=within)
    except LockNotAcquired as exc:
        pytest.fail(f"{resource!r} still locked {within} s later, with no holder left: {exc}")


def quick(urls, **kwargs):
    options = {"ttl": 10, "retry_count": 0, "retry_delay": 0.05, "retry_jitter": 0, "restart_window": 0}
    options.update(kwargs)
    return AsyncLockManager(urls, **options)


# -- a stale release from an earlier attempt must not delete the winning attempt's key ---------


async def test_stale_release_of_an_earlier_attempt_spares_the_winner(servers):
    """Item 3 (async): attempt 1's SET and release reach B and C late, after attempt 2 won."""
    a, b, c = servers[0], servers[1], servers[2]
    with Proxy(b.port) as pb, Proxy(c.port) as pc:
        mgr = quick([a.url, pb.url, pc.url], ttl=5, retry_count=1, retry_delay=1.5)
        other = quick([a.url, b.url, c.url], ttl=5)
        key = mgr.key("stale-async")
        raw(a).set(key, "someone-else", px=10_000)  # A refuses attempt 1
        pb.hold_requests()
        pc.hold_requests()

        def network_recovers():
            for proxy in (pb, pc):  # attempt 1 failed and queued its release behind its SET
                proxy.wait_held(lambda held: held.count(b"EVAL") >= 2)  # the vote, then its release
            raw(a).delete(key)
            for proxy in (pb, pc):
                proxy.pass_requests()  # new connections get through; the old ones stay stuck

        try:
            lock, _ = await asyncio.gather(mgr.acquire("stale-async"), asyncio.to_thread(network_recovers))
            assert lock.locked()
            for proxy in (pb, pc):
                await asyncio.to_thread(proxy.flush_requests)  # attempt 1's SET NX and release arrive
            await assert_not_acquired(other, "stale-async", lock)
            assert lock.locked()
            await lock.release()
        finally:
            await mgr.aclose()
            await other.aclose()


# -- a majority paused longer than the stale limit: no lock left behind after resume ----------


async def test_majority_pause_longer_than_stale_limit_leaves_nothing_behind(servers):
    """Item 14 (async): the connections are dropped after the stale limit; the SETs still land on resume."""
    mgr = quick(servers.urls)
    other = quick(servers.urls)
    try:
        await (await mgr.acquire("warm-up")).release()
        for server in servers[2:]:
            server.pause()
        try:
            with pytest.raises(LockNotAcquired):
                await mgr.acquire("res", blocking=False)
            await asyncio.sleep(1.5)  # longer than the stale limit: the engine gives up on those connections
        finally:
            for server in servers[2:]:
                server.resume()
        lock = await acquire_soon(mgr, "res", 1.0)  # the same manager, next acquire
        await lock.release()
        for server in servers[2:]:
            server.pause()
        try:
            with pytest.raises(LockNotAcquired):
                await mgr.acquire("res2", blocking=False)
            await asyncio.sleep(1.5)
        finally:
            for server in servers[2:]:
                server.resume()
        await (await mgr.acquire("unrelated")).release()  # one more call by the first manager
        await (await acquire_soon(other, "res2", 1.0)).release()
    finally:
        await mgr.aclose()
        await other.aclose()


async def test_partition_right_after_the_set_leaves_nothing_behind(servers):
    """Item 14 (async) with a network partition right after the SET NX went through to B and C."""
    a, b, c = servers[0], servers[1], servers[2]
    with Proxy(b.port) as pb, Proxy(c.port) as pc:
        mgr = quick([a.url, pb.url, pc.url])
        other = quick([a.url, b.url, c.url])
        try:
            await (await mgr.acquire("warm-up")).release()
            for proxy in (pb, pc):
                proxy.cut_after(mgr.key("res").encode())  # the SET NX is the first command on this key
            with pytest.raises(LockNotAcquired):
                await mgr.acquire("res", blocking=False)
            for proxy in (pb, pc):
                await asyncio.to_thread(proxy.wait_cut)
            await asyncio.sleep(1.5)  # longer than the stale limit
            for proxy in (pb, pc):
                proxy.heal()
            await (await acquire_soon(mgr, "res", 1.0)).release()
            for proxy in (pb, pc):
                proxy.cut_after(mgr.key("res2").encode())
            with pytest.raises(LockNotAcquired):
                await mgr.acquire("res2", blocking=False)
            await asyncio.sleep(1.5)
            for proxy in (pb, pc):
                proxy.heal()
            await (await mgr.acquire("unrelated", timeout=1.0)).release()
            await (await acquire_soon(other, "res2", 1.0)).release()
        finally:
            await mgr.aclose()
            await other.aclose()


# -- replies read late on a busy host: the SETs ran, the attempt failed, nothing may stay ---------


async def test_replies_read_late_on_a_blocked_loop_leave_no_keys(servers):
    """Item 13: the loop is blocked right after the SET fan-out went out, longer than node_timeout."""
    mgr = quick(servers.urls)
    other = quick(servers.urls)
    try:
        await (await mgr.acquire("warm-up")).release()
        loop = asyncio.get_running_loop()
        for attempt in range(5):
            resource = f"busy-{attempt}"
            loop.call_soon(time.sleep, 0.2)  # a CPU-bound callback queued ahead of the reply readers
            try:
                lock = await mgr.acquire(resource, blocking=False)
            except LockNotAcquired:
                pass
            else:
                await lock.release()
            await (await mgr.acquire("unrelated")).release()
            await (await acquire_soon(other, resource, 1.0)).release()
    finally:
        await mgr.aclose()
        await other.aclose()


async def test_replies_that_come_late_leave_no_keys(servers):
    """Item 13 through the network: every reply arrives after node_timeout, the SETs have run."""
    proxies = [Proxy(server.port).start() for server in servers[:3]]
    mgr = quick([p.url for p in proxies])
    other = quick([s.url for s in servers[:3]])
    try:
        await (await mgr.acquire("warm-up")).release()
        for proxy in proxies:
            proxy.delay_replies = 0.2
        with pytest.raises(LockNotAcquired, match="nodes answered"):
            await mgr.acquire("res", blocking=False)  # "only 0 of 3 nodes answered"
        await asyncio.sleep(0.3)
        for proxy in proxies:
            proxy.delay_replies = 0.0
        await (await mgr.acquire("unrelated", timeout=1.0)).release()
        await (await acquire_soon(other, "res", 1.0)).release()
    finally:
        await mgr.aclose()
        await other.aclose()
        for proxy in proxies:
            proxy.close()


# -- a release must not ride behind its own SET still unanswered on another connection ------------


def test_release_is_ordered_after_its_own_set(servers):
    """Two tasks contend: B's release must not ride behind A's unanswered SET and settle too early."""
    proxies = [Proxy(s.port).start() for s in servers[:3]]
    c_raw = redis.Redis(port=servers[2].port)
    try:

        async def main():
            mgr = AsyncLockManager(
                [p.url for p in proxies], ttl=20, max_ttl=20, retry_count=0, node_timeout=0.5, restart_window=0
            )
            pc = proxies[2]
            pc.hold_replies()
            a = await mgr.acquire("wc")  # wins on 0 and 1; SET V1 unanswered on C (connection X)
            for p in proxies[:2]:
                p.delay_replies = 0.2
            pc.hold_requests()

            stage_error = []

            def let_x_through():
                try:
                    pc.wait_held(lambda held: b"SET" in held)  # B's vote V2 (SET NX PX) frozen on connection Y
                    pc.pass_requests()  # X flows again, Y stays frozen
                except BaseException as exc:  # noqa: BLE001 - reported by the test
                    stage_error.append(exc)

            t = threading.Thread(target=let_x_through)
            t.start()
            try:
                await mgr.acquire("wc", blocking=False)
                raise AssertionError("B got the lock")
            except LockNotAcquired:
                pass
            t.join()
            assert not stage_error, stage_error
            for p in proxies[:2]:
                p.delay_replies = 0.0
            await a.release()
            pc.pass_replies()
            pc.flush_replies()
            await asyncio.sleep(0.3)
            pc.flush_requests()
            await asyncio.sleep(0.3)
            await mgr.ping()
            await asyncio.sleep(0.3)
            await mgr.ping()  # pays what is still owed
            await asyncio.sleep(0.3)
            await mgr.aclose()

        asyncio.run(main())
        assert c_raw.get("redlock:lock:wc") is None, f"C keeps a key nobody holds ({c_raw.pttl('redlock:lock:wc')} ms)"
    finally:
        for p in proxies:
            p.close()
