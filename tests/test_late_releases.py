"""Late and stale replies leave no lock behind (sync engine): a release of an earlier attempt, a NOSCRIPT read
late, a majority paused past the stale limit, a partition right after the SET.

Every test runs against real ``redis-server`` processes started by the suite; where a scenario needs late
delivery on the network, a small TCP proxy (:mod:`tests.proxy`) sits between the engine and a real node.
"""

from __future__ import annotations

import threading
import time

import pytest

from django_redlock.core import LockManager
from django_redlock.exceptions import LockNotAcquired
from tests.proxy import Proxy
from tests.test_restart_window import acquire_soon, assert_not_acquired, raw


# -- a stale release from an earlier attempt must not delete the winning attempt's key ---------


def test_stale_release_of_an_earlier_attempt_spares_the_winner(servers):
    """Item 3: attempt 1's SET and release reach B and C late, after attempt 2 won."""
    a, b, c = servers[0], servers[1], servers[2]
    with Proxy(b.port) as pb, Proxy(c.port) as pc:
        mgr = LockManager(
            [a.url, pb.url, pc.url], ttl=5, retry_count=1, retry_delay=1.5, retry_jitter=0, restart_window=0
        )
        other = LockManager([a.url, b.url, c.url], ttl=5, retry_count=0, restart_window=0)
        key = mgr.key("stale-sync")
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
            lock = mgr.acquire("stale-sync")  # attempt 2 (after the stale limit) wins on A, B, C
        finally:
            helper.join()
        assert not stage_error, stage_error
        try:
            assert lock.locked()
            for proxy in (pb, pc):
                proxy.flush_requests()  # attempt 1's SET NX and release finally reach B and C
            assert_not_acquired(other, "stale-sync", lock)
            assert lock.locked()
            lock.release()
        finally:
            mgr.close()
            other.close()


# -- a late NOSCRIPT on a parked connection must not swallow the release -----------------------


def test_release_answered_noscript_late_still_runs(servers):
    """Item 12: B and C lost their scripts (as after a restart) and answer the release late."""
    a, b, c = servers[0], servers[1], servers[2]
    with Proxy(b.port) as pb, Proxy(c.port) as pc:
        mgr = LockManager([a.url, pb.url, pc.url], ttl=10, retry_count=0, restart_window=0)
        other = LockManager([a.url, b.url, c.url], ttl=10, retry_count=0, retry_delay=0.1, restart_window=0)
        try:
            mgr.acquire("warm-up").release()  # each connection has sent the release's source: EVALSHA from now on
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
        finally:
            mgr.close()
            other.close()


# -- a majority paused longer than the stale limit: no lock left behind after resume ----------


def test_majority_pause_longer_than_stale_limit_leaves_nothing_behind(servers):
    """Item 14 (sync)."""
    mgr = LockManager(servers.urls, ttl=10, retry_count=0, retry_delay=0.05, retry_jitter=0, restart_window=0)
    other = LockManager(servers.urls, ttl=10, retry_count=0, retry_delay=0.05, retry_jitter=0, restart_window=0)
    try:
        mgr.acquire("warm-up").release()
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
    finally:
        mgr.close()
        other.close()


def test_partition_right_after_the_set_leaves_nothing_behind(servers):
    """Item 14 with a network partition: the SET NX lands on B and C, the release meant to follow is lost.

    B and C are cut off right after the SET got through (replies and the release are
    lost); the partition lasts longer than the stale limit, then heals. The manager's
    next acquire of the same resource must succeed at once, not after the ttl.
    """
    a, b, c = servers[0], servers[1], servers[2]
    with Proxy(b.port) as pb, Proxy(c.port) as pc:
        mgr = LockManager([a.url, pb.url, pc.url], ttl=10, retry_count=0, retry_delay=0.05, restart_window=0)
        other = LockManager([a.url, b.url, c.url], ttl=10, retry_count=0, retry_delay=0.05, restart_window=0)
        try:
            mgr.acquire("warm-up").release()
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
        finally:
            mgr.close()
            other.close()
