"""A deterministic world for running Redlock clients: nodes, network, clocks, faults.

Design
------
* **One seed drives everything.** ``World(seed)`` owns true time, one event
  heap ordered by ``(time, sequence)``, and ``random.Random(seed)``. Nothing
  reads the real clock, opens a socket or starts a thread, so a run is a pure
  function of its seed and replays exactly; a failure prints the seed and the
  end of a readable trace.
* **Every decision goes through the chooser.** Delays, late bytes, what a
  reset keeps, how a partition heals, clock rates: each is one call to
  ``world.choose`` / ``world.uniform`` / ``world.chance``. The default chooser
  samples from the seed; :class:`Exhaustive` (with :func:`explore`) instead
  enumerates every choice sequence depth first, so small cases are
  model-checked rather than sampled.
* **Each process has its own clock** (:mod:`.clock`): a monotonic reading
  ``offset + rate * true_time`` whose rate stays within a drift bound (by
  default 0.9 of the algorithm's ``clock_drift_factor``, split between any two
  clocks). Nodes expire keys on their own clock; clients read theirs and set
  timers in local seconds.
* **The checker judges in true time** (:mod:`.invariants`): exclusion,
  fencing order, honest validity against the keys actually on the nodes,
  nothing left behind, progress.

Modelled
--------
Independent Redis masters with the commands and Lua scripts the engine uses
(:mod:`.redis_model`): SET NX PX, GET, MGET, PTTL, PEXPIRE, DEL, PING, TIME, the
sorted-set and list commands of the waiting line, BLPOP that blocks its
connection until a push or its timeout (noticed at the next server tick),
EVAL/EVALSHA with a per-boot script cache (VOTE, ACQUIRE, RELEASE, EXTEND,
FENCE_READ, FENCE_RAISE, INSPECT, DATASET done in Python, as their Lua does, the
data-set check of the vote and fencing scripts included), INFO (uptime, run id;
or denied), CONFIG GET for persistence, SCAN. Crashes that lose data unless
fsync-always, restarts, SIGSTOP pauses that buffer input and freeze timeouts, a
full resync that replaces a node's data set under open connections. TCP connections (:mod:`.network`) with
per-connection FIFO, random and late delays, connection resets where bytes
already sent may still land, refused connections, silent peers after power
loss, partitions that hold bytes, client GC pauses and client deaths (a new
process takes the dead one's place).
:mod:`.faults` schedules random faults from the chooser; :func:`.scenario.build`
puts a world together in one call.

Not modelled
------------
Replication streams and clusters (a failover is one fault: a replica that lagged
promoted behind a node's address; a resync is another: the data set replaced at
once); partial writes (a write is one message, a node runs a write's commands back
to back); byte-level RESP framing (the
client sends command tuples; :func:`.redis_model.parse_commands` splits packed
bytes if a driver has them); TCP keepalive and OS-level timeouts (the client's
own timers decide when to give up); wall-clock jumps (all clocks are
monotonic); memory limits and eviction; AUTH/SELECT.

Plugging in a client
--------------------
A client is a :class:`Process` (``world.process(name, clock)``). Its driver
reads ``proc.now()`` (local seconds), sets timers with
``proc.after_local(dt, fn)`` / ``proc.at_local(t, fn)`` (cancel with
``world.cancel(handle)``), opens connections with
``network.connect(proc, node)`` and sets ``on_connected``, ``on_reply`` and
``on_broken`` on them, writes with ``conn.send([cmd, ...])`` and gives up with
``conn.close()``. It reports outcomes to :class:`Checker` at the moment its
caller would see them.
"""

from .clock import SAFE_SHARE, Clock, drifting_clock
from .faults import FaultConfig, Nemesis
from .invariants import Checker, Holding, Violation
from .network import ConnectionBroken, NetConfig, Network, SimConnection
from .redis_model import SimNode, parse_commands
from .scenario import Sim, build
from .world import Chooser, Exhaustive, Process, RandomChooser, World, explore

__all__ = [
    "SAFE_SHARE",
    "Checker",
    "Chooser",
    "Clock",
    "ConnectionBroken",
    "Exhaustive",
    "FaultConfig",
    "Holding",
    "Nemesis",
    "NetConfig",
    "Network",
    "Process",
    "RandomChooser",
    "SimConnection",
    "Sim",
    "SimNode",
    "Violation",
    "World",
    "build",
    "drifting_clock",
    "explore",
    "parse_commands",
]
