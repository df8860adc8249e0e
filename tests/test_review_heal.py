"""Adversarial review of re-creating extensions, on real redis-server processes: a re-creating EXTEND
delivered late must not set the key again after the holder's own release (a ghost key for a ttl)."""

from __future__ import annotations

import time

import redis

from tests.conftest import eventually
from tests.proxy import Proxy
from tests.test_restart_window import raw

TTL = 5.0


def test_a_late_recreating_extension_leaves_no_key_after_release(engine, servers):
    """C lost the key; the extension that re-creates it there is stuck in the network while a quorum
    (A, B) extends; the holder releases; then C finally runs the EXTEND. No key may be left on C."""
    a, b, c = servers[0], servers[1], servers[2]
    with Proxy(c.port) as pc:
        mgr = engine.manager([a.url, b.url, pc.url], ttl=TTL, max_ttl=TTL, retry_count=0, restart_window=0)
        lock = mgr.acquire("ghost")
        key = mgr.key("ghost")
        raw(c).delete(key)  # C lost the key (as after an expiry while it was stopped)
        pc.hold_requests()
        lock.extend()  # A and B extend: a quorum; C's re-creating EXTEND waits in the network
        pc.wait_held(lambda held: b"EXTEND" in held.upper() or len(held) > 0)
        pc.pass_requests()  # new connections get through; the stuck one stays stuck
        lock.release()
        assert [raw(s).get(key) for s in (a, b)] == [None, None]
        pc.flush_requests()  # the late EXTEND reaches C now
        time.sleep(0.3)
        mgr.acquire("unrelated").release()  # the manager's next call reads what came late
        eventually(lambda: raw(c).get(key) is None, seconds=2.0)


def test_a_recreating_extension_on_a_given_up_connection_leaves_no_key(engine, servers):
    """As above, but the stuck connection is given up (past the stale limit) before the release: the
    release goes on a new connection and runs first; the old EXTEND lands after it."""
    a, b, c = servers[0], servers[1], servers[2]
    with Proxy(c.port) as pc:
        mgr = engine.manager([a.url, b.url, pc.url], ttl=TTL, max_ttl=TTL, retry_count=0, restart_window=0)
        lock = mgr.acquire("ghost2")
        key = mgr.key("ghost2")
        raw(c).delete(key)
        pc.hold_requests()
        lock.extend()
        time.sleep(1.5)  # longer than the stale limit: the engine gives up on the stuck connection
        mgr.acquire("unrelated0").release()
        pc.pass_requests()
        lock.release()
        assert [raw(s).get(key) for s in (a, b, c)] == [None, None, None]
        pc.flush_requests()
        time.sleep(0.3)
        mgr.acquire("unrelated").release()
        eventually(lambda: raw(c).get(key) is None, seconds=2.0)


def test_a_flushed_node_sits_out_before_its_key_is_set_again(engine, servers):
    """FLUSHALL replaces C's data set: C sits out for the restart window like a restarted node; the
    keep-alive must not set the key again there before the window has passed."""
    from tests.test_recreated_keys import old_nodes

    window = 6.0
    nodes = servers[:3]
    mgr = engine.manager(old_nodes(nodes, window), ttl=1.0, max_ttl=1.0, restart_window=window)
    lock = mgr.acquire("flushed", auto_extend=True)
    key = mgr.key("flushed")
    raw(nodes[2]).flushall()
    flushed_at = time.monotonic()
    seen = []
    while time.monotonic() - flushed_at < window - 1.0:
        seen.append(raw(nodes[2]).get(key))
        time.sleep(0.1)
    assert not lock.lost, lock.lost_reason
    lock.release()
    assert set(seen) == {None}, f"set again {seen.index(lock.value.encode())/10:.1f} s after FLUSHALL"


def test_a_late_extension_does_not_resurrect_an_expired_lock(engine, servers):
    """The holder stalls past its validity; another process takes the lock and releases it; then the
    stalled holder extends: it must learn the lock was lost, and leave no key behind."""
    from django_redlock.exceptions import LockError, LockLost

    nodes = servers[:3]
    urls = [s.url for s in nodes]
    mgr = engine.manager(urls, ttl=1.0, max_ttl=1.0, retry_count=0, restart_window=0)
    other = engine.manager(urls, ttl=1.0, max_ttl=1.0, retry_count=0, restart_window=0)
    lock = mgr.acquire("stalled")
    token = lock.fencing_token
    key = mgr.key("stalled")
    eventually(lambda: all(raw(s).get(key) is None for s in nodes), seconds=3.0)  # expired everywhere
    second = other.acquire("stalled")
    assert second.fencing_token > token
    second.release()
    try:
        lock.extend()
    except (LockError, LockLost):
        pass
    else:
        raise AssertionError("an extension after another holder's turn held the lock again")
    mgr.acquire("unrelated").release()
    eventually(lambda: all(raw(s).get(key) is None for s in nodes), seconds=2.0)


def test_a_majority_stopped_past_the_ttl_loses_the_lock_and_leaves_nothing(engine, servers):
    """B and C are SIGSTOPped longer than the ttl while the keep-alive runs: on SIGCONT they drop the
    key. The lock is lost (only A kept it); no extension may set it again on B and C, and another
    process gets the lock once A's key is gone."""
    nodes = servers[:3]
    urls = [s.url for s in nodes]
    mgr = engine.manager(urls, ttl=1.0, max_ttl=1.0, restart_window=0)
    other = engine.manager(urls, ttl=1.0, max_ttl=1.0, retry_count=0, restart_window=0)
    lock = mgr.acquire("majority", auto_extend=True)
    key = mgr.key("majority")
    for s in nodes[1:]:
        s.pause()
    try:
        eventually(lambda: lock.lost, seconds=4.0)
        time.sleep(1.2)  # past the ttl on B and C too
    finally:
        for s in nodes[1:]:
            s.resume()
    time.sleep(1.5)  # whatever the keep-alive had in flight has landed
    assert [raw(s).get(key) for s in nodes[1:]] == [None, None]
    got = other.acquire("majority")
    got.release()
