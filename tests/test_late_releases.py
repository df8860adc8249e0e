"""Late and stale replies leave no lock behind, on the sync and asyncio engines: a release of an earlier
attempt, a NOSCRIPT read late, a majority paused past the stale limit, a partition right after the SET,
replies that all come late; on a blocked event loop, and a release behind its own unanswered SET.

Every test runs against real ``redis-server`` processes started by the suite; where a scenario needs late
delivery on the network, a small TCP proxy (:mod:`tests.proxy`) sits between the engine and a real node.
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
from tests.test_restart_window import acquire_soon, assert_not_acquired, raw


QUICK = {"ttl": 10, "retry_count": 0, "retry_delay": 0.05, "retry_jitter": 0, "restart_window": 0}


# -- a stale release from an earlier attempt must not delete the winning attempt's key ---------


def test_stale_release_of_an_earlier_attempt_spares_the_winner(engine, servers):
    """Attempt 1's SET and release reach B and C late, after attempt 2 won."""
    a, b, c = servers[0], servers[1], servers[2]
    with Proxy(b.port) as pb, Proxy(c.port) as pc:
        mgr = engine.manager(
            [a.url, pb.url, pc.url], ttl=5, retry_count=1, retry_delay=1.5, retry_jitter=0, restart_window=0
        )
        other = engine.manager([a.url, b.url, c.url], ttl=5, retry_count=0, restart_window=0)
        key = mgr.key("stale")
        raw(a).set(key, "someone-else", px=10_000)  # A refuses attempt 1
        pb.hold_requests()
        pc.hold_requests()  # B and C: attempt 1's bytes are stuck in the network
        stage_error = []

        def network_recovers():
            try:
                for proxy in (pb, pc):  # attempt 1 failed and queued its release behind its SET
                    proxy.wait_held(lambda held: held.count(b"EVAL") >= 2)  # the vote, then its release
                raw(a).delete(key)  # the other holder is gone
                for proxy in (pb, pc):
                    proxy.pass_requests()  # new connections get through; the old ones stay stuck
            except BaseException as exc:  # noqa: BLE001 - reported by the test thread
                stage_error.append(exc)

        helper = threading.Thread(target=network_recovers)
        helper.start()
        try:
            lock = mgr.acquire("stale")  # attempt 2 (after the stale limit) wins on A, B, C
        finally:
            helper.join()
        assert not stage_error, stage_error
        assert lock.locked()
        for proxy in (pb, pc):
            proxy.flush_requests()  # attempt 1's SET NX and release finally reach B and C
        assert_not_acquired(other, "stale", lock)
        assert lock.locked()
        lock.release()



# -- a late NOSCRIPT on a parked connection must not swallow the release -----------------------


def test_release_answered_noscript_late_still_runs(engine, servers):
    """B and C lost their scripts (as after a restart) and answer the release late."""
    a, b, c = servers[0], servers[1], servers[2]
    with Proxy(b.port) as pb, Proxy(c.port) as pc:
        # A node timeout a busy machine does not outrun: a reply given up on would park its connection,
        # and the next command would go on a new one, which sends the script's source (no NOSCRIPT).
        mgr = engine.manager([a.url, pb.url, pc.url], ttl=10, retry_count=0, restart_window=0, node_timeout=0.5)
        other = engine.manager([a.url, b.url, c.url], ttl=10, retry_count=0, retry_delay=0.1, restart_window=0)
        mgr.acquire("warm-up", timeout=1.0).release()  # each connection has sent the release's source: EVALSHA from now on
        lock = mgr.acquire("res")
        for server in (b, c):
            raw(server).script_flush()
        pb.hold_replies()
        pc.hold_replies()
        lock.release()  # A deletes at once; B and C answer NOSCRIPT, but too late for the fan-out
        for proxy in (pb, pc):
            proxy.wait_held(lambda held: b"NOSCRIPT" in held, replies=True)
            proxy.pass_replies()
            proxy.flush_replies()
        mgr.acquire("unrelated").release()  # the same manager's next call reads the late replies
        lock2 = acquire_soon(other, "res", 1.5)
        lock2.release()


# -- a majority paused longer than the stale limit: no lock left behind after resume ----------


