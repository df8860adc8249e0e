"""The asyncio driver: connections read by a protocol, and the fan-out on the running loop.

Each connection's transport is read by a protocol (:class:`AConn`) that parses
and books every reply the moment it arrives (see :mod:`django_redlock.core.entries`),
whether or not a caller still waits for it. A fan-out writes every command
before awaiting anything, then waits on the replies it wants until the outcome
is known or ``node_timeout`` passes. Nothing a caller does (giving up, being
cancelled) can lose a reply's meaning: the protocol keeps the books and a
connection goes back to the pool only when nothing is pending on it.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import weakref
from collections.abc import AsyncGenerator, Coroutine, Mapping, Sequence
from typing import Any

import redis
import redis.asyncio as aredis
from redis.exceptions import RedisError

from django_redlock.core import clock, forks
from django_redlock.core.node_spec import NodeConfig, describe
from django_redlock.core.resp import INCOMPLETE, USUAL, ReplyBuffer, pack, pack_write
from django_redlock.core.books import IDLE_CHECK, NEW, ConnState, NodeBooks, NodeUnavailable
from django_redlock.core.rounds import Round
from django_redlock.core.steps import Fan

__all__ = ["AConn", "AsyncNode", "afanout", "settle_and_close"]


class AConn(ConnState, asyncio.Protocol):
    """One connection: the books' per-connection state, and the protocol that reads its replies.

    redis.asyncio makes the connection (TCP or TLS, AUTH, SELECT); then this
    protocol takes the transport over. Every reply is parsed and booked the
    moment it arrives (see :mod:`django_redlock.core.entries`), whether or not
    a caller still waits for it: no reader task, no parser round trip through
    redis-py. When nothing is pending any more, the connection is idle again.
    """

    __slots__ = ("conn", "anode", "books", "transport", "closed", "_replies")

    def __init__(self, conn: Any, anode: AsyncNode, books: NodeBooks[AConn], transport: Any) -> None:
        super().__init__()
        self.conn = conn  # redis-py closes the transport when its connection is collected: keep it
        self.anode = anode
        self.books = books
        self.transport = transport
        self.closed = False
        self._replies = ReplyBuffer()

    def healthy(self) -> bool:
        """An idle connection has nothing to read; a closed one or stray bytes mean it is unusable."""
        return not self.closed and not self._replies.buf and not self.transport.is_closing()

    def data_received(self, data: bytes) -> None:
        """Book every whole reply that arrived, in order, the moment it arrives."""
        if self.closed:
            return
        replies = self._replies
        books = self.books
        try:
            # A read that brings exactly one of the usual replies (most do) needs no parse.
            reply = INCOMPLETE if replies.buf else USUAL.get(data, INCOMPLETE)
            if reply is INCOMPLETE:
                replies.feed(data)
                reply = replies.next()
            while reply is not INCOMPLETE:
                resend = books.book(self, reply, clock.now())[1]
                if resend is not None:
                    self.transport.write(pack(resend))
                if self.anode._settling:  # someone closing waits for the replies still due
                    settling = self.anode._settling.pop(books, None)
                    if settling is not None:
                        _wake(settling)
                reply = replies.next() if replies.buf else INCOMPLETE
        except (ValueError, RedisError) as exc:
            self.anode.drop(self, f"protocol error ({exc})")

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed:
            self.anode.drop(self, "connection lost")

    def close(self) -> None:
        self.closed = True
        self.transport.close()
        self._forget()

    def close_abandoned(self) -> None:
        """Close the socket of a connection whose event loop is closed (it can run nothing more)."""
        self.closed = True
        transport = self.transport
        inner = getattr(getattr(transport, "_ssl_protocol", None), "_transport", transport)  # TLS: the TCP one
        if getattr(inner, "_sock", None) is not None:
            inner._call_connection_lost(None)  # what close() would have the loop run: closes the socket
        self._forget()

    def _forget(self) -> None:
        self.conn._reader = self.conn._writer = None  # closed here: nothing left for redis-py (nor its warning)


class AsyncNode:
    """One node's asyncio connections and books (per event loop, fork-aware)."""

    def __init__(self, node: NodeConfig) -> None:
        self.node = node
        self.name = node.name
        self.node_timeout = node.node_timeout
        self._pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, NodeBooks[AConn]] = (
            weakref.WeakKeyDictionary()
        )
        self._pools_lock = forks.mutex(self, "_pools_lock")  # several threads may each run their own loop
        #: Per loop's books: woken when a reply is booked while :meth:`settle` waits.
        self._settling: dict[NodeBooks[AConn], asyncio.Future[None]] = {}
        self._pid = os.getpid()
        #: An idle connection is looked at (:meth:`usable`) once idle this long: a Sentinel node's
        #: every time (is it still the master's?), others' as the sync driver's are.
        self.look_after = IDLE_CHECK if node.sentinel is None else 0.0
        kwargs = dict(node.kwargs)
        kwargs.pop("retry", None)
        kwargs.pop("parser_class", None)
        kwargs.pop("connection_class", None)
        self.kwargs = kwargs
        self.connection_class = _async_class(node)

    @property
    def books(self) -> NodeBooks[AConn]:
        """The books of the running event loop: connections belong to one loop (and one process)."""
        return self.books_for(asyncio.get_running_loop(), os.getpid())

    def books_for(self, loop: asyncio.AbstractEventLoop, pid: int) -> NodeBooks[AConn]:
        """:attr:`books` for a fan-out that read the loop and ``os.getpid()`` (a syscall) once for all nodes."""
        books = self._pools.get(loop)
        if books is None or pid != self._pid:
            with self._pools_lock:
                if os.getpid() != self._pid:
                    self._pools = weakref.WeakKeyDictionary()  # a forked child: the parent's sockets are not ours
                    self._pid = os.getpid()
                books = self._pools.get(loop)
                if books is None:
                    self._sweep_closed_loops()
                    books = self._pools[loop] = NodeBooks(
                        self.node.name, self.node_timeout, self.node.fsync_always, self.node.history, True
                    )
        return books

    def _sweep_closed_loops(self) -> None:
        """Close the connections of loops closed without shutting down their async generators
        (``run_until_complete()`` then ``close()``): their end never ran, and the books' transports
        would keep such a loop (and its sockets) alive for good. Hold :attr:`_pools_lock`."""
        for loop in [loop for loop in self._pools if loop.is_closed()]:
            for aconn in self._pools.pop(loop).close_all(clock.now()):
                aconn.close_abandoned()

    async def connect(self, books: NodeBooks[AConn]) -> AConn:
        await _close_at_loop_end(self)
        conn = None
        try:
            if self.node.tls_pending:
                # The client's own CPU (the CA store parsed), never in a node timeout, and off the loop.
                await asyncio.to_thread(self.node.tls_context)
            kwargs = self.kwargs
            if self.node.sentinel is not None:  # the master its Sentinels name now
                kwargs = {**kwargs, **await self.node.sentinel.afollow(self.node)}
            conn = self.connection_class(**kwargs)
            if self.connection_class is _TLSConnection:
                conn.context = self.node.tls_context()
            await _within(conn.connect(), self.node_timeout)
            if conn._reader._buffer:
                raise ConnectionError("unexpected bytes after the handshake")
            transport = conn._writer.transport
        except Exception as exc:  # noqa: BLE001 - a failed connect is a failed vote
            if conn is not None:
                await _adisconnect(conn)
            reason = str(exc) if isinstance(exc, NodeUnavailable) else describe(exc, self.node_timeout)
            raise NodeUnavailable(self.node.redact(reason)) from None
        aconn = AConn(conn, self, books, transport)
        transport.set_protocol(aconn)
        return aconn

    def usable(self, aconn: AConn, idle_for: float) -> bool:
        """An idle connection of a Sentinel node is used while it goes to the master the Sentinels
        name (and that server did not answer as a replica)."""
        sentinel = self.node.sentinel
        follows = sentinel is None or (not aconn.demoted and sentinel.current(aconn.conn.host, aconn.conn.port))
        if follows and aconn.healthy():
            return True
        aconn.close()  # closed by the server, stray bytes, or no longer the master's: connect another
        return False

    def drop(self, aconn: AConn, reason: str) -> None:
        """The connection broke (or is given up): the books tell the rounds waiting on it and drop it; close it."""
        aconn.books.broken(aconn, reason, clock.now())
        aconn.close()

    async def settle(self, deadline: float) -> None:
        """Wait until ``deadline`` (monotonic) for the replies still due on parked connections
        (as the sync :meth:`Node.settle <django_redlock.core.nodes.Node.settle>` does)."""
        books = self.books
        loop = asyncio.get_running_loop()
        while any(aconn.expect for aconn in books.parked):
            left = deadline - clock.now()
            if left <= 0:
                return
            waiter = self._settling[books] = loop.create_future()
            timer = loop.call_later(left, _wake, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._settling.pop(books, None)

    async def close(self) -> None:
        for aconn in self.books.close_all(clock.now()):
            aconn.close()


async def settle_and_close(anodes: Sequence[AsyncNode]) -> None:
    """Close the nodes' connections on the running loop once the replies still due were read
    (at most one node timeout in all)."""
    deadline = clock.now() + max((anode.node_timeout for anode in anodes), default=0.0)
    for anode in anodes:
        await anode.settle(deadline)
        await anode.close()


#: Per event loop: the nodes that made connections on it, and what the loop's shutdown runs for them.
_LOOP_ENDS: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, tuple[weakref.WeakSet[AsyncNode], AsyncGenerator[None, None]]
] = weakref.WeakKeyDictionary()


