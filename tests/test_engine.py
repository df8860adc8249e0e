"""The engine against five real redis-server masters, with real faults: the tests that take the
``manager`` fixture run on the sync and on the asyncio engine."""

from __future__ import annotations

import contextlib
import enum
import math
import threading
import time

import pytest
import redis

from django_redlock.core import Hooks, LockManager
from django_redlock.exceptions import LockError, LockLost, LockNotAcquired, QuorumUnavailable
from tests.conftest import eventually, on_nodes
from tests.proxy import Proxy


@pytest.fixture
def manager(engine, servers):
    """The sync or the asyncio manager (tests/engines.py): each test here holds for both."""
    return engine.manager(servers.urls, ttl=10.0, retry_count=0, node_timeout=0.05, restart_window=0)


def keys_everywhere(servers, pattern="redlock:lock:*"):
    found = []
    for server in servers:
        if server.running:
            client = redis.Redis.from_url(server.url, socket_timeout=2)
            found.extend(k.decode() for k in client.keys(pattern))
            client.close()
    return found


def test_acquire_release_roundtrip(manager, servers):
    lock = manager.acquire("invoice-1")
    assert lock.locked()
    assert 9.5 < lock.validity <= 10.0
    assert len(lock.token) == 40 and int(lock.token, 16) >= 0
    assert manager.is_locked("invoice-1")
    # acquire() returns once a quorum granted: the last votes may still be on their way.
    eventually(lambda: sorted(keys_everywhere(servers)) == ["redlock:lock:invoice-1"] * 5)
    assert lock.release() is True
    assert lock.release() is False  # idempotent
    assert not manager.is_locked("invoice-1")
    eventually(lambda: keys_everywhere(servers) == [])  # release() returns once a quorum deleted the key


class _Color(str, enum.Enum):
    """A str-mixin Enum member equals (and hashes as) its value, "a", but formats as "_Color.A"."""

    A = "a"


def test_a_str_enum_member_and_its_value_each_lock_their_own_key_in_either_order(manager, servers):
    """A resource is its text as its key names it: a str subclass is taken as it formats. Locking the
    member first must not change the key that the plain string locks later (nor the reverse)."""
    for first, then, key in ((_Color.A, "a", "redlock:lock:a"), ("a", _Color.A, "redlock:lock:_Color.A")):
        manager.acquire(first).release()
        lock = manager.acquire(then)
        eventually(lambda: sorted(keys_everywhere(servers)) == [key] * 5)
        assert lock.resource == key.removeprefix("redlock:lock:") and manager.is_locked(lock.resource)
        lock.release()
        eventually(lambda: keys_everywhere(servers) == [])


def test_second_acquire_is_refused_with_reasons(manager):
    held = manager.acquire("report")
    with pytest.raises(LockNotAcquired) as info:
        manager.acquire("report", blocking=False)
    err = info.value
    assert not isinstance(err, QuorumUnavailable)
    assert (err.granted, err.quorum, err.total) == (0, 3, 5)
    assert "0 of 5 nodes agreed, 3 needed" in str(err)
    reasons = list(err.failures.values())
    assert reasons.count("held by another holder") >= 3  # enough to decide; the rest may not be awaited
    assert set(reasons) <= {"held by another holder", "not awaited: the outcome was already known"}
    assert 9.0 < err.retry_after <= 10.0
    held.release()


def test_value_identifies_the_holder(servers):
    mgr = LockManager(servers.urls, label="nightly-import", retry_count=0, restart_window=0)
    lock = mgr.acquire("imports")
    value = redis.Redis.from_url(servers[0].url).get("redlock:lock:imports").decode()
    assert lock.token in value and "nightly-import" in value
    record = next(mgr.live_locks())
    assert record.resource == "imports"
    assert record.holder.token == lock.token
    assert record.holder.pid is not None and record.holder.label == "nightly-import"
    assert record.nodes_holding == 5 and record.state == "held"
    assert all(0 < entry.ttl <= 30 for entry in record.entries)
    lock.release()
    mgr.close()


