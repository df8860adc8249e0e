"""A Sentinel-managed master as one node, on real ``redis-server --sentinel`` processes.

The node asks its Sentinels for the master, follows a failover, and sits out for the restart
window after a promotion (the promoted replica may lack the last locks written), for the sync
and the asyncio driver alike. Its passwords, the master's and the Sentinels' own, never show.
"""

from __future__ import annotations

import io
import logging

import pytest
import redis
from django.core.management import call_command

from django_redlock.core import LockManager, ledger
from django_redlock.core.nodes import parse_nodes
from django_redlock.exceptions import LockNotAcquired
from tests.conftest import eventually, on_nodes
from tests.proxy import Proxy
from tests.sentinels import SERVICE, SentinelGroup

MASTER_SECRET = "m4ster-s3cret-pw"
SENTINEL_SECRET = "s3ntinel-s3cret-pw"
WINDOW = 2.0


@pytest.fixture(scope="module")
def group():
    """One master, one replica, one Sentinel, with passwords; tests here do not fail it over."""
    made = SentinelGroup(1, password=MASTER_SECRET, sentinel_password=SENTINEL_SECRET).start()
    yield made
    made.stop()


@pytest.fixture
def fresh_group():
    """A group of its own, for a test that fails it over."""
    ledger._HISTORIES.by_address.clear()
    made = SentinelGroup(1, password=MASTER_SECRET, sentinel_password=SENTINEL_SECRET).start()
    yield made
    made.stop()


def _key(server, resource):
    with redis.Redis(port=server.port, password=MASTER_SECRET, socket_timeout=2) as c:
        return c.get(f"redlock:lock:{resource}")


def _try(manager, resource):
    try:
        return manager.acquire(resource, blocking=False)
    except LockNotAcquired as exc:
        return exc


def _lock(manager, resource):
    """The lock, or None when it was not acquired."""
    got = _try(manager, resource)
    return None if isinstance(got, LockNotAcquired) else got


def test_a_lock_over_a_sentinel_node(group, engine):
    manager = engine.manager([group.spec()], ttl=5.0, retry_count=0, node_timeout=0.5, restart_window=0)
    lock = manager.acquire("over-sentinel", blocking=False)
    assert _key(group.current(), "over-sentinel") is not None
    with pytest.raises(LockNotAcquired):
        manager.acquire("over-sentinel", blocking=False)
    lock.release()
    assert _key(group.current(), "over-sentinel") is None
    (status,) = manager.node_status()
    assert status.name == f"sentinel:127.0.0.1:{group.sentinel_ports[0]}/{SERVICE}/0"
    assert (status.host, status.port, status.role) == ("127.0.0.1", group.current().port, "master")


def test_after_a_failover_the_node_follows_the_new_master_and_sits_out(fresh_group, engine):
    manager = engine.manager(
        [fresh_group.spec()], ttl=WINDOW, max_ttl=WINDOW, restart_window=WINDOW, retry_count=0, node_timeout=0.5
    )
    old = fresh_group.current()
    # Sentinel took this server for the master moments ago (it just started): the node waits too.
    eventually(lambda: _lock(manager, "warm-up"), WINDOW + 3).release()
    new = fresh_group.failover()

    def refused_on_the_new_master():
        failure = _try(manager, "after-failover")
        if isinstance(failure, LockNotAcquired):
            return failure
        failure.release()  # on the old master, before the node asked the Sentinel again
        return None

    refused = eventually(refused_on_the_new_master, 5)
    (reason,) = refused.failures.values()
    assert ledger.DELAYED_RESTART in reason, reason
    (status,) = manager.node_status()
    assert status.port == new.port and not status.votes and status.sits_out_for > 0
    lock = eventually(lambda: _lock(manager, "after-failover"), WINDOW + 3)
    assert _key(new, "after-failover") is not None and _key(old, "after-failover") is None
    lock.release()


def test_a_process_started_after_the_promotion_sits_out_too(fresh_group):
    """Nothing of the old master is known here: Sentinel says how long ago it promoted this one.
    The new master itself has been up (as a replica) for longer than the window."""
    new = next(s for s in fresh_group.servers if s is not fresh_group.current())
    eventually(lambda: _uptime(new) > WINDOW + 1, WINDOW + 5)
    fresh_group.failover()
    ledger._HISTORIES.by_address.clear()  # as a new process
    manager = LockManager(
        [fresh_group.spec()], ttl=WINDOW, max_ttl=WINDOW, restart_window=WINDOW, retry_count=0, node_timeout=0.5
    )
    try:
        failure = _try(manager, "fresh")
        assert isinstance(failure, LockNotAcquired)
        (reason,) = failure.failures.values()
        assert ledger.DELAYED_RESTART in reason, reason
        eventually(lambda: _lock(manager, "fresh"), WINDOW + 3).release()
    finally:
        manager.close()


