"""The delayed-restart rule against what real servers do: late probe replies, durability switched
on after an empty restart, and a replica promoted behind a node's address.

In each test a first client holds "r" on nodes 0, 1 and 2 only (its votes to nodes 3 and 4 are
held in a proxy and never arrive); then node 2 loses the key, and a second client must not get a
quorum out of node 2 and nodes 3, 4 while the first lock is valid.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis

from django_redlock.core import AsyncLockManager, LockManager, clock
from django_redlock.core.ledger import NO_REPLICATION, sure_uptime
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


def wait_until_aged(urls: list[str], window: float) -> None:
    """Every node past ``window`` by its uptime, and past any failover's window (see wait_until_old)."""
    with LockManager(urls, ttl=window, max_ttl=window, restart_window=window) as manager:
        wait_until_old(manager, window + 0.2)


def config_set(url: str, **values: str) -> None:
    with redis.Redis.from_url(url, socket_timeout=5) as client:
        for name, value in values.items():
            client.config_set(name, value)


# -- a probe reply read late is aged from when it was read ------------------------------------

STALL = 3.0  # the second client's connect to node 0 hangs this long, before it reaches node 2
WINDOW = 6.0


def test_a_probe_reply_read_after_a_stall_is_aged_from_its_reading(servers):
    wait_until_aged(servers.urls, WINDOW)
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
        restarted = clock.now()
        servers[2].pause()
        # The second client's first vote probes node 2, which answers nothing yet: the probe is parked.
        second.acquire("warm-up", blocking=False)
        assert second.node_list[2].books.parked
        eventually(lambda: clock.now() > second.node_list[0].books.down_until + 0.05)  # node 0's cool-off
        while clock.now() < restarted + 1.5:  # deliberately: the stall below ends 4.5 s into the window
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
        assert clock.now() - restarted < WINDOW - 0.5, "the machine was too slow for this test's timing"
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
    wait_until_aged(servers.urls, DURABLE_WINDOW)
    proxies: list[Proxy] = []
    first, lock = hold_on_first_three(servers.urls, servers, DURABLE_WINDOW, proxies)
    second = LockManager(servers.urls, ttl=DURABLE_WINDOW, max_ttl=DURABLE_WINDOW, restart_window=DURABLE_WINDOW,
                         retry_count=0, node_timeout=0.5)
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
                          retry_count=0, node_timeout=0.5)
    wait_until_old(manager, DURABLE_WINDOW + 0.2)
    last_heard = clock.now()  # node_status() read node 2 last
    try:
        # Deliberately: INFO's uptime is whole seconds, so a server that started within about 2 s
        # of this process's last reply from the one before may have been there already (a failover:
        # it sits out one window, declared or not). Restart it later than that.
        while clock.now() < last_heard + 2.5:
            time.sleep(0.05)
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
                         retry_count=0, node_timeout=0.5)
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
                              retry_count=0, node_timeout=0.5)
    wait_until_aged(urls, FAILOVER_WINDOW)
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


# -- another master behind the address while this process kept talking to the old one ----------


def old_enough(url: str, seconds: float) -> bool:
    with redis.Redis.from_url(url, socket_timeout=5) as client:
        return sure_uptime(float(client.info("server")["uptime_in_seconds"])) > seconds


def test_a_master_started_while_the_old_one_still_answered_sits_out(servers):
    """The new master (never a replica, empty) started after this process probed the old one, but
    while the old one still answered it on the same connection: not a restart."""
    old = RedisServer().start()
    address = Proxy(old.port).start()
    new = None
    urls = [*servers.urls[:2], address.url, *servers.urls[3:]]
    second = LockManager(urls, ttl=FAILOVER_WINDOW, max_ttl=FAILOVER_WINDOW, restart_window=FAILOVER_WINDOW,
                         retry_count=0, node_timeout=0.5)
    proxies: list[Proxy] = [address]
    try:
        wait_until_old(second, FAILOVER_WINDOW + 0.2)
        second.acquire("warm-up", blocking=False).release()  # probes the old master
        new = RedisServer().start()
        while not old_enough(new.url, FAILOVER_WINDOW + 0.2):  # the old master answers all along
            second.acquire("busy", blocking=False).release()
            time.sleep(0.05)
        first, lock = hold_on_first_three(urls, servers, FAILOVER_WINDOW, proxies)
        address.upstream = ("127.0.0.1", new.port)
        old.kill()
        for _ in range(2):  # the first vote may go on the connection the old master's death broke
            with pytest.raises(LockNotAcquired) as info:
                second.acquire("r", blocking=False)
            assert lock.locked(), "the first lock is still valid: nobody else may hold it"
            if "delayed-restart rule" in info.value.failures[second.nodes[2]]:
                break
        assert "another server answers" in info.value.failures[second.nodes[2]]
        first.close()
    finally:
        second.close()
        for proxy in proxies:
            proxy.close()
        for server in (old, new):
            if server is not None:
                server.stop()


# -- INFO replication denied to the lock user --------------------------------------------------

ACL_PASSWORD = "Acl-Secret-42x"
INFO_SERVER_ONLY = ["--user", "locker", "on", f">{ACL_PASSWORD}", "~*", "&*", "+@all", "-info", "+info|server"]


