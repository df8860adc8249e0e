"""Hostile nodes and hostile names: TLS + ACL, garbage, dropped connections, glob characters."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import threading
import time
from types import SimpleNamespace

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_redlock.core import AsyncLockManager, Hooks, LockManager, steps
from django_redlock.core.records import Holder
from django_redlock.exceptions import LockNotAcquired, QuorumUnavailable
from django_redlock.testing import RedisServer

from tests.certs import make_ca, make_server_cert
from tests.proxy import Proxy


# -- TLS and ACL ---------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    ca = make_ca(d)
    return (*make_server_cert(d, "server", "IP:127.0.0.1,DNS:localhost"), str(ca))


ACL_USER = ["--user", "locker", "on", ">Acl-Secret-77", "~*", "&*", "+@all"]


@pytest.fixture(scope="module")
def tls_servers(tls_files):
    servers = [RedisServer(tls=tls_files, extra_args=ACL_USER).start() for _ in range(3)]
    yield servers
    for server in servers:
        server.stop()


def tls_urls(servers, ca, password="Acl-Secret-77"):
    return [
        f"rediss://locker:{password}@127.0.0.1:{s.tls_port}/0?ssl_ca_certs={ca}&ssl_cert_reqs=required"
        for s in servers
    ]


def test_tls_with_acl_user(tls_servers, tls_files):
    mgr = LockManager(tls_urls(tls_servers, tls_files[2]), retry_count=0, restart_window=0)
    lock = mgr.acquire("over-tls")
    assert lock.fencing_token > 0
    assert [r.resource for r in mgr.live_locks()] == ["over-tls"]
    assert all(s.reachable for s in mgr.node_status())
    assert lock.release()
    assert "Acl-Secret-77" not in repr(mgr.nodes) + repr(mgr.node_status())
    mgr.close()


def test_tls_wrong_acl_password_is_a_clear_error(tls_servers, tls_files):
    mgr = LockManager(tls_urls(tls_servers, tls_files[2], "Wrong-Secret-99"), retry_count=0, restart_window=0)
    with pytest.raises(QuorumUnavailable) as info:
        mgr.acquire("over-tls")
    text = str(info.value)
    assert "authentication failed" in text and "Wrong-Secret-99" not in text


def test_plain_client_against_tls_port_fails_fast(tls_servers):
    urls = [f"redis://locker:Acl-Secret-77@127.0.0.1:{s.tls_port}/0" for s in tls_servers]
    mgr = LockManager(urls, retry_count=0, restart_window=0)
    started = time.monotonic()
    with pytest.raises(QuorumUnavailable):
        mgr.acquire("plain-on-tls")
    assert time.monotonic() - started < 1.0
    assert "Acl-Secret-77" not in repr(mgr.nodes)


# -- misbehaving nodes -----------------------------------------------------------


class FakeNode:
    """A TCP listener that misbehaves on purpose: answers garbage or hangs up mid-call.

    It stands in for a broken *network peer*, not for Redis: the locking itself
    is always decided by the real masters next to it.
    """

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.stopped = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stopped:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            try:
                while conn.recv(65536):
                    if self.mode == "garbage":
                        conn.sendall(b"%%% not RESP at all \x00\xff\r\n")
                    elif self.mode == "drop":
                        conn.shutdown(socket.SHUT_RDWR)
                        return
            except OSError:
                return

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def close(self) -> None:
        self.stopped = True
        self.sock.close()


@pytest.mark.parametrize("mode", ["garbage", "drop"])
def test_broken_minority_node_is_just_a_failed_vote(servers, mode):
    fake = FakeNode(mode)
    try:
        mgr = LockManager([*servers.urls[:4], fake.url], retry_count=0, restart_window=0)
        for i in range(5):
            lock = mgr.acquire(f"broken-{i}")
            assert lock.locked()
            lock.release()
        mgr.close()
    finally:
        fake.close()


@pytest.mark.parametrize("mode", ["garbage", "drop"])
def test_broken_majority_fails_fast_and_leaves_nothing(servers, mode):
    fakes = [FakeNode(mode) for _ in range(3)]
    try:
        mgr = LockManager([*servers.urls[:2], *(f.url for f in fakes)], retry_count=0, restart_window=0)
        started = time.monotonic()
        with pytest.raises(LockNotAcquired) as info:
            mgr.acquire("broken-majority")
        assert time.monotonic() - started < 0.5
        assert not isinstance(info.value.__cause__, redis.RedisError)
        for server in servers[:2]:
            assert redis.Redis.from_url(server.url).keys("*") == []
        mgr.close()
    finally:
        for fake in fakes:
            fake.close()


def time_a_failed_acquire(urls, proxies, node_timeout):
    """Seconds a sync acquire takes to fail once every proxy splits the replies, the rest 1 s late."""
    mgr = LockManager(urls, ttl=10.0, retry_count=0, node_timeout=node_timeout, restart_window=0)
    mgr.acquire("split-warm").release()  # connections made before the replies split
    for proxy in proxies:
        proxy.split_replies = 1.0
    started = time.monotonic()
    with pytest.raises(LockNotAcquired):
        mgr.acquire("split")
    took = time.monotonic() - started
    mgr.close()
    return took


@pytest.mark.parametrize("engine", ["sync", "asyncio"])
def test_replies_split_across_packets_do_not_stretch_a_round_past_its_timeout(servers, engine):
    """Every node's replies arrive in two packets, the second one 1 s late: each is a slow node.
    A failed acquire (its round and the release round after it) ends at about two node timeouts,
    not one node timeout per node per round spent waiting for the rest of a reply."""
    node_timeout = 0.1
    proxies = [Proxy(server.port).start() for server in servers]
    kwargs = dict(ttl=10.0, retry_count=0, node_timeout=node_timeout, restart_window=0)
    try:
        if engine == "sync":
            took = time_a_failed_acquire([p.url for p in proxies], proxies, node_timeout)
        else:

            async def run() -> float:
                amgr = AsyncLockManager([p.url for p in proxies], **kwargs)
                await (await amgr.acquire("split-warm")).release()
                for proxy in proxies:
                    proxy.split_replies = 1.0
                started = time.monotonic()
                with pytest.raises(LockNotAcquired):
                    await amgr.acquire("split")
                took = time.monotonic() - started
                await amgr.aclose()
                return took

            took = asyncio.run(run())
    finally:
        for proxy in proxies:
            proxy.close()
    assert took < 6 * node_timeout, f"a failed acquire took {took * 1000:.0f} ms (node timeout 100 ms)"


def test_tls_replies_split_across_packets_do_not_stretch_a_round_past_its_timeout(tls_servers, tls_files):
    """The same over TLS: a record whose rest is late is not waited for on its one socket."""
    node_timeout = 0.1
    proxies = [Proxy(server.tls_port).start() for server in tls_servers]
    urls = tls_urls([SimpleNamespace(tls_port=p.port) for p in proxies], tls_files[2])
    try:
        took = time_a_failed_acquire(urls, proxies, node_timeout)
    finally:
        for proxy in proxies:
            proxy.close()
    assert took < 5 * node_timeout, f"a failed acquire took {took * 1000:.0f} ms (node timeout 100 ms)"


def test_closing_waits_one_node_timeout_in_all_for_split_replies(servers):
    """A release left every node's reply coming, split, its rest 1 s late: closing the manager
    reads what comes within one node timeout in all, not one node timeout per connection."""
    node_timeout = 0.1
    proxies = [Proxy(server.port).start() for server in servers]
    try:
        mgr = LockManager([p.url for p in proxies], ttl=10.0, retry_count=0, node_timeout=node_timeout,
                          restart_window=0)
        lock = mgr.acquire("split-close")
        for proxy in proxies:
            proxy.split_replies = 1.0
        lock.release()
        started = time.monotonic()
        mgr.close()
        took = time.monotonic() - started
    finally:
        for proxy in proxies:
            proxy.close()
    assert took < 3 * node_timeout, f"closing took {took * 1000:.0f} ms (node timeout 100 ms)"


# -- hostile names -------------------------------------------------------------------

GLOBS = st.text(alphabet=st.sampled_from("*?[]^-\\ab:"), min_size=1, max_size=12)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=GLOBS)
def test_glob_names_never_touch_other_keys(manager, servers, name):
    servers.heal()
    bystanders = ["a", "ab", "b", "a:b", "[ab]", "a*"]
    for other in bystanders:
        if other != name:
            manager.acquire(other)
    lock = manager.acquire(name)
    seen = [r.resource for r in manager.live_locks(match=name)]
    assert name in seen
    assert all(name in resource for resource in seen)  # match is a substring, never a pattern
    assert manager.force_release(name) == 5
    remaining = sorted(r.resource for r in manager.live_locks())
    assert remaining == sorted(o for o in bystanders if o != name)
    lock.release()


@settings(max_examples=60, deadline=None)
@given(label=st.one_of(st.none(), st.text(max_size=40)), token=st.text(min_size=1, max_size=50))
def test_holder_value_round_trips(label, token):
    holder = Holder(token, "host-1", 42, label, 1700000000.5)
    assert Holder.decode(holder.encode()) == holder
    assert Holder.decode(holder.encode().encode("utf-8")) == holder


@settings(max_examples=60, deadline=None)
@given(raw=st.binary(max_size=80))
def test_foreign_values_decode_without_error(raw):
    holder = Holder.decode(raw)
    assert holder is not None and isinstance(holder.token, str)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(resource=st.text(min_size=1, max_size=40))
def test_any_resource_is_accepted_or_refused_clearly(resource, manager):
    try:
        key = manager.key(resource)
    except ValueError as exc:
        assert "resource" in str(exc)
        assert any(ord(c) < 32 or ord(c) == 127 for c in resource)
    else:
        assert key == "redlock:lock:" + resource


def test_non_ascii_and_long_names_work(manager):
    for name in ("fa\u00e7ade-\u6587\u66f8-\U0001f512", "x" * 1024):
        lock = manager.acquire(name)
        assert [r.resource for r in manager.live_locks()] == [name]
        lock.release()


# -- names the nodes cannot be sent ---------------------------------------------------


class Seen(Hooks):
    """Every node a round reported, and every acquire's outcome."""

    def __init__(self):
        self.nodes = []
        self.outcomes = []

    def nodes_seen(self, seen):
        self.nodes.extend(seen)

    def acquire_finished(self, report):
        self.outcomes.append(report.outcome)