def _uptime(server):
    with redis.Redis(port=server.port, password=MASTER_SECRET, socket_timeout=2) as c:
        return c.info("server")["uptime_in_seconds"]


def test_three_nodes_one_a_sentinel_group_keep_working_across_its_failover(servers, engine):
    ledger._HISTORIES.by_address.clear()
    window = 3 * WINDOW  # the steps between the failover and the check of the sit-out, on a busy machine
    three = SentinelGroup(3, password=MASTER_SECRET, sentinel_password=SENTINEL_SECRET).start()
    try:
        nodes = [servers.urls[0], three.spec(), servers.urls[1]]
        manager = engine.manager(nodes, ttl=window, max_ttl=window, restart_window=window, retry_count=0,
                                 node_timeout=0.5)
        other = engine.manager(nodes, ttl=window, max_ttl=window, restart_window=window, retry_count=0,
                               node_timeout=0.5)
        eventually(lambda: all(s.votes for s in manager.node_status()), window + 3)
        manager.acquire("before", blocking=False).release()
        three.failover()
        # The Sentinel node sits out; the two others still make a quorum, and exclusion holds.
        held = manager.acquire("shared", blocking=False)
        with pytest.raises(LockNotAcquired):
            other.acquire("shared", blocking=False)
        assert held.locked()
        held.release()
        # The release ends once two nodes deleted the key; the third may be a moment behind (a
        # busy host), and refuses the next acquire until then.
        lock = eventually(lambda: _lock(other, "shared"), 2.0)
        lock.release()
        sentinel_node = other.node_status()[1]
        assert not sentinel_node.votes and ledger.DELAYED_RESTART in sentinel_node.not_voting_reason
        eventually(lambda: all(s.votes for s in manager.node_status()), window + 3)
        assert manager.acquire("after", blocking=False).release()
    finally:
        three.stop()


# -- what is shown --------------------------------------------------------------------------


SECRETS = (MASTER_SECRET, SENTINEL_SECRET, "wr0ng-s3ntinel-pw", "wr0ng-m4ster-pw")


def _clean(text):
    for secret in SECRETS:
        assert secret not in text, f"a password shows in: {text[:300]}"


def test_passwords_never_show(group, settings, caplog, admin_client):
    bad_sentinel = group.spec(SENTINEL_OPTIONS={"password": "wr0ng-s3ntinel-pw"})
    bad_master = group.spec(OPTIONS={"password": "wr0ng-m4ster-pw"})
    settings.REDLOCK_NODES = [group.spec(), bad_sentinel, bad_master]
    settings.REDLOCK = {"RESTART_WINDOW": 0}
    caplog.set_level(logging.DEBUG)
    nodes = parse_nodes(settings.REDLOCK_NODES, 0.5)
    shown = [repr(nodes), str([n.name for n in nodes])]
    manager = LockManager(settings.REDLOCK_NODES, retry_count=0, node_timeout=0.5, restart_window=0)
    try:
        failure = _try(manager, "secret")
        assert isinstance(failure, LockNotAcquired)
        statuses = manager.node_status()
        assert [s.votes for s in statuses] == [True, False, False]
        assert "no Sentinel named a master" in statuses[1].error and "authentication failed" in statuses[1].error
        assert statuses[2].error == "authentication failed", statuses[2]
        shown += [str(failure), repr(failure.failures), repr(statuses)]
    finally:
        manager.close()
    for args in (("redlock", "status"), ("redlock", "status", "--json"), ("check", "--deploy")):
        out, err = io.StringIO(), io.StringIO()
        try:
            call_command(*args, stdout=out, stderr=err)
        except BaseException as exc:  # noqa: BLE001 - a failing check or status exits: its text is what counts
            shown.append(str(exc))
        shown += [out.getvalue(), err.getvalue()]
    from django.urls import reverse

    for page in ("admin:django_redlock_lock_changelist", "admin:django_redlock_lock_detail"):
        response = admin_client.get(reverse(page), {"resource": "secret"})
        assert response.status_code == 200
        shown.append(response.content.decode())
    shown += [record.getMessage() for record in caplog.records]
    text = "\n".join(shown)
    assert text.count("authentication failed") >= 6 and f"sentinel:127.0.0.1:{group.sentinel_ports[0]}" in text
    _clean(text)