@pytest.mark.parametrize("killed", [1, 2])
def test_quorum_survives_a_minority_killed(manager, servers, killed):
    for server in servers[:killed]:
        server.kill()
    lock = manager.acquire("q")
    assert lock.locked()
    eventually(lambda: len(keys_everywhere(servers)) == 5 - killed)
    assert lock.release() is True
    eventually(lambda: keys_everywhere(servers) == [])


def test_quorum_lost_with_three_killed_leaves_nothing(engine, servers):
    # A node timeout well above a first write's fsync on a busy disk: the two live nodes' count must
    # not depend on it (at 50 ms one of them was sometimes reported "no reply within 50 ms").
    manager = engine.manager(servers.urls, ttl=10.0, retry_count=0, node_timeout=0.5, restart_window=0)
    for server in servers[:3]:
        server.kill()
    with pytest.raises(QuorumUnavailable) as info:
        manager.acquire("q", blocking=False)
    assert "only 2 of 5 nodes answered, 3 needed" in str(info.value)
    assert str(info.value).count("connection refused") == 3
    eventually(lambda: keys_everywhere(servers) == [])  # released on the two that said yes (sent, maybe not yet run)


def test_sigstopped_node_costs_at_most_about_node_timeout(manager, servers):
    servers[0].pause()
    worst = 0.0
    for i in range(20):
        started = time.monotonic()
        lock = manager.acquire(f"stopped-{i}")
        lock.release()
        worst = max(worst, time.monotonic() - started)
    # One node_timeout is 50 ms; a pair must never wait much longer than that.
    assert worst < 0.05 * 3, worst
    servers[0].resume()


class StallingSocket:
    """A real socket; once ``stall`` is set, the next read runs it before returning (the client
    process stops there, as in a long garbage collection or when descheduled)."""

    def __init__(self, sock):
        self._sock = sock
        self.stall = None

    def recv(self, size):
        data = self._sock.recv(size)
        stall, self.stall = self.stall, None
        if stall is not None:
            stall()
        return data

    def __getattr__(self, name):
        return getattr(self._sock, name)


class StallingConnection(redis.Connection):
    sockets: list[StallingSocket] = []

    def _connect(self):
        sock = StallingSocket(super()._connect())
        self.sockets.append(sock)
        return sock


def test_replies_that_came_while_the_client_stalled_count(servers):
    """The client stops for longer than node_timeout right after reading the first reply; the other
    replies arrived meanwhile, in time. They are read before anything is judged missing."""
    proxies = [Proxy(server.port).start() for server in servers[1:]]
    StallingConnection.sockets = []
    first = redis.Redis(connection_pool=redis.ConnectionPool(
        connection_class=StallingConnection, host="127.0.0.1", port=servers[0].port))
    mgr = LockManager([first, *(p.url for p in proxies)], ttl=10, retry_count=0, restart_window=0)
    try:
        mgr.acquire("warm-up", blocking=False).release()  # connections exist: no connect in the round

        def stall():
            for proxy in proxies:  # the other replies arrive while the client does not run ...
                proxy.wait_held(lambda held: held.endswith(b"\r\n"), replies=True)
                proxy.flush_replies()
            time.sleep(0.05 * 2)  # ... and it stops for two node timeouts: the fault under test

        for proxy in proxies:
            proxy.hold_replies()
        [sock] = StallingConnection.sockets
        sock.stall = stall
        started = time.monotonic()
        lock = mgr.acquire("stalled", blocking=False)  # was: "only 1 of 5 nodes answered"
        assert sock.stall is None and lock.locked()
        assert lock.validity <= 10 - (time.monotonic() - started)  # the stall is taken off the validity
        for proxy in proxies:
            proxy.pass_replies()
        lock.release()
    finally:
        mgr.close()
        for proxy in proxies:
            proxy.close()