def test_majority_pause_longer_than_stale_limit_leaves_nothing_behind(engine, servers):
    """The paused nodes' connections are dropped after the stale limit; the SETs still land on resume."""
    mgr = engine.manager(servers.urls, **QUICK)
    other = engine.manager(servers.urls, **QUICK)
    mgr.acquire("warm-up", timeout=1.0).release()
    for server in servers[2:]:
        server.pause()  # their sockets still accept and queue the SET NX
    try:
        with pytest.raises(LockNotAcquired):
            mgr.acquire("res", blocking=False)
        time.sleep(1.2)  # longer than the stale limit: the engine gives up on those connections
        with pytest.raises(LockNotAcquired):
            mgr.acquire("res", blocking=False)
        time.sleep(0.3)
    finally:
        for server in servers[2:]:
            server.resume()
    lock = acquire_soon(mgr, "res", 1.0)
    lock.release()
    # The same from another manager, after the first one made one more call.
    for server in servers[2:]:
        server.pause()
    try:
        with pytest.raises(LockNotAcquired):
            mgr.acquire("res2", blocking=False)
        time.sleep(1.2)
        with pytest.raises(LockNotAcquired):
            mgr.acquire("res2", blocking=False)
        time.sleep(0.3)
    finally:
        for server in servers[2:]:
            server.resume()
    mgr.acquire("unrelated").release()
    acquire_soon(other, "res2", 1.0).release()


def test_partition_right_after_the_set_leaves_nothing_behind(engine, servers):
    """A network partition: the SET NX lands on B and C, the release meant to follow is lost.

    B and C are cut off right after the SET got through (replies and the release are
    lost); the partition lasts longer than the stale limit, then heals. The manager's
    next acquire of the same resource must succeed at once, not after the ttl.
    """
    a, b, c = servers[0], servers[1], servers[2]
    with Proxy(b.port) as pb, Proxy(c.port) as pc:
        mgr = engine.manager([a.url, pb.url, pc.url], **QUICK)
        other = engine.manager([a.url, b.url, c.url], **QUICK)
        mgr.acquire("warm-up", timeout=1.0).release()
        for proxy in (pb, pc):
            proxy.cut_after(mgr.key("res").encode())  # the SET NX is the first command on this key
        with pytest.raises(LockNotAcquired):
            mgr.acquire("res", blocking=False)
        for proxy in (pb, pc):
            proxy.wait_cut()
        time.sleep(1.2)  # longer than the stale limit: the engine gives up on those connections
        with pytest.raises(LockNotAcquired):
            mgr.acquire("res", blocking=False)  # during the partition: nothing answers
        time.sleep(0.3)
        for proxy in (pb, pc):
            proxy.heal()
        acquire_soon(mgr, "res", 1.0).release()
        # The same for another manager, once the first one made one more call.
        for proxy in (pb, pc):
            proxy.cut_after(mgr.key("res2").encode())
        with pytest.raises(LockNotAcquired):
            mgr.acquire("res2", blocking=False)
        time.sleep(1.5)
        for proxy in (pb, pc):
            proxy.heal()
        mgr.acquire("unrelated", timeout=1.0).release()
        acquire_soon(other, "res2", 1.0).release()


def test_replies_that_come_late_leave_no_keys(engine, servers):
    """Every reply arrives after node_timeout, the SETs have run: the next calls find no key left."""
    proxies = [Proxy(server.port).start() for server in servers[:3]]
    mgr = engine.manager([p.url for p in proxies], **QUICK)
    other = engine.manager([s.url for s in servers[:3]], **QUICK)
    try:
        mgr.acquire("warm-up", timeout=1.0).release()
        for proxy in proxies:
            proxy.delay_replies = 0.2
        with pytest.raises(LockNotAcquired, match="nodes answered"):
            mgr.acquire("res", blocking=False)  # "only 0 of 3 nodes answered"
        time.sleep(0.3)
        for proxy in proxies:
            proxy.delay_replies = 0.0
        mgr.acquire("unrelated", timeout=1.0).release()
        acquire_soon(other, "res", 1.0).release()
    finally:
        for proxy in proxies:
            proxy.close()


# -- the asyncio driver's own cases -------------------------------------------------------------


def quick(urls, **kwargs):
    return AsyncLockManager(urls, **{**QUICK, **kwargs})


async def test_replies_read_late_on_a_blocked_loop_leave_no_keys(servers):
    """The loop is blocked right after the SET fan-out went out, longer than node_timeout."""
    mgr = quick(servers.urls)
    other = quick(servers.urls)
    try:
        await (await mgr.acquire("warm-up", timeout=1.0)).release()
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
            try:
                await (await other.acquire(resource, timeout=1.0)).release()
            except LockNotAcquired as exc:
                pytest.fail(f"{resource!r} still locked 1 s later, with no holder left: {exc}")
    finally:
        await mgr.aclose()
        await other.aclose()


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
