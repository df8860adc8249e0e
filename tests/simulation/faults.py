"""A nemesis: random faults from the chooser, all healed by a given time.

Faults: node crash + restart, node pause (SIGSTOP), partition of a node from
some clients, a connection reset, a client GC pause, a node's script cache
flushed under open connections (``"flush_scripts"``), a node's data set replaced under open
connections by a full sync from an empty server (``"resync"``; not a default kind: a client whose
first contact with the node comes after it cannot tell), and (kind
``"kill_client"``, when a ``respawn`` callback is set) a client process killed
and replaced by a new one. At ``until`` every fault
heals (paused nodes resume, partitions heal, frozen clients thaw, crashed
nodes start once their minimum downtime is over) and, if a checker is given,
progress is required within ``progress_within`` true seconds after that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from .invariants import Checker
from .network import Network
from .redis_model import SimNode
from .world import Process, World

__all__ = ["FaultConfig", "Nemesis"]


@dataclass
class FaultConfig:
    """What the nemesis may do, and how often (true seconds)."""

    #: Fault kinds to pick from; repeat a name to make it likelier.
    kinds: Sequence[str] = ("crash", "pause_node", "partition", "drop", "pause_client")
    #: Mean true time between two faults.
    mean_gap: float = 0.5
    #: Longest node pause, partition or client pause.
    max_duration: float = 2.0
    #: Longest downtime of a crashed node.
    max_down: float = 2.0
    #: Least downtime of a node without fsync-always (the spec's delayed restart);
    #: 0 lets nodes rejoin at once, which only a restart-aware client survives.
    restart_after: float = 0.0
    #: At most this many nodes crashed, paused or partitioned at once (None: a minority).
    max_faulty_nodes: int | None = None
    #: After the heal, a lock must be acquired within this many true seconds.
    progress_within: float = 10.0


class Nemesis:
    """Schedules faults on a world's nodes, network and clients."""

    def __init__(self, world: World, network: Network, nodes: Sequence[SimNode],
                 clients: Sequence[Process], config: FaultConfig | None = None,
                 checker: Checker | None = None) -> None:
        self.world = world
        self.network = network
        self.nodes = list(nodes)
        self.clients = list(clients)
        self.config = config or FaultConfig()
        self.checker = checker
        self.until = 0.0
        self.injected = 0
        #: Kills a client process and returns the process that replaces it ("kill_client" faults).
        self.respawn: Callable[[Process], Process] | None = None
        self._faulty: dict[str, float] = {}  # node name -> true time its fault ends
        self._down_since: dict[str, float] = {}
        limit = self.config.max_faulty_nodes
        self._limit = (len(self.nodes) - 1) // 2 if limit is None else limit

    def start(self, until: float) -> None:
        """Inject faults from now until ``until``, then heal everything."""
        self.until = until
        self._schedule_next()
        self.world.at(until, self.heal_all)

    def _schedule_next(self) -> None:
        gap = self.world.uniform(0.0, 2 * self.config.mean_gap, "fault gap")
        if self.world.now + gap < self.until:
            self.world.after(gap, self._inject)

    def _free_nodes(self) -> list[SimNode]:
        now = self.world.now
        busy = [name for name, end in self._faulty.items() if end > now or name in self._down_since]
        if len(busy) >= self._limit:
            return []
        return [n for n in self.nodes if n.name not in busy and n.up and not n.paused]

    def _inject(self) -> None:
        world, cfg = self.world, self.config
        kind = world.choose(tuple(cfg.kinds), "fault kind")
        left = self.until - world.now
        if kind in ("crash", "pause_node", "partition"):
            free = self._free_nodes()
            if free:
                node = world.choose(free, "fault node")
                self.injected += 1
                if kind == "crash":
                    self._crash(node, left)
                elif kind == "pause_node":
                    dt = min(left, world.uniform(0.0, cfg.max_duration, "pause length"))
                    self._faulty[node.name] = world.now + dt
                    node.pause()
                    world.after(dt, node.resume)
                else:
                    dt = min(left, world.uniform(0.0, cfg.max_duration, "partition length"))
                    self._faulty[node.name] = world.now + dt
                    some = [c for c in self.clients if world.chance(0.5, "partitioned client")] or self.clients
                    self.network.partition(node, some, duration=dt)
        elif kind == "flush_scripts":
            up = [n for n in self.nodes if n.up]
            if up:
                self.injected += 1
                world.choose(up, "flushed node").flush_scripts()
        elif kind == "resync":
            free = self._free_nodes()
            if free:
                self.injected += 1
                # From an empty server: a copy of another node would bring back keys whose release
                # that node had not run yet (leftovers that expire, not a fault of the engine).
                world.choose(free, "resynced node").resync(None)
        elif kind == "drop":
            live = [c for c in self.network.connections if not c.dead and c.state == "open"]
            if live:
                self.injected += 1
                self.network.drop(world.choose(live, "dropped connection"))
        elif kind == "kill_client" and self.respawn is not None:
            alive = [c for c in self.clients if c.alive]
            if alive:
                self.injected += 1
                victim = world.choose(alive, "killed client")
                self.clients.append(self.respawn(victim))
        elif kind == "pause_client":
            awake = [c for c in self.clients if c.alive and not c.frozen]
            if awake:
                self.injected += 1
                client = world.choose(awake, "paused client")
                dt = min(left, world.uniform(0.0, cfg.max_duration, "gc pause length"))
                self.network.pause_client(client, dt)
        self._schedule_next()

    def _crash(self, node: SimNode, left: float) -> None:
        world, cfg = self.world, self.config
        down = world.uniform(0.0, cfg.max_down, "downtime")
        if not node.fsync_always:
            down = max(down, cfg.restart_after)
        self._down_since[node.name] = world.now
        node.crash()
        if down < left:
            world.after(down, self._start, node)

    def _start(self, node: SimNode) -> None:
        self._down_since.pop(node.name, None)
        node.start()

    def heal_all(self) -> None:
        """End every fault now (a crashed node starts once its minimum downtime is over)."""
        world = self.world
        world.note("nemesis", "HEAL ALL")
        last = world.now
        for node in self.nodes:
            if node.paused:
                node.resume()
            self.network.heal(node)
            if not node.up:
                since = self._down_since.get(node.name, world.now)
                wait = 0.0 if node.fsync_always else max(0.0, since + self.config.restart_after - world.now)
                last = max(last, world.now + wait)
                if wait:
                    world.after(wait, self._start, node)
                else:
                    self._start(node)
        for client in self.clients:
            if client.frozen:
                world.thaw(client)
        self._faulty.clear()
        if self.checker is not None:
            world.at(last, self.checker.expect_progress, self.config.progress_within)
