"""The sync driver of the one-round-trip fan-out.

A :class:`Node` is one independent Redis master (its settings:
:class:`~django_redlock.core.node_spec.NodeConfig`) with its sync connections
and the core's books for them (:class:`~django_redlock.core.books.NodeBooks`),
behind a mutex.

:func:`fanout` runs one :class:`~django_redlock.core.rounds.Round` on real
sockets: it writes what the round asks for to every node before it reads any
reply, then polls until the round says to stop. Which connection a command
goes on, what rides along with it, what a reply means and what is left for
later are the round's and the books' decisions, not this module's. Replies
that arrive late stay booked on their connection and are read, without
waiting, the next time the node is used.
"""

from __future__ import annotations

import atexit
import functools
import os
import select
import threading
import weakref
from collections.abc import Callable, Sequence
from operator import attrgetter, itemgetter
from typing import Any, TypeVar

from redis.exceptions import RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError

from django_redlock.core import clock, sentinel
from django_redlock.core.ledger import parse_info
from django_redlock.core.node_spec import NodeConfig, NodeSpec, config_from_spec, describe, parse_specs
from django_redlock.core.resp import INCOMPLETE, pack, pack_write
from django_redlock.core.books import IDLE_CHECK, MAX_PENDING, NEW, Failure, NodeBooks, NodeUnavailable
from django_redlock.core.rounds import Round
from django_redlock.core.scripts import script_command
from django_redlock.core.steps import Fan
from django_redlock.core.wire import Wire

__all__ = [
    "MAX_PENDING",
    "Failure",
    "Node",
    "NodeSpec",
    "NodeUnavailable",
    "close_nodes",
    "describe",
    "fanout",
    "node_from_spec",
    "parse_info",
    "parse_nodes",
    "script_command",
]