def client_ids(servers):
    """The ids of the clients connected to each server, but the asking one."""
    ids = []
    for server in servers:
        with redis.Redis.from_url(server.url, socket_timeout=2) as client:
            me = client.client_id()
            ids.append({c["id"] for c in client.client_list() if int(c["id"]) != me})
    return ids


LONE_SURROGATE = json.loads('"\\ud800"')  # what a JSON body can carry: no UTF-8 encodes it


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda m: m.acquire("order-" + LONE_SURROGATE, blocking=False), "resource"),
        (lambda m: m.acquire(["order-1", "order-" + LONE_SURROGATE], blocking=False), "resource"),
        (lambda m: m.acquire("order-1", blocking=False, label="by " + LONE_SURROGATE), "label"),
        (lambda m: m.acquire("order-1", timeout=1.0, label=LONE_SURROGATE), "label"),
        (lambda m: m.is_locked(LONE_SURROGATE), "resource"),
        (lambda m: m.force_release(LONE_SURROGATE), "resource"),
        (lambda m: m.lock_record(LONE_SURROGATE), "resource"),
        (lambda m: m.lock_listing(match=LONE_SURROGATE), "match"),
        (lambda m: m.adopt(LONE_SURROGATE, "token"), "resource"),
    ],
)
def test_a_name_no_utf_8_encodes_is_refused_before_any_node_is_asked(engine, servers, call, argument):
    """A lone surrogate (JSON "\\ud800") once failed every node's write: 503, every node reported
    down to the hooks (node_up 0, a no_quorum refusal) and every connection dropped."""
    seen = Seen()
    manager = engine.manager(servers.urls, retry_count=0, restart_window=0, hooks=seen)
    manager.acquire("warm-up").release()  # a connection to every node, parked
    before, seen.nodes, seen.outcomes = client_ids(servers), [], []
    with pytest.raises(ValueError, match=argument) as info:
        call(manager)
    assert not isinstance(info.value, LockNotAcquired)
    assert "UTF-8" in str(info.value)
    assert seen.nodes == [] and seen.outcomes == []  # no node was asked, none reported down
    assert client_ids(servers) == before  # no connection dropped, none opened
    manager.acquire("after").release()
    assert all(node.up for node in seen.nodes)


