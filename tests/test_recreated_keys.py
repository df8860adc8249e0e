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
    nodes[2].restart()  # empty: it forgot the key
    assert value_on(nodes[2], "heal") is None
    # While it sits out, the extensions hold on the other two and give it nothing.
    extended_twice(lock)
    assert value_on(nodes[2], "heal") is None and hooks.nodes == []
    # Once it may vote again, the next extension puts the key back there.
    eventually(lambda: value_on(nodes[2], "heal") == ours, seconds=WINDOW + 1 + 3 * TTL)
    assert hooks.nodes and set(hooks.nodes) == {mgr.node_list[2].name}
    # A second failure: two of three nodes still hold it, and the lock stays held.
    nodes[0].kill()
    extended_twice(lock)
    extended_twice(lock)
    assert not lock.lost, lock.lost_reason
    assert lock.locked() and lock.owned()
    assert [value_on(s, "heal") for s in nodes[1:]] == [ours, ours]
    with pytest.raises(LockNotAcquired):
        engine.manager([s.url for s in nodes], restart_window=0).acquire("heal", blocking=False)
    lock.release()
    assert [value_on(s, "heal") for s in nodes[1:]] == [None, None]


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