class Node(NodeConfig):
    """One independent Redis master and its connections (thread-safe, fork-aware).

    Each connection carries its own queue of unanswered entries and what its
    restart probe learned (see :mod:`django_redlock.core.ledger`); the node
    keeps its release debts.
    """

    @classmethod
    def follower(cls, spec: NodeSpec, node_timeout: float, where: str) -> Node | None:
        return sentinel.node_from(spec, node_timeout, where, cls)

    def _configured(self) -> None:
        self._mutex = threading.Lock()
        self._reset()
        _NODES.add(self)

    @property
    def stale_limit(self) -> float:
        return self.books.stale_limit

    def _reset(self) -> None:
        self._pid = os.getpid()
        #: The core's books for this node: connections, restart knowledge, release debts.
        self.books: NodeBooks[Wire] = NodeBooks(self.name, self.node_timeout, self.fsync_always, self.history)

    @property
    def fsync_always(self) -> bool:
        """Declared to fsync every write: votes at once after a restart, never probed."""
        return self._fsync_always

    @fsync_always.setter
    def fsync_always(self, value: bool) -> None:
        self._fsync_always = self.books.fsync_always = bool(value)

    def _check_fork(self) -> None:
        if os.getpid() != self._pid:
            with self._mutex:
                if os.getpid() != self._pid:
                    self._reset()  # the parent's sockets are not ours to use

    def _drain_parked(self, now: float) -> None:
        """Read and book late replies that already arrived; the books drop connections overdue too long.

        ``now`` is the fan-out's start, which may be a while ago (a connect timeout to a node listed
        before this one): each reply is booked with the time it is read.
        """
        books = self.books
        for conn in list(books.parked):
            try:
                while conn.expect and read_booked(books, conn) is not None:
                    pass
            except (RedisError, OSError, ValueError):
                books.drop(conn, now)
                _disconnect(conn)
                continue
            if books.give_up_if_stale(conn, now):
                _disconnect(conn)

    def checkout(
        self, rnd: Round[Wire], i: int, now: float, pid: int | None = None
    ) -> tuple[Wire, float | None, list[Command]] | None:
        """Node ``i``'s connection for ``rnd``, booked: ``(conn, parked since, commands to send)``;
        None when the round has its result.

        ``pid``: the caller's ``os.getpid()``, read once per fan-out (a syscall).
        """
        if (os.getpid() if pid is None else pid) != self._pid:
            self._check_fork()
        if self.sentinel is not None and self.sentinel.due(now):
            self.sentinel.recheck(self)  # do the Sentinels still name the master idle connections go to?
        with self._mutex:
            if self.books.parked:  # usually empty: only after an early decision or a silent node
                self._drain_parked(now)
            if self.sentinel is None:
                opened = rnd.open(i, now, _usable, IDLE_CHECK)
            else:
                opened = rnd.open(i, now, self._follows)  # every idle connection: is it the master's?
            if opened != NEW:
                return opened
        conn = None
        try:
            conn = self.new_connection()  # a TLS node's context is built once, before its first connect
            conn.connect()
            wire = Wire(conn, self.node_timeout)  # from here on the engine reads and writes the socket itself
        except Exception as exc:  # noqa: BLE001 - any connect failure makes the node unavailable
            if conn is not None:
                _disconnect(conn)
            reason = str(exc) if isinstance(exc, NodeUnavailable) else describe(exc, self.node_timeout)
            with self._mutex:
                rnd.connect_failed(i, self.redact(reason), clock.now())
            return None
        with self._mutex:
            return wire, None, rnd.write(i, wire, now)

    def _follows(self, conn: Wire, idle_for: float) -> bool:
        """A Sentinel node's idle connection is used while it goes to the master the Sentinels name
        (and that server did not answer as a replica); else it is closed."""
        if conn.demoted or not self.sentinel.current(conn.conn.host, conn.conn.port):
            _disconnect(conn)
            return False
        return _usable(conn, idle_for)

    def checkin(self, conn: Wire, since: float, pid: int | None = None) -> None:
        if (os.getpid() if pid is None else pid) != self._pid:
            return
        with self._mutex:
            self.books.checkin(conn, since, clock.now())

    def drop(self, conn: Wire) -> None:
        with self._mutex:
            self.books.drop(conn, clock.now())
        _disconnect(conn)

    def settle(self, deadline: float) -> None:
        """Read the replies still due on parked connections until ``deadline`` (monotonic), then
        close those connections.

        A release that ended at a quorum leaves the last nodes' replies coming. A socket closed
        with unread bytes is reset, and a command the node has not run yet may go with it, so
        closing (and exiting) reads them first.
        """
        if os.getpid() != self._pid:
            return
        with self._mutex:
            parked = self.books.take_parked()  # taken out: no other thread reads them now
        for conn in parked:
            try:
                while conn.expect:
                    if read_booked(self.books, conn, self._mutex) is None and not conn.more_arrives(
                        deadline - clock.now()
                    ):
                        break
            except (RedisError, OSError, ValueError):
                pass
            self.drop(conn)

    def close(self, deadline: float | None = None) -> None:
        """Close every connection once the replies still due were read, until ``deadline``
        (default: one node timeout from now)."""
        self.settle(clock.now() + self.node_timeout if deadline is None else deadline)
        with self._mutex:
            conns = self.books.close_all(clock.now())
        for conn in conns:
            _disconnect(conn)


def close_nodes(nodes: Sequence[Node]) -> None:
    """Close the nodes' connections once the replies still due were read (at most one node
    timeout in all, as the asyncio driver's ``settle_and_close``)."""
    deadline = clock.now() + max((node.node_timeout for node in nodes), default=0.0)
    for node in nodes:
        node.close(deadline)


#: Every node of this process, reset in a forked child (its parent's sockets and mutexes are not its own).
_NODES: weakref.WeakSet[Node] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for node in list(_NODES):
        node._mutex = threading.Lock()
        node._reset()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