@pytest.mark.parametrize("argument", [LONE_SURROGATE, object()], ids=["lone-surrogate", "object"])
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_command_that_cannot_be_built_counts_against_no_node(servers, kind, argument):
    """Whatever raises while a command is encoded is the caller's error: no node is marked down and no
    connection is dropped, whichever step sent it."""
    seen = Seen()
    options = {"retry_count": 0, "restart_window": 0, "hooks": seen}
    total = len(servers.urls)

    if kind == "sync":
        manager = LockManager(servers.urls, **options)
        manager.acquire("warm-up").release()
        before, seen.nodes[:] = client_ids(servers), []
        with pytest.raises((ValueError, TypeError)) as info:
            manager._run(steps.ask(total, [("GET", argument)], 0.5))
        after = client_ids(servers)
        manager.close()
    else:
        async def main():
            manager = AsyncLockManager(servers.urls, **options)
            await (await manager.acquire("warm-up")).release()
            before, seen.nodes[:] = client_ids(servers), []
            with pytest.raises((ValueError, TypeError)) as info:
                await manager._run(steps.ask(total, [("GET", argument)], 0.5))
            after = client_ids(servers)
            await manager.aclose()
            return before, info, after

        before, info, after = asyncio.run(main())
    assert "cannot be sent" in str(info.value)
    assert seen.nodes == []  # no node reported, up or down
    assert after == before  # no connection dropped, none opened


