"""Release debts owed to a node that stays down: bounded in count and memory, on real servers.

A release that a node did not confirm is owed to it and paid with the next
command written there, until the key has surely expired. While the node stays
down nothing is written to it, so the debts that expire must be dropped
without a write, and a cap bounds the rest.
"""

from __future__ import annotations

import threading
import time
import tracemalloc

import redis

from django_redlock.core import AsyncLockManager, LockManager, clock, steps
from django_redlock.core.base import ManagerConfig
from django_redlock.core.books import NEW, PARKED, ConnState, NodeBooks
from django_redlock.core.rounds import Round
from tests.conftest import eventually, eventually_async
from tests.proxy import Proxy

BATCH = 1000
BATCHES = 5


def _released(manager, start, count):
    for n in range(start, start + count):
        manager.acquire(f"debt-{n}", ttl=0.1).release()


async def _released_async(manager, start, count):
    for n in range(start, start + count):
        await (await manager.acquire(f"debt-{n}", ttl=0.1)).release()


def _ledger_memory(snapshot, ledger_file):
    return sum(stat.size for stat in snapshot.statistics("filename") if stat.traceback[0].filename == ledger_file)


def _expired(ledger):
    """True once every debt on ``ledger`` is past the time its key has surely expired."""
    latest = max((debt.until for debt in ledger.debts.values()), default=0.0)
    return clock.now() > latest


def test_debts_to_a_node_that_stays_down_expire_without_a_write(servers):
    """5,000 releases (ttl 0.1 s, longest ttl 0.5 s) while one node is killed: the debts of each batch are dropped once their
    keys have surely expired, without any command written to that node (it is down), and their memory with them."""
    from django_redlock.core import ledger as ledger_module

    servers[4].kill()
    manager = LockManager(servers.urls, ttl=0.1, max_ttl=0.5, retry_count=3, node_timeout=0.05, restart_window=0)
    ledger = manager.node_list[4].books.ledger
    counts, sizes = [], []
    tracemalloc.start()
    try:
        for batch in range(BATCHES):
            _released(manager, batch * BATCH, BATCH)
            counts.append(len(ledger.debts))
            sizes.append(_ledger_memory(tracemalloc.take_snapshot(), ledger_module.__file__))
            eventually(lambda: _expired(ledger), seconds=10)  # this batch's keys have surely expired
    finally:
        tracemalloc.stop()
        manager.close()
    assert counts[0] >= BATCH // 2, counts  # the releases were owed there at all
    # Each batch finds the last one's debts expired: they go, though nothing reached the node.
    assert max(counts) <= BATCH + BATCH // 10, (counts, sizes)
    assert max(sizes) <= 2 * sizes[0] + 50_000, sizes


async def test_async_debts_to_a_node_that_stays_down_expire_without_a_write(servers):
    servers[4].kill()
    manager = AsyncLockManager(servers.urls, ttl=0.1, max_ttl=0.5, retry_count=3, node_timeout=0.05, restart_window=0)
    counts = []
    try:
        for batch in range(3):
            await _released_async(manager, batch * BATCH, BATCH)
            ledger = manager.anodes[4].books.ledger
            counts.append(len(ledger.debts))
            await eventually_async(lambda: _expired(ledger), seconds=10)
    finally:
        await manager.aclose()
    assert counts[0] >= BATCH // 2, counts
    assert max(counts) <= BATCH + BATCH // 10, counts


def test_debts_past_the_cap_drop_the_oldest(servers):
    """Past the cap the oldest debt goes (its key, if the node holds it, still expires by its ttl); the newest
    are kept, and paid once the node is back."""
    servers[4].kill()
    manager = LockManager(servers.urls, ttl=10.0, retry_count=3, node_timeout=0.05, restart_window=0)
    try:
        ledger = manager.node_list[4].books.ledger
        ledger.max_debts = 100
        values = []
        for n in range(300):
            lock = manager.acquire(f"capped-{n}")
            values.append(lock.value)
            lock.release()
            assert len(ledger.debts) <= 100
        assert [value for _, value in ledger.debts] == values[-100:]
        servers[4].restart()
        # Paid with the next commands written there (a few a write); "after"'s own may still be in flight.
        def paid():
            manager.acquire("after").release()
            return all("after" in key for key, _ in ledger.debts)

        eventually(paid, show=lambda: list(ledger.debts)[:3])
    finally:
        manager.close()