async def _close_at_loop_end(anode: AsyncNode) -> None:
    """Have the running loop settle and close ``anode``'s connections when it shuts down."""
    loop = asyncio.get_running_loop()
    known = _LOOP_ENDS.get(loop)
    if known is None:
        for closed in [other for other in _LOOP_ENDS if other.is_closed()]:
            del _LOOP_ENDS[closed]  # its end never ran and never will; it kept that loop alive
        nodes: weakref.WeakSet[AsyncNode] = weakref.WeakSet()
        end = _at_loop_end(nodes)
        _LOOP_ENDS[loop] = nodes, end
        await end.asend(None)  # its first step: from now on the loop closes it at its shutdown
    else:
        nodes = known[0]
    nodes.add(anode)


async def _at_loop_end(nodes: weakref.WeakSet[AsyncNode]) -> AsyncGenerator[None, None]:
    """Settle and close ``nodes``' connections when the loop shuts down its async generators
    (``asyncio.run`` does, before it closes the loop), as :meth:`AsyncLockManager.aclose` would.

    A release that ended at a quorum leaves the last replies coming; a program that ends
    without ``aclose()`` would exit with them unread, and a socket closed like that is reset.
    """
    try:
        yield
    finally:
        _LOOP_ENDS.pop(asyncio.get_running_loop(), None)
        await settle_and_close(list(nodes))


