"""A lock held alone is never reported lost at its release because of its own release debt, on real servers.

Threads (or tasks) of one process share the nodes' books, and with them the release debts. A release round
owes its release to every node before it writes there; if the round is held up between two writes (the
GIL, a busy CPU, a slow connect) and another thread writes to the nodes meanwhile, that thread must not
carry the debt ahead of the round's own release: the key would be deleted first, and the release would
read "not ours" on enough nodes to call the lock lost, although nobody else ever held it.

The holder's round is held at one point (``Node.checkout`` of a node, ``AsyncNode.connect``), by an event,
while the other thread or task runs; nothing here waits on a sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

import redis

from django_redlock.core import AsyncLockManager, LockManager, clock, entries
from django_redlock.exceptions import LockError, LockLost
from tests.conftest import eventually, eventually_async

NODE_TIMEOUT = 0.2


def _due(books, key):
    """True once every debt owed on ``key`` is past the node timeout: another write would carry it."""
    debts = [debt for (k, _), debt in list(books.ledger.debts.items()) if k == key]
    return bool(debts) and all(clock.now() >= debt.paid_at + NODE_TIMEOUT for debt in debts)


def _left_on(servers, key):
    return [i for i, server in enumerate(servers) if redis.Redis(port=server.port).exists(key)]


def test_a_release_held_up_between_its_writes_is_not_raced_by_its_own_debt(servers):
    """The holder's release wrote to nodes 0 and 1 and is held up before node 2 for longer than the node
    timeout; another thread of the process writes to every node meanwhile. Its writes must not carry the
    holder's debt: the holder's own release then deletes the key on nodes 2-4, and its exit reports no loss."""
    manager = LockManager(servers.urls, ttl=30.0, retry_count=0, node_timeout=NODE_TIMEOUT, restart_window=0)
    key = manager.key("r")
    node = manager.node_list[2]
    real_checkout = node.checkout
    holding, reached, go = threading.Event(), threading.Event(), threading.Event()
    outcome: list[BaseException | None] = []

    def checkout(rnd, i, now, pid=None):
        if rnd.kind == entries.RELEASE and threading.current_thread() is holder and not reached.is_set():
            reached.set()  # nodes 0 and 1 have the release; nodes 2-4 not yet
            go.wait(10)
        return real_checkout(rnd, i, now, pid)

    def hold():
        try:
            with manager.lock("r"):
                holding.set()
        except LockLost as exc:
            outcome.append(exc)
        else:
            outcome.append(None)

    node.checkout = checkout
    holder = threading.Thread(target=hold)
    try:
        holder.start()
        assert reached.wait(10)
        eventually(lambda: _due(node.books, key))
        with contextlib.suppress(LockError):  # its answer does not matter, its writes do
            manager.is_locked("x")  # another thread of the worker writes to every node
        go.set()
        holder.join(10)
        assert not holder.is_alive()
        assert holding.is_set() and outcome == [None], outcome
        assert _left_on(servers, key) == []
    finally:
        go.set()
        manager.close()


async def test_an_async_release_held_up_in_its_connects_is_not_raced_by_its_own_debt(servers):
    """The asyncio twin: the holder's release wrote to nodes 0 and 1 and waits for new connections to
    nodes 2-4 (the server closed the idle ones) for longer than the node timeout; another task of the loop
    writes to every node meanwhile. It must not carry the holder's debt; the holder's exit reports no loss."""
    import contextvars

    manager = AsyncLockManager(servers.urls, ttl=30.0, retry_count=0, node_timeout=NODE_TIMEOUT, restart_window=0)
    key = manager.key("r")
    in_holder: contextvars.ContextVar[bool] = contextvars.ContextVar("in_holder", default=False)
    holding, killed, reached, go = asyncio.Event(), asyncio.Event(), asyncio.Event(), asyncio.Event()
    outcome: list[BaseException | None] = []

    def gated(anode):
        real_connect = anode.connect

        async def connect(books):
            if in_holder.get() and killed.is_set():  # the holder's release (connects run in copies of its context)
                reached.set()
                await go.wait()
            return await real_connect(books)

        return connect

    async def hold():
        in_holder.set(True)
        try:
            async with manager.lock("r"):
                holding.set()
                await killed.wait()
        except LockLost as exc:
            outcome.append(exc)
        else:
            outcome.append(None)

    for anode in manager.anodes[2:]:
        anode.connect = gated(anode)
    holder = asyncio.ensure_future(hold())
    try:
        await asyncio.wait_for(holding.wait(), 10)
        for server in servers[2:]:
            redis.Redis(port=server.port).client_kill_filter(_type="normal", skipme=True)
        await eventually_async(lambda: not any(anode.books.idle for anode in manager.anodes[2:]))
        killed.set()  # the holder releases: nodes 0 and 1 at once, nodes 2-4 once connected
        await asyncio.wait_for(reached.wait(), 10)
        await eventually_async(lambda: _due(manager.anodes[2].books, key))
        with contextlib.suppress(LockError):
            await manager.is_locked("x")  # another task of the loop writes to every node
        go.set()
        await asyncio.wait_for(holder, 10)
        assert outcome == [None], outcome
        assert _left_on(servers, key) == []
    finally:
        go.set()
        await manager.aclose()
