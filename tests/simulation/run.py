"""Simulation runs of the real engine core: one seed, a few clients, random faults, every invariant.

``python -m tests.simulation.run --seeds 1000`` explores 1000 seeds and exits
non-zero on the first violation, printing the seed and the trace; ``--seed N``
replays one run exactly.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .client import SimClient
from .faults import FaultConfig
from .invariants import Violation
from .network import NetConfig
from .scenario import build, settled
from .sim_async import AsyncSimProcess
from .sim_manager import SimProcess
from .world import Chooser

__all__ = ["Outcome", "contend", "simulate"]

#: How far a host's wall clock may be off (seconds). Fencing tokens are floored at the
#: wall clock, which keeps them ordered after counters are lost with restarted nodes
#: only while clocks disagree by less than the restart window (docs/safety.rst).
WALL_SKEW = 0.2
#: The share of calls in the random runs that lock several resources at once (two or three of
#: the pool, overlapping with the calls on one of them).
MULTI = 0.3


@dataclass
class Outcome:
    seed: int
    acquired: int = 0
    #: How many of the locks acquired held several resources at once.
    several: int = 0
    failed: int = 0
    faults: int = 0
    events: int = 0
    violation: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def simulate(
    seed: int,
    *,
    seconds: float = 4.0,
    clients: int = 3,
    nodes: int = 5,
    resources: tuple[str, ...] = ("r0", "r1", "r2"),
    multi: float = MULTI,
    ttl: float = 1.0,
    faults: FaultConfig | None = None,
    net: NetConfig | None = None,
    chooser: Chooser | None = None,
    share: float | None = None,
    fsync_always: bool = False,
    deny_info: bool = False,
    restart_window: float | None = None,
    fencing: bool = True,
    node_timeout: float = 0.05,
    flaky_info: float = 0.0,
    wall_skew: float | None = None,
    managers: int = 1,
    callers: int = 2,
    async_managers: int = 0,
    stalls: float = 0.0,
) -> Outcome:
    """Run one seeded simulation; a broken invariant is returned in ``violation`` (with the trace).

    Each call locks one of ``resources`` or, by chance ``multi``, two or three of them at once.
    Besides the ``clients`` driving the core's steps, ``managers`` processes run the real
    ``LockManager`` with ``callers`` greenlets each (:mod:`.sim_manager`), and ``async_managers``
    processes the real ``AsyncLockManager`` with ``callers`` asyncio tasks each (:mod:`.sim_async`).
    With ``stalls``, each round is held up before each node's write with that chance (up to four node
    timeouts: a thread descheduled between two writes) while the process's other callers go on.
    """
    kwargs: dict[str, Any] = {}
    if share is not None:
        kwargs["share"] = share
    sim = build(seed, nodes=nodes, ttl=ttl, fsync_always=fsync_always, deny_info=deny_info,
                net=net, chooser=chooser, flaky_info=flaky_info, **kwargs)
    world = sim.world
    if stalls:
        def stall(proc: Any, rnd: Any, i: int) -> float:
            return world.uniform(0.0, 4 * node_timeout, "stall") if world.chance(stalls, "stalled") else 0.0

        sim.stall = stall
    skew = WALL_SKEW if wall_skew is None else wall_skew
    procs = [
        SimClient(sim, f"c{i}", ttl=ttl, restart_window=restart_window, node_timeout=node_timeout,
                  wall_offset=world.uniform(-skew, skew, "wall clock error"))
        for i in range(clients)
    ]
    real = [
        SimProcess(sim, f"m{i}", ttl=ttl, restart_window=restart_window, node_timeout=node_timeout,
                   wall_offset=world.uniform(-skew, skew, "wall clock error"))
        for i in range(managers)
    ] + [
        AsyncSimProcess(sim, f"a{i}", ttl=ttl, restart_window=restart_window, node_timeout=node_timeout,
                        wall_offset=world.uniform(-skew, skew, "wall clock error"))
        for i in range(async_managers)
    ]
    for process in real:
        process.peers = real
    outcome = Outcome(seed)
    begin = settled(ttl)  # the nodes are new: wait out the restart window once
    end = begin + seconds
    try:
        nemesis = None
        # Clients keep working past the heal, so that progress can be checked.
        stop = end + ttl * 2 + (faults.progress_within if faults else 0.0)
        by_proc: dict[Any, Any] = {client.proc: client for client in [*procs, *real]}

        def respawn(victim: Any) -> Any:
            """Kill a client process; a new one (fresh books, new name) takes up its work."""
            dead = by_proc[victim]
            dead.die()
            sim.network.kill_client(victim)
            if isinstance(dead, SimProcess):
                process = type(dead)(sim, f"{victim.name}'", ttl=ttl, restart_window=restart_window,
                                     node_timeout=node_timeout, wall_offset=dead.wall_offset)
                by_proc[process.proc] = process
                real.append(process)
                process.peers = real
                process.proc.after_local(world.uniform(0.0, 0.2, "respawn delay"), process.start,
                                         list(resources), stop, callers, multi)
                return process.proc
            new = SimClient(sim, f"{victim.name}'", ttl=ttl, restart_window=restart_window,
                            node_timeout=node_timeout, wall_offset=dead.wall_offset)
            new.fencing = fencing
            new.multi = multi
            by_proc[new.proc] = new
            procs.append(new)
            new.proc.after_local(world.uniform(0.0, 0.2, "respawn delay"), new.session, list(resources), stop)
            return new.proc

        if faults is not None:
            nemesis = sim.nemesis(end, faults)
            nemesis.respawn = respawn
        for client in procs:
            client.fencing = fencing
            client.multi = multi
            world.at(begin, client.session, list(resources), stop)
        for process in real:
            world.at(begin, process.start, list(resources), stop, callers, multi)
        world.run_until(stop + ttl * 2)
        if nemesis is not None:
            outcome.faults = nemesis.injected
    except Violation as exc:
        outcome.violation = str(exc)
    finally:
        for process in real:
            process.close()
    outcome.acquired = sum(c.acquired for c in [*procs, *real])
    outcome.several = sim.checker.acquisitions_of_several
    outcome.failed = sum(c.failed for c in [*procs, *real])
    outcome.events = world.events_run
    outcome.extra["real"] = sum((p.stats for p in real), Counter())
    return outcome


def contend(
    seed: int,
    *,
    seconds: float = 3.0,
    clients: int = 4,
    ttl: float = 1.0,
    hold: float = 0.05,
    once: float = 0.2,
    wake_within: float = 0.1,
    net: NetConfig | None = None,
    resources: tuple[str, ...] = ("r",),
    multi: float = 0.0,
) -> Outcome:
    """A run without faults where ``clients`` queue up for one lock with blocking acquires.

    Besides every invariant, checks (f) fairness (nobody is granted past an earlier call that
    was already in line everywhere) and (g) wake-up (after a release, someone in line is granted
    within ``wake_within`` seconds). ``extra`` has the grants per client, the wake-up delays and
    how many wake-ups were excused because every waiter was blocked on another resource.

    With several ``resources``, each call locks one of them or, by chance ``multi``, two or three
    at once: overlapping sets queue in the lines of all their members.
    """
    sim = build(seed, ttl=ttl, net=net or NetConfig(late_chance=0.0))
    world, checker = sim.world, sim.checker
    checker.fair = True
    checker.wake_within = wake_within
    procs = [SimClient(sim, f"c{i}", ttl=ttl) for i in range(clients)]
    target: str | tuple[str, ...] = resources[0] if len(resources) == 1 else resources
    for client in procs:
        client.multi = multi
    outcome = Outcome(seed)
    begin = settled(ttl)  # the nodes are new: wait out the restart window once
    try:
        for i, client in enumerate(procs):
            world.at(begin + 0.01 * i, lambda c=client: c.contend(target, begin + seconds, hold=hold, once=once))
        world.run_until(begin + seconds + ttl * 2)
    except Violation as exc:
        outcome.violation = str(exc)
    outcome.acquired = sum(c.acquired for c in procs)
    outcome.several = checker.acquisitions_of_several
    outcome.failed = sum(c.failed for c in procs)
    outcome.events = world.events_run
    grants = {id(g): g for r in resources for g in checker.grants.get(r, [])}.values()
    outcome.extra = {
        "grants": {c.name: sum(1 for g in grants if g.client == c.name) for c in procs},
        "wake_delays": list(checker.wake_delays),
        "wakes_excused": checker.wakes_excused,
    }
    return outcome


def default_faults(restart_after: float = 0.0) -> FaultConfig:
    return FaultConfig(kinds=("crash", "pause_node", "partition", "drop", "pause_client", "kill_client",
                              "flush_scripts"),
                       mean_gap=0.3, max_duration=1.5, max_down=1.5, restart_after=restart_after,
                       progress_within=4.0)


def resync_faults() -> FaultConfig:
    """The default faults with resyncs (a node's data set replaced under open connections) and without
    killed clients: a respawned client's first contact with a resynced node could not tell."""
    config = default_faults()
    config.kinds = (*(k for k in config.kinds if k != "kill_client"), "resync", "resync")
    return config


#: A ttl above the provisional ttl of a grant in line (1 s, the usual runs' ttl): see :func:`provisional`.
LONG_TTL = 3.0


def provisional(seed: int, **options: Any) -> Outcome:
    """Random faults with a ttl of :data:`LONG_TTL`: every lock won in line is granted provisionally and
    extended by its winner. Progress after the heal may wait out the longest hold (a watchdog's, 2.5 ttls)."""
    faults = default_faults()
    faults.progress_within += 2.5 * LONG_TTL
    return simulate(seed, faults=faults, ttl=LONG_TTL, **options)


def main(argv: list[str] | None = None) -> int:
    import logging

    logging.getLogger("django_redlock").setLevel(logging.CRITICAL)  # restarts are logged once per node
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=200, help="how many seeds to explore")
    parser.add_argument("--first", type=int, default=0, help="the first seed")
    parser.add_argument("--seed", type=int, default=None, help="replay one seed and print its trace")
    parser.add_argument("--seconds", type=float, default=4.0, help="simulated seconds of faults per seed")
    parser.add_argument("--clients", type=int, default=3, help="client processes driving the core's steps")
    parser.add_argument("--managers", type=int, default=1,
                        help="processes running the real LockManager (two callers each)")
    parser.add_argument("--async-managers", type=int, default=0,
                        help="processes running the real AsyncLockManager (two tasks each)")
    parser.add_argument("--stalls", type=float, default=0.0,
                        help="chance that a round is held up before each node's write (a descheduled thread)")
    args = parser.parse_args(argv)
    seeds = [args.seed] if args.seed is not None else range(args.first, args.first + args.seeds)
    started = time.monotonic()
    totals = Outcome(-1)
    for seed in seeds:
        outcome = simulate(seed, seconds=args.seconds, faults=default_faults(), clients=args.clients,
                           managers=args.managers, async_managers=args.async_managers, stalls=args.stalls)
        totals.acquired += outcome.acquired
        totals.several += outcome.several
        totals.failed += outcome.failed
        totals.faults += outcome.faults
        totals.events += outcome.events
        if outcome.violation:
            print(f"VIOLATION with seed {seed}:\n{outcome.violation}")
            print(f"replay: python -m tests.simulation.run --seed {seed} --seconds {args.seconds} "
                  f"--clients {args.clients} --managers {args.managers} --async-managers {args.async_managers} "
                  f"--stalls {args.stalls}")
            return 1
    took = time.monotonic() - started
    n = len(seeds)
    print(
        f"{n} seeds, {args.seconds:g} simulated s of faults each: no violation. "
        f"{totals.acquired} locks acquired ({totals.several} of them on several resources at once), "
        f"{totals.failed} acquire calls refused, {totals.faults} faults, "
        f"{totals.events} events; {took:.1f} s ({n / took:.1f} seeds/s, {totals.events / took:,.0f} events/s)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