@atexit.register
def _settle_at_exit() -> None:
    """At interpreter exit, read the replies still due (at most one node timeout in all)."""
    nodes = list(_NODES)
    deadline = clock.now() + max((node.node_timeout for node in nodes), default=0.0)
    for node in nodes:
        try:
            node.settle(deadline)
        except Exception:  # noqa: BLE001 - never fail an exit
            pass


def _usable(conn: Wire, idle_for: float) -> bool:
    """An idle connection has nothing to read; EOF or stray bytes mean it is unusable (closed here).
    One idle for less than ``IDLE_CHECK`` is not looked at."""
    if idle_for < IDLE_CHECK:
        return True
    try:
        if not conn.can_read(0):
            return True
    except Exception:  # noqa: BLE001
        pass
    _disconnect(conn)
    return False


def _disconnect(conn: Any) -> None:
    try:
        conn.disconnect()
    except Exception:  # noqa: BLE001 - closing a broken socket must not raise
        pass


# -- building nodes from specs ---------------------------------------------


def parse_nodes(specs: Any, node_timeout: float, argument: str = "nodes") -> list[Node]:
    """Turn URLs, redis-py clients or ``{"URL", "OPTIONS"}`` mappings into nodes."""
    return parse_specs(specs, node_timeout, argument, Node)


def node_from_spec(spec: NodeSpec, node_timeout: float, where: str) -> Node:
    return config_from_spec(spec, node_timeout, where, Node)


# -- the fan-out -----------------------------------------------------------

Command = tuple[Any, ...]


def read_booked(
    books: NodeBooks[Wire],
    conn: Wire,
    mutex: threading.Lock | None = None,
    rnd: Round[Wire] | None = None,
) -> bool | None:
    """Read the next reply that has fully arrived on ``conn`` and have the books book it
    (:meth:`NodeBooks.book`, with the time it was read): False when booked, None when no whole
    reply has arrived (the rest of one may be on its way). With ``rnd``, read on until ``rnd``'s
    own reply was taken (True) or none more has arrived (None).

    Error replies are booked as exceptions; a broken connection raises. After
    a NOSCRIPT the script's source is sent at once. Pass the node's ``mutex``
    when the caller does not hold it: booking, taking and the check-in happen
    under one acquisition.
    """
    while True:
        try:
            reply = conn.arrived_reply()
        except ResponseError as exc:
            reply = exc
        if reply is INCOMPLETE:
            return None
        try:
            now = clock.now()
            try:
                if mutex is None:
                    taken, resend = books.book(conn, reply, now, rnd)
                else:
                    with mutex:
                        taken, resend = books.book(conn, reply, now, rnd)
            except ValueError as exc:
                raise RedisConnectionError(f"Protocol error: {exc}") from None
            if resend is not None:
                conn.send_packed_command(pack(resend))
        except (RedisError, OSError):
            raise  # the caller gives the connection up
        except BaseException:
            # Interrupted (a signal) between reading the reply and booking it, or before sending what it
            # asks for: the connection is out of step with its replies; give it up.
            if mutex is None:
                books.drop(conn, clock.now())
            else:
                with mutex:
                    books.drop(conn, clock.now())
            _disconnect(conn)
            raise
        if rnd is None or taken:
            return taken


