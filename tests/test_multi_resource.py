"""Several resources in one lock, on real servers: all or nothing, one validity, no deadlock.

``manager.acquire(["a", "b"])`` sets every member's key on each node in one
script call, or none of them; a quorum of such nodes grants the lock. These
tests read the keys on the nodes themselves.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest
import redis

from django_redlock.core import AsyncLockManager, LockManager
from django_redlock.core.base import MAX_RESOURCES, WAIT_SLICE
from django_redlock.exceptions import LockLost, LockNotAcquired
from tests.conftest import eventually, on_nodes


def values(servers, resource):
    return on_nodes(servers, "get", resource)


def ttls(servers, resource):
    return on_nodes(servers, "pttl", resource)


def test_several_resources_are_taken_together_and_released_together(mgr, servers):
    lock = mgr.acquire(["invoice-2", "invoice-1", "invoice-2"])
    assert lock.resources == ("invoice-1", "invoice-2")  # sorted, each once
    assert lock.resource == "invoice-1, invoice-2"
    # acquire() and release() return at a quorum: the last nodes' replies may still be on their way.
    eventually(lambda: values(servers, "invoice-1") == values(servers, "invoice-2") == [lock.value.encode()] * len(servers))
    assert mgr.is_locked("invoice-1") and mgr.is_locked("invoice-2")
    with pytest.raises(LockNotAcquired, match="held by another holder"):
        mgr.acquire("invoice-2", blocking=False)
    assert lock.owned()
    assert lock.release() is True
    eventually(lambda: values(servers, "invoice-1") == values(servers, "invoice-2") == [None] * len(servers))


def test_all_or_nothing_when_one_member_is_held(mgr, servers):
    held = mgr.acquire("b")
    with pytest.raises(LockNotAcquired) as info:
        mgr.acquire(["a", "b", "c"], blocking=False)
    # No node was left holding the free members: each node sets all of them or none.
    assert values(servers, "a") == values(servers, "c") == [None] * len(servers)
    assert 0 < info.value.retry_after <= 10.0  # when "b" may be free
    held.release()
    mgr.acquire(["a", "b", "c"], blocking=False).release()


def test_one_extension_resets_every_member(mgr, servers):
    lock = mgr.acquire(["x", "y"], ttl=2.0)
    lock.extend(8.0)  # returns once a quorum extended: the last nodes may still be on their way
    eventually(
        lambda: all(t > 2000 for t in ttls(servers, "x") + ttls(servers, "y")),
        show=lambda: (ttls(servers, "x"), ttls(servers, "y"), [n.books.down_reason for n in mgr.node_list]),
    )
    assert lock.validity > 7.0 and lock.extensions == 1
    lock.release()


def test_a_member_taken_away_loses_the_whole_lock(mgr, servers):
    with pytest.raises(LockLost):
        with mgr.lock(["p", "q"]) as lock:
            assert mgr.force_release("q") == len(servers)
            assert lock.owned() is False  # "q" is no longer ours on any node
            assert lock.lost
    # The release still removed "p": nothing is left behind.
    eventually(lambda: values(servers, "p") == [None] * len(servers))


def test_a_member_cannot_be_extended_once_taken_away(mgr, servers):
    lock = mgr.acquire(["e", "f"])
    mgr.force_release("f")
    with pytest.raises(LockLost, match="no longer stored"):
        lock.extend()
    # Gone from every node: the extension, which set "f" again (and "e" with it), released what it set.
    assert ttls(servers, "f") == ttls(servers, "e") == [-2] * len(servers)
    lock.release()


def test_one_fencing_token_for_the_set_above_every_member(mgr):
    with mgr.lock("m1") as single:
        first = single.fencing_token
    with mgr.lock(["m1", "m2"]) as both:
        token = both.fencing_token
    with mgr.lock("m2") as later:
        after = later.fencing_token
    assert first < token < after


def test_a_set_waits_in_line_and_is_woken_when_its_last_member_is_free(mgr, servers):
    a, b = mgr.acquire("w1"), mgr.acquire("w2")
    got = {}

    def waiter():
        lock = mgr.acquire(["w1", "w2"], timeout=5)
        got["at"] = time.monotonic()
        lock.release()

    t = threading.Thread(target=waiter)
    t.start()
    deadline = time.monotonic() + 5
    with redis.Redis.from_url(servers[0].url) as c:
        while not (c.zcard("redlock:places:w1") and c.zcard("redlock:places:w2")):
            assert time.monotonic() < deadline, "the waiter never took its places"
            time.sleep(0.005)
    a.release()
    time.sleep(0.05)
    assert "at" not in got  # one member free is not enough
    released_at = time.monotonic()
    b.release()
    t.join(5)
    assert got["at"] - released_at < WAIT_SLICE / 2  # woken by the release of w2, not by polling


def test_overlapping_sets_never_deadlock_and_never_overlap(servers):
    """Threads take rings of overlapping sets; each resource's section must be alone."""
    sets = [["r0", "r1"], ["r1", "r2"], ["r2", "r0"], ["r0", "r1", "r2"], ["r1"]]
    inside = {r: 0 for r in ("r0", "r1", "r2")}
    guard = threading.Lock()
    errors: list[str] = []
    done = [0] * len(sets)

    def worker(n):
        m = LockManager(servers.urls, ttl=5.0, restart_window=0)
        try:
            for _ in range(15):
                with m.lock(sets[n], timeout=20) as lock:
                    with guard:
                        for r in lock.resources:
                            inside[r] += 1
                            if inside[r] != 1:
                                errors.append(f"{r} held twice")
                    time.sleep(random.uniform(0, 0.003))
                    with guard:
                        for r in lock.resources:
                            inside[r] -= 1
                done[n] += 1
        finally:
            m.close()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(len(sets))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "deadlocked"
    assert errors == []
    assert done == [15] * len(sets)


async def test_async_sets_all_or_nothing_and_no_deadlock(servers):
    m = AsyncLockManager(servers.urls, ttl=5.0, restart_window=0)
    held = await m.acquire("ab")
    with pytest.raises(LockNotAcquired):
        await m.acquire(["aa", "ab"], blocking=False)
    assert values(servers, "aa") == [None] * len(servers)
    await held.release()
    count = {"n": 0}

    async def worker(names):
        for _ in range(10):
            async with m.lock(names, timeout=20) as lock:
                assert await lock.owned()
                count["n"] += 1

    await asyncio.wait_for(asyncio.gather(worker(["aa", "ab"]), worker(["ab", "ac"]), worker(["ac", "aa"])), 60)
    assert count["n"] == 30
    async with m.lock(["aa", "ac"]) as lock:
        assert await lock.get_fencing_token() > 0
    await m.aclose()


@pytest.mark.parametrize(
    ("resources", "message"),
    [
        ([], "at least one resource"),
        (["a", 3], "non-empty string"),
        (["a", ""], "non-empty string"),
        (b"bytes", "or a list of them"),
        (7, "or a list of them"),
        ([f"r{i}" for i in range(MAX_RESOURCES + 1)], f"the limit is {MAX_RESOURCES}"),
    ],
)
def test_bad_resource_sets_are_refused_before_anything_is_sent(mgr, resources, message):
    with pytest.raises(ValueError, match=message):
        mgr.acquire(resources)
    with pytest.raises(ValueError, match=message):
        mgr.lock(resources)
