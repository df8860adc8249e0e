"""Listing live locks at scale: the LIST script's pages, reading only a slice in any order, one lock alone, odd keys, nodes down."""

from __future__ import annotations

import dataclasses
import gc
import json
from io import StringIO

import pytest
import redis
from django.core.management import CommandError, call_command
from django.urls import reverse

from django_redlock import get_lock_manager
from django_redlock.core import AsyncLockManager, LockManager, steps
from django_redlock.core.listing import NODE_WAIT, ORDERS, Scan, read_listing, without_gc
from django_redlock.core.records import Holder
from django_redlock.core.scripts import LIST
from django_redlock.exceptions import LockNotAcquired, QuorumUnavailable
from tests.conftest import eventually

LOCKS = 2_345  # more than two SCAN pages of 1,000 on every node


def fill(servers, count=LOCKS, nodes=range(5), holder=lambda i: Holder(f"t{i}", "h", 1, "lbl", 1.0)):
    for n in nodes:
        with redis.Redis.from_url(servers[n].url) as client:
            pipe = client.pipeline(transaction=False)
            for i in range(count):
                pipe.set(f"redlock:lock:r-{i:05d}", holder(i).encode(), px=60_000)
            pipe.execute()


def names(count=LOCKS):
    return [f"r-{i:05d}" for i in range(count)]


def test_many_locks_across_pages_are_each_listed_once_in_order(manager, servers):
    fill(servers)
    listing = manager.lock_listing()
    assert [r.resource for r in listing.records] == names() and listing.count == LOCKS
    record = listing.records[1234]
    assert record.state == "held" and record.nodes_holding == 5 and str(record.holder) == "h:1 (lbl)"
    assert [e.node for e in record.entries] == list(manager.nodes) and 59 < record.ttl <= 60


def test_a_slice_is_read_in_full_and_the_count_covers_all(manager, servers):
    fill(servers)
    first = manager.lock_listing(rows=slice(0, 100))
    assert [r.resource for r in first.records] == names()[:100] and first.count == LOCKS
    last = manager.lock_listing(rows=slice(-100, None))
    assert [r.resource for r in last.records] == names()[-100:]
    assert last.records[-1].holder == Holder(f"t{LOCKS - 1}", "h", 1, "lbl", 1.0)
    middle = manager.lock_listing(match="r-012", rows=slice(20, 30))
    assert [r.resource for r in middle.records] == names()[1220:1230] and middle.count == 100
    assert manager.lock_listing(rows=slice(LOCKS, LOCKS + 100)).records == ()


def walk(client, pattern, reads, count=50, safe=""):
    """Every LIST call of a walk on one node: (names, values, ttls) per call."""
    cursor, calls = "0", []
    while True:
        cursor, n, *columns = client.eval(
            LIST.source, 0, cursor, pattern, count, reads, "redlock:lock:", "redlock:places:", safe
        )
        columns = [c if isinstance(c, list) else (c.split(b"\0") if n else []) for c in columns]
        assert len(columns[0]) == n
        calls.append(columns)
        if cursor == b"0":
            return calls


def test_the_script_walks_every_key_once_over_calls_that_stop_early(servers):
    fill(servers, nodes=[0])
    keys = [f"redlock:lock:{n}".encode() for n in names()]
    with redis.Redis.from_url(servers[0].url) as client:
        client.set("unrelated", "x")
        client.set("redlock:lock:r-00007", "not a lock", px=60_000)
        client.zadd("redlock:lock:not-a-string", {"x": 1})
        for reads in ("n", "v", "t", "vt"):
            calls = walk(client, "redlock:lock:r-*", reads)
            found = [key for names_, _values, _ttls in calls for key in names_]
            assert sorted(set(found)) == keys and len(calls) > 10
            if "v" in reads:
                values = dict(zip(found, (v for _n, values, _t in calls for v in values)))
                assert values[keys[7]] == b"not a lock" and values[keys[8]] == Holder("t8", "h", 1, "lbl", 1.0).encode().encode()
            if "t" in reads:
                ttls = [int(t) for _n, _v, ttls in calls for t in ttls]
                assert len(ttls) == len(found) and 59_000 < min(ttls) <= max(ttls) <= 60_000
        calls = walk(client, "redlock:lock:not-*", "v")
        assert [v for _n, values, _t in calls for v in values] == [b""]  # an MGET of a zset: no value
        # A match found nowhere: each call walks at most ten SCAN pages, then hands back the cursor.
        cursor, n, *_ = client.eval(LIST.source, 0, "0", "redlock:lock:nothing*", 10, "vt", "redlock:lock:", "redlock:places:", "")
        assert cursor != b"0" and n == 0


