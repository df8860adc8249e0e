"""Waiting in line on real servers: woken on release, in ticket order, places that go away.

A blocking ``acquire()`` takes a place in every node's line for the resource
and waits (BLPOP) between votes; a release wakes the first in line. These
tests watch the places on the nodes themselves (the ``places`` zset) to know
when a waiter is in line, instead of sleeping.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import threading
import time

import pytest
import redis

from django_redlock.core import AsyncLockManager, LockManager
from django_redlock.core.base import PLACE_MARGIN, WAIT_SLICE
from django_redlock.core.scripts import RELEASE
from django_redlock.exceptions import LockNotAcquired


def client(server):
    return redis.Redis.from_url(server.url, socket_timeout=2)


def places(servers, resource):
    """Places in line for ``resource`` on each reachable node."""
    return [client(s).zcard(f"redlock:places:{resource}") for s in servers if s.running and not s.paused]


def wait_for(test, timeout=5.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not test():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def in_line(servers, resource, count):
    """Until ``count`` places are in line on every reachable node."""
    wait_for(lambda: all(n >= count for n in places(servers, resource)), what=f"{count} in line")


def waiting_thread(mgr, servers, resource, timeout, *, release=True, place=1):
    """A thread whose acquire() waits in line for ``resource``, returned once ``place`` calls are in
    line everywhere; ``got["lock"]`` is its lock and ``got["at"]`` when it got it (with ``release``,
    it releases the lock at once)."""
    got = {}

    def waiter():
        got["lock"] = mgr.acquire(resource, timeout=timeout)
        got["at"] = time.monotonic()
        if release:
            got["lock"].release()

    t = threading.Thread(target=waiter)
    t.start()
    in_line(servers, resource, place)
    time.sleep(0.05)  # the waiter is now blocked in its wait (its first vote was refused)
    return t, got


def test_a_waiter_is_woken_by_the_release_not_by_polling(mgr, servers):
    holder = mgr.acquire("woken")
    t, got = waiting_thread(mgr, servers, "woken", timeout=5)
    released_at = time.monotonic()
    holder.release()
    t.join(5)
    # A waiter polling would vote again only after its slice (WAIT_SLICE): the wake-up beats it by far.
    assert got["at"] - released_at < WAIT_SLICE / 2


def test_waiters_are_granted_in_the_order_they_came(mgr, servers):
    holder = mgr.acquire("fifo")
    order: list[int] = []
    threads = []
    for n in range(4):
        def waiter(n=n):
            with mgr.lock("fifo", timeout=10):
                order.append(n)
                time.sleep(0.01)

        t = threading.Thread(target=waiter)
        t.start()
        threads.append(t)
        in_line(servers, "fifo", n + 1)  # one place per waiter so far
    holder.release()
    for t in threads:
        t.join(10)
    assert order == [0, 1, 2, 3]
    wait_for(lambda: places(servers, "fifo") == [0] * 5, what="the line to empty")


def test_a_non_blocking_call_takes_a_free_lock_and_the_waiter_stays_first(mgr, servers):
    holder = mgr.acquire("queue-jump", ttl=10)
    t, got = waiting_thread(mgr, servers, "queue-jump", 5, release=False)
    # The key goes away without a release (nobody is woken): the lock is free, the waiter asleep.
    for s in servers:
        client(s).delete(mgr.key("queue-jump"))
    passer_by = mgr.acquire("queue-jump", blocking=False)  # a plain SET NX: it does not wait, it takes it
    assert places(servers, "queue-jump") == [1] * 5  # the waiter is still first in line
    released_at = time.monotonic()
    passer_by.release()  # and its release wakes the waiter
    t.join(5)
    assert got["lock"].locked() and got["at"] - released_at < WAIT_SLICE / 2
    got["lock"].release()
    holder.release()


def test_a_waiter_that_gives_up_leaves_the_line_at_once(mgr, servers):
    holder = mgr.acquire("give-up")
    started = time.monotonic()
    with pytest.raises(LockNotAcquired):
        mgr.acquire("give-up", timeout=0.3)
    took = time.monotonic() - started
    assert 0.3 <= took < 0.3 + 0.4  # the deadline holds: the last vote is made at it
    assert places(servers, "give-up") == [0] * 5  # it left the line (the holder's place went at its grant)
    holder.release()


def _wait_in_child(urls, ready):
    mgr = LockManager(urls, ttl=10.0, restart_window=0)
    ready.set()
    mgr.acquire("dead-waiter", timeout=60)  # killed while waiting
    os._exit(0)


def test_a_dead_waiter_holds_up_the_line_only_until_its_place_expires(mgr, servers):
    holder = mgr.acquire("dead-waiter")
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    child = ctx.Process(target=_wait_in_child, args=(servers.urls, ready))
    child.start()
    try:
        ready.wait(5)
        in_line(servers, "dead-waiter", 1)
        os.kill(child.pid, signal.SIGKILL)
        child.join(5)
        t, got = waiting_thread(mgr, servers, "dead-waiter", 10, release=False, place=2)
        released_at = time.monotonic()
        holder.release()  # wakes the dead child, first in line: nobody answers
        t.join(10)
        assert got["lock"].locked()
        assert got["at"] - released_at <= WAIT_SLICE + PLACE_MARGIN + 0.5
        got["lock"].release()
    finally:
        if child.is_alive():
            child.kill()


def test_waiting_does_not_make_the_nodes_look_down(mgr, servers):
    holder = mgr.acquire("busy-wait")
    t = threading.Thread(target=lambda: mgr.acquire("busy-wait", timeout=1.5).release())
    t.start()
    in_line(servers, "busy-wait", 1)
    time.sleep(0.2)  # several node timeouts into the waiter's wait
    other = mgr.acquire("elsewhere", blocking=False)  # same manager, same nodes
    assert other.locked()
    other.release()
    holder.release()
    t.join(5)


def test_a_paused_node_does_not_stop_the_wake_up(mgr, servers):
    holder = mgr.acquire("paused-wake")
    got = {}

    def waiter():
        got["lock"] = mgr.acquire("paused-wake", timeout=5)
        got["at"] = time.monotonic()

    servers[4].pause()
    t = threading.Thread(target=waiter)
    t.start()
    in_line(servers, "paused-wake", 1)
    time.sleep(0.05)
    released_at = time.monotonic()
    holder.release()
    t.join(5)
    assert got["lock"].locked()
    assert got["at"] - released_at < WAIT_SLICE / 2
    got["lock"].release()


async def test_async_waiters_are_woken_in_order_and_a_cancelled_one_leaves(servers):
    amgr = AsyncLockManager(servers.urls, ttl=10.0, restart_window=0)
    try:
        holder = await amgr.acquire("afifo")
        order: list[int] = []

        async def waiter(n):
            async with amgr.lock("afifo", timeout=10):
                order.append(n)

        tasks = []
        for n in range(3):
            tasks.append(asyncio.create_task(waiter(n)))
            while not all(c >= n + 1 for c in places(servers, "afifo")):
                await asyncio.sleep(0.005)
        cancelled = asyncio.create_task(amgr.acquire("afifo", timeout=10))
        while not all(c >= 4 for c in places(servers, "afifo")):
            await asyncio.sleep(0.005)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        deadline = time.monotonic() + 2
        while not all(c == 3 for c in places(servers, "afifo")):  # the cancelled call left the line
            assert time.monotonic() < deadline, places(servers, "afifo")
            await asyncio.sleep(0.005)
        await holder.release()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
        assert order == [0, 1, 2]
    finally:
        await amgr.aclose()


def test_force_release_wakes_the_first_in_line(mgr, servers):
    mgr.acquire("forced")
    got = {}

    def waiter():
        got["lock"] = mgr.acquire("forced", timeout=5)
        got["at"] = time.monotonic()

    t = threading.Thread(target=waiter)
    t.start()
    in_line(servers, "forced", 1)
    time.sleep(0.05)
    forced_at = time.monotonic()
    assert mgr.force_release("forced") == 5
    t.join(5)
    assert got["at"] - forced_at < WAIT_SLICE / 2
    got["lock"].release()


def test_a_vote_granted_by_a_minority_keeps_the_waiter_in_line(mgr, servers):
    """Nodes 0 and 1 see the holder release first and grant the waiter's vote; the others still
    refuse. The attempt fails, and its release must put the waiter's place back on 0 and 1 (a grant
    had taken it out): without it, anyone arriving next would be first there."""
    holder = mgr.acquire("minority", ttl=20)
    t, got = waiting_thread(mgr, servers, "minority", timeout=10)
    first_two = [client(s) for s in servers[:2]]
    release = mgr.config.release_command(("minority",), holder.value)
    for c in first_two:
        c.execute_command("EVAL", RELEASE.source, *release[2:])
    key = "redlock:lock:minority"
    wait_for(lambda: all(c.get(key) not in (None, holder.value.encode()) for c in first_two), what="the grants")
    # Each attempt fails on the other three (after its slice there) and is released on 0 and 1. On
    # those two the waiter must hold the key or be in line at every moment, over several attempts.
    lost = []
    deadline = time.monotonic() + 3 * WAIT_SLICE
    while time.monotonic() < deadline:
        for n, c in enumerate(first_two):
            with c.pipeline(transaction=True) as p:
                value, places = p.get(key).zcard("redlock:places:minority").execute()
            if value is None and places == 0:
                lost.append(n)
    assert lost == [], "the waiter was neither holding nor in line on node(s) 0/1"
    holder.release()
    t.join(10)
    assert "at" in got
