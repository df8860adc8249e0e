"""A node's data set replaced behind connections that stay open.

Three real nodes X, Y, Z (``appendfsync always``, declared: a restart alone would let them vote at
once) and a fourth server W, the resync source. A first client holds "f" on X and Y only (its vote
to Z is held in a proxy). Then X loses the key without closing a connection: it becomes a replica
of W (a full sync replaces its data) and is promoted back, or it is flushed. A second client, whose
connections to every node were opened and probed before, must not win "f" with X's and Z's votes
while the first lock is valid, and X must vote again once the restart window has passed.
"""

from __future__ import annotations

import pytest
import redis

from django_redlock.core import AsyncLockManager, LockManager
from django_redlock.core.ledger import DELAYED_RESTART
from django_redlock.exceptions import LockNotAcquired
from django_redlock.testing import RedisServer
from tests.conftest import eventually, eventually_async
from tests.proxy import Proxy

WINDOW = 3.0
FSYNC = ("--appendonly", "yes", "--appendfsync", "always")
SOURCE = ("--repl-diskless-sync-delay", "0")  # the full sync starts at once


@pytest.fixture
def world():
    """X, Y, Z (the nodes) and W (the resync source), each a fresh redis-server."""
    started = [RedisServer(extra_args=FSYNC + SOURCE).start() for _ in range(3)]
    started.append(RedisServer(extra_args=SOURCE).start())
    proxies: list[Proxy] = []
    yield started, proxies
    for proxy in proxies:
        proxy.close()
    for server in started:
        server.stop()


def declared(url: str) -> dict[str, object]:
    return {"URL": url, "FSYNC_ALWAYS": True}


def options() -> dict[str, object]:
    return {"ttl": WINDOW, "max_ttl": WINDOW, "restart_window": WINDOW, "retry_count": 0, "node_timeout": 0.5}


def learned(nodes) -> bool:
    """Every node's books have read its data set's token (a reply still in flight when a round ended at
    its quorum teaches nothing until it is read: a data set replaced before that is a first contact)."""
    return all(node.books.dataset for node in nodes)


def warm_up(second: LockManager) -> bool:
    """One more acquire and release (the sync driver reads what a connection still owes when it next
    uses it); True once the second client has read every node's data-set token."""
    second.acquire("warm-up", blocking=False).release()
    return learned(second.node_list)


def hold_on_x_and_y(servers: list[RedisServer], proxies: list[Proxy]):
    """The first client, holding "f" on X and Y only: its vote to Z never arrives."""
    cut = Proxy(servers[2].port).start()
    proxies.append(cut)
    cut.hold_requests()
    first = LockManager([declared(servers[0].url), declared(servers[1].url), declared(cut.url)], **options())
    return first, first.acquire("f", blocking=False)


def resync_from(x: RedisServer, source: RedisServer) -> None:
    """X becomes a replica of ``source`` (a full sync replaces its data set), then a master again.
    Client connections to X stay open all along."""
    with redis.Redis(port=x.port, socket_timeout=5) as client:
        client.replicaof("127.0.0.1", source.port)
        eventually(lambda: client.info("replication").get("master_link_status") == "up", 10)
        client.replicaof("NO", "ONE")


def flush(x: RedisServer, command: str) -> None:
    """FLUSHALL or FLUSHDB on X: its data set is emptied under open connections."""
    with redis.Redis(port=x.port, socket_timeout=5) as client:
        client.execute_command(command)


#: How X's data set is replaced, given X, Y, Z, W: from W (empty), from Z (a lock node: its own
#: marker, and no key of the first lock), or flushed.
REPLACEMENTS = {
    "resync": lambda x, y, z, w: resync_from(x, w),
    "resync-from-z": lambda x, y, z, w: resync_from(x, z),
    "flushall": lambda x, y, z, w: flush(x, "FLUSHALL"),
    "flushdb": lambda x, y, z, w: flush(x, "FLUSHDB"),
}


def second_acquire(second: LockManager, blocking: bool):
    if blocking:  # runs the ACQUIRE script (a place in line), not the plain vote
        return second.acquire("f", blocking=True, timeout=0.3)
    return second.acquire("f", blocking=False)


@pytest.mark.parametrize("blocking", [False, True], ids=["once", "in-line"])
@pytest.mark.parametrize("replace", list(REPLACEMENTS))
def test_a_node_whose_data_set_was_replaced_sits_out(world, replace, blocking):
    servers, proxies = world
    x, y, z, w = servers
    second = LockManager([declared(s.url) for s in (x, y, z)], **options())
    try:
        eventually(lambda: warm_up(second))  # every connection of the second client is open
        first, lock = hold_on_x_and_y(servers, proxies)
        assert lock.locked()
        REPLACEMENTS[replace](*servers)
        with pytest.raises(LockNotAcquired) as refused:
            stolen = second_acquire(second, blocking)
            left = lock.validity
            stolen.release()
            pytest.fail(f"two holders: the second client won 'f' while the first had {left:.1f} s left")
        assert lock.locked(), "the first lock is still valid"
        assert DELAYED_RESTART in refused.value.failures[second.nodes[0]]
        assert "data set" in refused.value.failures[second.nodes[0]]
        # The window passes (the first lock is gone by then): X votes again.
        eventually(lambda: not lock.locked(), WINDOW + 1)
        again = eventually(lambda: _try(second), WINDOW + 2)
        again.release()
        first.close()
    finally:
        second.close()


def _try(manager: LockManager):
    try:
        return manager.acquire("f", blocking=False)
    except LockNotAcquired:
        return None


async def test_the_async_manager_sees_the_resync_too(world):
    servers, proxies = world
    x, y, z, w = servers
    second = AsyncLockManager([declared(s.url) for s in (x, y, z)], **options())
    try:
        await (await second.acquire("warm-up", blocking=False)).release()
        await eventually_async(lambda: learned(second.anodes))
        first, lock = hold_on_x_and_y(servers, proxies)
        resync_from(x, w)
        with pytest.raises(LockNotAcquired) as refused:
            stolen = await second.acquire("f", blocking=False)
            left = lock.validity
            await stolen.release()
            pytest.fail(f"two holders: the second client won 'f' while the first had {left:.1f} s left")
        assert lock.locked(), "the first lock is still valid"
        assert DELAYED_RESTART in refused.value.failures[second.nodes[0]]
        await eventually_async(lambda: not lock.locked(), WINDOW + 1)
        first.close()
    finally:
        await second.aclose()


def test_a_new_connection_after_the_resync_sees_it_too(world):
    """The second client's connection to X is gone when X is resynced: its next connection's probe
    reads another data set than the one it knew, and X sits out."""
    servers, proxies = world
    x, y, z, w = servers
    second = LockManager([declared(s.url) for s in (x, y, z)], **options())
    try:
        eventually(lambda: warm_up(second))
        first, lock = hold_on_x_and_y(servers, proxies)
        resync_from(x, w)
        with redis.Redis(port=x.port, socket_timeout=5) as client:
            client.client_kill_filter(_type="normal", skipme=True)  # the second client's connections break
        for _ in range(2):  # the first vote may meet the connection that was killed
            with pytest.raises(LockNotAcquired) as refused:
                second.acquire("f", blocking=False).release()
                pytest.fail("two holders")
            if DELAYED_RESTART in refused.value.failures[second.nodes[0]]:
                break
        assert DELAYED_RESTART in refused.value.failures[second.nodes[0]]
        assert lock.locked()
        first.close()
    finally:
        second.close()
