"""A release written on idle connections the nodes have already closed (the server's ``timeout``, CLIENT
KILL, a proxy or load balancer cutting idle flows) is sent once more on new connections: release() says
the lock was held and the keys go at once, not a ttl later. Real redis-server processes.

That second round is bounded by the node timeout the release has. Two nodes SIGSTOPped, a third's pooled connection closed by the server (CLIENT KILL) and its new
connections black-holed by a proxy: the first round waits its whole node timeout for the paused
nodes, and the retry gets none of it, so release() stays within one node timeout (a command's stop
waits for a whole engine call); it took two before. Also: the black-holed retry alone stays within
one node timeout, and an asyncio caller cancelled during the retry sees the ``released`` hook once
while the keys go in the background.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
import redis

from django_redlock.core import AsyncLockManager, LockManager
from django_redlock.core.hooks import Hooks
from django_redlock.exceptions import LockNotAcquired
from tests.conftest import on_nodes
from tests.proxy import Proxy

NODE_TIMEOUT = 0.5
#: Within one node timeout, with room for a loaded machine; the bug took two.
LIMIT = 1.5 * NODE_TIMEOUT


class Counting(Hooks):
    def __init__(self) -> None:
        self.calls: list[object] = []

    def released(self, lock: object) -> None:
        self.calls.append(lock)


def _cut_idle_connections(servers) -> None:
    """The servers close every client connection (a proxy or load balancer cutting idle flows)."""
    for server in servers:
        with redis.Redis.from_url(server.url, socket_timeout=2) as client:
            client.client_kill_filter(_type="normal", skipme=True)
    time.sleep(0.05)  # the FINs cross the loopback


def _until(condition: Callable[[], bool], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.005)


def _holds_bytes(proxies: list[Proxy]) -> bool:
    """A new connection through a proxy has written bytes the proxy holds back (the retry is waiting)."""
    return any(pipe.up_held for proxy in proxies for pipe in list(proxy.pipes))


def _takeable(servers, resource: str, within: float) -> None:
    other = LockManager(servers.urls, ttl=30, node_timeout=0.2, restart_window=0)
    try:
        lock = other.acquire(resource, timeout=within)
    except LockNotAcquired as exc:
        pytest.fail(f"released {resource!r} still locked {within} s later (pttl {on_nodes(servers, 'pttl', resource)}): {exc}")
    lock.release()
    other.close()


def test_a_release_on_connections_the_servers_closed_is_sent_again(servers):
    manager = LockManager(servers.urls, ttl=30, node_timeout=NODE_TIMEOUT, restart_window=0)
    try:
        lock = manager.acquire("sync-res")
        _cut_idle_connections(servers)
        released = lock.release()
        _takeable(servers, "sync-res", 3.0)
        assert released, "release() said the lock was not held, yet its keys were all there"
    finally:
        manager.close()


def test_async_a_release_on_connections_the_servers_closed_is_sent_again(servers):
    async def main() -> bool:
        manager = AsyncLockManager(servers.urls, ttl=30, node_timeout=NODE_TIMEOUT, restart_window=0)
        try:
            lock = await manager.acquire("async-res")
            _cut_idle_connections(servers)  # no await since: the loop has not read the EOFs yet
            return await lock.release()
        finally:
            await manager.aclose()

    released = asyncio.run(main())
    _takeable(servers, "async-res", 3.0)
    assert released


def _black_holed(servers, cut: int) -> tuple[list[Proxy], list[str]]:
    """Nodes ``0..cut-1`` behind proxies, then the rest: the proxies, and the URLs in node order."""
    proxies = [Proxy(server.port).start() for server in servers[:cut]]
    return proxies, [p.url for p in proxies] + servers.urls[cut:]


def _release_seconds(servers, urls, resource: str, cut: list, proxies: list[Proxy], paused: list) -> float:
    manager = LockManager(urls, ttl=30, node_timeout=NODE_TIMEOUT, restart_window=0)
    try:
        lock = manager.acquire(resource)
        _cut_idle_connections(cut)
        for proxy in proxies:
            proxy.hold_requests()  # new bytes are held from now on: no reply ever comes
        for server in paused:
            server.pause()
        started = time.monotonic()
        lock.release()
        return time.monotonic() - started
    finally:
        for server in paused:
            server.resume()
        manager.close()
        for proxy in proxies:
            proxy.close()


def test_a_black_holed_retry_alone_stays_within_the_node_timeout(servers):
    proxies, urls = _black_holed(servers, 3)
    took = _release_seconds(servers, urls, "bh", servers[:3], proxies, [])
    assert took < LIMIT, f"release() took {took:.3f} s, node timeout {NODE_TIMEOUT} s"


def test_the_retry_gets_only_what_is_left_of_the_node_timeout(servers):
    proxy = Proxy(servers[2].port).start()
    urls = servers.urls[:2] + [proxy.url] + servers.urls[3:]
    took = _release_seconds(servers, urls, "bh2", [servers[2]], [proxy], [servers[0], servers[1]])
    assert took < LIMIT, f"release() took {took:.3f} s, node timeout {NODE_TIMEOUT} s"


def test_async_the_retry_gets_only_what_is_left_of_the_node_timeout(servers):
    proxy = Proxy(servers[2].port).start()
    urls = servers.urls[:2] + [proxy.url] + servers.urls[3:]

    async def main() -> float:
        manager = AsyncLockManager(urls, ttl=30, node_timeout=NODE_TIMEOUT, restart_window=0)
        try:
            lock = await manager.acquire("abh2")
            _cut_idle_connections([servers[2]])  # no await: the loop has not read the EOF yet
            proxy.hold_requests()
            servers[0].pause()
            servers[1].pause()
            started = time.monotonic()
            await lock.release()
            return time.monotonic() - started
        finally:
            servers[0].resume()
            servers[1].resume()
            await manager.aclose()

    try:
        took = asyncio.run(main())
    finally:
        proxy.close()
    assert took < LIMIT, f"release() took {took:.3f} s, node timeout {NODE_TIMEOUT} s"


def test_async_release_cancelled_during_the_retry_goes_on_in_the_background(servers):
    proxies, urls = _black_holed(servers, 3)
    hooks = Counting()

    async def main():
        manager = AsyncLockManager(urls, ttl=30, node_timeout=NODE_TIMEOUT, restart_window=0, hooks=hooks)
        try:
            lock = await manager.acquire("acancel")
            _cut_idle_connections(servers[:3])
            for proxy in proxies:
                proxy.hold_requests()
            task = asyncio.ensure_future(lock.release())
            while not _holds_bytes(proxies):  # the first round broke at once; the retry now waits
                await asyncio.sleep(0.005)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            for proxy in proxies:
                proxy.pass_requests()
                proxy.flush_requests(wait=False)
            while any(on_nodes(servers, "get", "acancel")):  # the background round deletes the keys
                await asyncio.sleep(0.01)
            return lock
        finally:
            await manager.aclose()

    try:
        lock = asyncio.run(asyncio.wait_for(main(), 10))
    finally:
        for proxy in proxies:
            proxy.close()
    assert len(hooks.calls) == 1
    assert lock.released
