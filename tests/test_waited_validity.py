"""A lock won after waiting in line starts with the validity a fresh acquire gets.

Three callers take turns on one resource: each turn is won by a vote that
waited in line (``BLPOP``) for the previous holder's release. Its validity must
be ``ttl`` minus a round trip and the drift allowance, not minus the wait, and
never more than a quorum of nodes keeps the key.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import threading
import time

import pytest
import redis

from django_redlock.core import AsyncLockManager, Hooks, LockManager
from django_redlock.exceptions import LockLost, LockNotAcquired
from django_redlock.testing import RedisServer, RedisServers

from tests.conftest import eventually, eventually_async

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


# -- a step of the nodes' wall clocks while a caller waits in line ------------------------------

#: The lock's ttl, the ttl of the lock the caller waits behind, and the step (NTP, a resumed VM): longer
#: than that ttl, so the lock ahead expires on the stepped nodes at once.
STEP_TTL, AHEAD_TTL, STEP = 2.0, 0.4, 0.6
#: How far a validity may sit above what the nodes keep on a loaded machine (a reply's trip back);
#: crediting the step overstated it by about STEP.
STEP_SLACK = 0.05


@pytest.fixture(scope="module")
def stepped(tmp_path_factory):
    """Three nodes whose wall clocks a test can step: ``(servers, step(seconds, nodes))``.

    redis-server runs with tests/clockshift.c preloaded (built here with gcc); each node reads
    its step from its own file.
    """
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is needed to build the clock-step shim (tests/clockshift.c)")
    where = tmp_path_factory.mktemp("clockshift")
    shim = where / "clockshift.so"
    source = os.path.join(os.path.dirname(__file__), "clockshift.c")
    subprocess.run([gcc, "-shared", "-fPIC", "-O1", "-o", str(shim), source, "-ldl"], check=True)
    files = [where / f"step-{i}" for i in range(3)]
    group = RedisServers(0)
    try:
        for file in files:
            file.write_text("0")
            with pytest.MonkeyPatch.context() as env:
                env.setenv("LD_PRELOAD", str(shim))
                env.setenv("REDLOCK_CLOCK_STEP_FILE", str(file))
                group.append(RedisServer().start())

        def step(seconds, nodes):
            for i in nodes:
                files[i].write_text(repr(seconds))

        yield group, step
    finally:
        group.stop()


def blocked_in_line(servers, nodes):
    """True once each of ``nodes`` has a client blocked in BLPOP (the caller waits in line there)."""
    for i in nodes:
        with redis.Redis.from_url(servers[i].url, socket_timeout=2) as c:
            if not any("b" in client["flags"] for client in c.client_list()):
                return False
    return True


def kept_by_quorum_of(servers, resource):
    """Seconds a quorum of ``servers`` keeps ``resource``'s lock key (the quorum-th longest PTTL)."""
    ttls = []
    for s in servers:
        with redis.Redis.from_url(s.url, socket_timeout=2) as c:
            ttls.append(c.pttl(f"redlock:lock:{resource}"))
    return sorted(ttls, reverse=True)[len(servers) // 2] / 1000.0


def check_stepped_entry(servers, validity, entered):
    kept = kept_by_quorum_of(servers, "stepped") + (time.monotonic() - entered)
    assert validity <= min(kept, STEP_TTL) + STEP_SLACK, (
        f"the caller entered with {validity:.3f} s of validity (ttl {STEP_TTL} s) but a quorum of nodes keeps "
        f"its key {kept:.3f} s: the {STEP} s step during its wait in line was counted as waiting"
    )


def check_second_holder(validity_then):
    assert validity_then <= STEP_SLACK, (
        f"another caller acquired the lock while the one that waited in line still had {validity_then:.3f} s"
    )


@pytest.fixture
def step_nodes(stepped):
    servers, step = stepped
    for s in servers:
        s.flushall()
    yield servers, step
    step(0, range(len(servers)))


def test_a_clock_step_during_the_wait_is_not_counted_as_waiting(step_nodes):
    servers, step = step_nodes
    managers = [LockManager(servers.urls, ttl=STEP_TTL, restart_window=0, node_timeout=0.05) for _ in range(3)]
    ahead, waiter, other = managers
    try:
        ahead.acquire("stepped", ttl=AHEAD_TTL, blocking=False)
        won = {}

        def wait_in_line():
            lock = waiter.acquire("stepped", timeout=10)
            won.update(entered=time.monotonic(), validity=lock.validity, lock=lock)

        thread = threading.Thread(target=wait_in_line)
        thread.start()
        eventually(lambda: blocked_in_line(servers, (0, 1)))
        step(STEP, (0, 1))  # a quorum's clocks jump ahead: the key ahead of the caller expires there
        thread.join(10)
        check_stepped_entry(servers, won["validity"], won["entered"])

        def second():
            try:
                return other.acquire("stepped", blocking=False)
            except LockNotAcquired:
                return None

        eventually(second, seconds=STEP_TTL + 2)
        check_second_holder(won["lock"].validity)
    finally:
        for m in managers:
            m.close()


async def test_async_a_clock_step_during_the_wait_is_not_counted_as_waiting(step_nodes):
    servers, step = step_nodes
    managers = [AsyncLockManager(servers.urls, ttl=STEP_TTL, restart_window=0, node_timeout=0.05) for _ in range(3)]
    ahead, waiter, other = managers
    try:
        await ahead.acquire("stepped", ttl=AHEAD_TTL, blocking=False)
        task = asyncio.create_task(waiter.acquire("stepped", timeout=10))
        await eventually_async(lambda: blocked_in_line(servers, (0, 1)))
        step(STEP, (0, 1))
        lock = await asyncio.wait_for(task, 10)
        check_stepped_entry(servers, lock.validity, time.monotonic())
        deadline = time.monotonic() + STEP_TTL + 2
        while True:
            try:
                await other.acquire("stepped", blocking=False)
                break
            except LockNotAcquired:
                assert time.monotonic() < deadline, "the lock was never free again"
                await asyncio.sleep(0.02)
        check_second_holder(lock.validity)
    finally:
        for m in managers:
            await m.aclose()
