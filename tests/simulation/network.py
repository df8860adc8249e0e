"""TCP connections between client processes and simulated nodes.

Each connection is two pipes (client -> node, node -> client). A pipe is a FIFO
queue of messages, each stamped with the true time it may arrive; stamps never
decrease along a pipe, so bytes are never reordered, whatever the delays. One
event per pipe delivers whatever is due. A pipe stalls while its link is
partitioned (both directions) and, towards a node, while that node is paused
(the kernel still completes the handshake: SYN is not stalled by a pause).

Message delays come from the world's chooser: usually short, sometimes long
("late bytes"). Faults: :meth:`Network.drop` (both sides reset; a chosen prefix
of the bytes in flight still reaches the node, as if already in its buffer),
:meth:`Network.partition` / :meth:`Network.heal` (held bytes then delivered or
the connection reset, chosen per connection), node crashes (reset, or silence
as after a power loss), :meth:`Network.pause_client` (GC pause: the client's
events wait, see :meth:`World.freeze`), :meth:`Network.kill_client`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .redis_model import Session, SimNode
from .world import Process, World

__all__ = ["ConnectionBroken", "NetConfig", "Network", "SimConnection"]

# message kinds
SYN, SYNACK, DATA, FIN, RST = range(5)
_KIND = {SYN: "SYN", SYNACK: "SYNACK", DATA: "DATA", FIN: "FIN", RST: "RST"}


class ConnectionBroken(Exception):
    """The client used a connection it closed or already saw reset."""


@dataclass
class NetConfig:
    """Delays in true seconds; chances per message (or per event)."""

    min_delay: float = 0.0002
    max_delay: float = 0.002
    #: Chance that a message is late, and how late it may be.
    late_chance: float = 0.01
    late_max: float = 0.5
    #: Chance that a crashed node's connections go silent (power loss) rather than reset.
    silent_crash_chance: float = 0.3


class _Message:
    __slots__ = ("at", "kind", "payload", "buffered", "late")

    def __init__(self, at: float, kind: int, payload: Any, late: bool) -> None:
        self.at = at
        self.kind = kind
        self.payload = payload
        self.buffered = False  # already in the node's socket buffer: no partition holds it
        self.late = late


class _Pipe:
    __slots__ = ("conn", "to_node", "queue", "last", "token", "scheduled", "stalled", "proc")

    def __init__(self, conn: SimConnection, to_node: bool, proc: Process | None) -> None:
        self.conn = conn
        self.to_node = to_node
        self.queue: deque[_Message] = deque()
        self.last = 0.0
        self.token = 0
        self.scheduled = False
        self.stalled = False
        self.proc = proc  # whose freeze defers delivery (the client, for replies)


def _ignore(*_args: Any) -> None:
    return None


def _finished(conn: SimConnection) -> bool:
    """Nothing more can happen on it: the client is done and no byte is in flight."""
    return conn.state in ("closed", "broken") and not conn.in_flight()


class SimConnection:
    """The client's end of one TCP connection to one node.

    The client driver sets the callbacks: ``on_connected()`` once the handshake
    completes, ``on_reply(reply)`` once per reply in order, ``on_broken(reason)``
    once when the connection is reset or refused. After :meth:`close` or after
    ``on_broken`` no callback runs again.
    """

    def __init__(self, network: Network, client: Process, node: SimNode, name: str) -> None:
        self.network = network
        self.client = client
        self.node = node
        self.name = name
        self.on_connected: Callable[[], Any] = _ignore
        self.on_reply: Callable[[Any], Any] = _ignore
        self.on_broken: Callable[[str], Any] = _ignore
        #: "connecting", "open", "closed" (by the client) or "broken" (reset seen).
        self.state = "connecting"
        #: The transport is gone (reset or silent); bytes sent now vanish.
        self.dead = False
        #: The node holds its end open (its session: what it runs, whether a BLPOP blocks it).
        self.server_open = False
        self.session: Session | None = None
        self.up = _Pipe(self, True, None)
        self.down = _Pipe(self, False, client)
        self.sent = 0

    @property
    def link(self) -> tuple[str, str]:
        return (self.client.name, self.node.name)

    def send(self, commands: Sequence[Sequence[Any]]) -> None:
        """Write commands (a sequence of command tuples) in one write."""
        if self.state in ("closed", "broken"):
            raise ConnectionBroken(f"{self.name} is {self.state}")
        self.sent += len(commands)
        if not self.dead:
            self.network._enqueue(self.up, DATA, list(commands))

    def close(self) -> None:
        """Give up on the connection. Bytes already sent may still reach the node."""
        if self.state in ("closed", "broken"):
            self.state = "closed"
            return
        self.state = "closed"
        self.network.world.note(self.client.name, "close", self.name)
        if not self.dead:
            self.network._enqueue(self.up, FIN, None)

    def in_flight(self) -> int:
        """Messages not yet delivered, both directions."""
        return len(self.up.queue) + len(self.down.queue)

    def __repr__(self) -> str:
        return f"<SimConnection {self.name} {self.state}{' dead' if self.dead else ''}>"


class Network:
    """All connections of one world, and the faults that hit them."""

    def __init__(self, world: World, config: NetConfig | None = None) -> None:
        self.world = world
        self.config = config or NetConfig()
        self.partitioned: set[tuple[str, str]] = set()
        self._by_node: dict[str, list[SimConnection]] = {}
        self._per_client: dict[str, int] = {}
        self._watched_nodes: list[SimNode] = []
        self.messages = 0

    # -- the client driver's entry point -----------------------------------------

    def connect(self, client: Process, node: SimNode) -> SimConnection:
        """Open a connection; the result is reported through its callbacks."""
        self._watch(node)
        n = self._per_client.get(client.name, 0) + 1
        self._per_client[client.name] = n
        conn = SimConnection(self, client, node, f"{client.name}#{n}")
        self._by_node.setdefault(node.name, []).append(conn)
        self.world.note(client.name, "connect", conn.name, "->", node.name)
        self._enqueue(conn.up, SYN, None)
        return conn

    # -- faults --------------------------------------------------------------------

    def drop(self, conn: SimConnection, reason: str = "connection reset") -> None:
        """Reset a connection; a chosen prefix of the bytes in flight still reaches the node."""
        if conn.dead:
            return
        self.world.note("net", "DROP", conn.name)
        self._reset(conn, reason, keep_prefix=True)
        self.world.disturbed(conn.client.name)

    def partition(self, node: SimNode, clients: Sequence[Process] | None = None,
                  duration: float | None = None) -> None:
        """Hold all bytes between ``node`` and ``clients`` (None: every client, also future ones)."""
        names = ["*"] if clients is None else [c.name for c in clients]
        for name in names:
            link = (name, node.name)
            if link not in self.partitioned:
                self.partitioned.add(link)
                self.world.fault_begin(f"partition:{name}-{node.name}")
        self.world.note("net", "PARTITION", node.name, "from", ",".join(names))
        if duration is not None:
            self.world.after(duration, self.heal, node, clients)

    def heal(self, node: SimNode, clients: Sequence[Process] | None = None) -> None:
        """End a partition; per connection, deliver the held bytes or reset (chosen).

        ``clients=None`` heals every link of ``node``.
        """
        if clients is None:
            healed = [name for name, n in self.partitioned if n == node.name]
        else:
            healed = [c.name for c in clients if (c.name, node.name) in self.partitioned]
        if not healed:
            return
        self.world.note("net", "HEAL", node.name, "from", ",".join(sorted(healed)))
        for name in healed:
            self.partitioned.discard((name, node.name))
        for conn in self.connections_of(node):
            if not conn.in_flight() or self._cut(conn):
                continue
            if conn.dead:  # reset while partitioned: the RST (and kept bytes) now get through
                self._restamp(conn.up)
                self._restamp(conn.down)
            elif self.world.chance(0.5, "heal resets"):
                self._reset(conn, "connection reset (partition)", keep_prefix=True)
            else:
                self._restamp(conn.up)
                self._restamp(conn.down)
        for name in sorted(healed):
            self.world.fault_end(f"partition:{name}-{node.name}")

    def pause_client(self, client: Process, duration: float) -> None:
        """Freeze a client (GC / stop-the-world) for ``duration`` true seconds."""
        self.world.freeze(client)
        self.world.after(duration, self.world.thaw, client)

    def kill_client(self, client: Process) -> None:
        """The client process dies: the kernel closes its sockets (sent bytes still land)."""
        for conn in self.connections:
            if conn.client is client and conn.state not in ("closed", "broken"):
                conn.close()
        self.world.kill(client)

    def in_flight(self) -> int:
        return sum(c.in_flight() for c in self.connections)

    def connections_of(self, node: SimNode) -> list[SimConnection]:
        """The node's connections that still matter (finished ones are forgotten here)."""
        conns = self._by_node.get(node.name, [])
        live = [c for c in conns if not _finished(c)]
        if len(live) != len(conns):
            self._by_node[node.name] = live
        return live

    @property
    def connections(self) -> list[SimConnection]:
        """Every connection that still matters, node by node."""
        return [c for node in list(self._watched_nodes) for c in self.connections_of(node)]

    # -- internals -------------------------------------------------------------------

    def _watch(self, node: SimNode) -> None:
        if node not in self._watched_nodes:
            self._watched_nodes.append(node)
            node.crash_listeners.append(lambda: self._node_crashed(node))
            node.resume_listeners.append(lambda: self._node_resumed(node))

    def _node_resumed(self, node: SimNode) -> None:
        # A paused node stalls its inbound pipes; on resume they are pumped again.
        for conn in self.connections_of(node):
            self._unstall(conn.up)

    def _delay(self) -> tuple[float, bool]:
        cfg = self.config
        world = self.world
        if cfg.late_chance > 0 and world.chance(cfg.late_chance, "late"):
            return world.uniform(cfg.max_delay, cfg.late_max, "late delay"), True
        return world.uniform(cfg.min_delay, cfg.max_delay, "delay"), False

    def _enqueue(self, pipe: _Pipe, kind: int, payload: Any) -> None:
        delay, late = self._delay()
        at = self.world.now + delay
        if at < pipe.last:
            at = pipe.last  # FIFO: never overtake an earlier message
        pipe.last = at
        pipe.queue.append(_Message(at, kind, payload, late))
        self.messages += 1
        if not pipe.scheduled and not pipe.stalled:
            self._schedule(pipe, at)

    def _schedule(self, pipe: _Pipe, at: float) -> None:
        pipe.token += 1
        pipe.scheduled = True
        self.world.at(at, self._pump, pipe, pipe.token, proc=pipe.proc)

    def _cut(self, conn: SimConnection) -> bool:
        """Is the link of ``conn`` partitioned now?"""
        p = self.partitioned
        return bool(p) and ((conn.client.name, conn.node.name) in p or ("*", conn.node.name) in p)

    def _blocked(self, pipe: _Pipe, msg: _Message) -> bool:
        conn = pipe.conn
        if self.partitioned and not msg.buffered and self._cut(conn):
            return True
        return pipe.to_node and msg.kind in (DATA, FIN) and conn.node.proc.frozen

    def _pump(self, pipe: _Pipe, token: int) -> None:
        if token != pipe.token:
            return
        pipe.scheduled = False
        now = self.world.now
        queue = pipe.queue
        while queue:
            msg = queue[0]
            if msg.at > now:
                self._schedule(pipe, msg.at)
                return
            if self._blocked(pipe, msg):
                pipe.stalled = True
                return
            queue.popleft()
            if msg.late and pipe.to_node:
                self.world.disturbed(pipe.conn.client.name)
            if pipe.to_node:
                self._at_node(pipe.conn, msg)
            else:
                self._at_client(pipe.conn, msg)

    def _unstall(self, pipe: _Pipe) -> None:
        if pipe.stalled:
            pipe.stalled = False
            if pipe.queue and not pipe.scheduled:
                self._schedule(pipe, max(self.world.now, pipe.queue[0].at))

    def _restamp(self, pipe: _Pipe) -> None:
        """After a partition heals, held messages leave with fresh delays, still in order."""
        now = self.world.now
        prev = now
        for msg in pipe.queue:
            if msg.at <= now:
                delay, late = self._delay()
                msg.at = max(prev, now + delay)
                msg.late = msg.late or late  # late bytes disturb their client's keys, as in _enqueue
            elif msg.at < prev:
                msg.at = prev
            prev = msg.at
        pipe.last = max(pipe.last, prev)
        pipe.stalled = False
        if pipe.queue:
            self._schedule(pipe, pipe.queue[0].at)

    def _at_node(self, conn: SimConnection, msg: _Message) -> None:
        node = conn.node
        world = self.world
        if msg.kind == SYN:
            if not node.up:
                self._enqueue(conn.down, RST, "connection refused")
                conn.dead = True
                return
            conn.server_open = True
            conn.session = node.open_session(conn.name, lambda replies: self._replies(conn, replies))
            self._enqueue(conn.down, SYNACK, None)
            return
        if not conn.server_open or not node.up:
            return  # the node's end is gone: the bytes vanish
        if msg.kind == FIN:
            self._server_close(conn)
            world.note(node.name, "<-", conn.name, "FIN")
            return
        assert conn.session is not None
        node.serve(conn.session, msg.payload)

    def _replies(self, conn: SimConnection, replies: list[Any]) -> None:
        if conn.server_open and conn.state != "closed" and not conn.dead:
            self._enqueue(conn.down, DATA, replies)

    def _server_close(self, conn: SimConnection) -> None:
        conn.server_open = False
        if conn.session is not None:
            conn.node.close_session(conn.session)

    def _at_client(self, conn: SimConnection, msg: _Message) -> None:
        if conn.state in ("closed", "broken"):
            return
        kind = msg.kind
        if kind == DATA:
            for reply in msg.payload:
                if conn.state != "open":
                    return
                conn.on_reply(reply)
        elif kind == SYNACK:
            conn.state = "open"
            conn.on_connected()
        elif kind == RST:
            conn.state = "broken"
            self.world.note(conn.client.name, "broken", conn.name, msg.payload)
            conn.on_broken(msg.payload)

    def _reset(self, conn: SimConnection, reason: str, keep_prefix: bool, keep_replies: bool = False) -> None:
        """Kill the transport: the client hears RST; some sent bytes may still land."""
        conn.dead = True
        up = conn.up
        kept: list[_Message] = []
        data = [m for m in up.queue if m.kind in (DATA, FIN)]
        if keep_prefix and data and conn.server_open:
            k = self.world.choose(range(len(data) + 1), "bytes kept at reset")
            kept = data[:k]
        now = self.world.now
        for m in kept:  # already in the node's socket buffer: they arrive now, held by nothing
            m.buffered = True
            m.at = now
        up.queue = deque(kept)
        if kept:
            up.queue.append(_Message(now, FIN, None, False))
            up.queue[-1].buffered = True
        else:
            self._server_close(conn)
        up.token += 1  # cancel the pending pump
        up.scheduled = False
        up.stalled = False
        if up.queue:
            self._schedule(up, now)
        down = conn.down
        if not keep_replies:  # the client's kernel drops what it had not read
            down.queue.clear()
            down.token += 1
            down.scheduled = False
            down.stalled = False
            down.last = now
        if conn.state not in ("closed", "broken"):
            self._enqueue(down, RST, reason)

    def _node_crashed(self, node: SimNode) -> None:
        for conn in self.connections_of(node):
            if conn.dead:
                continue
            conn.server_open = False  # the node's sessions died with it
            if self.world.chance(self.config.silent_crash_chance, "crash is silent"):
                # Power loss: nothing tells the client; its own timeout must notice.
                conn.dead = True
                conn.up.queue.clear()
                conn.up.token += 1
                conn.up.scheduled = False
                continue
            # A crashed process: replies already on the wire arrive, then the reset.
            self._reset(conn, "connection reset (node crashed)", keep_prefix=False, keep_replies=True)
