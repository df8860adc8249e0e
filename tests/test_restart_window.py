"""The delayed-restart rule at its edges (sync engine): a probe read late or answered with an error, uptimes
in whole seconds, nodes that deny INFO, and a window that covers the longest ttl of any client.

Every test runs against real ``redis-server`` processes started by the suite;
where a scenario needs late delivery on the network, a small TCP proxy
(:mod:`tests.proxy`) sits between the engine and a real node. The tests drive
the public API only (LockManager, Lock, the exceptions, django_redlock.testing).
"""

from __future__ import annotations

import inspect
import threading
import time

import pytest
import redis

from django_redlock.core import LockManager
from django_redlock.exceptions import LockNotAcquired
from django_redlock.testing import RedisServers
from tests.test_restart_guard import hold_on_three, wait_reachable, wait_until_old


def manager(nodes, cls=LockManager, **kwargs):
    """Build a manager; ``max_ttl`` is passed only where the manager knows it (so the scenarios also run on
    engines without it, where the restart window is the longest ttl the process used)."""
    if "max_ttl" not in inspect.signature(cls.__init__).parameters:
        kwargs.pop("max_ttl", None)
    return cls(nodes, **kwargs)


def raw(server):
    """A plain redis-py client straight to the server (no proxy), for setting the stage."""
    return redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=5)


def assert_not_acquired(mgr, resource, first, **kwargs):
    """``mgr`` must not get ``resource`` while ``first`` (another holder) is still valid."""
    try:
        second = mgr.acquire(resource, blocking=False, **kwargs)
    except LockNotAcquired as exc:
        return exc
    both = first.locked() and second.locked()
    seen = f"{first!r} and {second!r}"
    second.release()
    assert not both, f"two holders of {resource!r} at once: {seen}"
    pytest.fail(f"{resource!r} was acquired although {first!r} was still held (it expired meanwhile: too slow)")


def acquire_soon(mgr, resource, within, **kwargs):
    """Acquire ``resource`` with retries for at most ``within`` seconds; fail with the last error."""
    try:
        return mgr.acquire(resource, timeout=within, **kwargs)
    except LockNotAcquired as exc:
        pytest.fail(f"{resource!r} still locked {within} s later, with no holder left: {exc}")


def hold_on_abc(holder, servers, resource):
    """Acquire ``resource`` on nodes 0, 1, 2 only; nodes 3 and 4 (never restarted) refuse, then forget.

    A foreign value on nodes 3 and 4 makes them refuse; it is deleted once the
    lock is held, so those two old nodes will later grant the resource to anyone.
    """
    key = holder.key(resource)
    for server in servers[3:5]:
        raw(server).set(key, "someone-else", px=10_000)
    lock = holder.acquire(resource, timeout=1.0)  # retried if a connection closed by a restart is met
    for server in servers[3:5]:
        raw(server).delete(key)
    return lock


# -- the delayed-restart rule must not depend on reading the probe in time ---------------------


def test_restarted_node_whose_first_replies_come_late_does_not_vote(servers):
    """C restarts empty and is slow exactly when client 2 first talks to it."""
    first = manager(servers.urls, ttl=2, max_ttl=2, retry_count=0)
    second = manager(servers.urls, ttl=2, max_ttl=2, retry_count=0)
    try:
        wait_until_old(first, 2.3)  # every node may vote for client 1; D and E may vote for client 2
        lock = hold_on_abc(first, servers, "res")
        servers[2].restart()  # C forgets client 1's key
        servers[2].pause()  # C is slow when client 2 first talks to it (its probe is sent, not read)
        try:
            try:
                second.acquire("warm-up", blocking=False).release()  # client 2's first call, on another resource
            except LockNotAcquired:
                pass
        finally:
            time.sleep(0.3)  # the length of the hiccup is the scenario
            servers[2].resume()
        wait_reachable(second)
        exc = assert_not_acquired(second, "res", lock)
        assert lock.locked()
        reason = exc.failures[second.nodes[2]]
        assert "held by another holder" not in reason, f"C must sit out, it answered: {reason}"
        lock.release()
    finally:
        first.close()
        second.close()


ROUNDS = 40