def test_a_release_behind_a_vote_another_thread_holds_stays_owed_until_it_runs_after_the_vote(servers):
    """The vote's connection is in another thread's round when the release is written, so the release goes
    on a new connection and reaches the node first (0: no key yet); the vote lands after it and its OK is
    read before the release's 0. That 0 proves nothing: the debt must stay, and be paid after the vote."""
    with Proxy(servers[4].port) as proxy:
        urls = servers.urls[:4] + [proxy.url]
        manager = LockManager(urls, ttl=30.0, retry_count=0, node_timeout=1.0, restart_window=0)
        node = manager.node_list[4]
        try:
            proxy.hold_requests()
            lock = manager.acquire("r")  # a quorum without node 4: its vote is held, unanswered
            other = threading.Thread(target=manager.is_locked, args=("x",))
            other.start()  # its round takes the vote's connection (replies in flight), queues behind the vote
            proxy.wait_held(lambda held: b"PTTL" in held)
            assert not node.books.parked  # that connection is out, in the other thread's round
            proxy.pass_requests()  # new connections go through; the vote's stays held
            proxy.hold_replies()
            lock.release()  # on a new connection: runs on node 4 before the vote, and its 0 is held
            proxy.wait_held(lambda held: held.startswith(b":0"), replies=True)
            proxy.pass_replies()
            proxy.flush_requests()  # the vote lands now: node 4 holds the key; its OK is read first
            other.join(10)
            assert not other.is_alive()
            key = redis.Redis(port=servers[4].port)
            assert key.get("redlock:lock:r") == lock.value.encode()
            proxy.flush_replies()  # then the release's 0

            def gone():
                manager.is_locked("y")  # the next commands to node 4 pay what is still owed
                return key.get("redlock:lock:r") is None

            eventually(gone, show=lambda: (key.pttl("redlock:lock:r"), list(node.books.ledger.debts)))
        finally:
            manager.close()


def test_the_same_interleaving_replayed_on_the_core():
    """The interleaving above, step by step on the core's own books (no I/O): the vote's connection is taken by
    another round, the release goes on a new one, and the vote's OK is read before the release's 0."""
    books = NodeBooks("n", node_timeout=0.05)
    key, value = "redlock:lock:r", "v1"
    vote = Round([books], steps.Fan([("SET", key, value, "NX", "PX", 30000)]), now=0.0, timeout=0.05)
    assert vote.open(0, 0.0, lambda conn, idle_for: True) == NEW
    voted = ConnState()
    vote.write(0, voted, 0.0)
    vote.written(0, voted, None, 0.0)
    for i, conn in vote.finish(0.001):  # the round ended at a quorum without this node's reply
        books.checkin(conn, vote.sent_at, 0.001)
    assert books.choose(None, True, 0.002)[:2] == (PARKED, voted)  # another round queues behind the vote
    fan = steps.release_fan(ManagerConfig(), 1, ["r"], value, quorum=1)
    release = Round([books], fan, now=0.003, timeout=0.05)
    # The vote's connection is out: the release cannot queue behind it.
    assert release.open(0, 0.003, lambda conn, idle_for: True) == NEW
    released = ConnState()
    release.write(0, released, 0.003)
    books.book(voted, b"OK", 0.004)  # the vote ran after the release on the node...
    books.book(released, 0, 0.005)  # ...whose 0 is read last
    assert (key, value) in books.ledger.debts  # still owed: that 0 proves nothing
    release.finish(0.006)  # the release round is over: its debt is due as any other
    ping = Round([books], steps.Fan([("PING",)]), now=0.1, timeout=0.05)
    later = ConnState()
    sent = ping.write(0, later, 0.1)  # the next command written to the node pays it, after the vote
    assert [c[0] for c in sent] == ["EVAL", "PING"]
    books.book(later, 1, 0.101)
    assert not books.ledger.debts


