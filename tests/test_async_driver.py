"""The asyncio driver against real ``redis-server`` processes: a stalled loop, and exiting without ``aclose()``.

Replies that already arrived are read before any node is judged silent (the
sync driver too), and a release that returned at a quorum still reaches the
last nodes when the program ends without closing its manager.
"""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from django_redlock.core import AsyncLockManager, LockManager, anodes
from django_redlock.exceptions import LockNotAcquired
from tests.conftest import eventually, on_nodes
from tests.proxy import Proxy
from tests.test_loop_connections import open_files

ROOT = Path(__file__).resolve().parent.parent
RUNS = 20
STALL = 0.1  # a loop that does not run for twice the node timeout
OTHERS = 6
OPTIONS = {"ttl": 10, "retry_count": 0, "node_timeout": 0.05, "restart_window": 0}


async def _open_connections(mgr: AsyncLockManager) -> None:
    """Give every node ``OTHERS`` connections, each past its restart probe. A first contact costs a
    connect and the probe, which a slow machine may not finish within the node timeout: such an
    attempt fails, and the next one (on fresh keys) finds those connections open. A host busy with
    other work may fail several in a row: the attempts go on for up to 10 s."""
    deadline = time.monotonic() + 10.0
    attempt = 0
    while True:
        locks = await asyncio.gather(*(mgr.acquire(f"warm-{attempt}-{k}") for k in range(OTHERS)), return_exceptions=True)
        for lock in locks:
            if not isinstance(lock, BaseException):
                await lock.release()
        if not any(isinstance(lock, BaseException) for lock in locks):
            return
        attempt += 1
        if time.monotonic() > deadline:
            raise AssertionError(f"the nodes never answered {OTHERS} first acquires in {attempt} attempts: {locks}")


async def test_replies_that_arrived_during_a_loop_stall_are_read_before_a_node_is_judged_silent(servers):
    """Other tasks' commands are in flight (releases that returned at a quorum leave the last
    replies coming, acquires wait for theirs) when the loop stalls; the next acquire must succeed."""
    mgr = AsyncLockManager(servers.urls, **OPTIONS)
    failed: list[str] = []
    try:
        await _open_connections(mgr)
        for run in range(RUNS):
            others = [asyncio.ensure_future(mgr.acquire(f"other-{run}-{k}")) for k in range(OTHERS)]
            await asyncio.sleep(0)  # one turn: each task writes its commands and waits for the replies
            time.sleep(STALL)  # the fault: a blocking call on the loop; every reply arrives meanwhile
            try:
                lock = await mgr.acquire(f"after-stall-{run}")
            except LockNotAcquired as exc:
                failed.append(str(exc))
            else:
                await lock.release()
            for other in await asyncio.gather(*others):
                await other.release()
    finally:
        await mgr.aclose()
    assert not failed, f"{len(failed)} of {RUNS} acquires failed after a {STALL * 1000:.0f} ms stall: {failed[0]}"


def test_replies_that_arrived_during_a_stall_are_read_before_a_node_is_judged_silent_sync(servers):
    """The sync driver, the same way: releases that returned at a quorum, then a stall in the thread."""
    mgr = LockManager(servers.urls, **OPTIONS)
    failed: list[str] = []
    try:
        for run in range(RUNS):
            for k in range(OTHERS):
                mgr.acquire(f"other-{run}-{k}").release()
            time.sleep(STALL)  # the fault: the thread does not run; the last replies arrive meanwhile
            try:
                lock = mgr.acquire(f"after-stall-{run}")
            except LockNotAcquired as exc:
                failed.append(str(exc))
            else:
                lock.release()
    finally:
        mgr.close()
    assert not failed, f"{len(failed)} of {RUNS} acquires failed after a {STALL * 1000:.0f} ms stall: {failed[0]}"


# -- a release at the end of a program that never closes its manager ------------------------------

SLOW = 0.5  # how late the last two nodes read each command
PROGRAM = {
    "async": """
        import asyncio, sys
        from django_redlock.core import AsyncLockManager

        async def main():
            mgr = AsyncLockManager(sys.argv[1:], ttl=30, retry_count=0, node_timeout=3.0, restart_window=0)
            lock = await mgr.acquire("left-at-exit")
            assert await lock.release()

        asyncio.run(main())  # no aclose()
    """,
    "sync": """
        import sys
        from django_redlock.core import LockManager

        mgr = LockManager(sys.argv[1:], ttl=30, retry_count=0, node_timeout=3.0, restart_window=0)
        lock = mgr.acquire("left-at-exit")
        assert lock.release()  # no close()
    """,
}


