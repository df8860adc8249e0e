"""The simulator's round driver: a :class:`~django_redlock.core.rounds.Round` on simulated connections.

What the sync driver does with sockets and ``poll()`` and the asyncio driver with
protocols, this does with the simulated network: open connections, write what the
round asks for, hand each reply to the books, set timers on the process's own clock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from django_redlock.core import steps
from django_redlock.core.books import NEW, ConnState, NodeBooks
from django_redlock.core.rounds import Round

from .network import ConnectionBroken, SimConnection
from .scenario import Sim

__all__ = ["SimConn", "SimDriver"]


class SimConn(ConnState):
    """A simulated connection carrying the books' per-connection state."""

    __slots__ = ("sim", "books")

    def __init__(self, sim: SimConnection, books: NodeBooks[SimConn]) -> None:
        super().__init__()
        self.sim = sim
        self.books = books


class SimDriver:
    """One client process's connections to the simulated nodes, and the rounds run on them."""

    def __init__(self, sim: Sim, proc: Any, books: Sequence[NodeBooks[SimConn]], node_timeout: float) -> None:
        self.sim = sim
        self.proc = proc
        self.world = sim.world
        for book in books:
            book.background_reads = True  # every reply is booked as it arrives, as the asyncio driver does
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
        try:
            resend = conn.books.book(conn, reply, self.proc.now())[1]
        except ValueError:
            self._broken(conn, "protocol error")
            return
        if resend is not None:
            self._send(conn, [resend])

    def _broken(self, conn: SimConn, reason: str) -> None:
        conn.books.broken(conn, reason, self.proc.now())

    def _send(self, conn: SimConn, commands: list[tuple[Any, ...]]) -> bool:
        try:
            conn.sim.send(commands)
            return True
        except ConnectionBroken:
            return False

    def give_up_stale(self, i: int, now: float) -> None:
        """Apply the books' stale rule to parked connections, as the other drivers do before a round."""
        for conn in self.books[i].give_up_stale(now):
            conn.sim.close()

    def usable(self, conn: SimConn, idle_for: float) -> bool:
        """An idle connection closed meanwhile is not used (a new one is made)."""
        return bool(conn.sim.state == "open")


class _SimRound:
    """One round on simulated connections: connect, write, collect, finish."""

    def __init__(self, client: SimDriver, fan: steps.Fan, done: Callable[[list[Any]], None]) -> None:
        self.client = client
        self.done = done
        self.finished = False
        self.timer: int | None = None
        proc = client.proc
        now = proc.now()
        self.rnd = rnd = Round[SimConn](client.books, fan, now=now,
                               timeout=fan.timeout or client.node_timeout)
        rnd.on_reply = self.check
        self.connecting: dict[int, SimConn] = {}
        self.opened = False  # every node opened (a stall may hold the round up before one)
        self.open_from(0)

    def open_from(self, first: int) -> None:
        """Open nodes ``first``.. in turn, unless the world holds the round up before one of them."""
        client, rnd, proc = self.client, self.rnd, self.client.proc
        now = proc.now()
        stall = client.sim.stall
        for i in range(first, client.total):
            if stall is not None and i > first and (hold := stall(proc, rnd, i)) > 0:
                proc.after_local(hold, self.open_from, i)
                return
            if client.books[i].parked:
                client.give_up_stale(i, now)
            opened = rnd.open(i, now, client.usable)
            if opened == NEW:
                conn = client.connect(i)
                self.connecting[i] = conn
                conn.sim.on_connected = lambda i=i, conn=conn: self.connected(i, conn)
                proc.after_local(client.node_timeout, self.connect_timeout, i, conn)
            elif opened is not None:
                self.send(i, *opened)
        self.opened = True
        if not self.connecting:
            self.check()

    def send(self, i: int, conn: SimConn, since: float | None, commands: list[tuple[Any, ...]]) -> None:
        ok = self.client._send(conn, commands)
        self.rnd.written(i, conn, since, self.client.proc.now(), None if ok else "connection lost")

    def connected(self, i: int, conn: SimConn) -> None:
        if self.connecting.pop(i, None) is None:
            return
        self.send(i, conn, None, self.rnd.write(i, conn, self.client.proc.now()))
        if not self.connecting:
            self.check()

    def connect_timeout(self, i: int, conn: SimConn) -> None:
        if self.connecting.pop(i, None) is None:
            return
        conn.sim.close()
        self.rnd.connect_failed(i, "connect timed out", self.client.proc.now())
        if not self.connecting:
            self.check()

    def check(self) -> None:
        if self.finished or self.connecting or not self.opened:
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