def test_plain_restarts_never_give_two_holders(servers):
    """Item 1 without a pause: repeated restarts of a node that holds a lock, a new client each time.

    The restarted node's first replies to the new client sometimes arrive just after the
    warm-up fan-out was decided (about 8 % of rounds on localhost); the rule must hold anyway.
    """
    # The holder is not under test; its ttl is within the clients' max_ttl, as the window requires.
    holder = LockManager(servers.urls, ttl=1, max_ttl=1, retry_count=0, restart_window=0)
    probe = manager(servers.urls, ttl=1, max_ttl=1, retry_count=0)
    wait_until_old(probe, 1.3)  # A, B, D, E are old: they vote for anyone
    probe.close()
    doubles = []
    for i in range(ROUNDS):
        resource = f"res-{i}"
        lock = hold_on_abc(holder, servers, resource)
        servers[2].restart()
        client = manager(servers.urls, ttl=1, max_ttl=1, retry_count=0)
        try:
            try:
                client.acquire(f"warm-up-{i}", blocking=False).release()  # first contact with the new C
            except LockNotAcquired:
                pass
            for _ in range(2):
                try:
                    other = client.acquire(resource, blocking=False)
                except LockNotAcquired:
                    continue
                if lock.locked() and other.locked():
                    doubles.append(i)
                other.release()
        finally:
            client.close()
        lock.release()
    holder.close()
    assert not doubles, f"two holders at once in rounds {doubles} of {ROUNDS}"


def sleep_until_second_fraction(fraction):
    """Sleep until the wall clock is ``fraction`` of the way through a second."""
    time.sleep((fraction - time.time() % 1.0) % 1.0)


def info_uptime(server):
    return int(raw(server).info("server")["uptime_in_seconds"])


def test_uptime_in_whole_seconds_does_not_shorten_the_window(servers):
    """INFO's ``uptime_in_seconds`` is the difference of two wall-clock seconds, each truncated.

    A node started at x.85 s reads "1" at (x+1).00 s, 0.15 s later. Counting that as a whole
    second made C vote about 0.2 s after its restart, under a lock of 1 s (window 1.01 s).
    """
    probe = manager(servers.urls, ttl=1, max_ttl=1, retry_count=0)
    wait_until_old(probe, 1.3)  # A, B, D, E are old: they vote for anyone
    probe.close()
    holder = LockManager(servers.urls, ttl=1, max_ttl=1, retry_count=0, restart_window=0)
    try:
        for _ in range(8):  # a slow hold, or a restart that crosses a second boundary, starts over
            sleep_until_second_fraction(0.6)
            lock = hold_on_abc(holder, servers, "guarded")
            if time.time() % 1.0 >= 0.85:
                lock.release()
                continue
            sleep_until_second_fraction(0.85)
            restarted = time.monotonic()
            servers[2].restart()  # C forgets the key of a lock that is valid for almost 1 s more
            while info_uptime(servers[2]) < 1 and time.monotonic() - restarted < 0.5:
                time.sleep(0.005)
            if info_uptime(servers[2]) == 1 and time.monotonic() - restarted < 0.4:
                break
            lock.release()
        else:
            pytest.fail("could not restart a node just before a wall-clock second ended")
        client = manager(servers.urls, ttl=1, max_ttl=1, retry_count=0)
        try:
            for i in range(2):  # first contact with the new C: its uptime ("1 s") is read by now
                client.acquire(f"warm-up-{i}", blocking=False).release()
            time.sleep(0.05)  # what the probe read plus the time since: past the window if "1" were sure
            assert lock.locked()
            refused = assert_not_acquired(client, "guarded", lock)
            assert "delayed-restart rule" in refused.failures[client.nodes[2]]
            assert lock.locked()
            assert time.monotonic() - restarted < 0.9  # C really is younger than the window
            status = client.node_status()[2]
            assert not status.votes and status.sits_out_for > 0.5, status
        finally:
            client.close()
        lock.release()
    finally:
        holder.close()


# -- a node that denies INFO has an unknown restart state: it does not vote --------------------

ACL_NO_INFO = ["--user", "locker", "on", ">pw", "~*", "&*", "+@all", "-info"]


@pytest.fixture
def no_info_servers():
    group = RedisServers(3, extra_args=ACL_NO_INFO).start()
    try:
        yield group
    finally:
        group.stop()


def locker_urls(group):
    return [f"redis://locker:pw@127.0.0.1:{s.port}/0" for s in group]


