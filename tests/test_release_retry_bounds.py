"""The release's second round (sent on new connections where the first one's broke) is bounded by the
node timeout the release has, on real redis-server processes.

Two nodes SIGSTOPped, a third's pooled connection closed by the server (CLIENT KILL) and its new
connections black-holed by a proxy: the first round waits its whole node timeout for the paused
nodes, and the retry gets none of it, so release() stays within one node timeout (a command's stop
waits for a whole engine call). Also: the black-holed retry alone stays within one node timeout, and
an asyncio caller cancelled during the retry sees the ``released`` hook once while the keys go in
the background.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

from django_redlock.core import AsyncLockManager, LockManager
from django_redlock.core.hooks import Hooks
from tests.conftest import on_nodes
from tests.proxy import Proxy


class Counting(Hooks):
    def __init__(self):
        self.calls = []

    def released(self, lock):
        self.calls.append(lock)


def _kill_normal(urls):
    for url in urls:
        with redis.Redis.from_url(url, socket_timeout=2) as c:
            c.client_kill_filter(_type="normal", skipme=True)


def test_release_time_with_three_cut_and_black_holed(servers):
    """Three of five nodes cut the idle connections, then swallow every new one (a load balancer
    whose backend hangs). How long does release() take against node_timeout?"""
    proxies = [Proxy(s.port).start() for s in servers[:3]]
    urls = [p.url for p in proxies] + servers.urls[3:]
    timeout = 0.5
    mgr = LockManager(urls, ttl=30, node_timeout=timeout, restart_window=0)
    try:
        lock = mgr.acquire("bh")
        _kill_normal(servers.urls[:3])  # the idle connections through the proxies are closed
        time.sleep(0.1)
        for p in proxies:
            p.hold_requests()  # new bytes are held from now on: no reply ever comes
        t0 = time.monotonic()
        released = lock.release()
        took = time.monotonic() - t0
        print("release took", took, "released", released)
        assert took < 1.2 * timeout, f"release() took {took:.3f} s, node timeout {timeout} s"
    finally:
        mgr.close()
        for p in proxies:
            p.close()


def test_release_time_two_paused_one_cut_and_black_holed(servers):
    """Two nodes SIGSTOPped (the first round waits the whole node timeout for them), a third's idle
    connection cut and its new ones swallowed: the retry waits a second node timeout on top."""
    proxy = Proxy(servers[2].port).start()
    urls = servers.urls[:2] + [proxy.url] + servers.urls[3:]
    timeout = 0.5
    mgr = LockManager(urls, ttl=30, node_timeout=timeout, restart_window=0)
    try:
        lock = mgr.acquire("bh2")
        _kill_normal([servers[2].url])
        time.sleep(0.1)
        proxy.hold_requests()
        servers[0].pause()
        servers[1].pause()
        t0 = time.monotonic()
        released = lock.release()
        took = time.monotonic() - t0
        print("release took", took, "released", released)
        assert took < 1.2 * timeout, f"release() took {took:.3f} s, node timeout {timeout} s"
    finally:
        servers[0].resume()
        servers[1].resume()
        mgr.close()
        proxy.close()


def test_async_release_cancelled_during_the_retry(servers):
    """The asyncio caller is cancelled while the retry round waits (its new connections swallowed):
    the released hook must be called exactly once, and release must go on in the background."""
    proxies = [Proxy(s.port).start() for s in servers[:3]]
    urls = [p.url for p in proxies] + servers.urls[3:]
    hooks = Counting()

    async def main():
        mgr = AsyncLockManager(urls, ttl=30, node_timeout=0.5, restart_window=0, hooks=hooks)
        try:
            lock = await mgr.acquire("acancel")
            _kill_normal(servers.urls[:3])
            await asyncio.sleep(0.1)
            for p in proxies:
                p.hold_requests()
            task = asyncio.ensure_future(lock.release())
            await asyncio.sleep(0.2)  # the first round is over (broken at once); the retry waits
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            for p in proxies:
                p.pass_requests()
                p.flush_requests(wait=False)
            await asyncio.sleep(1.0)
            return lock
        finally:
            await mgr.aclose()

    try:
        lock = asyncio.run(main())
    finally:
        for p in proxies:
            p.close()
    print("hook calls", len(hooks.calls), "keys", on_nodes(servers, "get", "acancel"))
    assert len(hooks.calls) == 1
    assert lock.released


def test_async_release_time_two_paused_one_cut_and_black_holed(servers):
    """The asyncio twin: two nodes SIGSTOPped, a third's connection cut and new ones swallowed."""
    proxy = Proxy(servers[2].port).start()
    urls = servers.urls[:2] + [proxy.url] + servers.urls[3:]
    timeout = 0.5

    async def main():
        mgr = AsyncLockManager(urls, ttl=30, node_timeout=timeout, restart_window=0)
        try:
            lock = await mgr.acquire("abh2")
            _kill_normal([servers[2].url])
            time.sleep(0.1)  # no await: the loop has not read the EOF, the pooled connection is used
            proxy.hold_requests()
            servers[0].pause()
            servers[1].pause()
            t0 = time.monotonic()
            await lock.release()
            return time.monotonic() - t0
        finally:
            servers[0].resume()
            servers[1].resume()
            await mgr.aclose()

    try:
        took = asyncio.run(main())
    finally:
        proxy.close()
    assert took < 1.2 * timeout, f"release() took {took:.3f} s, node timeout {timeout} s"
