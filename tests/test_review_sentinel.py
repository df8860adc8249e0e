"""Adversarial review of Sentinel nodes on real ``redis-server --sentinel`` processes: one Sentinel with
a stale view (as in a minority partition, where it cannot fail the master over and keeps naming the old
one) must not be enough for a process to follow that master, or two processes lock the same resource
on two different masters of one node."""

from __future__ import annotations

import pytest
import redis

from django_redlock.core import ledger
from django_redlock.exceptions import LockNotAcquired
from tests.sentinels import SentinelGroup


@pytest.fixture
def old_and_new():
    """Two masters of one service: ``old`` is named only by a lone Sentinel (the stale view), ``new``
    by the others."""
    ledger._HISTORIES.by_address.clear()
    old = SentinelGroup(1).start()
    new = SentinelGroup(2).start()
    yield old, new
    new.stop()
    old.stop()


def test_a_lone_stale_sentinel_does_not_make_a_second_holder(engine, servers, old_and_new):
    old, new = old_and_new
    a, b = servers[0], servers[1]
    # The same three Sentinels, listed in another order: X asks the stale one first, Y a current one.
    x_node = {"SENTINELS": [*old.addresses, *new.addresses], "SERVICE": "lockmaster"}
    y_node = {"SENTINELS": [*new.addresses, *old.addresses], "SERVICE": "lockmaster"}
    options = {"ttl": 10, "retry_count": 0, "restart_window": 0}
    x = engine.manager([a.url, b.url, x_node], **options)
    y = engine.manager([a.url, b.url, y_node], **options)
    key = x.key("split")
    with redis.Redis(port=b.port, socket_timeout=2) as raw_b:
        raw_b.set(key, "someone-else", px=60_000)  # B refuses X (another holder, gone right after)
        first = x.acquire("split")  # A and the old master: 2 of 3
        raw_b.delete(key)
    try:
        second = y.acquire("split", blocking=False)  # B and the new master: 2 of 3
    except LockNotAcquired:
        first.release()
        return
    both = first.locked() and second.locked()
    second.release()
    first.release()
    assert not both, "two holders of one lock: each followed another master of the same Sentinel node"


def test_no_call_hangs_while_every_sentinel_is_stopped(engine, servers):
    """Every Sentinel SIGSTOPped (connections accepted, nothing answered): the node does not vote and
    the lock is taken on the other two; the calls return."""
    import os
    import signal
    import threading

    ledger._HISTORIES.by_address.clear()
    group = SentinelGroup(3).start()
    try:
        mgr = engine.manager([servers[0].url, servers[1].url, group.spec()], ttl=5, restart_window=0)
        for process in group._sentinels:
            os.kill(process.pid, signal.SIGSTOP)
        outcome = []

        def work():
            lock = mgr.acquire("stopped-sentinels", auto_extend=True)
            lock.extend()
            lock.release()
            outcome.append("done")

        worker = threading.Thread(target=work, daemon=True)
        worker.start()
        worker.join(30)
        assert outcome == ["done"], "a call hung while every Sentinel was stopped"
    finally:
        for process in group._sentinels:
            os.kill(process.pid, signal.SIGCONT)
        group.stop()
