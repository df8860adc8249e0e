"""Small scope, every schedule: 2 clients, 3 nodes, one restart or one pause.

Instead of sampling, :func:`check_small_scope` enumerates every sequence of
choices up to a depth (which node fails, when, and the order in which each
message arrives: every delay takes each end of its range), so small cases are
model-checked. Choices past the depth take their first option.
"""

from __future__ import annotations

import logging
import time

from django_redlock.core.lock import LockBase

from .client import SimClient
from .invariants import Violation
from .network import NetConfig
from .scenario import build, settled
from .world import Exhaustive

__all__ = ["check_small_scope"]

TTL = 1.0
START = settled(TTL)  # the nodes are new: after the restart window
ROUNDS = 2


def _rounds(client: SimClient, left: int) -> None:
    """Acquire (blocking, short timeout), hold briefly, release; ``left`` times."""
    if left == 0:
        return

    def acquired(lock: LockBase | None, error: BaseException | None) -> None:
        if lock is None:
            client.proc.after_local(0.01, _rounds, client, left - 1)
            return
        client.proc.after_local(0.02, client.release, lock, lambda: _rounds(client, left - 1))

    client.acquire("r", acquired, blocking=True, timeout=0.05)


def one_schedule(chooser: Exhaustive, fault: str) -> None:
    sim = build(0, nodes=3, ttl=TTL, share=0.0, chooser=chooser,
                net=NetConfig(min_delay=0.0005, max_delay=0.004, late_chance=0.0, silent_crash_chance=0.0))
    world = sim.world
    clients = [SimClient(sim, name, ttl=TTL, retry_count=2, retry_delay=0.01, retry_jitter=0.0) for name in "ab"]
    node = world.choose(sim.nodes, "fault node")
    at = START + world.choose([0.0, 0.002, 0.004, 0.008, 0.03], "fault time")
    if fault == "restart":
        world.at(at, node.restart, 0.005)
    else:
        world.at(at, node.pause)
        world.at(at + 0.3, node.resume)
    for client in clients:
        world.at(START, _rounds, client, ROUNDS)
    world.run_until(START + 3)


def check_small_scope(fault: str, *, max_depth: int, limit: int | None = None) -> tuple[int, float]:
    """Run every schedule up to ``max_depth`` choices; raise the first Violation. Returns (schedules, seconds)."""
    logging.getLogger("django_redlock").setLevel(logging.CRITICAL)
    chooser = Exhaustive(points=2, max_depth=max_depth)
    started = time.monotonic()
    while True:
        try:
            one_schedule(chooser, fault)
        except Violation as exc:
            raise Violation(f"{exc}\nschedule #{chooser.runs}, choices: {chooser.path()}") from None
        if limit is not None and chooser.runs >= limit:
            break
        if not chooser.advance():
            break
    return chooser.runs, time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-depth", type=int, default=10, help="choices enumerated per schedule")
    args = parser.parse_args(argv)
    for fault in ("restart", "pause"):
        try:
            schedules, took = check_small_scope(fault, max_depth=args.max_depth)
        except Violation as exc:
            print(f"VIOLATION (one {fault}):\n{exc}")
            return 1
        print(f"2 clients, 3 nodes, one {fault}: all {schedules} schedules up to depth {args.max_depth} hold "
              f"every invariant ({took:.1f} s, {schedules / took:.0f} schedules/s).")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
