"""Fault-injection ("torture") runs on five real masters.

Worker processes contend for one resource and do a non-atomic
read-modify-write on a separate referee Redis inside the critical section,
while the controller kills a node, pauses one, restarts a killed node empty,
and takes the majority away and gives it back. Afterwards the run is checked:

- no two critical sections overlap, and the referee counter is exact;
- fencing tokens strictly increase in acquisition order;
- no acquire call outlives its timeout (plus a small margin);
- every phase with a majority up makes progress, none without one does;
- how long the lock takes to be usable again after the majority returns.

The short run is part of the normal suite; ``make torture`` runs it for
``REDLOCK_TORTURE_SECONDS`` (default 120) and prints the report.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time

import pytest
import redis

from django_redlock.core import LockManager
from django_redlock.exceptions import LockError, LockLost
from django_redlock.testing import RedisServer, RedisServers

WORKERS = 6
TTL = 1.0
ACQUIRE_TIMEOUT = 0.5
CALL_MARGIN = 0.3  # allowed on top of the timeout: one retry pause plus node timeouts

FENCED_WRITE = """
local stored = tonumber(redis.call('get', KEYS[1]) or '0')
if tonumber(ARGV[1]) <= stored then return 0 end
redis.call('set', KEYS[1], ARGV[1])
return 1
"""


def torture_worker(urls, referee_url, seconds, barrier, out):
    mgr = LockManager(urls, ttl=TTL, max_ttl=TTL, retry_delay=0.02, retry_jitter=0.02)
    referee = redis.Redis.from_url(referee_url)
    barrier.wait(60)
    stop_at = time.monotonic() + seconds
    sections, calls = [], []
    while time.monotonic() < stop_at:
        started = time.monotonic()
        try:
            lock = mgr.acquire("torture", timeout=ACQUIRE_TIMEOUT)
        except LockError:
            calls.append((started, time.monotonic(), False))
            continue
        calls.append((started, time.monotonic(), True))
        try:
            token = lock.fencing_token
        except LockLost:
            lock.release()
            continue
        begin = time.monotonic()
        value = int(referee.get("counter") or 0)
        time.sleep(0.002)
        referee.set("counter", value + 1)
        end = time.monotonic()
        valid = lock.locked()
        lock.release()
        sections.append((begin, end, token, valid, os.getpid()))
    out.put({"sections": sections, "calls": calls})
    mgr.close()


def wait_old_enough(urls, seconds):
    deadline = time.monotonic() + 15
    mgr = LockManager(urls, ttl=TTL, max_ttl=TTL)
    while time.monotonic() < deadline:
        uptimes = [s.uptime or 0 for s in mgr.node_status()]
        if min(uptimes) > seconds:
            break
        time.sleep(0.1)
    mgr.close()


def run_torture(phase_seconds: float) -> dict:
    with RedisServers(5) as nodes:
        referee = RedisServer().start()
        wait_old_enough(nodes.urls, TTL + 0.2)  # fresh nodes sit out for the longest ttl
        phases: list[tuple[str, float, float, bool]] = []
        ctx = multiprocessing.get_context("spawn")
        barrier = ctx.Barrier(WORKERS + 1)
        out = ctx.Queue()
        total = phase_seconds * 6 + TTL + 1.0
        procs = [
            ctx.Process(target=torture_worker, args=(nodes.urls, referee.url, total, barrier, out))
            for _ in range(WORKERS)
        ]
        try:
            for proc in procs:
                proc.start()
            barrier.wait(60)

            def phase(name, majority_up=True):
                start = time.monotonic()
                time.sleep(phase_seconds)
                phases.append((name, start, time.monotonic(), majority_up))

            phase("healthy")
            nodes[0].kill()
            phase("node 0 killed")
            nodes[1].pause()
            phase("node 0 killed, node 1 paused")
            nodes[1].resume()
            time.sleep(TTL)  # delayed restart: bring node 0 back only after the max ttl
            nodes[0].start()
            phase("node 0 restarted empty")
            for i in (2, 3, 4):
                nodes[i].pause()
            majority_gone = time.monotonic()
            phase("majority paused", majority_up=False)
            for i in (2, 3, 4):
                nodes[i].resume(wait=False)
            back = time.monotonic()
            phase("majority back")
            results = [out.get(timeout=total + 60) for _ in procs]
            for proc in procs:
                proc.join(10)
            counter = int(redis.Redis.from_url(referee.url).get("counter") or 0)
        finally:
            for proc in procs:
                if proc.is_alive():
                    proc.kill()
            referee.stop()
    sections = sorted(s for r in results for s in r["sections"])
    calls = [c for r in results for c in r["calls"]]
    overlaps = sum(1 for a, b in zip(sections, sections[1:]) if a[1] > b[0])
    order_violations = sum(1 for a, b in zip(sections, sections[1:]) if a[2] >= b[2])
    longest_call = max((end - start for start, end, _ in calls), default=0.0)
    per_phase = {
        name: sum(1 for s in sections if start <= s[0] < end) for name, start, end, _ in phases
    }
    # Acquired during the majority's absence (after locks taken before it had expired).
    during_outage = sum(1 for s in sections if majority_gone + TTL < s[0] < back)
    after = [s[0] for s in sections if s[0] >= back]
    report = {
        "workers": WORKERS,
        "sections": len(sections),
        "counter": counter,
        "overlaps": overlaps,
        "fencing_order_violations": order_violations,
        "invalid_at_end": sum(1 for s in sections if not s[3]),
        "acquire_calls": len(calls),
        "longest_acquire_call_s": round(longest_call, 3),
        "sections_per_phase": per_phase,
        "sections_while_majority_gone": during_outage,
        "recovery_s": round(min(after) - back, 3) if after else None,
        "winning_processes": len({s[4] for s in sections}),
    }
    return report


def check(report: dict) -> None:
    assert report["overlaps"] == 0, report
    assert report["fencing_order_violations"] == 0, report
    assert report["counter"] == report["sections"], report
    assert report["invalid_at_end"] == 0, report
    assert report["longest_acquire_call_s"] <= ACQUIRE_TIMEOUT + CALL_MARGIN, report
    assert report["sections_while_majority_gone"] == 0, report
    for name, count in report["sections_per_phase"].items():
        if name != "majority paused":
            assert count > 0, f"no progress in phase {name!r}: {report}"
    assert report["recovery_s"] is not None and report["recovery_s"] < 2.0, report


def test_torture_short():
    report = run_torture(phase_seconds=1.5)
    print(json.dumps(report, indent=2))
    check(report)


@pytest.mark.torture
def test_torture_long():
    seconds = float(os.environ.get("REDLOCK_TORTURE_SECONDS", "120"))
    report = run_torture(phase_seconds=seconds / 6)
    print(json.dumps(report, indent=2))
    check(report)


# -- a paused client ---------------------------------------------------------------


def paused_holder(urls, referee_url, ready, result):
    mgr = LockManager(urls, ttl=0.5, restart_window=0)
    referee = redis.Redis.from_url(referee_url)
    write = referee.register_script(FENCED_WRITE)
    lock = mgr.acquire("gc-pause")
    token = lock.fencing_token
    ready.set()
    os.kill(os.getpid(), signal.SIGSTOP)  # a long GC pause, as the critique describes
    try:
        lock.extend()
        extended = True
    except LockLost:
        extended = False
    accepted = write(keys=["fenced-value"], args=[token])
    result.put({"extended": extended, "accepted": bool(accepted), "token": token})


def test_paused_client_loses_lock_and_its_fenced_write_is_rejected(servers):
    referee = RedisServer().start()
    try:
        ctx = multiprocessing.get_context("spawn")
        ready, result = ctx.Event(), ctx.Queue()
        proc = ctx.Process(target=paused_holder, args=(servers.urls, referee.url, ready, result))
        proc.start()
        assert ready.wait(30)
        deadline = time.monotonic() + 5
        while proc.is_alive() and time.monotonic() < deadline:  # wait until it has stopped itself
            with open(f"/proc/{proc.pid}/stat") as fh:
                if fh.read().split(") ", 1)[1].startswith("T"):
                    break
            time.sleep(0.01)
        mgr = LockManager(servers.urls, ttl=5, restart_window=0)
        lock = mgr.acquire("gc-pause", timeout=3)  # the paused holder's lock expires meanwhile
        newer = lock.fencing_token
        write = redis.Redis.from_url(referee.url).register_script(FENCED_WRITE)
        assert write(keys=["fenced-value"], args=[newer]) == 1
        os.kill(proc.pid, signal.SIGCONT)
        outcome = result.get(timeout=10)
        proc.join(10)
        assert outcome["extended"] is False, "the paused holder must learn it lost the lock"
        assert outcome["accepted"] is False, "the stale holder's fenced write must be rejected"
        assert outcome["token"] < newer
        lock.release()
        mgr.close()
    finally:
        referee.stop()