def test_the_script_counts_live_places_per_line(servers):
    with redis.Redis.from_url(servers[0].url) as client:
        now = int(client.time()[0]) * 1000
        client.zadd("redlock:places:busy", {"a": now + 60_000, "b": now + 60_000, "gone": now - 1})
        client.zadd("redlock:places:over", {"gone": now - 1})
        calls = walk(client, "redlock:places:*", "w")
        found = {key: int(count) for names_, counts, _ in calls for key, count in zip(names_, counts)}
        assert found == {b"redlock:lock:busy": 2}


def test_nul_bytes_in_keys_and_values_are_read_exactly(manager, servers):
    fill(servers, count=3)
    for server in servers:
        with redis.Redis.from_url(server.url) as client:
            client.set("redlock:lock:a\0b", "odd\0value", px=60_000)
    records = {r.resource: r for r in manager.live_locks()}
    assert sorted(records) == ["a\0b", *names(3)]
    assert records["a\0b"].holder == Holder("odd\0value") and records["r-00002"].nodes_holding == 5
    page = manager.lock_listing(rows=slice(0, 2))
    assert [r.resource for r in page.records] == ["a\0b", "r-00000"] and page.count == 4
    assert manager.lock_record("a\0b").holder == Holder("odd\0value")


def test_split_and_minority_copies(manager, servers):
    fill(servers, count=2, nodes=[0, 1], holder=lambda i: Holder("one"))
    fill(servers, count=1, nodes=[2, 3], holder=lambda i: Holder("two"))
    split, minority = manager.lock_listing().records
    assert split.state == "split" and split.holder == Holder("one") and split.nodes_holding == 2
    assert [e.holder.token for e in split.entries] == ["one", "one", "two", "two"]
    assert minority.state == "minority" and minority.nodes_holding == 2 and len(minority.entries) == 2


