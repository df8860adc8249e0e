"""One call that builds a world: nodes, network, checker and a way to add clients."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from django_redlock.core import ledger

from .clock import SAFE_SHARE, drifting_clock
from .faults import FaultConfig, Nemesis
from .invariants import Checker
from .network import NetConfig, Network
from .redis_model import SimNode
from .world import Chooser, Process, World

__all__ = ["Sim", "build", "settled"]


def settled(ttl: float) -> float:
    """When nodes booted at time 0 vote for a client of ``ttl``: after its restart window, which the
    engine counts from INFO's whole seconds less one (the truth may lie up to 2 s above that)."""
    return ttl * 2 + 2 * ledger.UPTIME_STEP + 0.1


@dataclass
class Sim:
    """A built world; add clients with :meth:`client`, faults with :meth:`nemesis`."""

    world: World
    network: Network
    nodes: list[SimNode]
    checker: Checker
    drift: float
    share: float
    clients: list[Process] = field(default_factory=list)
    #: ``stall(process, round, i)``: how long (the process's seconds) a round is held up before it writes
    #: to node ``i`` (0.0: not at all): a thread descheduled between two writes (the GIL, a busy CPU)
    #: while the process's other callers go on.
    stall: Callable[[Process, Any, int], float] | None = None

    def client(self, name: str) -> Process:
        """A client process with its own drifting clock."""
        proc = self.world.process(name, drifting_clock(self.world, self.drift, name, share=self.share))
        self.clients.append(proc)
        return proc

    def nemesis(self, until: float, config: FaultConfig | None = None) -> Nemesis:
        """Random faults until ``until`` (true seconds), then heal and require progress."""
        nemesis = Nemesis(self.world, self.network, self.nodes, self.clients, config, self.checker)
        nemesis.start(until)
        return nemesis


def build(
    seed: int,
    *,
    nodes: int = 5,
    ttl: float = 1.0,
    drift: float = 0.01,
    share: float = SAFE_SHARE,
    fsync_always: bool | Sequence[bool] = False,
    deny_info: bool | Sequence[bool] = False,
    net: NetConfig | None = None,
    chooser: Chooser | None = None,
    key_prefix: str = "redlock:",
    flaky_info: float = 0.0,
) -> Sim:
    """A world of ``nodes`` independent masters ``node0..`` with drifting clocks.

    ``drift`` is the algorithm's ``clock_drift_factor``; ``share`` how much of it
    the clocks use (above 1 breaks the algorithm's assumption on purpose).
    ``fsync_always`` and ``deny_info`` take one flag or one per node.
    """
    world = World(seed, chooser=chooser)
    fsync = [fsync_always] * nodes if isinstance(fsync_always, bool) else list(fsync_always)
    deny = [deny_info] * nodes if isinstance(deny_info, bool) else list(deny_info)
    sim_nodes = [
        SimNode(world, f"node{i}", drifting_clock(world, drift, f"node{i}", share=share),
                fsync_always=fsync[i], deny_info=deny[i], flaky_info=flaky_info)
        for i in range(nodes)
    ]
    checker = Checker(world, sim_nodes, ttl=ttl, key_of=lambda r: f"{key_prefix}lock:{r}",
                      line_of=lambda r: (f"{key_prefix}queue:{r}", f"{key_prefix}places:{r}"))
    return Sim(world, Network(world, net), sim_nodes, checker, drift, share)