def test_bad_sentinel_options_are_refused_without_the_password():
    with pytest.raises(ValueError) as info:
        parse_nodes([{"SENTINELS": [("h", 26379)], "SERVICE": "s",
                      "SENTINEL_OPTIONS": {"password": SENTINEL_SECRET, "pasword": SENTINEL_SECRET}}], 0.05)
    assert "nodes[0]: invalid 'SENTINEL_OPTIONS'" in str(info.value)
    _clean(str(info.value))


# -- system checks ----------------------------------------------------------------------------


def _ids(errors):
    return sorted(e.id for e in errors)


def test_the_checks_count_a_sentinel_group_as_one_master(group, settings, servers):
    from django_redlock import checks

    settings.REDLOCK_NODES = [group.spec(), servers.urls[0], servers.urls[1]]
    assert _ids(checks.check_settings()) == []
    # The same group twice (another Sentinel listed first) is one master listed twice.
    again = group.spec(SENTINELS=[("127.0.0.2", 26379), *group.addresses])
    settings.REDLOCK_NODES = [group.spec(), again, servers.urls[0]]
    found = checks.check_settings()
    assert _ids(found) == [checks.Codes.FEW_MASTERS, checks.Codes.SAME_SERVER]
    assert f"sentinel:{SERVICE}@127.0.0.1:{group.sentinel_ports[0]}" in found[1].msg


def test_check_deploy_on_a_sentinel_node(group, settings, servers):
    """The master behind the node is asked as any node is (one server under two entries shows);
    one that takes writes with no replica in reach is named."""
    from django_redlock import checks

    master = group.current()
    url = f"redis://:{MASTER_SECRET}@127.0.0.1:{master.port}/0"
    settings.REDLOCK_NODES = [group.spec(), url, servers.urls[0]]
    found = checks.check_nodes()
    assert checks.Codes.SAME_RUN_ID in _ids(found)
    (writes,) = [e for e in found if e.id == checks.Codes.SENTINEL_WRITES]
    assert "min-replicas-to-write 0" in writes.msg and writes.msg.startswith("Redlock node sentinel:")
    _clean(" ".join(e.msg + (e.hint or "") for e in found))
    with redis.Redis(port=master.port, password=MASTER_SECRET, socket_timeout=2) as c:
        c.config_set("min-replicas-to-write", 1)
        try:
            settings.REDLOCK_NODES = [group.spec(), servers.urls[0], servers.urls[1]]
            assert checks.Codes.SENTINEL_WRITES not in _ids(checks.check_nodes())
        finally:
            c.config_set("min-replicas-to-write", 0)


# -- a cache whose client is a Sentinel client ------------------------------------------------


def _sentinel_caches(group):
    options = {
        "SENTINELS": group.addresses,
        "SENTINEL_KWARGS": {"password": SENTINEL_SECRET},
        "PASSWORD": MASTER_SECRET,
    }
    return {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "redis": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://{SERVICE}/0",
            "OPTIONS": {
                **options,
                "CLIENT_CLASS": "django_redis.client.SentinelClient",
                "CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
            },
        },
        "valkey": {
            "BACKEND": "django_valkey.cache.ValkeyCache",
            "LOCATION": f"valkey://{SERVICE}/0",
            "OPTIONS": {
                **options,
                "CLIENT_CLASS": "django_valkey.client.SentinelClient",
                "CONNECTION_FACTORY": "django_valkey.pool.SentinelConnectionFactory",
            },
        },
    }


@pytest.mark.parametrize("alias", ["redis", "valkey"])
def test_a_cache_whose_client_is_a_sentinel_client(group, settings, alias):
    if alias == "valkey":
        pytest.importorskip("django_valkey.cache", exc_type=ImportError)
    from django_redlock import conf

    settings.CACHES = _sentinel_caches(group)
    settings.REDLOCK_NODES = [f"cache:{alias}"]
    (spec,) = conf.get_nodes()
    (node,) = parse_nodes([spec], 0.5)
    assert node.sentinel is not None and node.sentinel.service == SERVICE
    assert node.sentinel.sentinels == group.addresses
    manager = LockManager([node], ttl=5.0, retry_count=0, node_timeout=0.5, restart_window=0)
    try:
        lock = manager.acquire(f"via-{alias}", blocking=False)
        assert _key(group.current(), f"via-{alias}") is not None
        lock.release()
        _clean(repr(node) + repr(manager.node_status()))
    finally:
        manager.close()


