"""Mutual exclusion across processes, with fencing tokens, while nodes are killed.

Six worker processes contend for one resource. Inside the critical section
each does a deliberately non-atomic read-modify-write of a counter in a
separate referee Redis, and records when its section started and ended. If
two sections ever overlapped, increments would be lost and intervals would
intersect. Fencing tokens must strictly increase in acquisition order.
"""

from __future__ import annotations

import multiprocessing
import time

import pytest
import redis

from django_redlock.core import LockManager
from django_redlock.exceptions import LockError
from django_redlock.testing import RedisServer

WORKERS = 6


def worker(urls, referee_url, seconds, start, out):
    mgr = LockManager(urls, ttl=2.0, retry_count=None, retry_delay=0.005, retry_jitter=0.005, restart_window=0)
    referee = redis.Redis.from_url(referee_url)
    start.wait(60)
    stop_at = time.monotonic() + seconds
    sections = []
    while time.monotonic() < stop_at:
        try:
            lock = mgr.acquire("shared-counter", timeout=1.0)
        except LockError:
            continue
        try:
            token = lock.fencing_token
            begin = time.monotonic()
            value = int(referee.get("counter") or 0)  # read ...
            time.sleep(0.001)  # ... widen the race window ...
            referee.set("counter", value + 1)  # ... write
            end = time.monotonic()
            valid = lock.locked()
        except LockError:
            lock.release()
            continue
        lock.release()
        sections.append((begin, end, token, valid))
    out.put(sections)
    mgr.close()


def run_contention(servers, seconds, faults=()):
    referee = RedisServer().start()
    ctx = multiprocessing.get_context("spawn")  # the test process has threads: no fork
    start = ctx.Barrier(WORKERS + 1)  # every worker ready, then all go
    out = ctx.Queue()
    procs = [
        ctx.Process(target=worker, args=(servers.urls, referee.url, seconds, start, out)) for _ in range(WORKERS)
    ]
    try:
        for proc in procs:
            proc.start()
        start.wait(60)
        for delay, action in faults:
            time.sleep(delay)
            action()
        results = [out.get(timeout=seconds + 30) for _ in procs]
        for proc in procs:
            proc.join(10)
        counter = int(redis.Redis.from_url(referee.url).get("counter") or 0)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
        referee.stop()
    return [s for sections in results for s in sections], counter, results


def check_sections(sections, counter):
    assert counter == len(sections), f"{len(sections)} increments but the counter says {counter}: lost updates"
    assert all(valid for *_, valid in sections), "a section ended after its lock's validity"
    sections.sort()
    for (b1, e1, t1, _), (b2, e2, t2, _) in zip(sections, sections[1:]):
        assert e1 <= b2, f"critical sections overlap: ({b1}, {e1}) and ({b2}, {e2})"
        assert t1 < t2, f"fencing tokens not increasing in acquisition order: {t1} then {t2}"


def test_six_processes_never_overlap(servers):
    sections, counter, results = run_contention(servers, 3.0)
    check_sections(sections, counter)
    assert len(sections) > 50
    assert sum(1 for r in results if r) >= 2, "more than one process must have won the lock"


def test_exclusion_and_fencing_hold_while_nodes_die(servers):
    faults = [(0.7, servers[0].kill), (0.7, servers[3].kill)]
    sections, counter, _ = run_contention(servers, 3.0, faults)
    check_sections(sections, counter)
    assert len(sections) > 20