def varied(servers):
    """Thirty locks with different ttls, holders and acquisition times, two of them with calls in
    line, a minority left-over and a split lock. Returns the resources in resource order."""
    for n, server in enumerate(servers):
        with redis.Redis.from_url(server.url) as client:
            pipe = client.pipeline(transaction=False)
            for i in range(30):
                holder = Holder(f"t{i}", f"host-{i % 3}", 100 + i % 4, f"label-{i % 5}", 1000.0 + (i * 13) % 30)
                pipe.set(f"redlock:lock:r-{i:02d}", holder.encode(), ex=100 + (i * 7) % 30 * 10)
            if n < 2:
                pipe.set("redlock:lock:m-left", Holder("gone", "h", 1).encode(), ex=500)
            if n < 4:  # one holder on nodes 0 and 1 (for 600 s), another on 2 and 3 (50 s)
                pipe.set("redlock:lock:s-split", Holder("ab"[n // 2], "h", n).encode(), ex=(600, 50)[n // 2] + n % 2)
            now = int(client.time()[0]) * 1000
            for resource, places in (("r-03", 2), ("r-11", 1)):
                pipe.zadd(f"redlock:places:{resource}", {f"p{k}": now + 60_000 for k in range(places)})
            pipe.execute()
    return ["m-left", *[f"r-{i:02d}" for i in range(30)], "s-split"]


#: What each order sorts by, worked out here from the full listing's records. By ttl: the quorum-th
#: longest of all the keys, whoever holds them (the record's own ttl counts its main holder's only).
BY = {
    "resource": lambda r: r.resource,
    "state": lambda r: r.state,
    "nodes_holding": lambda r: r.nodes_holding,
    "ttl": lambda r: sorted(r.pttls)[-3] if len(r.pttls) >= 3 else max(r.pttls),
    "waiting": lambda r: r.waiting,
    "holder": lambda r: str(r.holder),
    "acquired_at": lambda r: r.holder.acquired_at or 0,
}


@pytest.mark.parametrize("order", [*ORDERS, *(f"-{o}" for o in ORDERS)])
def test_each_order_reads_just_the_rows_asked_as_the_full_listing_sorts_them(manager, servers, order):
    resources = varied(servers)
    full = manager.lock_listing()
    assert [r.resource for r in full.records] == resources
    split = next(r for r in full.records if r.state == "split")
    assert split.ttl == pytest.approx(601, abs=1) and split.nodes_holding == 2 and split.holder.token == "a"
    expected = [r.resource for r in sorted(full.records, key=BY[order.lstrip("-")], reverse=order.startswith("-"))]
    page = manager.lock_listing(rows=slice(0, 12), order=order)
    assert [r.resource for r in page.records] == expected[:12] and page.count == 32
    assert [r.resource for r in manager.lock_listing(order=order).records] == expected
    last = manager.lock_listing(rows=lambda count: slice(count - 5, count), order=order)
    assert [r.resource for r in last.records] == expected[-5:]
    shown, listed = page.records[0], next(r for r in full.records if r.resource == expected[0])
    assert (shown.state, shown.nodes, shown.values, shown.lives) == (listed.state, listed.nodes, listed.values, listed.lives)


def test_an_unknown_order_is_refused(manager):
    with pytest.raises(ValueError, match="order must be one of resource, state"):
        manager.lock_listing(order="size")


@pytest.mark.parametrize("order", ["resource", "-ttl", "waiting", "holder"])
def test_a_state_keeps_only_its_locks_in_the_order_asked(manager, servers, order):
    varied(servers)
    everything = manager.lock_listing(order=order).records
    for state, count in (("held", 30), ("minority", 1), ("split", 1), ("unknown", 0)):
        expected = [r.resource for r in everything if r.state == state]
        assert len(expected) == count
        assert [r.resource for r in manager.lock_listing(order=order, state=state).records] == expected
        page = manager.lock_listing(rows=slice(0, 12), order=order, state=state)
        assert [r.resource for r in page.records] == expected[:12] and page.count == count
    asked = []
    last = manager.lock_listing(rows=lambda n: asked.append(n) or slice(n - 3, n), order=order, state="held")
    held = [r.resource for r in everything if r.state == "held"]
    assert asked == [30] and [r.resource for r in last.records] == held[-3:]


def test_a_state_reads_values_in_one_walk_and_an_unknown_one_is_refused(manager, servers):
    fill(servers, count=250, nodes=range(2))  # minority left-overs
    fill(servers, count=50)  # the first 50 on every node: held
    before = scripts_run(servers[0])
    page = manager.lock_listing(rows=slice(0, 100), state="minority")
    assert [r.resource for r in page.records] == names(250)[50:150] and page.count == 200
    assert scripts_run(servers[0]) - before == 2  # one LIST call (250 keys, values), one INSPECT
    with pytest.raises(ValueError, match=r"state must be one of held, split, minority, unknown \(or None for all\); got"):
        manager.lock_listing(state="stuck")


async def test_async_listing_filters_by_state(servers):
    fill(servers, count=20, nodes=range(2))
    async with AsyncLockManager(servers.urls, restart_window=0) as amanager:
        listing = await amanager.lock_listing(rows=slice(0, 5), order="-resource", state="minority")
        assert [r.resource for r in listing.records] == names(20)[:-6:-1] and listing.count == 20
        assert (await amanager.lock_listing(state="held")).records == ()


def commandstats(server, command):
    with redis.Redis.from_url(server.url) as client:
        return client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0)


def scripts_run(server):
    """Script calls run on ``server``: a connection sends a script's source first, its hash after that."""
    return commandstats(server, "eval") + commandstats(server, "evalsha")


def test_rows_asked_by_a_function_of_the_count_are_read_in_one_walk(manager, servers):
    fill(servers, count=250)
    asked = []

    def last_page(count):
        asked.append(count)
        return slice((count - 1) // 100 * 100, count)

    before = scripts_run(servers[0])
    listing = manager.lock_listing(rows=last_page)
    assert asked == [250] and [r.resource for r in listing.records] == names(250)[200:]
    assert scripts_run(servers[0]) - before == 2  # one LIST call, one INSPECT


def test_one_lock_is_read_alone_from_its_key(manager, servers):
    varied(servers)
    full = {r.resource: r for r in manager.lock_listing().records}
    scans = commandstats(servers[0], "scan")
    for resource in ("r-03", "m-left", "s-split"):
        record, listed = manager.lock_record(resource), full[resource]
        assert record.ttl == pytest.approx(listed.ttl, abs=0.5) and record.entries[0].holder == listed.entries[0].holder
        assert (record.state, record.nodes_holding, record.waiting, record.nodes, record.values) == (
            listed.state, listed.nodes_holding, listed.waiting, listed.nodes, listed.values
        )
    assert manager.lock_record("nobody") is None and commandstats(servers[0], "scan") == scans
    with pytest.raises(ValueError):
        manager.lock_record("")


def test_holders_decoded_together_are_those_decoded_one_by_one():
    values = [
        Holder("abc", "host", 12, "label \u00e9", 1.5, 3).encode(),
        Holder("x y", None, None, None, None).encode(),
        '{"t": "spaced"}',
        ' {"t":"lead"}',
        '{"t":"trail"} ',
        '{"t":1}',
        '{"h":"no token"}',
        '["t"]',
        '"t"',
        "not json",
        '{"t":"a","p":true,"a":"1","l":3,"n":2}',
        '{"t":"x"}{"t":"y"}',
        "NaN",
        '{"t":"a","h":"x","p":01,"a":1}',  # not JSON (a leading zero): a bare token, not an error
        '{"t":"a","h":"x","p":1,"a":1,"n":1}',
        '{"t":"a","h":"x","p":1,"a":2,"l":"z","n":12}',
        Holder("tok", 'q"uote', 0, "back\\slash", 0.0).encode(),
        Holder("tok", "tab\t", -3, "nul\x00", 1e300, 2).encode(),
        Holder("tök", "hé", 5, "", 1700000000.125).encode(),
    ]
    holders = Holder.decode_many(values)
    assert holders == [Holder.decode(v) for v in values]
    assert [str(h) for h in holders] == [str(Holder.decode(v)) for v in values]
    assert [type(h.acquired_at) for h in holders] == [type(Holder.decode(v).acquired_at) for v in values]
    for h in holders:  # as the constructor builds them: equal, the same hash and fields, frozen
        made = Holder(h.token, h.host, h.pid, h.label, h.acquired_at, h.members)
        assert h == made and hash(h) == hash(made) and repr(h) == repr(made) and vars(h) == vars(made)
    with pytest.raises(dataclasses.FrozenInstanceError):
        holders[0].token = "other"


@pytest.mark.parametrize("enabled", [True, False])
def test_the_listing_pauses_the_collector_and_leaves_it_as_it_was(enabled):
    seen = []

    @without_gc
    def build(fail=False):
        seen.append(gc.isenabled())
        if fail:
            raise RuntimeError("fails")
        return "built"

    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        assert build() == "built"
        assert gc.isenabled() is enabled
        with pytest.raises(RuntimeError):
            build(fail=True)
        assert gc.isenabled() is enabled and seen == [False, False]
    finally:
        (gc.enable if was else gc.disable)()


def test_an_interrupt_as_the_collector_pauses_leaves_it_running(monkeypatch):
    # A signal handler (Ctrl-C, an alarm) runs as soon as gc.disable() returns: its exception
    # must not leave the collector paused for the rest of the process.
    pause = gc.disable

    def interrupted() -> None:
        pause()
        raise KeyboardInterrupt

    monkeypatch.setattr(gc, "disable", interrupted)
    was = gc.isenabled()
    gc.enable()
    try:
        with pytest.raises(KeyboardInterrupt):
            without_gc(lambda: "built")()
        assert gc.isenabled()
    finally:
        (gc.enable if was else pause)()


@pytest.mark.parametrize("rows", [None, slice(0, 100)])
def test_a_node_down_while_listing_is_named_and_its_keys_left_out(manager, servers, rows):
    fill(servers)
    servers[4].kill()
    listing = manager.lock_listing(rows=rows)
    assert list(listing.down) == [manager.nodes[4]] and listing.trustworthy and listing.count == LOCKS
    assert {r.nodes_holding for r in listing.records} == {4} and listing.records[0].down == (manager.nodes[4],)
    servers[3].kill()
    servers[2].kill()
    listing = manager.lock_listing(rows=rows)
    assert not listing.trustworthy and len(listing.down) == 3 and listing.count == LOCKS


async def test_async_listing_reads_a_slice(servers):
    from django_redlock.core import AsyncLockManager

    fill(servers)
    async with AsyncLockManager(servers.urls, restart_window=0) as amanager:
        listing = await amanager.lock_listing(rows=slice(100, 200))
        assert [r.resource for r in listing.records] == names()[100:200] and listing.count == LOCKS
        assert len((await amanager.lock_listing()).records) == LOCKS
        record = await amanager.lock_record("r-00007")
        assert record.holder == Holder("t7", "h", 1, "lbl", 1.0) and record.nodes_holding == 5
        ordered = await amanager.lock_listing(rows=slice(0, 3), order="-resource")
        assert [r.resource for r in ordered.records] == names()[-1:-4:-1]


@pytest.mark.django_db
@pytest.mark.usefixtures("redlock_settings")
def test_admin_pages_through_many_locks_in_either_order(servers, admin_client):
    fill(servers)

    def shown(**query):
        page = admin_client.get(reverse("admin:django_redlock_lock_changelist"), query).content.decode()
        return page, [n for n in names() if f">{n}</a>" in page]

    page, rows = shown()
    assert rows == names()[:100] and f"{LOCKS} locks" in page and "Page 1 of 24" in page
    assert shown(p="3")[1] == names()[200:300]
    page, rows = shown(p="99")  # past the end: the last page
    assert rows == names()[2300:] and "Page 24 of 24" in page
    page, rows = shown(o="-resource")
    assert rows == names()[-100:] and page.index(names()[-1]) < page.index(names()[-100])
    assert shown(o="-resource", p="24")[1] == names()[:45]
    assert shown(q="r-0123")[1] == names()[1230:1240]
    page, rows = shown(o="ttl")
    assert len(rows) == 100 and f"{LOCKS} locks" in page
    walks = scripts_run(servers[0])
    shown(p="99")
    assert scripts_run(servers[0]) - walks == 4  # three LIST calls and one INSPECT: one reading


@pytest.mark.django_db
@pytest.mark.usefixtures("redlock_settings")
@pytest.mark.parametrize("column", ["resource", "holder", "acquired", "ttl", "nodes", "waiting", "state"])
def test_admin_sorts_every_column_both_ways_as_the_listing_does(servers, admin_client, manager, column):
    varied(servers)
    order = {"acquired": "acquired_at", "nodes": "nodes_holding"}.get(column, column)
    for sign in ("", "-"):
        page = admin_client.get(reverse("admin:django_redlock_lock_changelist"), {"o": sign + column}).content.decode()
        expected = [r.resource for r in manager.lock_listing(order=sign + order).records]
        shown = sorted(expected, key=lambda resource: page.index(f">{resource}</a>"))
        assert shown == expected and "32 locks" in page


@pytest.mark.django_db
@pytest.mark.usefixtures("redlock_settings")
def test_admin_detail_reads_its_one_key(servers, admin_client):
    varied(servers)
    scans = commandstats(servers[0], "scan")
    page = admin_client.get(reverse("admin:django_redlock_lock_detail"), {"resource": "s-split"}).content.decode()
    assert "Held on 2 of 5 nodes (split between holders)" in page and all(f"<td>h:{n}</td>" in page for n in (1, 2, 3))
    assert page.count("<td>h:") == 4 and commandstats(servers[0], "scan") == scans  # one row a node holding it


def three_nodes(servers):
    return LockManager(servers.urls[:3], ttl=30.0, retry_count=0, node_timeout=0.05, restart_window=0)


@pytest.mark.parametrize("rows", [None, slice(0, 100)])
def test_a_lock_is_unknown_when_fewer_than_a_quorum_answered(servers, rows):
    """1 of 3 nodes answering: a lock it holds may be held by a quorum, so its state is unknown, not a left-over."""
    manager = three_nodes(servers)
    try:
        manager.acquire("held-everywhere")
        servers[1].kill()
        servers[2].kill()
        listing = manager.lock_listing(rows=rows)
        assert not listing.trustworthy
        assert [(r.resource, r.nodes_holding, r.state) for r in listing.records] == [("held-everywhere", 1, "unknown")]
    finally:
        manager.close()


def test_a_minority_is_unknown_while_the_silent_nodes_could_make_it_a_quorum(manager, servers):
    fill(servers, count=1, nodes=[0, 1])  # r-00000 on 2 of 5 nodes
    assert manager.lock_record("r-00000").state == "minority"  # every node answered: 2 of 5, for sure
    servers[4].kill()
    record = manager.lock_record("r-00000")
    assert (record.nodes_holding, record.state) == (2, "unknown")  # the silent node may hold the third copy
    servers[3].kill()
    assert manager.lock_listing().records[0].state == "unknown"
    sorted_by_state = manager.lock_listing(rows=slice(0, 10), order="state")
    assert [r.state for r in sorted_by_state.records] == ["unknown"]


def test_silent_nodes_cost_the_walk_one_round_within_the_node_timeout(servers):
    """Two of three nodes paused: they are waited for once, in one round bounded by the listing's node timeout
    (not the walk's longer one), and left out of every later round; a node still overdue is not waited for again."""
    fill(servers, nodes=range(3))
    manager = three_nodes(servers)
    servers[1].pause()
    servers[2].pause()
    try:
        for _ in range(2):
            fans = []

            def perform(effect):
                if isinstance(effect, steps.Fan):
                    fans.append(effect)
                return manager._perform(effect)

            step = read_listing(Scan(manager.config, manager.node_list, manager.quorum, rows=slice(0, 100)))
            listing = steps.run_sync(step, perform)
            reaching = [fan for fan in fans if fan.commands[1] is not None or fan.commands[2] is not None]
            assert len(reaching) == 1 and reaching[0].timeout == NODE_WAIT and not reaching[0].allow_lagging
            assert len(fans) > 2  # the walk itself went on with the node that answered
            assert set(listing.down) == set(manager.nodes[1:]) and listing.count == LOCKS
        assert all("earlier command" in why for why in listing.down.values())  # the second time: not waited for
    finally:
        servers[1].resume()
        servers[2].resume()
        manager.close()


#: How long a node restarted empty sits out (a window >= max_ttl, as the engine requires).
WINDOW = 4.0


def watching(servers, cls=LockManager):
    """An operator's manager: nodes restarted empty sit out for :data:`WINDOW`."""
    return cls(servers.urls, ttl=WINDOW, max_ttl=WINDOW, retry_count=0, node_timeout=0.05, restart_window=WINDOW)


def restart_three(manager, servers):
    """A lock held on 5 of 5 nodes, then 3 of them restarted empty: 2 still hold it, 3 sit out."""
    watcher = watching(servers)
    try:  # the nodes that keep running must be past the window themselves (the suite may have just started them)
        eventually(lambda: all(s.votes for s in watcher.node_status()[:2]), seconds=WINDOW + 5)
    finally:
        watcher.close()
    lock = manager.acquire("held-everywhere", ttl=WINDOW)
    assert manager.lock_record("held-everywhere").nodes_holding == 5
    for server in servers[2:]:
        server.restart()
    return lock


def test_nodes_sitting_out_after_a_restart_cannot_tell_a_held_lock_from_a_left_over(manager, servers):
    """The nodes sitting out may have forgotten the lock (they did): with the 2 holders they could be a
    quorum, so the lock's state is unknown, not a minority left-over, and is_locked() cannot say "free"."""
    lock = restart_three(manager, servers)
    watcher = watching(servers)
    try:
        listing = watcher.lock_listing()
        assert [(r.resource, r.nodes_holding, r.state) for r in listing.records] == [("held-everywhere", 2, "unknown")]
        assert not listing.trustworthy and all("sits out" in why for why in listing.down.values())
        assert sorted(listing.down) == sorted(watcher.nodes[2:])
        assert watcher.lock_record("held-everywhere").state == "unknown"
        assert watcher.lock_listing(rows=slice(0, 10), order="state").records[0].state == "unknown"
        with pytest.raises(QuorumUnavailable, match="sits out"):
            watcher.is_locked("held-everywhere")
        with pytest.raises(LockNotAcquired):
            watcher.acquire("held-everywhere", blocking=False)
        assert lock.validity > 0  # all of it while the lock was held
    finally:
        watcher.close()


async def test_async_nodes_sitting_out_after_a_restart_cannot_tell_a_held_lock_from_a_left_over(manager, servers):
    lock = restart_three(manager, servers)
    watcher = watching(servers, AsyncLockManager)
    try:
        listing = await watcher.lock_listing()
        assert [(r.nodes_holding, r.state) for r in listing.records] == [(2, "unknown")]
        with pytest.raises(QuorumUnavailable, match="sits out"):
            await watcher.is_locked("held-everywhere")
        assert lock.validity > 0
    finally:
        await watcher.aclose()


@pytest.mark.usefixtures("redlock_settings")
def test_redlock_list_says_unknown_when_fewer_than_a_quorum_answered(servers, settings):
    from django_redlock.exit_codes import ExitCode

    settings.REDLOCK_NODES = servers.urls[:3]
    get_lock_manager().acquire("held-everywhere", ttl=30)
    servers[1].kill()
    servers[2].kill()
    for args in ((), ("--json",)):
        out, err = StringIO(), StringIO()
        with pytest.raises(CommandError) as failed:
            call_command("redlock", "list", *args, stdout=out, stderr=err)
        assert failed.value.returncode == ExitCode.NO_QUORUM and "Only 1 of 3 nodes answered" in str(failed.value)
        if args:
            assert [lock["state"] for lock in json.loads(out.getvalue())] == ["unknown"]
        else:
            assert "unknown" in out.getvalue() and "minority" not in out.getvalue()
