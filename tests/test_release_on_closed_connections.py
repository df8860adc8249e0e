"""A release written on idle connections the nodes have already closed (the server's ``timeout``, CLIENT
KILL, a proxy or load balancer cutting idle flows) is sent once more on new connections: release() says
the lock was held and the keys go at once, not a ttl later. Real redis-server processes."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

from django_redlock.core import AsyncLockManager, LockManager
from django_redlock.exceptions import LockNotAcquired
from tests.conftest import on_nodes


def _cut_idle_connections(servers):
    for s in servers:
        with redis.Redis.from_url(s.url, socket_timeout=2) as c:
            c.client_kill_filter(_type="normal", skipme=True)


def _takeable(servers, resource, within):
    other = LockManager(servers.urls, ttl=30, node_timeout=0.2, restart_window=0)
    try:
        lock = other.acquire(resource, timeout=within)
    except LockNotAcquired as exc:
        pytest.fail(f"released {resource!r} still locked {within} s later (pttl {on_nodes(servers, 'pttl', resource)}): {exc}")
    lock.release()
    other.close()


def test_sync_release_on_connections_closed_by_the_servers(servers):
    mgr = LockManager(servers.urls, ttl=30, node_timeout=0.5, restart_window=0)
    try:
        lock = mgr.acquire("sync-res")
        _cut_idle_connections(servers)
        time.sleep(0.05)  # the servers' FINs have arrived
        released = lock.release()
        _takeable(servers, "sync-res", 3.0)
        assert released, "release() said the lock was not held, yet its keys were all there"
    finally:
        mgr.close()


def test_async_release_on_connections_closed_by_the_servers(servers):
    async def main():
        mgr = AsyncLockManager(servers.urls, ttl=30, node_timeout=0.5, restart_window=0)
        try:
            lock = await mgr.acquire("async-res")
            _cut_idle_connections(servers)  # no await since: the loop has not read the EOFs yet
            released = await lock.release()
            await asyncio.sleep(0.5)  # the loop runs on: any background work may finish
            return released
        finally:
            await mgr.aclose()

    released = asyncio.run(main())
    _takeable(servers, "async-res", 3.0)
    assert released