@contextlib.contextmanager
def forgetful_late_node(servers):
    """A manager whose node E restarted (its script cache is empty) and sits behind a proxy: set
    ``late.delay_replies`` to make it answer after the quorum."""
    servers[4].restart()
    with Proxy(servers[4].port) as late:
        mgr = LockManager([*servers.urls[:4], late.url], ttl=30, retry_count=0, restart_window=0)
        try:
            yield mgr, late
        finally:
            late.delay_replies = 0.0
            mgr.close()


def test_a_release_that_ends_at_a_quorum_runs_where_the_script_was_forgotten(servers):
    """The release returns once a quorum deleted the key; E must still delete it (its NOSCRIPT came
    after the round and was left unread, so the key stayed there for its ttl)."""
    with forgetful_late_node(servers) as (mgr, late):
        lock = mgr.acquire("forgotten", blocking=False)  # a plain SET NX: no script runs on E
        eventually(lambda: len(keys_everywhere(servers)) == 5)
        late.delay_replies = 0.05
        assert lock.release() is True
        eventually(lambda: keys_everywhere(servers) == [])  # was: E kept the key for 30 s


def test_an_extension_that_ends_at_a_quorum_runs_where_the_script_was_forgotten(servers):
    """The extension returns once a quorum extended; E must still extend (its NOSCRIPT came after
    the round and nobody sent the source, so the key there expired at the old ttl)."""
    with forgetful_late_node(servers) as (mgr, late):
        lock = mgr.acquire("extended", ttl=2.0, blocking=False)  # a plain SET NX: no script runs on E
        eventually(lambda: len(keys_everywhere(servers)) == 5)
        late.delay_replies = 0.03
        lock.extend(8.0)
        eventually(lambda: all(t > 2000 for t in on_nodes(servers, "pttl", "extended")))  # was: E's ran out
        lock.release()


def test_an_extension_that_ends_at_a_quorum_runs_where_a_live_connection_saw_scripts_flushed(servers):
    """As above, but E forgot the script under a connection that had already sent it (SCRIPT FLUSH):
    the extension goes as EVALSHA, and E's late NOSCRIPT, read on the node's next use (here the
    manager's reading of the record), must still be answered with the source."""
    with forgetful_late_node(servers) as (mgr, late):
        lock = mgr.acquire("flushed", ttl=2.0, blocking=False)
        lock.extend(2.0)  # every connection has now sent the extension script
        redis.Redis(port=servers[4].port).script_flush()
        late.delay_replies = 0.03
        lock.extend(8.0)
        late.delay_replies = 0.0

        def extended_everywhere():
            mgr.lock_record("flushed")  # uses every node: late replies are read
            return all(t > 2000 for t in on_nodes(servers, "pttl", "flushed"))

        eventually(extended_everywhere, show=lambda: on_nodes(servers, "pttl", "flushed"))  # was: E's ran out
        lock.release()


def test_a_script_sent_again_after_noscript_gets_its_own_node_timeout(servers):
    """Three nodes forgot their scripts and answer 30 ms late: NOSCRIPT comes at 30 ms, the source
    goes out then, and its reply comes at 60 ms, within a node timeout (50 ms) of that write."""
    proxies = [Proxy(server.port).start() for server in servers[2:]]
    mgr = LockManager([*servers.urls[:2], *(p.url for p in proxies)], ttl=10, retry_count=0, restart_window=0)
    try:
        warm = mgr.acquire("warm-up", blocking=False)
        assert warm.fencing_token > 0  # each connection has sent the script: EVALSHA from now on
        warm.release()
        lock = mgr.acquire("fenced", blocking=False)
        for server in servers[2:]:
            redis.Redis(port=server.port).script_flush()
        for proxy in proxies:
            proxy.delay_replies = 0.03
        assert lock.fencing_token > 0  # was: "the fencing token reached 2 nodes, 3 needed"
        lock.release()
    finally:
        for proxy in proxies:
            proxy.delay_replies = 0.0
        mgr.close()
        for proxy in proxies:
            proxy.close()


