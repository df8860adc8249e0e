"""The delayed-restart rule against what real servers do: late probe replies, durability switched
on after an empty restart, and a replica promoted behind a node's address.

In each test a first client holds "r" on nodes 0, 1 and 2 only (its votes to nodes 3 and 4 are
held in a proxy and never arrive); then node 2 loses the key, and a second client must not get a
quorum out of node 2 and nodes 3, 4 while the first lock is valid.
"""

from __future__ import annotations

import threading
import time

import pytest
import redis

from django_redlock.core import AsyncLockManager, LockManager
from django_redlock.exceptions import LockNotAcquired
from django_redlock.testing import RedisServer
from tests.conftest import eventually
from tests.proxy import Proxy
from tests.test_restart_guard import wait_until_old


def hold_on_first_three(urls: list[str], servers, window: float, proxies: list[Proxy]):
    """A lock on "r" that lives on nodes 0, 1 and 2 of ``urls`` only: nodes 3 and 4 are reached
    through proxies that hold the votes."""
    cut = [Proxy(servers[i].port).start() for i in (3, 4)]
    proxies.extend(cut)
    for proxy in cut:
        proxy.hold_requests()
    first = LockManager([*urls[:3], *(p.url for p in cut)], ttl=window, max_ttl=window, restart_window=window,
                        retry_count=0)
    return first, first.acquire("r", blocking=False)


def config_set(url: str, **values: str) -> None:
    with redis.Redis.from_url(url, socket_timeout=5) as client:
        for name, value in values.items():
            client.config_set(name, value)


# -- a probe reply read late is aged from when it was read ------------------------------------

STALL = 3.0  # the second client's connect to node 0 hangs this long, before it reaches node 2
WINDOW = 6.0


def test_a_probe_reply_read_after_a_stall_is_aged_from_its_reading(servers):
    wait_until_old(LockManager(servers.urls), WINDOW + 0.2)
    proxies: list[Proxy] = []
    # The second client reaches node 0 with a password: its connect waits for AUTH's reply, which
    # the proxy can hold (node 0 unreachable: a connect timeout before node 2 is reached).
    gate = Proxy(servers[0].port).start()
    proxies.append(gate)
    first, lock = hold_on_first_three(servers.urls, servers, WINDOW, proxies)
    second = LockManager([gate.url_with(":secret"), *servers.urls[1:]], ttl=WINDOW, max_ttl=WINDOW,
                         restart_window=WINDOW, retry_count=0, node_timeout=STALL)
    try:
        servers[2].restart()  # forgets the first lock
        restarted = time.monotonic()
        servers[2].pause()
        # The second client's first vote probes node 2, which answers nothing yet: the probe is parked.
        second.acquire("warm-up", blocking=False)
        assert second.node_list[2].books.parked
        eventually(lambda: time.monotonic() > second.node_list[0].books.down_until + 0.05)  # node 0's cool-off
        while time.monotonic() < restarted + 1.5:  # deliberately: the stall below ends 4.5 s into the window
            time.sleep(0.05)
        gate.hold_requests()

        def answer_late() -> None:
            gate.wait_held(lambda held: b"AUTH" in held)  # the fan-out is stuck at node 0 now
            time.sleep(STALL - 0.4)  # node 2 reads the probe (and tells its uptime) near the stall's end
            servers[2].resume(wait=False)

        late = threading.Thread(target=answer_late, daemon=True)
        late.start()
        with pytest.raises(LockNotAcquired) as info:
            second.acquire("r", blocking=False)
        late.join()
        assert time.monotonic() - restarted < WINDOW - 0.5, "the machine was too slow for this test's timing"
        assert lock.locked(), "the first lock is still valid: nobody else may hold it"
        assert "delayed-restart rule" in info.value.failures[second.nodes[2]]
    finally:
        if servers[2].paused:
            servers[2].resume()
        first.close()
        second.close()
        for proxy in proxies:
            proxy.close()


# -- durability is what the node was declared, not what it says now ---------------------------

DURABLE_WINDOW = 3.0


def test_a_node_that_turned_fsync_on_after_restarting_empty_sits_out(servers):
    wait_until_old(LockManager(servers.urls), DURABLE_WINDOW + 0.2)
    proxies: list[Proxy] = []
    first, lock = hold_on_first_three(servers.urls, servers, DURABLE_WINDOW, proxies)
    second = LockManager(servers.urls, ttl=DURABLE_WINDOW, max_ttl=DURABLE_WINDOW, restart_window=DURABLE_WINDOW,
                         retry_count=0)
    try:
        servers[2].restart()  # empty
        config_set(servers[2].url, appendonly="yes", appendfsync="always")  # an operator, a config agent
        with pytest.raises(LockNotAcquired) as info:
            second.acquire("r", blocking=False)
        assert lock.locked()
        assert "delayed-restart rule" in info.value.failures[second.nodes[2]]
        status = second.node_status()[2]
        assert status.sits_out_for > 0 and not status.votes and status.persistence["appendfsync"] == "always"
    finally:
        config_set(servers[2].url, appendonly="no", appendfsync="everysec")
        first.close()
        second.close()
        for proxy in proxies:
            proxy.close()