def test_a_vote_sent_again_after_noscript_stays_in_flight_for_a_release_on_another_connection(servers):
    """Node 4 forgot its scripts (SCRIPT FLUSH): the vote's EVALSHA is answered NOSCRIPT and the vote goes
    again as EVAL, which the network holds. Another thread's round takes that connection, so the release goes
    on a new one, runs on node 4 before the vote and answers 0. The vote sent again is still in flight: that
    0 proves nothing, and the debt must stay until it is paid after the vote (else the key stays for its ttl)."""
    resources = ["r", "s"]  # a vote on several resources runs the ACQUIRE script (EVALSHA)
    with Proxy(servers[4].port) as proxy:
        # A long node timeout: the other thread's round must find the vote's connection with its reply due
        # for less than a quarter of it (else it opens a new one), however slow the host.
        manager = LockManager(servers.urls[:4] + [proxy.url], ttl=30.0, retry_count=0, node_timeout=4.0,
                              restart_window=0)
        node = manager.node_list[4]
        key = redis.Redis(port=servers[4].port)
        try:
            manager.acquire(resources).release()  # node 4's connection has sent the scripts
            key.script_flush()
            servers[2].pause()  # nodes 2 and 3 answer nothing: the round needs node 4's reply,
            servers[3].pause()  # so its NOSCRIPT is read while the round waits and the vote goes again
            proxy.hold_connection_from(b"$4\r\nEVAL\r\n")
            acquired = []
            voter = threading.Thread(target=lambda: acquired.append(manager.acquire(resources)))
            voter.start()
            proxy.wait_held(lambda held: b"EVAL" in held)  # the vote sent again is held
            servers[2].resume()  # its vote makes the quorum (nodes 0, 1, 2)
            voter.join(10)
            lock = acquired[0]
            other = threading.Thread(target=manager.is_locked, args=("x",))
            other.start()  # its round takes the vote's connection (a reply in flight) and queues behind it
            proxy.wait_held(lambda held: b"PTTL" in held)
            assert not node.books.parked  # that connection is out, in the other thread's round
            proxy.hold_replies()
            lock.release()  # on a new connection: runs on node 4 before the vote sent again (0)
            proxy.wait_held(lambda held: held.startswith(b":0"), replies=True)
            proxy.pass_replies()
            servers[3].resume()
            proxy.flush_requests()  # the vote lands now: node 4 holds the key
            other.join(10)
            assert not other.is_alive()
            assert key.get("redlock:lock:r") == lock.value.encode()
            proxy.flush_replies()  # then the release's 0

            def gone():
                manager.is_locked("y")  # the next commands to node 4 pay what is still owed
                return key.get("redlock:lock:r") is None

            # Paid once a node timeout has passed since the release was written.
            eventually(gone, seconds=15, show=lambda: (key.pttl("redlock:lock:r"), list(node.books.ledger.debts)))
        finally:
            for server in servers:
                if server.paused:
                    server.resume()
            manager.close()


def test_the_noscript_interleaving_replayed_on_the_core():
    """The NOSCRIPT case above on the core's books: while the vote sent again is unanswered, it counts as in
    flight, so a release on another connection is not ordered after it and its 0 settles nothing."""
    from redis.exceptions import NoScriptError

    from django_redlock.core.scripts import ACQUIRE

    books = NodeBooks("n", node_timeout=0.05)
    config = ManagerConfig()
    key, value = config.key("r"), "v1"
    vote_command = ("EVALSHA", ACQUIRE.sha, 3, key, "q", "p", value, 30000, "once", "", 0, 0, "w")
    vote = Round([books], steps.Fan([vote_command], script=ACQUIRE), now=0.0, timeout=0.05)
    voted = ConnState()
    voted.scripts.add(ACQUIRE.sha)  # it sent the script before: the vote goes as EVALSHA
    assert vote.write(0, voted, 0.0)[0][0] == "EVALSHA"
    vote.written(0, voted, None, 0.0)
    _, resend = books.book(voted, NoScriptError("NOSCRIPT No matching script."), 0.001, vote)
    assert resend is not None and resend[0] == "EVAL"  # the vote goes again: in flight
    assert books.ledger.unanswered == {(key, value): 1}
    for _, conn in vote.finish(0.002):
        books.checkin(conn, vote.sent_at, 0.002)
    assert books.choose(None, True, 0.003)[:2] == (PARKED, voted)  # another round queues behind it
    fan = steps.release_fan(config, 1, ["r"], value, quorum=1)
    release = Round([books], fan, now=0.004, timeout=0.05)
    released = ConnState()
    release.write(0, released, 0.004)  # on a new connection
    books.book(released, 0, 0.005)  # ran on the node before the vote sent again
    assert (key, value) in books.ledger.debts  # that 0 proves nothing
    books.book(voted, b"OK", 0.006)
    assert not books.ledger.unanswered