def test_majority_paused_fails_fast_without_blocking(manager, servers):
    for server in servers[:3]:
        server.pause()
    started = time.monotonic()
    with pytest.raises(QuorumUnavailable) as info:
        manager.acquire("paused", blocking=False)
    elapsed = time.monotonic() - started
    assert elapsed < 0.05 * 5, elapsed
    assert "no reply within 50 ms" in str(info.value)
    for server in servers[:3]:
        server.resume()


def test_blocking_acquire_waits_for_release(manager):
    lock = manager.acquire("queue", ttl=5)
    got = []

    def waiter():
        got.append(manager.acquire("queue", timeout=5))

    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(0.3)  # let the waiter fail a few attempts first
    assert not got
    lock.release()
    thread.join(5)
    assert got and got[0].locked()
    got[0].release()


def test_blocking_timeout_is_respected(manager):
    lock = manager.acquire("t")
    started = time.monotonic()
    with pytest.raises(LockNotAcquired) as info:
        manager.acquire("t", timeout=0.5)
    elapsed = time.monotonic() - started
    assert 0.2 <= elapsed < 1.0
    assert "attempts" in str(info.value)
    lock.release()


def test_extend_keeps_lock_past_first_ttl(manager):
    lock = manager.acquire("long", ttl=0.3)
    deadline = time.monotonic() + 0.9
    while time.monotonic() < deadline:
        time.sleep(0.1)
        lock.extend()
    assert lock.locked() and lock.extensions >= 6
    with pytest.raises(LockNotAcquired):
        manager.acquire("long", blocking=False)
    lock.release()


def test_extend_after_expiry_raises_lock_lost(manager):
    lock = manager.acquire("short", ttl=0.1)
    time.sleep(0.15)
    with pytest.raises(LockLost):
        lock.extend()
    assert lock.lost


def test_extend_is_bounded(servers):
    mgr = LockManager(servers.urls, max_extensions=2, retry_count=0, restart_window=0)
    lock = mgr.acquire("bounded")
    lock.extend()
    lock.extend()
    with pytest.raises(LockError, match="max_extensions"):
        lock.extend()
    lock.release()
    mgr.close()


def test_release_never_deletes_another_holders_key(manager, servers):
    first = manager.acquire("shared", ttl=0.1)
    time.sleep(0.15)
    second = manager.acquire("shared", ttl=10)
    assert first.release() is False
    assert first.lost  # it expired before release: reported, not silent
    assert manager.is_locked("shared")
    eventually(lambda: len(keys_everywhere(servers)) == 5)
    second.release()


def test_context_manager_raises_when_lock_expired_inside(manager):
    with pytest.raises(LockLost):
        with manager.lock("ctx", ttl=0.05):
            time.sleep(0.1)


def test_auto_extend_holds_past_ttl_and_reports_loss(manager, servers):
    lost = threading.Event()
    with pytest.raises(LockLost):
        with manager.lock("auto", ttl=0.3, auto_extend=True, on_lost=lambda lock: lost.set()) as lock:
            time.sleep(0.9)
            assert lock.locked() and lock.extensions >= 2
            for server in servers[:3]:
                server.kill()
            assert lost.wait(2.0), "loss must be reported"
            assert lock.lost and not lock.locked()


def test_auto_extend_loss_raises_on_exit(manager, servers):
    with pytest.raises(LockLost):
        with manager.lock("auto2", ttl=0.2, auto_extend=True) as lock:
            for server in servers[:3]:
                server.kill()
            deadline = time.monotonic() + 2
            while not lock.lost and time.monotonic() < deadline:
                time.sleep(0.02)