# -- values anyone who can write under the prefix may leave on the nodes -----------------

#: Any text, lone surrogates and control characters included.
ANY_TEXT = st.text(alphabet=st.characters(codec=None, categories=None), max_size=30)
NUMBERS = st.one_of(
    st.integers(),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e20, -1e20, 1e308, float("nan"), float("inf"), 253402300800, -62135596800, 0, -1]),
)
JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), NUMBERS, ANY_TEXT),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(ANY_TEXT, inner, max_size=3)),
    max_leaves=6,
)
FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "t": st.one_of(ANY_TEXT, JSON_VALUES),
        "h": st.one_of(ANY_TEXT, JSON_VALUES),
        "p": st.one_of(NUMBERS, JSON_VALUES),
        "a": st.one_of(NUMBERS, JSON_VALUES),
        "l": st.one_of(ANY_TEXT, JSON_VALUES),
        "n": st.one_of(NUMBERS, JSON_VALUES),
    },
)


def stored(fields):
    """A value as a node could hold it: JSON (NaN and Infinity too, as Python writes them)."""
    return json.dumps(fields, ensure_ascii=False).encode("utf-8", "surrogatepass")


def assert_sane(holder):
    """What every consumer (admin, listing, command, metrics) may rely on."""
    from datetime import datetime, timezone

    assert isinstance(holder.token, str)
    for text in (holder.token, holder.host, holder.label):
        if text is not None:
            text.encode("utf-8")  # never a lone surrogate: pages and terminals are written in UTF-8
    assert holder.host is None or isinstance(holder.host, str)
    assert holder.label is None or isinstance(holder.label, str)
    assert holder.pid is None or (type(holder.pid) is int and holder.pid >= 0)
    assert type(holder.members) is int and 1 <= holder.members <= 1000
    if holder.acquired_at is not None:
        assert type(holder.acquired_at) is float
        datetime.fromtimestamp(holder.acquired_at, tz=timezone.utc)  # a date the admin can show
        json.dumps(holder.acquired_at, allow_nan=False)
    shown = str(holder)
    assert shown.isprintable(), shown  # no control character reaches a terminal or a log line


@settings(max_examples=400, deadline=None)
@given(fields=FIELDS)
def test_any_value_on_the_nodes_decodes_to_a_holder_every_consumer_can_show(fields):
    raw = stored(fields)
    for holder in (Holder.decode(raw), Holder.decode_many([raw.decode("utf-8", "replace")])[0]):
        assert_sane(holder)
    assert Holder.decode_many([raw.decode("utf-8", "replace")]) == [Holder.decode(raw)]


@settings(max_examples=200, deadline=None)
@given(raw=st.one_of(st.binary(max_size=80), JSON_VALUES.map(stored)))
def test_any_bytes_on_the_nodes_decode_to_a_holder_every_consumer_can_show(raw):
    assert_sane(Holder.decode(raw))


@pytest.mark.parametrize(
    "acquired", ["1e20", "-1e20", "NaN", "Infinity", "-Infinity", "1e400", "true", "9" * 400, "253402300800"]
)
def test_a_damaged_acquired_at_is_no_date(acquired):
    holder = Holder.decode('{"t":"x","h":"host","p":7,"a":' + acquired + "}")
    assert holder.token == "x" and holder.host == "host" and holder.acquired_at is None


def test_a_value_nested_too_deep_to_parse_is_a_bare_token():
    raw = "[" * 100_000
    assert Holder.decode(raw).token == raw and Holder.decode_many([raw])[0].token == raw


@pytest.mark.parametrize("label", ["a\nrefund-77 held by a quorum 3/3", "\x1b]0;pwned\x07", "tab\there", "del\x7f"])
def test_a_label_with_a_control_character_is_refused_where_it_enters(manager, label):
    """Labels are shown to operators: a newline forged a row of `redlock list`, ESC/OSC reached the terminal."""
    from django_redlock import redlock

    with pytest.raises(ValueError, match="label must not contain control characters"):
        manager.acquire("labelled", label=label)
    with pytest.raises(ValueError, match="label must not contain control characters"):
        LockManager(["redis://127.0.0.1:1"], label=label)
    with pytest.raises(ValueError, match="label must not contain control characters"):
        redlock("labelled-{pk}", label=label)
    assert not manager.is_locked("labelled")
    manager.acquire("labelled", label="billing: run 7 (nightly)").release()