def test_a_node_declared_fsync_always_votes_right_after_a_restart(servers):
    declared = [*servers.urls[:2], {"URL": servers.urls[2], "FSYNC_ALWAYS": True}, *servers.urls[3:]]
    manager = LockManager(declared, ttl=DURABLE_WINDOW, max_ttl=DURABLE_WINDOW, restart_window=DURABLE_WINDOW,
                          retry_count=0)
    wait_until_old(manager, DURABLE_WINDOW + 0.2)
    try:
        servers[2].restart()
        eventually(lambda: manager.ping()[manager.nodes[2]] is not None)
        lock = manager.acquire("declared", blocking=False)
        assert lock.locked()
        status = manager.node_status()[2]
        assert status.votes and status.sits_out_for == 0 and status.fsync_declared
        lock.release()
    finally:
        manager.close()


# -- a replica promoted behind the node's address ---------------------------------------------

FAILOVER_WINDOW = 2.0


class Failover:
    """A master and its replica behind one address (a proxy); the replication stream runs through
    another proxy that can hold it (asynchronous replication falling behind)."""

    def __init__(self) -> None:
        self.master = RedisServer().start()
        self.replica = RedisServer().start()
        self.stream = Proxy(self.master.port).start()
        self.address = Proxy(self.master.port).start()
        with redis.Redis(port=self.replica.port, socket_timeout=5) as replica:
            replica.replicaof("127.0.0.1", self.stream.port)
            eventually(lambda: replica.info("replication").get("master_link_status") == "up", 10)

    @property
    def url(self) -> str:
        return self.address.url

    def fall_behind(self) -> None:
        self.stream.hold_replies()  # the master's writes stop reaching the replica

    def promote(self) -> None:
        """The replica becomes the master behind the address; the old master dies with its connections."""
        with redis.Redis(port=self.replica.port, socket_timeout=5) as replica:
            replica.replicaof("NO", "ONE")
        self.address.upstream = ("127.0.0.1", self.replica.port)  # new connections reach the replica
        self.master.kill()

    def close(self) -> None:
        self.address.close()
        self.stream.close()
        self.master.stop()
        self.replica.stop()


@pytest.fixture
def failover():
    pair = Failover()
    yield pair
    pair.close()


def test_a_replica_promoted_behind_the_address_sits_out(servers, failover):
    urls = [*servers.urls[:2], failover.url, *servers.urls[3:]]
    second = LockManager(urls, ttl=FAILOVER_WINDOW, max_ttl=FAILOVER_WINDOW, restart_window=FAILOVER_WINDOW,
                         retry_count=0)
    wait_until_old(second, FAILOVER_WINDOW + 0.2)
    proxies: list[Proxy] = []
    try:
        second.acquire("warm-up", blocking=False).release()  # the second client knows node 2's master
        failover.fall_behind()
        first, lock = hold_on_first_three(urls, servers, FAILOVER_WINDOW, proxies)
        failover.promote()  # the first lock's key never reached the replica
        for _ in range(2):  # the first vote may go on the connection the old master's death broke
            with pytest.raises(LockNotAcquired) as info:
                second.acquire("r", blocking=False)
            assert lock.locked(), "the first lock is still valid: nobody else may hold it"
            if "delayed-restart rule" in info.value.failures[second.nodes[2]]:
                break
        assert "delayed-restart rule" in info.value.failures[second.nodes[2]]
        status = second.node_status()[2]
        assert status.sits_out_for > 0 and not status.votes
        # Once the window has passed (and the first lock has expired) the promoted replica votes.
        eventually(lambda: not lock.locked(), FAILOVER_WINDOW + 1)
        again = eventually(lambda: _try(second, "r"), FAILOVER_WINDOW + 2)
        again.release()
        first.close()
    finally:
        second.close()
        for proxy in proxies:
            proxy.close()


def _try(manager, resource):
    try:
        return manager.acquire(resource, blocking=False)
    except LockNotAcquired:
        return None


async def test_the_async_manager_sees_the_failover_too(servers, failover):
    urls = [*servers.urls[:2], failover.url, *servers.urls[3:]]
    second = AsyncLockManager(urls, ttl=FAILOVER_WINDOW, max_ttl=FAILOVER_WINDOW, restart_window=FAILOVER_WINDOW,
                              retry_count=0)
    wait_until_old(LockManager(urls), FAILOVER_WINDOW + 0.2)
    proxies: list[Proxy] = []
    try:
        await (await second.acquire("warm-up", blocking=False)).release()
        failover.fall_behind()
        first, lock = hold_on_first_three(urls, servers, FAILOVER_WINDOW, proxies)
        failover.promote()
        for _ in range(2):  # the first vote may go on the connection the old master's death broke
            with pytest.raises(LockNotAcquired) as info:
                await second.acquire("r", blocking=False)
            assert lock.locked(), "the first lock is still valid: nobody else may hold it"
            if "delayed-restart rule" in info.value.failures[second.nodes[2]]:
                break
        assert "delayed-restart rule" in info.value.failures[second.nodes[2]]
        first.close()
    finally:
        await second.aclose()
        for proxy in proxies:
            proxy.close()


def test_the_deploy_check_warns_about_a_declaration_the_config_denies(settings, servers):
    from django_redlock.checks import Codes, check_nodes

    settings.REDLOCK_NODES = [*servers.urls[:4], {"URL": servers.urls[4], "FSYNC_ALWAYS": True}]
    warned = [m for m in check_nodes() if m.id == Codes.NOT_FSYNCING]
    assert len(warned) == 1 and "appendfsync everysec" in warned[0].msg and servers.urls[4][8:] in warned[0].msg
    config_set(servers.urls[4], appendonly="yes", appendfsync="always")
    try:
        assert not [m for m in check_nodes() if m.id == Codes.NOT_FSYNCING]
    finally:
        config_set(servers.urls[4], appendonly="no", appendfsync="everysec")