def test_a_promoted_replica_sits_out_when_info_replication_is_denied(servers):
    """With ``-info +info|server`` the probe cannot see a promotion: another run id then counts as a
    failover, whatever the uptimes say."""
    master = RedisServer(extra_args=INFO_SERVER_ONLY).start()
    address, stream = Proxy(master.port).start(), Proxy(master.port).start()
    proxies: list[Proxy] = [address, stream]
    replica = None
    node = f"redis://locker:{ACL_PASSWORD}@127.0.0.1:{address.port}/0"
    urls = [*servers.urls[:2], node, *servers.urls[3:]]
    second = LockManager(urls, ttl=FAILOVER_WINDOW, max_ttl=FAILOVER_WINDOW, restart_window=FAILOVER_WINDOW,
                         retry_count=0, node_timeout=0.5)
    try:
        eventually(lambda: old_enough(master.url, FAILOVER_WINDOW + 0.2), 10)
        second.acquire("warm-up", blocking=False).release()  # probes the master
        second.close()  # nothing more is heard from it
        replica = RedisServer(extra_args=INFO_SERVER_ONLY).start()  # added after that probe
        with redis.Redis(port=replica.port, socket_timeout=5) as client:
            client.replicaof("127.0.0.1", stream.port)
            eventually(lambda: client.info("replication").get("master_link_status") == "up", 10)
        eventually(lambda: old_enough(replica.url, FAILOVER_WINDOW + 0.2), 10)
        stream.hold_replies()
        first, lock = hold_on_first_three(urls, servers, FAILOVER_WINDOW, proxies)
        with redis.Redis(port=replica.port, socket_timeout=5) as client:
            client.replicaof("NO", "ONE")
        address.upstream = ("127.0.0.1", replica.port)
        master.kill()
        with pytest.raises(LockNotAcquired) as info:
            second.acquire("r", blocking=False)
        assert lock.locked(), "the first lock is still valid: nobody else may hold it"
        assert "another server answers" in info.value.failures[second.nodes[2]]
        status = second.node_status()[2]
        assert not status.votes and "another server answers" in (status.not_voting_reason or "")
        first.close()
    finally:
        second.close()
        for proxy in proxies:
            proxy.close()
        for server in (master, replica):
            if server is not None:
                server.stop()


# -- the Django layer's sync and async managers -------------------------------------------------


def test_the_sync_and_async_managers_share_what_they_learned(settings, servers, failover):
    """The sync manager met the old master; the async manager's first contact is after the failover."""
    from django_redlock.manager import get_async_lock_manager, get_lock_manager

    urls = [*servers.urls[:2], failover.url, *servers.urls[3:]]
    settings.REDLOCK_NODES = urls
    settings.REDLOCK = {"TTL": FAILOVER_WINDOW, "MAX_TTL": FAILOVER_WINDOW, "RESTART_WINDOW": FAILOVER_WINDOW,
                        "RETRY_COUNT": 0}
    sync, amanager = get_lock_manager(), get_async_lock_manager()
    wait_until_old(sync, FAILOVER_WINDOW + 0.2)
    proxies: list[Proxy] = []
    try:
        sync.acquire("warm-up", blocking=False).release()
        failover.fall_behind()
        first, lock = hold_on_first_three(urls, servers, FAILOVER_WINDOW, proxies)
        failover.promote()

        async def acquire():
            try:
                return await amanager.acquire("r", blocking=False)
            except LockNotAcquired as exc:
                return exc

        refused = asyncio.run(acquire())
        assert lock.locked(), "the first lock is still valid: nobody else may hold it"
        assert isinstance(refused, LockNotAcquired), "the async manager got a lock the first one holds"
        assert "another server answers" in refused.failures[amanager.nodes[2]]
        first.close()
    finally:
        for proxy in proxies:
            proxy.close()


def test_info_replication_denied_is_reported(settings, servers, caplog):
    from io import StringIO

    from django.core.management import call_command

    from django_redlock.checks import Codes, check_nodes

    limited = RedisServer(extra_args=INFO_SERVER_ONLY).start()
    try:
        node = f"redis://locker:{ACL_PASSWORD}@127.0.0.1:{limited.port}/0"
        settings.REDLOCK_NODES = [*servers.urls[:4], node]
        warned = [m for m in check_nodes() if m.id == Codes.NO_REPLICATION]
        assert len(warned) == 1 and "+info" in warned[0].hint
        out = StringIO()
        call_command("redlock", "status", stdout=out)
        assert "INFO replication is denied" in out.getvalue()
        manager = LockManager([node], ttl=0.5, max_ttl=0.5, restart_window=0.5, retry_count=0)  # it alone votes
        try:
            eventually(lambda: _try(manager, "probe"), 5).release()  # INFO server is enough to vote
            manager.acquire("again", blocking=False).release()
            # The status judges it as the engine does (its uptime read afresh, so maybe a second later).
            status = eventually(lambda: next((s for s in manager.node_status() if s.votes), None), 3,
                                show=manager.node_status)
            assert status.uptime is not None and status.warning == NO_REPLICATION
        finally:
            manager.close()
        assert sum("INFO replication is denied" in r.getMessage() for r in caplog.records) == 1
    finally:
        limited.stop()