@pytest.mark.parametrize("engine", ["async", "sync"])
def test_a_release_at_exit_without_closing_reaches_the_slow_nodes(servers, engine):
    """Acquire and release return at a quorum; the program exits without closing its manager while
    the last two nodes have read the vote but not the release behind it. The vote's reply arrives
    after (or just before) the exit: a socket closed with a reply still coming is reset, and the reset
    loses the release those nodes had not read."""
    slow = [Proxy(server.port).start() for server in servers[3:]]
    urls = [server.url for server in servers[:3]] + [proxy.url for proxy in slow]
    try:
        for proxy in slow:
            proxy.reset_loses_held = True
            proxy.delay_requests = SLOW
        child = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(PROGRAM[engine]), *urls],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )
        assert child.returncode == 0, child.stderr
        for proxy in slow:  # a node closes a connection after it ran what it read before the end
            eventually(lambda: all(pipe.upstream_closed for pipe in proxy.pipes), 10, proxy.pipes.copy)
        assert on_nodes(servers, "get", "left-at-exit") == [None] * len(servers)
    finally:
        for proxy in slow:
            proxy.close()


# -- event loops closed without shutting down their async generators ----------------------------

CLOSED_LOOPS = 40


def test_loops_closed_without_shutdown_asyncgens_leave_nothing_behind(servers):
    """``new_event_loop()``, ``run_until_complete()``, ``close()``: the loop never runs the end that
    closes its connections, so the next loop's first connection closes them."""
    manager = AsyncLockManager(servers.urls, ttl=10.0, retry_count=0, node_timeout=0.5, restart_window=0)

    async def once(i):
        lock = await manager.acquire(f"closed-loop-{i}", blocking=False)
        await lock.release()

    def in_a_closed_loop(i):
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(once(i))
        finally:
            loop.close()  # no loop.shutdown_asyncgens()

    in_a_closed_loop(-1)
    gc.collect()
    files = open_files()
    for i in range(CLOSED_LOOPS):
        in_a_closed_loop(i)
    gc.collect()
    grown = open_files() - files
    ends = len(anodes._LOOP_ENDS)
    books = max(len(anode._pools) for anode in manager.anodes)
    # The last loop's connections stay until the next loop connects (or the manager is closed).
    assert grown <= 0 and ends <= 1 and books <= 1, (
        f"{CLOSED_LOOPS} closed loops: {grown} more files open, {ends} loop ends and {books} books per node kept"
    )


QUIET_EXIT = """
    import asyncio, gc, sys, warnings
    from django_redlock.core import AsyncLockManager

    warnings.simplefilter("always")
    mgr = AsyncLockManager(sys.argv[1:], ttl=5, retry_count=0, restart_window=0)

    async def main():
        async with await mgr.acquire("quiet-exit"):
            pass

    for _ in range(3):
        asyncio.run(main())  # each loop's end closes that loop's connections
    gc.collect()
"""


def test_connections_closed_at_a_loop_s_end_leave_no_resource_warning(servers):
    """The loop's end closes each connection's socket and tells redis-py so: neither redis-py nor
    asyncio warns of an unclosed connection when they are collected (three per loop, before)."""
    child = subprocess.run(
        [sys.executable, "-X", "dev", "-c", textwrap.dedent(QUIET_EXIT), *servers.urls],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert child.returncode == 0, child.stderr
    assert "ResourceWarning" not in child.stderr, child.stderr


async def test_paused_node_does_not_stall_and_loop_stays_free(servers):
    amanager = AsyncLockManager(servers.urls, **OPTIONS)
    await (await amanager.acquire("warm-up")).release()  # connections made before the fault
    servers[4].pause()
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.001)
            ticks += 1

    task = asyncio.ensure_future(ticker())
    worst = 0.0
    for i in range(20):
        started = time.monotonic()
        lock = await amanager.acquire(f"s{i}")
        await lock.release()
        worst = max(worst, time.monotonic() - started)
    task.cancel()
    await amanager.aclose()
    assert worst < 0.15
    assert ticks > 0  # the event loop kept running other tasks


async def test_connects_that_finished_while_the_loop_stalled_count(servers):
    """The loop stops for two node timeouts while a fresh manager connects (a long garbage
    collection): the connections were made meanwhile, so nodes are not written off."""
    mgr = AsyncLockManager(servers.urls, ttl=10.0, retry_count=0, restart_window=0)
    try:
        asyncio.get_running_loop().call_later(0, time.sleep, 0.05 * 2)  # runs once the connects began
        lock = await mgr.acquire("stalled-connect", blocking=False)  # was: "only 0 of 5 nodes answered"
        assert lock.locked()
        await lock.release()
    finally:
        await mgr.aclose()
