"""The simulator's round driver: a :class:`~django_redlock.core.rounds.Round` on simulated connections.

What the sync driver does with sockets and ``poll()`` and the asyncio driver with
protocols, this does with the simulated network: open connections, write what the
round asks for, hand each reply to the books, set timers on the process's own clock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from django_redlock.core import steps
from django_redlock.core.rounds import IDLE, NEW, PARKED, ConnState, Failure, NodeBooks, Round

from .network import ConnectionBroken, SimConnection
from .scenario import Sim

__all__ = ["SimConn", "SimDriver"]


class SimConn(ConnState):
    """A simulated connection carrying the books' per-connection state."""

    __slots__ = ("sim", "books")

    def __init__(self, sim: SimConnection, books: NodeBooks) -> None:
        super().__init__()
        self.sim = sim
        self.books = books


class SimDriver:
    """One client process's connections to the simulated nodes, and the rounds run on them."""

    def __init__(self, sim: Sim, proc: Any, books: Sequence[NodeBooks], node_timeout: float) -> None:
        self.sim = sim
        self.proc = proc
        self.world = sim.world
        self.books = books
        self.total = len(books)
        self.node_timeout = node_timeout

    def fan(self, fan: steps.Fan, done: Callable[[list[Any]], None]) -> None:
        _SimRound(self, fan, done)

    def connect(self, i: int) -> SimConn:
        books = self.books[i]
        conn = SimConn(self.sim.network.connect(self.proc, self.sim.nodes[i]), books)
        conn.sim.on_reply = lambda reply: self._reply(conn, reply)
        conn.sim.on_broken = lambda reason: self._broken(conn, reason)
        return conn

    def _reply(self, conn: SimConn, reply: Any) -> None:
        now = self.proc.now()
        books = conn.books
        try:
            entry, resend = books.read(conn, reply, now)
        except ValueError:
            self._broken(conn, "protocol error")
            return
        if conn in books.parked:
            books.parked[conn] = now  # progress
        if resend is not None:
            self._send(conn, [resend])
        elif entry.waiter is not None:
            entry.waiter.take(entry, reply, now)
        if not conn.expect and conn in books.parked:
            del books.parked[conn]
            books.checkin(conn, now, now)

    def _broken(self, conn: SimConn, reason: str) -> None:
        now = self.proc.now()
        for entry in list(conn.expect):
            if entry.waiter is not None:
                entry.waiter.take(entry, Failure(reason), now)
        conn.books.drop(conn, now)

    def _send(self, conn: SimConn, commands: list[tuple[Any, ...]]) -> bool:
        try:
            conn.sim.send(commands)
            return True
        except ConnectionBroken:
            return False

    def give_up_stale(self, i: int, now: float) -> None:
        """Apply the books' stale rule to parked connections, as the sync driver does before a round."""
        books = self.books[i]
        for conn, since in list(books.parked.items()):
            if not books.after_drain(conn, since, now):
                conn.sim.close()


class _SimRound:
    """One round on simulated connections: connect, write, collect, finish."""

    def __init__(self, client: SimDriver, fan: steps.Fan, done: Callable[[list[Any]], None]) -> None:
        self.client = client
        self.done = done
        self.finished = False
        self.timer: int | None = None
        proc = client.proc
        now = proc.now()
        self.rnd = rnd = Round(client.books, fan.commands, now=now,
                               timeout=fan.timeout or client.node_timeout, **fan.options())
        rnd.on_reply = self.check
        self.connecting: dict[int, SimConn] = {}
        for i in range(client.total):
            if client.books[i].parked:
                client.give_up_stale(i, now)
            while True:
                choice = rnd.choose(i, now)
                if choice is None:
                    break
                kind, conn, since = choice
                if kind == NEW:
                    conn = client.connect(i)
                    self.connecting[i] = conn
                    conn.sim.on_connected = lambda i=i, conn=conn: self.connected(i, conn)
                    proc.after_local(client.node_timeout, self.connect_timeout, i, conn)
                elif kind == IDLE and conn.sim.state != "open":
                    client._broken(conn, "closed")  # closed while idle: make a new one
                    continue
                else:
                    self.write(i, conn, since if kind == PARKED else None)
                break
        if not self.connecting:
            self.start()

    def write(self, i: int, conn: SimConn, since: float | None) -> None:
        now = self.client.proc.now()
        commands = self.rnd.write(i, conn, now)
        ok = self.client._send(conn, commands)
        books = self.client.books[i]
        if self.rnd.written(i, conn, since, now, None if ok else "connection lost") and conn not in books.parked:
            books.parked[conn] = since if since is not None else now

    def connected(self, i: int, conn: SimConn) -> None:
        if self.connecting.pop(i, None) is None:
            return
        self.write(i, conn, None)
        if not self.connecting:
            self.start()

    def connect_timeout(self, i: int, conn: SimConn) -> None:
        if self.connecting.pop(i, None) is None:
            return
        conn.sim.close()
        self.rnd.connect_failed(i, "connect timed out", self.client.proc.now())
        if not self.connecting:
            self.start()

    def start(self) -> None:
        self.rnd.start(self.client.proc.now())
        self.check()

    def check(self) -> None:
        if self.finished or self.connecting:
            return
        proc = self.client.proc
        wait = self.rnd.wait_time(proc.now())
        if wait is None:
            self.finish()
        elif wait == 0.0:
            proc.after_local(0.0, self.check)  # the outcome is known: take what arrives at this instant
        elif self.timer is None:
            self.timer = proc.after_local(wait, self._timer)

    def _timer(self) -> None:
        self.timer = None
        self.check()

    def finish(self) -> None:
        self.finished = True
        if self.timer is not None:
            self.client.world.cancel(self.timer)
        self.rnd.finish(self.client.proc.now())
        self.done(self.rnd.results)