def test_auto_extend_stops_at_max_hold(manager):
    lost = threading.Event()
    with pytest.raises(LockLost):
        with manager.lock("capped", ttl=0.2, auto_extend=True, max_hold=0.3, on_lost=lambda l: lost.set()):
            assert lost.wait(2.0)


def test_fencing_tokens_increase_across_majorities(manager, servers):
    tokens = []
    for victims in ([], [0, 1], [3, 4], [2]):
        for i in victims:
            servers[i].pause()
        lock = manager.acquire("fenced", timeout=2)  # a just-resumed node may lag for a moment
        tokens.append(lock.fencing_token)
        assert lock.fencing_token == tokens[-1]  # cached
        lock.release()
        for i in victims:
            servers[i].resume()
    servers[0].kill()
    servers[1].kill()
    with manager.lock("fenced", timeout=2) as lock:
        tokens.append(lock.fencing_token)
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)


def test_fencing_token_after_expiry_is_refused(manager):
    manager.acquire("warm-up").release()  # connections made first: a 50 ms ttl leaves no room for connects
    lock = manager.acquire("fence-late", ttl=0.05)
    time.sleep(0.08)
    with pytest.raises(LockLost):
        lock.fencing_token


def test_hooks_are_called(servers):
    events = []

    class Recorder(Hooks):
        def acquired(self, lock):
            events.append(("acquired", lock.resource))

        def released(self, lock):
            events.append(("released", lock.resource))

        def extended(self, lock):
            events.append(("extended", lock.resource))

        def not_acquired(self, resource, error):
            events.append(("not_acquired", resource))

        def lost(self, lock, reason):
            raise RuntimeError("hooks must not break locking")

    mgr = LockManager(servers.urls, hooks=Recorder(), retry_count=0, restart_window=0)
    lock = mgr.acquire("h")
    lock.extend()
    with pytest.raises(LockNotAcquired):
        mgr.acquire("h", blocking=False)
    lock.release()
    assert events == [("acquired", "h"), ("extended", "h"), ("not_acquired", "h"), ("released", "h")]
    mgr.close()


def test_force_release_and_live_locks(manager, servers):
    for name in ("a", "b*c", "b?d"):
        manager.acquire(name)
    assert [r.resource for r in manager.live_locks()] == ["a", "b*c", "b?d"]
    assert [r.resource for r in manager.live_locks(match="*")] == ["b*c"]
    assert manager.force_release("b*c") == 5
    assert [r.resource for r in manager.live_locks()] == ["a", "b?d"]
    servers[4].kill()
    records = list(manager.live_locks())
    assert len(records) == 2 and records[0].down == (manager.nodes[4],)
    assert records[0].nodes_holding == 4


def test_node_status_and_ping(manager, servers):
    servers[1].kill()
    status = manager.node_status()
    assert [s.reachable for s in status] == [True, False, True, True, True]
    assert status[0].role == "master" and status[0].version and status[0].uptime is not None
    assert status[1].error
    pings = manager.ping()
    assert pings[manager.nodes[1]] is None and pings[manager.nodes[0]] > 0


def test_restarted_node_rejoins(manager, servers):
    servers[0].kill()
    manager.acquire("r1").release()
    servers[0].restart()
    time.sleep(0.6)  # the node's connect cool-off
    lock = manager.acquire("r2")
    eventually(lambda: len(keys_everywhere(servers)) == 5)
    lock.release()


# -- bad input ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ttl": 0}, "ttl must be > 0"),
        ({"ttl": -1}, "ttl must be > 0"),
        ({"ttl": math.nan}, "ttl must be a finite"),
        ({"ttl": math.inf}, "ttl must be a finite"),
        ({"ttl": "10"}, "ttl must be a number"),
        ({"node_timeout": 0}, "node_timeout must be > 0"),
        ({"retry_count": -1}, "retry_count must be a whole number"),
        ({"clock_drift_factor": 0.7}, "clock_drift_factor must be below 0.5"),
        ({"key_prefix": 3}, "key_prefix must be a string"),
    ],
)
def test_bad_manager_arguments(servers, kwargs, message):
    with pytest.raises(ValueError, match=message):
        LockManager(servers.urls, **kwargs)