def fanout(nodes: Sequence[Node], fan: Fan, timeout: float) -> list[Any]:
    """Run one :class:`~django_redlock.core.rounds.Round` on real sockets: write everything, then poll.

    Returns one entry per node: the reply, or a :class:`Failure`. The round
    decides what is written, how long to wait and what each reply means;
    replies not read by the end stay booked on their connection and are read
    the next time the node is used.
    """
    now = clock.now()
    pid = os.getpid()  # once per fan-out: a syscall, and a fork cannot happen in the middle of one
    books = list(map(_BOOKS, nodes))
    if fan.owe is not None:
        for node in nodes:
            if node._pid != pid:
                node._check_fork()
        # Every node's mutex: the round owes its release to all of them at once.
        rnd = _holding(list(map(_MUTEX, nodes)), functools.partial(Round, books, fan, now=now, timeout=timeout))
    else:
        rnd = Round(books, fan, now=now, timeout=timeout)
    watched: dict[int, tuple[int, Wire]] = {}  # fd -> (node index, connection)
    tls: list[int] = []  # the fds of TLS connections among them
    packed = fan.packed  # every command of the round, encoded before any node was asked
    writing: tuple[Node, Wire] | None = None
    try:
        for i, node in enumerate(nodes):
            got = node.checkout(rnd, i, now, pid)
            if got is None:
                continue
            conn, since, wire = got
            writing = (node, conn)
            error = None
            # Outside the try: only the write is the node's failure. The usual write, the round's one
            # command, is looked up here (no call); pack_write() packs the others.
            data = packed.get(wire[0]) if len(wire) == 1 else None
            if data is None:
                data = pack_write(wire, packed)
            try:
                conn.send_packed_command(data)
            except (RedisError, OSError, ValueError) as exc:
                error = node.redact(describe(exc, node.node_timeout))
                _disconnect(conn)
            writing = None
            if error is None and since is None:
                wait = True  # the usual case: no call to written(), see its contract
            else:
                with node._mutex:
                    wait = rnd.written(i, conn, since, now, error)
            if wait:
                watched[conn.fd] = (i, conn)
                if conn.tls:
                    tls.append(conn.fd)
        if watched:
            _collect(nodes, rnd, watched, tls)
    except BaseException:
        # Interrupted (a signal, KeyboardInterrupt): a command booked but not written, or a reply read
        # but not booked, would leave a connection out of step with its replies. Give up every one
        # this round still used; what they carried may land later, as on any dropped connection.
        if writing is not None:
            writing[0].drop(writing[1])
        for i, conn in rnd.finish(clock.now()):
            nodes[i].drop(conn)
        raise
    for i, conn in rnd.finish(clock.now()):
        nodes[i].checkin(conn, rnd.sent_at, pid)
    return rnd.results


_T = TypeVar("_T")


def _holding(mutexes: Sequence[threading.Lock], make: Callable[[], _T]) -> _T:
    """``make()`` with every one of ``mutexes`` (at least one) held. Each is taken by a ``with``: a signal handler
    that raises cannot run between taking a mutex and the block that gives it back (it could after
    an ``acquire()`` call, leaving the node's mutex taken and every later round on it hung)."""
    with mutexes[0]:
        return make() if len(mutexes) == 1 else _holding(mutexes[1:], make)


_POLL_READ = select.POLLIN | select.POLLERR | select.POLLHUP
# C-level accessors: a comprehension is a Python call of its own (before Python 3.12).
_FD = itemgetter(0)
_BOOKS = attrgetter("books")
_MUTEX = attrgetter("_mutex")


def _collect(nodes: Sequence[Node], rnd: Round[Wire], watched: dict[int, tuple[int, Wire]], tls: list[int]) -> None:
    poller = select.poll()
    for fd in watched:
        poller.register(fd, _POLL_READ)
    while watched:
        wait = rnd.wait_time(clock.now())
        if wait is None:
            break
        buffered = [fd for fd in tls if fd in watched and _has_buffered(watched[fd][1])] if tls else []
        ready = list(map(_FD, poller.poll(0 if buffered else wait * 1000)))
        for fd in buffered:
            if fd not in ready:
                ready.append(fd)
        for fd in ready:
            got = watched.get(fd)
            if got is None:
                continue
            i, conn = got
            node = nodes[i]
            try:
                taken = read_booked(node.books, conn, node._mutex, rnd)  # True: ours was taken
            except (RedisError, OSError, ValueError) as exc:
                with node._mutex:
                    node.books.broken(conn, node.redact(describe(exc, node.node_timeout)), clock.now())
                _disconnect(conn)
                taken = True
            if taken:
                del watched[fd]
                poller.unregister(fd)


def _has_buffered(conn: Wire) -> bool:
    try:
        return conn.tls_buffered()
    except Exception:  # noqa: BLE001
        return False
