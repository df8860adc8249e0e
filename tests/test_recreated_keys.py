"""A kept-alive lock regains a node that lost its key: the extension re-creates it there (SET NX, the
same value, the new ttl) once the node may vote again, never over another holder, never on a node that
still sits out.

Real redis-server processes (no persistence): a restart forgets every key. Three of the suite's nodes
hold the lock; both engines run each scenario.
"""

from __future__ import annotations

import pytest
import redis

from django_redlock.core import Hooks, LockManager
from django_redlock.exceptions import LockNotAcquired
from tests.conftest import eventually
from tests.test_restart_guard import wait_until_old

TTL = 2.0
#: The shortest restart window a ttl of TTL allows: a restarted node sits out this long (plus the
#: second INFO's whole-second uptime may be ahead).
WINDOW = TTL


class Recreations(Hooks):
    """Records the nodes each extension re-created a key on."""

    def __init__(self) -> None:
        self.nodes: list[str] = []

    def recreated(self, lock, nodes):
        self.nodes.extend(nodes)


def value_on(server, resource):
    with redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=2) as client:
        return client.get(f"redlock:lock:{resource}")


def old_nodes(nodes, window):
    """The nodes' urls, once every one of them has been up for longer than ``window`` (they vote)."""
    urls = [s.url for s in nodes]
    with LockManager(urls, ttl=1.0, max_ttl=1.0, restart_window=window) as looker:
        wait_until_old(looker, window)
    return urls


def extended_twice(lock):
    """Waits until the keep-alive has extended ``lock`` twice more (each extension is counted)."""
    seen = lock.extensions
    eventually(lambda: lock.extensions >= seen + 2 or lock.lost, seconds=4 * TTL)


def test_a_kept_alive_lock_regains_a_restarted_node_and_survives_the_next_failure(servers, engine):
    nodes = servers[:3]
    hooks = Recreations()
    mgr = engine.manager(old_nodes(nodes, WINDOW), ttl=TTL, max_ttl=TTL, restart_window=WINDOW, hooks=hooks)
    lock = mgr.acquire("heal", auto_extend=True)
    ours = lock.value.encode()
    token = lock.fencing_token
    nodes[2].restart()  # empty: it forgot the key (and the fencing counter)
    assert value_on(nodes[2], "heal") is None
    # While it sits out, the extensions hold on the other two and give it nothing.
    extended_twice(lock)
    assert value_on(nodes[2], "heal") is None and hooks.nodes == []
    # Once it may vote again, the next extension puts the key back there.
    eventually(lambda: value_on(nodes[2], "heal") == ours, seconds=WINDOW + 1 + 3 * TTL)
    # Counted where the round read the reply (it ends once a quorum answered): never another node.
    assert set(hooks.nodes) <= {mgr.node_list[2].name}
    # A second failure: two of three nodes still hold it, and the lock stays held.
    nodes[0].kill()
    extended_twice(lock)
    extended_twice(lock)
    assert not lock.lost, lock.lost_reason
    assert lock.locked() and lock.owned()
    assert [value_on(s, "heal") for s in nodes[1:]] == [ours, ours]
    with pytest.raises(LockNotAcquired):
        engine.manager([s.url for s in nodes], restart_window=0).acquire("heal", blocking=False)
    # A key set again is the same lock: its token stands, and the next holder's is higher.
    assert lock.fencing_token == token
    lock.release()
    assert [value_on(s, "heal") for s in nodes[1:]] == [None, None]
    second = mgr.acquire("heal")
    assert second.fencing_token > token
    second.release()


def test_a_key_expired_while_its_node_was_paused_comes_back(servers, engine):
    """The node did not restart (it votes at once): only its key is gone."""
    nodes = servers[:3]
    mgr = engine.manager(old_nodes(nodes, WINDOW), ttl=TTL, max_ttl=TTL, restart_window=WINDOW)
    lock = mgr.acquire("paused", auto_extend=True)
    ours = lock.value.encode()
    with redis.Redis(host="127.0.0.1", port=nodes[1].port) as client:
        client.delete("redlock:lock:paused")  # as if it had expired while the server was stopped
    eventually(lambda: value_on(nodes[1], "paused") == ours, seconds=2 * TTL)
    nodes[2].kill()
    extended_twice(lock)
    assert not lock.lost and lock.owned()
    lock.release()


def test_a_key_that_expired_while_its_node_was_stopped_comes_back(servers, engine):
    """SIGSTOP longer than the ttl: on SIGCONT the node drops the key; the node never restarted, so it
    votes at once and the next extension puts the key back."""
    nodes = servers[:3]
    mgr = engine.manager(old_nodes(nodes, WINDOW), ttl=TTL, max_ttl=TTL, restart_window=WINDOW)
    lock = mgr.acquire("stopped", auto_extend=True)
    ours = lock.value.encode()
    with nodes[1].paused_for_block():
        extended_twice(lock)
        extended_twice(lock)  # more than a ttl: the key there has expired
    eventually(lambda: value_on(nodes[1], "stopped") == ours, seconds=3 * TTL)
    nodes[2].kill()
    extended_twice(lock)
    assert not lock.lost and lock.owned()
    lock.release()