@pytest.mark.parametrize(
    ("nodes", "message"),
    [
        ([], "nodes is empty"),
        ("redis://localhost", "must be a list"),
        (["http://localhost:6379"], r"nodes\[0\]: unsupported scheme 'http'"),
        (["redis://localhost:notaport"], r"nodes\[0\]: malformed Redis URL"),
        (["redis://"], "has no host"),
        ([42], "expected a Redis URL string"),
        ([{"URL": "redis://x", "OPTONS": {}}], "unknown key"),
    ],
)
def test_bad_nodes(nodes, message):
    with pytest.raises(ValueError, match=message):
        LockManager(nodes)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda m: m.acquire(""), "resource must be a non-empty string"),
        (lambda m: m.acquire(None), "resource must be a non-empty string"),
        (lambda m: m.acquire(b"x"), "resource must be a non-empty string"),
        (lambda m: m.acquire("a\nb"), "control characters"),
        (lambda m: m.acquire("x" * 2000), "limit is 1024"),
        (lambda m: m.acquire("x", ttl=0), "ttl must be > 0"),
        (lambda m: m.acquire("x", timeout=-1), "timeout must be >= 0"),
    ],
)
def test_bad_call_arguments(manager, servers, call, message):
    with pytest.raises(ValueError, match=message):
        call(manager)
    assert keys_everywhere(servers) == []


def test_down_at_startup_does_not_crash(servers):
    servers[0].kill()
    mgr = LockManager(servers.urls, retry_count=0, restart_window=0)  # no connection at construction
    mgr.acquire("x").release()
    mgr.close()


@pytest.mark.parametrize(
    "url",
    [
        "redis:/:s3cretPW@127.0.0.1:7851/0",  # one slash: the password is in the path, not the netloc
        "redis:user:s3cretPW@127.0.0.1:7851/0",
        "rediss:/user:s3cretPW@127.0.0.1/0",
        "redis://:s3cretPW@/0",
    ],
)
def test_a_malformed_url_s_password_never_shows_in_the_error(url):
    with pytest.raises(ValueError) as bad:
        LockManager([url, "redis://127.0.0.1:1/0", "redis://127.0.0.1:2/0"])
    assert "s3cretPW" not in str(bad.value), str(bad.value)


def test_password_never_leaks(servers, tmp_path):
    from django_redlock.testing import RedisServer

    secret = "s3cr3t-Pa55"
    guarded = [RedisServer(password=secret).start() for _ in range(3)]
    try:
        wrong = [s.url.replace("redis://", "redis://:wrong-pass-XYZ@") for s in guarded]
        mgr = LockManager(wrong, retry_count=0, restart_window=0)
        with pytest.raises(QuorumUnavailable) as info:
            mgr.acquire("p")
        text = str(info.value) + repr(info.value.failures) + repr(mgr) + repr(mgr.nodes)
        assert "wrong-pass-XYZ" not in text
        assert "authentication failed" in text
        good = [f"redis://:{secret}@127.0.0.1:{s.port}/0" for s in guarded]
        mgr = LockManager(good, retry_count=0, restart_window=0)
        lock = mgr.acquire("p")
        text = repr(lock) + repr(mgr.nodes) + repr(mgr.node_status()) + repr(list(mgr.live_locks()))
        assert secret not in text
        lock.release()
        with pytest.raises(ValueError) as bad:
            LockManager([f"redis://:{secret}@host:port"])
        assert secret not in str(bad.value)
    finally:
        for server in guarded:
            server.stop()


