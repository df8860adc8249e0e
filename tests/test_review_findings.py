"""Regressions found in review: a release ordered after its own SET, a passing probe error, a swallowed cancellation."""

from __future__ import annotations

import asyncio
import threading
import time

import redis

from django_redlock.core import AsyncLockManager, LockManager
from django_redlock.exceptions import LockNotAcquired
from tests.proxy import Proxy
from tests.test_restart_guard import wait_until_old


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


def test_passing_probe_error_does_not_disable_the_node(servers):
    mgr = LockManager(servers.urls[:3], ttl=2, max_ttl=2, retry_count=0, node_timeout=0.05)
    wait_until_old(mgr, 3)
    admin = redis.Redis(port=servers[2].port)
    admin.config_set("busy-reply-threshold", 100)

    def block():
        try:
            redis.Redis(port=servers[2].port).eval("while true do end", 0)
        except redis.RedisError:
            pass

    blocker = threading.Thread(target=block)
    blocker.start()
    time.sleep(0.3)  # the script must be running (BUSY) when the probe arrives
    try:
        mgr.acquire("a", blocking=False).release()  # first contact with node 2: its probe gets -BUSY
    finally:
        admin.script_kill()
        blocker.join()
    last = None
    for _ in range(5):
        servers[0].kill()  # node 2's vote is now needed
        try:
            mgr.acquire("b", blocking=False).release()
            break
        except LockNotAcquired as exc:
            last = exc
        finally:
            servers[0].start()
        time.sleep(0.6)
    else:
        raise AssertionError(f"node 2 never votes again after one BUSY probe: {last}")
    mgr.close()


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