def test_a_key_another_holder_took_is_never_overwritten(servers, engine):
    nodes = servers[:3]
    mgr = engine.manager([s.url for s in nodes], ttl=TTL, max_ttl=TTL, restart_window=0)
    lock = mgr.acquire("taken", auto_extend=True)
    with redis.Redis(host="127.0.0.1", port=nodes[2].port) as client:
        client.set("redlock:lock:taken", "someone-else", px=60_000)
    extended_twice(lock)
    assert value_on(nodes[2], "taken") == b"someone-else"
    assert not lock.lost
    lock.release()


def test_a_node_still_sitting_out_is_not_given_the_key(servers, engine):
    """The restart window is long: for the whole test the restarted node sits out, and gets nothing (the
    other two are declared FSYNC_ALWAYS: they vote however young)."""
    nodes = servers[:3]
    urls = [nodes[0].url, *({"URL": s.url, "FSYNC_ALWAYS": True} for s in nodes[1:])]
    mgr = engine.manager(urls, ttl=1.0, max_ttl=1.0, restart_window=60)
    lock = mgr.acquire("sitting", auto_extend=True)
    nodes[0].restart()
    for _ in range(3):
        extended_twice(lock)
    assert value_on(nodes[0], "sitting") is None
    assert not lock.lost
    lock.release()


def test_a_lock_force_released_on_every_node_is_not_brought_back(servers, engine):
    """Gone from a majority: the lock was released behind the holder's back; the keep-alive reports it
    lost and leaves no key behind (what an extension set again is released)."""
    nodes = servers[:3]
    mgr = engine.manager([s.url for s in nodes], ttl=TTL, max_ttl=TTL, restart_window=0)
    lock = mgr.acquire("forced", auto_extend=True)
    assert mgr.force_release("forced") == 3
    eventually(lambda: lock.lost, seconds=2 * TTL)
    assert "no longer store" in lock.lost_reason
    eventually(lambda: [value_on(s, "forced") for s in nodes] == [None] * 3, seconds=TTL)
    other = engine.manager([s.url for s in nodes], restart_window=0).acquire("forced", blocking=False)
    other.release()


def test_the_extension_script_on_a_real_server(servers):
    """EXTEND on one node: all or nothing over its keys, never over another holder, behind the data-set
    check when it re-creates."""
    from django_redlock.core.base import ManagerConfig, extend_command
    from django_redlock.core.scripts import EXTEND

    config = ManagerConfig()
    a, b = config.key("a"), config.key("b")
    client = redis.Redis(host="127.0.0.1", port=servers[0].port, socket_timeout=2)

    def extend(recreate, token=""):
        command = extend_command((a, b), "v", 5.0, config.dataset_key, recreate)
        return client.execute_command("EVAL", EXTEND.source, *command[2:-1], token)

    client.set(a, "v", px=1000)
    assert extend(False) == 0 and client.exists(b) == 0  # b missing, not to be re-created
    assert 0 < client.pttl(a) <= 1000
    assert extend(True) == 2  # b re-created, a extended
    assert client.mget(a, b) == [b"v", b"v"] and client.pttl(a) > 4000 and client.pttl(b) > 4000
    assert extend(True) == 1
    client.delete(b)
    client.set(a, "other", px=60_000)
    assert extend(True) == 0 and client.exists(b) == 0  # a is another holder's: nothing changes
    client.set(a, "v", px=1000)
    client.set(config.dataset_key, "token-1")
    with pytest.raises(redis.ResponseError, match="DATASET token-1"):  # another data set than the one known
        extend(True, "token-0")
    assert client.exists(b) == 0 and client.pttl(a) <= 1000
    assert extend(True, "token-1") == 2
    client.close()


def test_recreated_keys_are_counted_by_the_metrics(servers):
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from prometheus_client import CollectorRegistry

    from django_redlock.core.config import CombinedHooks
    from django_redlock.metrics import OpenTelemetryHooks, PrometheusHooks

    registry, reader = CollectorRegistry(), InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    hooks = CombinedHooks(PrometheusHooks(registry), OpenTelemetryHooks(meter_provider=provider))
    nodes = servers[:3]
    with LockManager([s.url for s in nodes], ttl=TTL, max_ttl=TTL, restart_window=0, hooks=hooks) as mgr:
        lock = mgr.acquire("counted", auto_extend=True)
        nodes[2].kill()  # every extension now waits for node 1's reply: a quorum needs it
        with redis.Redis(host="127.0.0.1", port=nodes[1].port) as client:
            client.delete("redlock:lock:counted")
        names = mgr.nodes
        sample = registry.get_sample_value
        # Counted once the watchdog has judged the extension's replies: the key is back on node 1
        # before that (a release in between makes those replies mean nothing, and counts nothing).
        eventually(lambda: sample("django_redlock_keys_recreated_total", {"node": names[1]}) == 1, seconds=2 * TTL)
        assert value_on(nodes[1], "counted") is not None
        lock.release()
    assert sample("django_redlock_keys_recreated_total", {"node": names[0]}) is None
    points = [
        p
        for r in reader.get_metrics_data().resource_metrics
        for s in r.scope_metrics
        for m in s.metrics
        if m.name == "redlock.keys.recreated"
        for p in m.data.data_points
    ]
    assert [(dict(p.attributes), p.value) for p in points] == [({"redlock.node": names[1]}, 1)]
    provider.shutdown()
