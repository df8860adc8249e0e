"""The delayed-restart rule, enforced in code.

A node restarted without fsync-every-write persistence may have forgotten
locks that are still valid. Until its uptime passes the longest ttl in use,
it must not vote. These tests restart a real node empty under a held lock.
"""

from __future__ import annotations

import time

import pytest

from django_redlock.core import AsyncLockManager, LockManager
from django_redlock.core.ledger import sure_uptime
from django_redlock.exceptions import LockNotAcquired

TTL = 1.0


def wait_until_old(manager, seconds):
    """Let every node's sure uptime (INFO's whole seconds less one) pass ``seconds``, and the window of
    any failover this process noticed end (a restart soon after an earlier test's last reply from
    that node may have been taken for one: it sits out ``manager``'s window from when it was noticed)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        statuses = manager.node_status()
        uptimes = [sure_uptime(s.uptime) for s in statuses if s.reachable and s.uptime is not None]
        failed_over = [s for s in statuses if "another server answers" in (s.not_voting_reason or "")]
        if uptimes and min(uptimes) > seconds and not failed_over:
            return
        time.sleep(0.1)
    raise AssertionError("nodes never got old enough")


def wait_reachable(manager):
    """Wait out the engine's short reconnect cool-off after nodes came back."""
    deadline = time.monotonic() + 5
    while None in manager.ping().values():
        assert time.monotonic() < deadline, "nodes did not come back"
        time.sleep(0.05)


def hold_on_three(manager, servers):
    """Acquire while nodes 3 and 4 are down, so the lock lives on nodes 0, 1, 2 only.

    Nodes 3 and 4 then come back empty; with node 2 restarted too, a majority
    of the nodes has no trace of a lock that is still valid.
    """
    servers[3].kill()
    servers[4].kill()
    lock = manager.acquire("guarded")
    servers[3].start()
    servers[4].start()
    return lock


def test_restarted_node_sits_out_until_the_window_passes(servers, caplog):
    guarded = LockManager(servers.urls, ttl=TTL, max_ttl=TTL, retry_count=0)  # window = max_ttl (+ drift)
    wait_until_old(guarded, TTL + 0.2)
    lock = hold_on_three(guarded, servers)
    servers[2].restart()  # loses the key of a lock that is still valid
    wait_reachable(guarded)
    with pytest.raises(LockNotAcquired) as info:
        guarded.acquire("guarded", blocking=False)
    assert lock.locked(), "the first lock is still valid: nobody else may hold it"
    reasons = [info.value.failures[guarded.nodes[i]] for i in (2, 3, 4)]
    sitting_out = [r for r in reasons if "delayed-restart rule" in r and "sits out" in r]
    # Once the outcome is certain the rest is not awaited; node_status() below shows all three.
    assert sitting_out and all(r in sitting_out or r.startswith("not awaited") for r in reasons), reasons
    status = guarded.node_status()
    assert [s.sits_out_for > 0 for s in status] == [False, False, True, True, True]
    logged = [r.getMessage() for r in caplog.records if "delayed-restart rule" in r.getMessage()]
    assert len(logged) == 3 and all(r.levelname == "WARNING" for r in caplog.records if "delayed" in r.getMessage())
    with pytest.raises(LockNotAcquired):
        guarded.acquire("guarded", blocking=False)
    assert len([r for r in caplog.records if "delayed-restart rule" in r.getMessage()]) == 3  # once per restart
    # Once the window has passed (and the first lock has expired) node 2 votes again.
    wait_until_old(guarded, TTL + 0.02)
    assert not lock.locked()
    second = guarded.acquire("guarded", blocking=False)
    assert second.locked()
    second.release()
    guarded.close()


def test_without_the_guard_the_same_restart_breaks_exclusion(servers):
    """The known-unsafe case, shown on purpose: why the rule above exists."""
    guarded = LockManager(servers.urls, ttl=TTL, max_ttl=TTL, retry_count=0)
    wait_until_old(guarded, TTL + 0.2)
    unguarded = LockManager(servers.urls, ttl=TTL, retry_count=0, restart_window=0)
    first = hold_on_three(guarded, servers)
    servers[2].restart()
    wait_reachable(unguarded)
    second = unguarded.acquire("guarded", blocking=False)
    assert first.locked() and second.locked(), "two holders at once: the unsafe case"
    second.release()
    guarded.close()
    unguarded.close()


def test_nodes_declared_durable_vote_at_once(tmp_path):
    from django_redlock.testing import RedisServers

    durable = ["--appendonly", "yes", "--appendfsync", "always"]
    with RedisServers(3, extra_args=durable) as fresh:
        mgr = LockManager([{"URL": url, "FSYNC_ALWAYS": True} for url in fresh.urls], ttl=30, retry_count=0)
        mgr.acquire("fresh-but-durable").release()  # uptime ~0 s, but every write is fsynced
        assert all(s.sits_out_for == 0 for s in mgr.node_status())
        mgr.close()
        # What a node says of itself now does not waive the window: only the declaration does.
        undeclared = LockManager(fresh.urls, ttl=30, retry_count=0)
        with pytest.raises(LockNotAcquired, match="not declared FSYNC_ALWAYS"):
            undeclared.acquire("fresh-and-undeclared")
        assert all(s.sits_out_for > 0 and s.persistence["appendfsync"] == "always" for s in undeclared.node_status())
        undeclared.close()
    with RedisServers(3) as fresh:
        mgr = LockManager(fresh.urls, ttl=30, retry_count=0)
        with pytest.raises(LockNotAcquired, match="delayed-restart rule"):
            mgr.acquire("fresh-and-volatile")
        mgr.close()


async def test_async_manager_applies_the_same_rule(servers):
    amgr = AsyncLockManager(servers.urls, ttl=TTL, max_ttl=TTL, retry_count=0)
    sync = LockManager(servers.urls, ttl=TTL, max_ttl=TTL, retry_count=0)
    wait_until_old(sync, TTL + 0.2)
    lock = hold_on_three(sync, servers)
    servers[2].restart()
    wait_reachable(sync)
    with pytest.raises(LockNotAcquired, match="delayed-restart rule"):
        await amgr.acquire("guarded", blocking=False)
    assert lock.locked()
    await amgr.aclose()
    sync.close()