def test_a_cache_of_the_replicas_is_refused(group, settings):
    from django_redlock import conf

    caches = _sentinel_caches(group)
    caches["redis"]["LOCATION"] = f"redis://{SERVICE}/0?is_master=0"
    caches["redis"]["OPTIONS"]["CLIENT_CLASS"] = "django_redis.client.DefaultClient"
    settings.CACHES = caches
    settings.REDLOCK_NODES = ["cache:redis"]
    with pytest.raises(ValueError, match="is_master=1"):
        parse_nodes(conf.get_nodes(), 0.5)


# -- bad entries ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"SENTINELS": [], "SERVICE": "s"}, "got an empty list"),
        ({"SENTINELS": [("h", 26379)], "SERVICE": "s", "SENTINEL_OPTIONS": {"port": 1}}, "cannot set ['port']"),
        ({"SENTINELS": "h:26379", "SERVICE": "s"}, "'SENTINELS' must be a list of (host, port) pairs"),
        ({"SENTINELS": [("h", "26379")], "SERVICE": "s"}, "got the entry ('h', '26379')"),
        ({"SENTINELS": [("h", 26379)]}, "'SERVICE' must be the master's name"),
        ({"SENTINELS": [("h", 26379)], "SERVICE": "s", "OPTIONS": {"host": "x"}}, "cannot set ['host']"),
        ({"SENTINELS": [("h", 26379)], "SERVICE": "s", "URL": "redis://x"}, "unknown key 'URL' in a Sentinel node"),
        ({"SENTINELS": [("h", 26379)], "SERVICE": "s", "FSYNC_ALWAYS": "yes"}, "'FSYNC_ALWAYS' must be True or False"),
        ({"SENTINELS": [("h", 26379)], "SERVICE": "s", "OPTIONS": {"nope": 1}}, "invalid connection options"),
    ],
)
def test_a_bad_sentinel_entry_names_what_is_wrong(spec, message):
    with pytest.raises(ValueError) as info:
        parse_nodes([spec], 0.05, "REDLOCK_NODES")
    assert str(info.value).startswith("REDLOCK_NODES[0]: ") and message in str(info.value), str(info.value)


def test_sentinels_may_be_written_as_host_port_strings():
    (node,) = parse_nodes([{"SENTINELS": ["s1:26379", "[::1]:26380"], "SERVICE": "s", "FSYNC_ALWAYS": True}], 0.05)
    assert node.sentinel.sentinels == [("s1", 26379), ("::1", 26380)] and node.fsync_always
    assert node.name == "sentinel:s1:26379/s/0" and repr(node) == "<Node sentinel:s1:26379/s/0>"


# -- TLS to the Sentinels and to the master ---------------------------------------------------


@pytest.fixture(scope="module")
def tls_group(tmp_path_factory):
    from tests.certs import make_ca, make_server_cert

    pki = tmp_path_factory.mktemp("sentinel-pki")
    make_ca(pki)
    make_ca(pki, "other-ca")
    cert, key = make_server_cert(pki, "server", "IP:127.0.0.1,DNS:localhost")
    made = SentinelGroup(1, password=MASTER_SECRET, sentinel_password=SENTINEL_SECRET,
                         tls=(cert, key, str(pki / "ca.crt"))).start()
    made.other_ca = str(pki / "other-ca.crt")
    yield made
    made.stop()


def test_tls_to_the_sentinels_and_the_master(tls_group, engine):
    manager = engine.manager([tls_group.spec()], ttl=5.0, retry_count=0, node_timeout=0.5, restart_window=0)
    lock = manager.acquire("over-tls", blocking=False)
    lock.release()
    (status,) = manager.node_status()
    assert status.votes and status.port == tls_group.current().tls_port