def test_young_nodes_that_deny_info_do_not_vote(no_info_servers):
    mgr = LockManager(locker_urls(no_info_servers), ttl=1, retry_count=0)
    try:
        try:
            lock = mgr.acquire("res")
        except LockNotAcquired as exc:
            info = exc
        else:
            lock.release()
            pytest.fail("three young nodes that deny INFO voted: their restart state is unknown")
        reasons = [info.failures[name] for name in mgr.nodes]
        denied = [r for r in reasons if "restart state unknown" in r and "INFO" in r]
        # Once two refused, the outcome is known and the third reply may not be awaited.
        assert len(denied) >= 2, reasons
        assert all(r in denied or r.startswith("not awaited") for r in reasons), reasons
    finally:
        mgr.close()


def test_nodes_that_deny_info_restarted_under_a_held_lock(no_info_servers):
    urls = locker_urls(no_info_servers)
    first = LockManager(urls, ttl=3, retry_count=0, restart_window=0)
    second = LockManager(urls, ttl=3, retry_count=0)
    try:
        lock = first.acquire("res")
        for server in no_info_servers:
            server.restart()  # every node forgets the key of a lock that is still valid
        assert_not_acquired(second, "res", lock)
        assert lock.locked()
    finally:
        first.close()
        second.close()


def test_nodes_declared_fsync_always_vote_without_info(no_info_servers):
    specs = [{"URL": url, "FSYNC_ALWAYS": True} for url in locker_urls(no_info_servers)]
    mgr = LockManager(specs, ttl=1, retry_count=0)
    try:
        lock = mgr.acquire("res")
        assert lock.locked()
        assert lock.release()
    finally:
        mgr.close()


# -- the restart window must cover the longest ttl of any client of the nodes -------------------


def test_restart_window_covers_a_longer_ttl_of_another_process(servers):
    """Item 4: W (ttl 1) must not vote a restarted node in while C's 3 s lock is valid."""
    long_holder = manager(servers.urls, ttl=3, max_ttl=3, retry_count=0)
    short_user = manager(servers.urls, ttl=1, max_ttl=3, retry_count=0)
    try:
        wait_until_old(long_holder, 3.3)
        lock = hold_on_three(long_holder, servers)  # on nodes 0, 1, 2; nodes 3, 4 restarted empty
        servers[2].restart()
        time.sleep(1.2)  # W's own ttl has passed since the restarts; C's lock is still valid
        wait_reachable(short_user)
        assert lock.locked()
        assert_not_acquired(short_user, "guarded", lock)
        assert lock.locked()
    finally:
        long_holder.close()
        short_user.close()


def test_ttl_above_max_ttl_is_refused(servers):
    mgr = LockManager(servers.urls, ttl=1, max_ttl=3, retry_count=0, restart_window=0)
    try:
        with pytest.raises(ValueError, match="max_ttl"):
            mgr.acquire("x", ttl=5)
        lock = mgr.acquire("x", ttl=3)
        with pytest.raises(ValueError, match="max_ttl"):
            lock.extend(5)
        lock.release()
    finally:
        mgr.close()


def test_restart_window_shorter_than_max_ttl_is_refused(servers):
    with pytest.raises(ValueError, match="restart_window"):
        LockManager(servers.urls, ttl=1, max_ttl=3, restart_window=1)
    LockManager(servers.urls, ttl=1, max_ttl=3, restart_window=0).close()  # 0 turns the rule off
    LockManager(servers.urls, ttl=1, max_ttl=3, restart_window=3).close()


# -- a probe answered with an error (BUSY) does not keep the node from voting later ---------------


def test_passing_probe_error_does_not_disable_the_node(servers):
    mgr = LockManager(servers.urls[:3], ttl=2, max_ttl=2, retry_count=0, node_timeout=0.05)
    wait_until_old(mgr, 3)
    admin = redis.Redis(port=servers[2].port)
    admin.config_set("lua-time-limit", 100)  # busy-reply-threshold from Redis 7.0 on; this name on 6.2 too

    def block():
        try:
            redis.Redis(port=servers[2].port).eval("while true do end", 0)
        except redis.RedisError:
            pass

    blocker = threading.Thread(target=block)
    blocker.start()
    time.sleep(0.3)  # the script must be running (BUSY) when the probe arrives
    try:
        mgr.acquire("a", blocking=False).release()  # first contact with node 2: its probe gets -BUSY
    finally:
        admin.script_kill()
        blocker.join()
    last = None
    for _ in range(5):
        servers[0].kill()  # node 2's vote is now needed
        try:
            mgr.acquire("b", blocking=False).release()
            break
        except LockNotAcquired as exc:
            last = exc
        finally:
            servers[0].start()
        time.sleep(0.6)
    else:
        raise AssertionError(f"node 2 never votes again after one BUSY probe: {last}")
    mgr.close()