class _TLSConnection(aredis.SSLConnection):
    """redis.asyncio's TLS connection over its node's one context (see :class:`~django_redlock.core.node_spec.TLSConnection`)."""

    context: ssl.SSLContext | None = None

    def _connection_arguments(self) -> Mapping[str, Any]:
        if self.context is None:
            return super()._connection_arguments()
        return {**aredis.Connection._connection_arguments(self), "ssl": self.context}


def _async_class(node: NodeConfig) -> type:
    if node.path:
        return aredis.UnixDomainSocketConnection
    if issubclass(node.connection_class, redis.SSLConnection):
        return _TLSConnection
    return aredis.Connection


async def _within(work: Coroutine[Any, Any, None], timeout: float) -> None:
    """Await ``work`` for at most ``timeout`` seconds of the loop's own running time.

    A deadline that passes while the loop itself was stopped (a long garbage
    collection, a busy host) is not the node's fault: when the timer fires later
    than a quarter of the timeout, the work gets the timeout once more.
    """
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(work)
    try:
        for _ in range(2):
            due = loop.time() + timeout
            await asyncio.wait((task,), timeout=timeout)
            if task.done() or loop.time() - due < timeout / 4:
                break
    except BaseException:
        task.cancel()  # cancelled from outside: the work goes with it
        raise
    if not task.done():
        task.cancel()
        await asyncio.wait((task,))
        raise asyncio.TimeoutError
    task.result()


async def _adisconnect(conn: Any) -> None:
    try:
        await conn.disconnect()
    except Exception:  # noqa: BLE001
        pass


