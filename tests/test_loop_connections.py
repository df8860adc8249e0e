"""Event loops that end leave no connections or memory behind.

Under a WSGI server Django runs each async view in an event loop of its own
(asgiref's ``async_to_sync`` calls ``asyncio.run``): a worker serving async
views starts and ends a loop per request.
"""

import asyncio
import gc
import os
import tracemalloc

import pytest
from asgiref.sync import async_to_sync

from django_redlock.core import AsyncLockManager

LOOPS = 40


def open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("run", ["asyncio.run", "async_to_sync"])
def test_loops_that_end_leave_no_connections_or_memory(servers, run):
    # A generous node timeout: each loop connects anew, and a busy host must not fail this test.
    manager = AsyncLockManager(servers.urls, ttl=10.0, retry_count=0, node_timeout=0.5, restart_window=0)

    async def once(i):
        lock = await manager.acquire(f"loop-{i}", blocking=False)
        await lock.release()

    def in_a_new_loop(i):
        if run == "asyncio.run":
            asyncio.run(once(i))
        else:
            async_to_sync(once)(i)

    in_a_new_loop(-1)
    gc.collect()
    files = open_files()
    tracemalloc.start()
    try:
        for i in range(LOOPS):
            in_a_new_loop(i)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    files = open_files() - files
    # One loop's connections and books take about 45 kB: a leak would be ~1.8 MB here.
    assert files <= len(servers) and grown < 300_000, (
        f"{LOOPS} ended loops left {files} files open and {grown / 1024:.0f} kB allocated"
    )


def test_loops_taking_turns_each_use_their_own_connections(servers):
    """Two threads, each with its own event loop, take turns on one manager: every fan-out finds
    its own loop's books, never the other loop's sockets."""
    import threading

    manager = AsyncLockManager(servers.urls, ttl=10.0, retry_count=0, node_timeout=0.5, restart_window=0)
    turns = [threading.Event(), threading.Event()]
    loops: list[asyncio.AbstractEventLoop] = [None, None]  # type: ignore[list-item]
    errors: list[BaseException] = []

    def worker(me: int) -> None:
        async def main() -> None:
            loops[me] = asyncio.get_running_loop()
            for i in range(20):
                assert turns[me].wait(10)
                turns[me].clear()
                try:
                    lock = await manager.acquire(f"turns-{me}-{i}", blocking=False)
                    await lock.release()
                    for anode in manager.anodes:
                        books = anode.books
                        conns = [conn for conn, _ in books.idle] + list(books.parked)
                        assert conns and all(conn.transport._loop is loops[me] for conn in conns)
                except BaseException as exc:  # noqa: BLE001 - reported by the test
                    errors.append(exc)
                turns[1 - me].set()

        asyncio.run(main())

    threads = [threading.Thread(target=worker, args=(me,)) for me in (0, 1)]
    for thread in threads:
        thread.start()
    turns[0].set()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    assert all(len(anode._pools) >= 1 for anode in manager.anodes)