@pytest.mark.parametrize("side, reason", [
    ("SENTINEL_OPTIONS", "no Sentinel named a master for 'lockmaster' (127.0.0.1:{port}: certificate not accepted"),
    ("OPTIONS", "certificate not accepted"),
])
def test_a_certificate_not_accepted_is_named(tls_group, side, reason):
    spec = tls_group.spec()
    spec[side] = {**spec[side], "ssl_ca_certs": tls_group.other_ca}
    manager = LockManager([spec], ttl=5.0, retry_count=0, node_timeout=0.5, restart_window=0)
    try:
        (status,) = manager.node_status()
    finally:
        manager.close()
    assert not status.reachable and status.error.startswith(reason.format(port=tls_group.sentinel_ports[0])), status
    _clean(repr(status))


def _client_ids(server):
    with redis.Redis(port=server.port, password=MASTER_SECRET, socket_timeout=2) as c:
        me = c.client_id()
        clients = c.client_list(_type="normal")
    return {int(client["id"]) for client in clients if not client["name"].startswith("sentinel-")} - {me}


def test_a_connection_whose_server_answered_as_a_replica_is_not_used_again(fresh_group, engine):
    """The master turned replica behind the Sentinels' back (they still name it): its vote fails
    with READONLY, and the node leaves that connection for a new one (which asks the Sentinels)."""
    manager = engine.manager([fresh_group.spec()], ttl=5.0, retry_count=0, node_timeout=0.5, restart_window=0)
    manager.acquire("before", blocking=False).release()
    master, replica = fresh_group.current(), fresh_group.replica
    used = _client_ids(master)
    assert used
    with redis.Redis(port=replica.port, password=MASTER_SECRET, socket_timeout=2) as c:
        c.execute_command("REPLICAOF", "NO", "ONE")
    with redis.Redis(port=master.port, password=MASTER_SECRET, socket_timeout=2) as c:
        c.execute_command("REPLICAOF", "127.0.0.1", str(replica.port))
    failure = _try(manager, "readonly")
    assert isinstance(failure, LockNotAcquired) and "READONLY" in str(failure), str(failure)
    assert _try(manager, "readonly-again") is not None
    assert not used & _client_ids(master), "the connection that met READONLY was used again"


# -- the lock a promoted replica never received -------------------------------------------------

LOST_WINDOW = 8.0


def test_a_lock_the_promoted_replica_never_received_is_not_granted_again(servers, engine):
    """Replication falls behind: a lock reaches the master only, the master dies, the Sentinel
    promotes the replica. Without the sit-out, a second client would get the promoted replica's
    vote and a node's that the first lock missed: two holders."""
    ledger._HISTORIES.by_address.clear()
    group = SentinelGroup(1, password=MASTER_SECRET, stream=True).start()
    path = Proxy(servers[1].port).start()  # the first client's way to node 2, cut before it locks
    options = {"ttl": LOST_WINDOW, "max_ttl": LOST_WINDOW, "restart_window": LOST_WINDOW, "retry_count": 0,
               "node_timeout": 0.3}
    first = LockManager([servers.urls[0], group.spec(), path.url], **options)
    second = engine.manager([servers.urls[0], group.spec(), servers.urls[1]], **options)
    try:
        eventually(lambda: all(s.votes for s in first.node_status() + second.node_status()), LOST_WINDOW + 3)
        second.acquire("warm-up", blocking=False).release()
        group.stream.hold_replies()  # the master's writes stop reaching the replica
        path.close()
        lock = first.acquire("lost", blocking=False)  # node 0 and the Sentinel group's master
        assert on_nodes([servers[1]], "get", "lost") == [None]
        group.current().kill()
        new = group.replica
        group.wait_until(lambda: group.master_port() == group.port_of(new), "the replica is promoted", 20)
        assert _key(new, "lost") is None, "the lock reached the replica: nothing to lose"
        for _ in range(2):  # the first vote may go on a connection the old master's death broke
            refused = _try(second, "lost")
            assert isinstance(refused, LockNotAcquired), "two holders"
            assert lock.locked(), "the first lock is still valid: nobody else may hold it"
            if ledger.DELAYED_RESTART in refused.failures[second.nodes[1]]:
                break
        assert ledger.DELAYED_RESTART in refused.failures[second.nodes[1]]
        eventually(lambda: not lock.locked(), LOST_WINDOW + 1)
        eventually(lambda: _lock(second, "lost"), LOST_WINDOW + 3).release()
    finally:
        first.close()
        path.close()
        group.stop()
