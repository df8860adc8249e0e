"""A lock won after waiting in line starts with the validity a fresh acquire gets.

Three callers take turns on one resource: each turn is won by a vote that
waited in line (``BLPOP``) for the previous holder's release. Its validity must
be ``ttl`` minus a round trip and the drift allowance, not minus the wait, and
never more than a quorum of nodes keeps the key.
"""

from __future__ import annotations

import asyncio
import threading
import time

import redis

from django_redlock.core import AsyncLockManager, Hooks, LockManager
from django_redlock.exceptions import LockLost

TTL = 0.2
#: How long each turn holds the lock (half the ttl).
HOLD = 0.1
CALLERS = 3
TURNS = 30
#: A turn enters with at least ``TTL - SLACK`` of validity (a fresh acquire: a round trip and the drift).
SLACK = 0.03
RESOURCE = "turns"


def kept_by_quorum(clients, quorum):
    """How long a quorum of nodes still keeps the lock key (the quorum-th longest PTTL, seconds)."""
    ttls = sorted((c.pttl(f"redlock:lock:{RESOURCE}") for c in clients), reverse=True)
    return ttls[quorum - 1] / 1000.0


class Turns(Hooks):
    """What each turn saw: the validity it was granted with, how long a quorum kept the key, losses."""

    def __init__(self, servers):
        self.clients = [redis.Redis.from_url(s.url, socket_timeout=2) for s in servers]
        self.quorum = len(servers) // 2 + 1
        self.granted: list[float] = []
        self.overstated: list[tuple[float, float]] = []
        #: Turns that lost the lock although they ended within the validity they entered with.
        self.failed: list[str] = []
        #: Turns that ran past the validity they entered with (this process stalled, or the validity was short).
        self.overran: list[str] = []
        self.mutex = threading.Lock()

    def acquired(self, lock) -> None:
        """The validity as the lock is handed out (a hook: the caller's own delays are not counted)."""
        with self.mutex:
            self.granted.append(lock.validity)

    def enter(self, lock) -> tuple[float, float]:
        """Check the turn's validity against the nodes; returns when it entered and the validity then."""
        entered = time.monotonic()
        validity = lock.validity
        # The PTTLs, read after ``entered``, plus the time since: an upper bound of what a quorum kept then.
        kept = kept_by_quorum(self.clients, self.quorum) + (time.monotonic() - entered) + 0.001
        if validity > kept:
            self.overstated.append((validity, kept))
        return entered, validity

    def turn_lost(self, entered: tuple[float, float], error: LockLost) -> None:
        """A turn ended in LockLost: a failure unless it ran past the validity it entered with."""
        ran, validity = time.monotonic() - entered[0], entered[1]
        what = f"{error} (entered with {validity * 1000:.0f} ms, ran {ran * 1000:.0f} ms)"
        (self.overran if ran > validity else self.failed).append(what)

    def check(self):
        for c in self.clients:
            c.close()
        assert len(self.granted) == TURNS
        assert not self.overstated, f"validity above what a quorum keeps: {self.overstated}"
        low = min(self.granted)
        assert low >= TTL - SLACK and not self.failed and len(self.overran) <= TURNS // 10, (
            f"{len(self.failed) + len(self.overran)} of {TURNS} turns lost the lock ({self.failed[:2]}; "
            f"{len(self.overran)} ran past their validity: {self.overran[:2]}); the lowest validity a turn was "
            f"granted with was {low * 1000:.0f} ms (ttl {TTL * 1000:.0f} ms); all (ms): "
            f"{sorted(round(v * 1000) for v in self.granted)}"
        )


def test_callers_taking_turns_enter_with_a_fresh_validity(servers):
    turns = Turns(servers)
    mgr = LockManager(servers.urls, ttl=TTL, node_timeout=0.05, restart_window=0, hooks=turns)
    start = threading.Barrier(CALLERS)

    def caller():
        start.wait()
        for _ in range(TURNS // CALLERS):
            entered = (time.monotonic(), 0.0)
            try:
                with mgr.lock(RESOURCE, timeout=5) as lock:
                    entered = turns.enter(lock)
                    time.sleep(max(0.0, entered[0] + HOLD - time.monotonic()))
            except LockLost as exc:
                turns.turn_lost(entered, exc)

    threads = [threading.Thread(target=caller) for _ in range(CALLERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    mgr.close()
    turns.check()


async def test_async_callers_taking_turns_enter_with_a_fresh_validity(servers):
    turns = Turns(servers)
    mgr = AsyncLockManager(servers.urls, ttl=TTL, node_timeout=0.05, restart_window=0, hooks=turns)

    async def caller():
        for _ in range(TURNS // CALLERS):
            entered = (time.monotonic(), 0.0)
            try:
                async with mgr.lock(RESOURCE, timeout=5) as lock:
                    entered = turns.enter(lock)
                    await asyncio.sleep(max(0.0, entered[0] + HOLD - time.monotonic()))
            except LockLost as exc:
                turns.turn_lost(entered, exc)

    await asyncio.wait_for(asyncio.gather(*(caller() for _ in range(CALLERS))), 30)
    await mgr.aclose()
    turns.check()