def test_clients_and_dicts_as_nodes(servers):
    nodes = [
        redis.Redis.from_url(servers[0].url),
        {"URL": servers[1].url, "OPTIONS": {"socket_keepalive": True}},
        servers[2].url,
    ]
    mgr = LockManager(nodes, retry_count=0, restart_window=0)
    assert mgr.quorum == 2
    mgr.acquire("mixed").release()
    mgr.close()


def test_unix_socket_node(tmp_path):
    from django_redlock.testing import RedisServer

    sock = tmp_path / "r.sock"
    server = RedisServer(extra_args=["--unixsocket", str(sock), "--unixsocketperm", "700"]).start()
    try:
        mgr = LockManager([f"unix://{sock}?db=0"], retry_count=0, restart_window=0)
        assert mgr.nodes == (f"unix:{sock}",)
        mgr.acquire("u").release()
        mgr.close()
    finally:
        server.stop()


def waiting_on(manager, resource):
    """The quorum view of calls waiting on ``resource``, or None when no node holds its lock key."""
    record = next((r for r in manager.live_locks(match=resource) if r.resource == resource), None)
    return record.waiting if record else None


def test_live_locks_count_the_calls_waiting_in_line(manager, servers, waiters):
    held = manager.acquire("busy", ttl=10)
    manager.acquire("idle", ttl=10)
    waiters.start(manager, "busy", 3, timeout=5)
    eventually(lambda: waiting_on(manager, "busy") == 3)
    # A quorum shows all three; the last node may be a moment behind (each place is written to every node).
    # A node is also left out of a listing while a reply from it is overdue (a busy host): read again.
    def listed():
        records = {r.resource: r for r in manager.live_locks()}
        return {resource: [e.waiting for e in record.entries] for resource, record in records.items()}

    def seen():
        listing = manager.lock_listing()
        return [(r.resource, r.state, [(e.node, e.waiting) for e in r.entries]) for r in listing.records], listing.down

    eventually(lambda: listed() == {"busy": [3] * 5, "idle": [0] * 5}, show=seen)
    held.release()  # each waiter gets the lock in turn and releases it
    assert waiters.join() == ["acquired"] * 3
    eventually(lambda: listed() == {"idle": [0] * 5}, show=seen)


def test_waiting_count_drops_when_waiters_give_up(manager, waiters):
    held = manager.acquire("slow", ttl=10)
    waiters.start(manager, "slow", 2, timeout=0.8)
    waiters.start(manager, "slow", 1, timeout=8)
    eventually(lambda: waiting_on(manager, "slow") == 3)
    eventually(lambda: len(waiters.outcomes) == 2)
    # Read at once: the leavers' places went with their release, not with expiry (up to 1.5 s later).
    assert waiting_on(manager, "slow") == 1
    held.release()
    outcomes = waiters.join()
    assert outcomes[2] == "acquired" and all(isinstance(o, LockNotAcquired) for o in outcomes[:2])


def test_waiting_is_what_a_quorum_of_nodes_agree_on(manager, servers):
    manager.acquire("counted", ttl=10)
    # Places written straight into the lines: 4 on two nodes, 2 on two, 1 on the last.
    far = int(time.time() * 1000) + 60_000
    for server, count in zip(servers, (4, 4, 2, 2, 1)):
        client = redis.Redis.from_url(server.url)
        client.zadd("redlock:places:counted", {f"p{i}": far for i in range(count)})
        client.zadd("redlock:places:counted", {"gone": 1})  # expired long ago: not counted
        client.close()
    record = next(manager.live_locks())
    assert [e.waiting for e in record.entries] == [4, 4, 2, 2, 1]
    assert record.waiting == 2  # at least 2 on a quorum (3 nodes); 4 only on two
    servers[0].kill()
    servers[1].kill()
    servers[2].kill()
    record = next(manager.live_locks())  # fewer than a quorum answer: what all of them agree on
    assert [e.waiting for e in record.entries] == [2, 1] and record.waiting == 1
