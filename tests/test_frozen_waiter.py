"""A waiter frozen in line (SIGSTOP while its BLPOP is pending) holds up the line only briefly.

A frozen host, VM or container leaves its connections open: its wait in line stays pending on
every node, and a release wakes it and runs its vote there. The lock it is granted that way
lives only the provisional ttl until its winner, once it has read the grant, extends it; a
winner that never reads it holds up the next waiter for that long, not for the whole ttl.
Whether each waiter is in line, and blocked in its wait, is read on the nodes (``CLIENT LIST``,
the places zset), never guessed with a sleep.
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
from django_redlock.core.base import PROVISIONAL_TTL, WAIT_SLICE
from django_redlock.core.records import Holder
from tests.conftest import eventually

RESOURCE = "frozen-line"
TTL = 5.0


def _on_nodes(servers, read):
    """``read(client)`` on each node, through a connection closed afterwards."""
    out = []
    for server in servers:
        with redis.Redis.from_url(server.url, socket_timeout=2) as client:
            out.append(read(client))
    return out


def _blocked(servers):
    """How many connections wait in a BLPOP on each node."""
    return _on_nodes(
        servers, lambda c: sum(1 for x in c.client_list() if x.get("cmd") == "blpop" and "b" in x.get("flags", ""))
    )


def _places(servers):
    return _on_nodes(servers, lambda c: c.zcard(f"redlock:places:{RESOURCE}"))


def _holders(servers):
    """The pid of the holder on each node that stores the lock key."""
    return [Holder.decode(v).pid for v in _on_nodes(servers, lambda c: c.get(f"redlock:lock:{RESOURCE}")) if v]


def _wait_in_line(urls, kind, resources, report):
    """The waiter that freezes: a blocking acquire in its own process (stopped while it waits, then
    let go); it reports when it got the lock (``time.monotonic()``, the same clock in every process)
    and with how much validity."""
    if kind == "sync":
        lock = LockManager(urls, ttl=TTL, restart_window=0).acquire(resources, timeout=60)
        report.send((time.monotonic(), lock.validity))  # at once: no feeder thread
        lock.release()
    else:

        async def wait() -> None:
            lock = await AsyncLockManager(urls, ttl=TTL, restart_window=0).acquire(resources, timeout=60)
            report.send((time.monotonic(), lock.validity))  # at once: no feeder thread
            await lock.release()

        asyncio.run(wait())
    os._exit(0)


@pytest.mark.parametrize("resources", [[RESOURCE], [RESOURCE, "frozen-other"]], ids=["one", "several"])
def test_a_waiter_frozen_in_line_holds_up_the_next_one_briefly(servers, engine, resources):
    """The frozen waiter locks ``resources`` (one, or several at once); the next waiter the first one."""
    holder = LockManager(servers.urls, ttl=TTL, restart_window=0)
    mgr = engine.manager(servers.urls, ttl=TTL, restart_window=0)
    held = holder.acquire(RESOURCE)
    ctx = multiprocessing.get_context("spawn")  # the test process has threads: no fork
    reports, report = ctx.Pipe(duplex=False)
    frozen = ctx.Process(target=_wait_in_line, args=(servers.urls, engine.kind, resources, report))
    frozen.start()
    got: dict[str, float] = {}
    let_go = threading.Event()
    waiter = None
    try:
        eventually(lambda: _blocked(servers) == [1] * 5, 20, show=lambda: _blocked(servers))

        def next_in_line() -> None:
            lock = mgr.acquire(RESOURCE, timeout=30)
            got["at"] = time.monotonic()
            got["validity"] = lock.validity
            let_go.wait(30)
            got["released"] = time.monotonic()
            lock.release()

        waiter = threading.Thread(target=next_in_line)
        waiter.start()
        eventually(lambda: _places(servers) == [2] * 5 and _blocked(servers) == [2] * 5, show=lambda: _blocked(servers))
        # Freeze the first waiter while its BLPOP is pending on every node: stopped, then seen blocked
        # (its connections stay open). Its wait ends every slice; catch it inside one.
        while True:
            os.kill(frozen.pid, signal.SIGSTOP)
            if _blocked(servers) == [2] * 5:
                break
            os.kill(frozen.pid, signal.SIGCONT)
            eventually(lambda: _blocked(servers) == [2] * 5, show=lambda: _blocked(servers))
        released_at = time.monotonic()
        held.release()  # wakes the frozen waiter, first in line: its vote runs on every node
        owners = eventually(lambda: _holders(servers))
        assert owners.count(frozen.pid) >= 3, "the frozen waiter was not granted the lock"
        eventually(lambda: "at" in got, 30)
        waited = got["at"] - released_at
        # Held up by the grant nobody confirms (PROVISIONAL_TTL), then noticed at the next waiter's next
        # vote (a slice and a server tick), plus slack for a busy host.
        assert waited <= PROVISIONAL_TTL + WAIT_SLICE + 0.5, f"the next waiter got in {waited:.2f} s after the release"
        assert got["validity"] > TTL / 2  # it holds a lock of the full ttl, not a provisional one
        # The frozen waiter wakes up and reads its grant, long lapsed: it must not take the lock for
        # its own. It goes back to its place in line (first: its ticket is the older), and gets the
        # lock once the next waiter releases it.
        os.kill(frozen.pid, signal.SIGCONT)
        eventually(lambda: reports.poll() or _places(servers) == [1] * 5, show=lambda: _places(servers))
        let_go.set()
        waiter.join(30)
        assert reports.poll(30), "the waiter that read its grant late never got the lock"
        late_at, late_validity = reports.recv()
        assert late_at > got["released"], "the waiter that read its grant late held the lock with the next one"
        assert late_validity > TTL / 2
    finally:
        let_go.set()
        os.kill(frozen.pid, signal.SIGKILL)  # stopped or not
        frozen.join(5)
        if waiter is not None:
            waiter.join(30)
        holder.close()