def _keep_when_connected(books: NodeBooks[AConn], task: asyncio.Task[AConn]) -> None:
    """A connect the fan-out stopped waiting for (cancelled): keep the connection if it succeeds."""

    def after(done: asyncio.Task[AConn]) -> None:
        if not done.cancelled() and done.exception() is None:
            now = clock.now()
            books.checkin(done.result(), now, now)

    task.add_done_callback(after)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _look(loop: asyncio.AbstractEventLoop) -> None:
    """Return once the loop has read what already arrived: it runs a turn's due timers after that turn's reads."""
    looked = loop.create_future()
    loop.call_later(0.0, _wake, looked)
    await looked


async def afanout(anodes: Sequence[AsyncNode], fan: Fan, timeout: float) -> list[Any]:
    """The asyncio driver of :class:`~django_redlock.core.rounds.Round` (see :func:`~django_redlock.core.nodes.fanout`)."""
    now = clock.now()
    loop = asyncio.get_running_loop()
    pid = os.getpid()
    books: list[NodeBooks[AConn]] = []  # looked up once per fan-out
    following: list[Any] = []  # the Sentinel groups
    for anode in anodes:  # a loop, not comprehensions (each a Python call of its own before Python 3.12)
        books.append(anode.books_for(loop, pid))
        if anode.node.sentinel is not None:
            following.append(anode.node.sentinel)
    for book in books:
        if book.parked and book.lagging(now):
            # Replies overdue by the clock may be here, unread while the loop did not run (a blocking
            # call, a long garbage collection): the loop reads them before any node is judged silent.
            await _look(loop)
            now = clock.now()
            break
    if following and any(sentinel.due(now) for sentinel in following):
        # Do the Sentinels still name the master idle connections go to? (at most every RECHECK)
        await asyncio.gather(*(anode.node.sentinel.arecheck(anode.node) for anode in anodes if anode.node.sentinel))
        now = clock.now()
    rnd = Round(books, fan, now=now, timeout=timeout)
    woken = loop.create_future()  # set when one of the round's replies was taken; a new one per wait

    def wake() -> None:
        if not woken.done():
            woken.set_result(None)

    rnd.on_reply = wake
    packed = fan.packed  # every command of the round, encoded before any node was asked

    def send(i: int, aconn: AConn, since: float | None, wire: list[tuple[Any, ...]]) -> None:
        anode = anodes[i]
        error = None
        # Outside the try: only the write is the node's failure (the usual one looked up, as in fanout()).
        data = packed.get(wire[0]) if len(wire) == 1 else None
        if data is None:
            data = pack_write(wire, packed)
        try:
            aconn.transport.write(data)
        except Exception as exc:  # noqa: BLE001 - the connection is broken
            error = anode.node.redact(describe(exc, anode.node_timeout))
            aconn.close()
        rnd.written(i, aconn, since, now, error)  # the books keep it parked while its replies come

    connecting: dict[int, asyncio.Task[AConn]] = {}
    try:
        for i, anode in enumerate(anodes):
            if books[i].parked:
                for stale in books[i].give_up_stale(now):
                    stale.close()
            opened = rnd.open(i, now, anode.usable, anode.look_after)
            if opened == NEW:
                connecting[i] = asyncio.ensure_future(anode.connect(books[i]))
            elif opened is not None:
                send(i, *opened)
        if connecting:
            await asyncio.wait(connecting.values())
            now = clock.now()
            for i, task in connecting.items():
                exc = task.exception()
                if exc is not None:
                    rnd.connect_failed(i, str(exc) if isinstance(exc, NodeUnavailable) else describe(exc, timeout), now)
                else:
                    aconn = task.result()
                    send(i, aconn, None, rnd.write(i, aconn, now))
            connecting = {}
        while True:
            wait = rnd.wait_time(clock.now())
            if wait is None:
                break
            if woken.done():
                woken = loop.create_future()
            if wait == 0.0 and rnd.grace:
                await asyncio.sleep(0)  # the outcome is known: let replies already here be read
                continue
            # The last look (0.0 once the time is up) waits on a timer too: the loop runs a turn's
            # due timers after that turn's reads, so the replies already here are booked first.
            timer = loop.call_later(wait, _wake, woken)
            try:
                await woken
            finally:
                timer.cancel()
    except BaseException:
        # Cancelled: replies are still read and booked as they come; connects finish into the pool.
        rnd.finish(clock.now())
        for i, task in connecting.items():
            _keep_when_connected(books[i], task)
        raise
    rnd.finish(clock.now())
    return rnd.results
