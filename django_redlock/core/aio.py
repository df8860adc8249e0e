"""The async twin of the engine, on ``redis.asyncio``: same rules, same errors.

Each connection's transport is read by a protocol (:class:`AConn`) that parses
and books every reply the moment it arrives (see :mod:`django_redlock.core.ledger`),
whether or not a caller still waits for it. A fan-out writes every command
before awaiting anything, then waits on the replies it wants until the outcome
is known or ``node_timeout`` passes. Nothing a caller does (giving up, being
cancelled) can lose a reply's meaning: the protocol keeps the books and a
connection goes back to the pool only when nothing is pending on it.
"""

from __future__ import annotations

import asyncio
import os
import time
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine, Sequence
from types import TracebackType
from typing import Any, cast

import redis.asyncio as aredis
from redis.exceptions import RedisError

from django_redlock.core import base, clock, forks, ledger, steps
from django_redlock.core.base import Resources
from django_redlock.core.lock import ContextBase, LockBase
from django_redlock.core.listing import Rows, read_listing, read_locked, read_record
from django_redlock.core.manager import ManagerBase, status_of
from django_redlock.core.nodes import Node, ReplyBuffer, describe, pack
from django_redlock.core.rounds import NEW, PARKED, ConnState, Failure, NodeBooks, NodeUnavailable, Round
from django_redlock.core.records import ForcedRelease, LockListing, LockRecord, NodeStatus
from django_redlock.core.scripts import RELEASE, Script

__all__ = ["AsyncLock", "AsyncLockManager"]

#: Tasks that must finish even if whoever started them is cancelled (releases).
_BACKGROUND: set[asyncio.Task[Any]] = set()


class AConn(ConnState, asyncio.Protocol):
    """One connection: the books' per-connection state, and the protocol that reads its replies.

    redis.asyncio makes the connection (TCP or TLS, AUTH, SELECT); then this
    protocol takes the transport over. Every reply is parsed and booked the
    moment it arrives (see :mod:`django_redlock.core.ledger`), whether or not
    a caller still waits for it: no reader task, no parser round trip through
    redis-py. When nothing is pending any more, the connection is idle again.
    """

    __slots__ = ("conn", "anode", "books", "transport", "closed", "_replies")

    def __init__(self, conn: Any, anode: AsyncNode, books: NodeBooks, transport: Any) -> None:
        super().__init__()
        self.conn = conn  # redis-py closes the transport when its connection is collected: keep it
        self.anode = anode
        self.books = books
        self.transport = transport
        self.closed = False
        self._replies = ReplyBuffer()

    def healthy(self) -> bool:
        """An idle connection has nothing to read; a closed one or stray bytes mean it is unusable."""
        return not self.closed and not self._replies.pending() and not self.transport.is_closing()

    def write(self, data: bytes) -> None:
        self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        replies = self._replies
        replies.feed(data)
        try:
            while (reply := replies.next()) is not ReplyBuffer.INCOMPLETE:
                self._book(reply)
        except (ValueError, RedisError) as exc:
            self.anode.drop(self, f"protocol error ({exc})")

    def _book(self, reply: Any) -> None:
        books = self.books
        now = clock.now()
        entry, resend = books.read(self, reply, now)
        if resend is not None:
            self.transport.write(pack(resend))
        elif entry.waiter is not None:
            entry.waiter.take(entry, reply, now)
        if self in books.parked:
            if self.expect:
                books.parked[self] = now  # progress
            else:
                del books.parked[self]
                books.checkin(self, 0.0, now)
        if self.anode._settling:  # someone closing waits for the replies still due
            settling = self.anode._settling.pop(books, None)
            if settling is not None:
                _wake(settling)

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

    def __init__(self, node: Node) -> None:
        self.node = node
        self.name = node.name
        self.node_timeout = node.node_timeout
        self._pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, NodeBooks] = weakref.WeakKeyDictionary()
        self._pools_lock = forks.mutex(self, "_pools_lock")  # several threads may each run their own loop
        #: Per loop's books: woken when a reply is booked while :meth:`settle` waits.
        self._settling: dict[NodeBooks, asyncio.Future[None]] = {}
        self._pid = os.getpid()
        kwargs = dict(node.kwargs)
        kwargs.pop("retry", None)
        kwargs.pop("parser_class", None)
        kwargs.pop("connection_class", None)
        self.kwargs = kwargs
        self.connection_class = _async_class(node)

    @property
    def books(self) -> NodeBooks:
        """The books of the running event loop: connections belong to one loop (and one process)."""
        return self.books_for(asyncio.get_running_loop(), os.getpid())

    def books_for(self, loop: asyncio.AbstractEventLoop, pid: int) -> NodeBooks:
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
                        self.node.name, self.node_timeout, self.node.fsync_always, self.node.history
                    )
        return books

    def _sweep_closed_loops(self) -> None:
        """Close the connections of loops closed without shutting down their async generators
        (``run_until_complete()`` then ``close()``): their end never ran, and the books' transports
        would keep such a loop (and its sockets) alive for good. Hold :attr:`_pools_lock`."""
        for loop in [loop for loop in self._pools if loop.is_closed()]:
            books = self._pools.pop(loop)
            now = clock.now()
            for aconn in [conn for conn, _ in books.idle] + list(books.parked):
                books.drop(aconn, now)
                aconn.close_abandoned()
            books.idle.clear()

    def _conns(self) -> list[AConn]:
        books = self.books
        return [conn for conn, _ in books.idle] + list(books.parked)

    async def connect(self, books: NodeBooks) -> AConn:
        await _close_at_loop_end(self)
        conn = None
        try:
            conn = self.connection_class(**self.kwargs)
            await _within(conn.connect(), self.node_timeout)
            if conn._reader._buffer:
                raise ConnectionError("unexpected bytes after the handshake")
            transport = conn._writer.transport
        except Exception as exc:  # noqa: BLE001 - a failed connect is a failed vote
            if conn is not None:
                await _adisconnect(conn)
            raise NodeUnavailable(self.node.redact(describe(exc, self.node_timeout))) from None
        aconn = AConn(conn, self, books, transport)
        transport.set_protocol(aconn)
        return aconn

    def write(self, aconn: AConn, commands: list[tuple[Any, ...]], packed: dict[Any, bytes]) -> None:
        if len(commands) == 1:
            data = packed.get(commands[0])
            if data is None:
                data = packed[commands[0]] = pack(commands[0])  # the same command usually goes to every node
        else:
            data = b"".join(pack(c) for c in commands)
        aconn.write(data)

    def drop(self, aconn: AConn, reason: str) -> None:
        """The connection broke (or is given up): tell the rounds waiting on it, let the books drop it, close it."""
        now = clock.now()
        for entry in list(aconn.expect):
            if entry.waiter is not None:
                entry.waiter.take(entry, Failure(reason), now)
        aconn.books.drop(aconn, now)
        aconn.close()

    def drop_stale(self, books: NodeBooks, now: float) -> None:
        """Give up connections whose replies are overdue beyond the stale limit (the books decide)."""
        for aconn in books.stale(now):
            self.drop(aconn, f"no reply for over {books.stale_limit:.1f} s")

    async def settle(self, deadline: float) -> None:
        """Wait until ``deadline`` (monotonic) for the replies still due on parked connections
        (see :meth:`Node.settle <django_redlock.core.nodes.Node.settle>`)."""
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
        books = self.books
        now = clock.now()
        for aconn in self._conns():
            books.drop(aconn, now)
            aconn.close()
        books.idle.clear()


async def _settle_and_close(anodes: Sequence[AsyncNode]) -> None:
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
        await _settle_and_close(list(nodes))


def _async_class(node: Node) -> type:
    if node.path:
        return aredis.UnixDomainSocketConnection
    if node.connection_class.__name__ == "SSLConnection":
        return aredis.SSLConnection
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


def _keep_when_connected(books: NodeBooks, task: asyncio.Task[Any]) -> None:
    """A connect the fan-out stopped waiting for (cancelled): keep the connection if it succeeds."""

    def after(done: asyncio.Task[Any]) -> None:
        if not done.cancelled() and done.exception() is None:
            books.checkin(done.result(), 0.0, clock.now())

    task.add_done_callback(after)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _look(loop: asyncio.AbstractEventLoop) -> None:
    """Return once the loop has read what already arrived: it runs a turn's due timers after that turn's reads."""
    looked = loop.create_future()
    loop.call_later(0.0, _wake, looked)
    await looked


async def afanout(
    anodes: Sequence[AsyncNode],
    commands: Sequence[tuple[Any, ...] | None],
    *,
    timeout: float,
    done: Callable[[list[Any]], bool] | None = None,
    script: Script | None = None,
    ordered_after_key: str | None = None,
    allow_lagging: bool = True,
    timings: list[float | None] | None = None,
    restart_window: float = 0.0,
    owe: tuple[str, str, float] | None = None,
    block: tuple[tuple[str, ...], float] | None = None,
) -> list[Any]:
    """The asyncio driver of :class:`~django_redlock.core.rounds.Round` (see :func:`~django_redlock.core.nodes.fanout`)."""
    now = clock.now()
    loop = asyncio.get_running_loop()
    pid = os.getpid()
    books = [anode.books_for(loop, pid) for anode in anodes]  # looked up once per fan-out
    for book in books:
        if book.parked and book.lagging(now):
            # Replies overdue by the clock may be here, unread while the loop did not run (a blocking
            # call, a long garbage collection): the loop reads them before any node is judged silent.
            await _look(loop)
            now = clock.now()
            break
    rnd = Round(
        books,
        commands,
        now=now,
        timeout=timeout,
        done=done,
        script=script,
        ordered_after_key=ordered_after_key,
        allow_lagging=allow_lagging,
        restart_window=restart_window,
        timings=timings,
        owe=owe,
        block=block,
    )
    wake: list[asyncio.Future[None]] = [loop.create_future()]

    rnd.on_reply = lambda: _wake(wake[0])
    packed: dict[Any, bytes] = {}

    def write(i: int, aconn: AConn, since: float | None) -> None:
        anode = anodes[i]
        wire = rnd.write(i, aconn, now)
        error = None
        try:
            anode.write(aconn, wire, packed)
        except Exception as exc:  # noqa: BLE001 - the connection is broken
            error = anode.node.redact(describe(exc, anode.node_timeout))
            aconn.close()
        parked = books[i].parked
        if rnd.written(i, aconn, since, now, error) and aconn not in parked:
            parked[aconn] = since if since is not None else now

    connecting: dict[int, asyncio.Task[AConn]] = {}
    try:
        for i, anode in enumerate(anodes):
            if books[i].parked:
                anode.drop_stale(books[i], now)
            while True:
                choice = rnd.choose(i, now)
                if choice is None:
                    break
                kind, aconn, since = choice
                if kind == NEW:
                    connecting[i] = asyncio.ensure_future(anode.connect(books[i]))
                elif kind == PARKED or aconn.healthy():
                    write(i, aconn, since if kind == PARKED else None)
                else:
                    aconn.close()  # closed by the server: try again
                    continue
                break
        if connecting:
            await asyncio.wait(connecting.values())
            now = clock.now()
            for i, task in connecting.items():
                exc = task.exception()
                if exc is not None:
                    rnd.connect_failed(i, str(exc) if isinstance(exc, NodeUnavailable) else describe(exc, timeout), now)
                else:
                    write(i, task.result(), None)
            connecting = {}
        rnd.start(clock.now())
        while True:
            wait = rnd.wait_time(clock.now())
            if wait is None:
                break
            if wake[0].done():
                wake[0] = loop.create_future()
            if wait == 0.0 and rnd.grace:
                await asyncio.sleep(0)  # the outcome is known: let replies already here be read
                continue
            # The last look (0.0 once the time is up) waits on a timer too: the loop runs a turn's
            # due timers after that turn's reads, so the replies already here are booked first.
            timer = loop.call_later(wait, _wake, wake[0])
            try:
                await wake[0]
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


class AsyncLock(LockBase):
    """An async Redlock: ``await lock.extend()``, ``await lock.release()``, ``async with``."""

    manager: AsyncLockManager

    async def extend(self, ttl: float | None = None) -> None:
        """Reset the ttl on a quorum within the current validity; see :meth:`Lock.extend`."""
        await self._extend(ttl, automatic=False)

    async def _extend(self, ttl: float | None, *, automatic: bool) -> None:
        manager = self.manager
        await manager._run(steps.extend(self, ttl, automatic, manager.quorum, len(manager.node_list)))

    async def release(self) -> bool:
        """Delete this holder's key on every node; idempotent; never raises. See :meth:`Lock.release`."""
        started = self._start_release()
        if started is None:
            return True
        if not started:
            return False
        self.manager._forget(self)
        results = await self.manager._release_keys(self.resources, self.value, place=self._place)
        return self._judge_release(results)

    async def owned(self) -> bool:
        """Ask the nodes whether this holder still holds the lock; see :meth:`Lock.owned`."""
        if not self._can_ask():
            return False
        results = await self._read_values()
        held = self._judge_owned(results)
        if held is None:
            raise self._owned_error(results)
        return held

    async def _read_values(self) -> list[Any]:
        """Read the keys on every node, in one fan-out."""
        total = len(self.manager.node_list)
        return await self.manager._fanout(
            [self._read_command()] * total,
            done=base.until_outcome(self.manager.quorum, total, self._is_ours),
        )

    async def get_fencing_token(self) -> int:
        """The fencing token (computed on first call, then cached); see :attr:`Lock.fencing_token`."""
        if self._fencing_token is None:
            self._fencing_token = await self.manager._fence(self)
        return self._fencing_token

    @property
    def fencing_token(self) -> int:
        """The fencing token once ``await lock.get_fencing_token()`` has computed it."""
        if self._fencing_token is None:
            raise RuntimeError("Call 'await lock.get_fencing_token()' first: computing it needs the event loop.")
        return self._fencing_token

    async def __aenter__(self) -> AsyncLock:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.release()
        error = self._lost_error()
        if error is not None and exc_type is None:
            raise error


class AsyncLockContext(ContextBase):
    """``async with manager.lock(...) as lock:``; auto-extension runs as a task on the loop."""

    manager: AsyncLockManager
    _task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> AsyncLock:
        lock = await self.manager.acquire(self.resource, **self.kwargs)
        self.lock = lock
        if self.auto_extend and lock._depth == 1:
            self._task = asyncio.ensure_future(_keep_alive(lock, self.max_hold, self.on_lost))
        return lock

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if self._task is not None:
                self._task.cancel()
                # wait() does not raise the keep-alive's own cancellation; a cancellation
                # of the caller still propagates, after the release below.
                await asyncio.wait({self._task})
        finally:
            if self.lock is not None:
                await self.lock.__aexit__(exc_type, exc, tb)


def _keep_alive(
    lock: AsyncLock, max_hold: float | None, on_lost: Callable[[AsyncLock], Any] | None
) -> Coroutine[Any, Any, None]:
    """The keep-alive task's coroutine: same schedule as the sync extender, holding the lock weakly.

    ``on_lost`` (a function or a coroutine function) runs once, in a task of
    its own, when the lock is marked lost while held: also when the loss is
    found by ``extend()`` or ``owned()``, and also if this task was cancelled.
    """
    from django_redlock.core.extender import Watch

    stop_at = clock.now() + max_hold if max_hold is not None else None
    watch = Watch(lock.manager, weakref.ref(lock), lock.resource, stop_at, on_lost)
    if on_lost is not None:
        loop = asyncio.get_running_loop()

        def listener(lost: Any) -> None:
            if watch.listening:
                watch.listening = False
                loop.call_soon_threadsafe(_report_lost, lost, on_lost)

        lock._lost_listener = listener
    return _keep_alive_loop(watch)


async def _keep_alive_loop(watch: Any) -> None:
    from django_redlock.core.extender import next_action, next_due, note_extend_error

    while True:
        lock = watch.ref()
        action = next_action(watch, lock)
        if action == "extend":
            try:
                await lock._extend(None, automatic=True)
                watch.failure = None
            except Exception as exc:  # noqa: BLE001 - judged by note_extend_error
                note_extend_error(watch, lock, exc)
        elif action == "check" and lock._can_ask():
            lock._judge_owned(await lock._read_values())
        if action == "stop" or lock.lost or lock.released:
            return
        now = clock.now()
        delay = next_due(watch, lock, now) - now
        del lock  # hold it weakly while asleep: a dropped lock stops here and expires
        await asyncio.sleep(max(0.0, delay))


_reports: set[asyncio.Task[None]] = set()


def _report_lost(lock: AsyncLock, on_lost: Callable[[AsyncLock], Any]) -> None:
    async def report() -> None:
        from django_redlock.core.extender import logger

        try:
            result = on_lost(lock)
            if asyncio.iscoroutine(result):
                await result
        except Exception:  # noqa: BLE001
            logger.exception("on_lost callback for lock %r failed", lock.resource)

    task = asyncio.ensure_future(report())
    _reports.add(task)  # keep it alive until it ran
    task.add_done_callback(_reports.discard)


class AsyncLockManager(ManagerBase):
    """:class:`~django_redlock.core.LockManager` for asyncio code (async views, ASGI)."""

    _anodes: list[AsyncNode] | None = None

    @property
    def anodes(self) -> list[AsyncNode]:
        if self._anodes is None:
            self._anodes = [AsyncNode(node) for node in self.node_list]
        return self._anodes

    async def _fanout(self, commands: Sequence[Any], timeout: float | None = None, **kwargs: Any) -> list[Any]:
        return await afanout(self.anodes, commands, timeout=timeout or self.config.node_timeout, **kwargs)

    async def acquire(
        self,
        resource: Resources,
        ttl: float | None = None,
        *,
        blocking: bool = True,
        timeout: float | None = None,
        label: str | None = None,
        reentrant: bool = False,
    ) -> AsyncLock:
        """Acquire ``resource`` on a quorum; see :meth:`LockManager.acquire`."""
        held, step = self._acquiring(resource, ttl, blocking, timeout, label, reentrant)
        if step is None:
            return cast(AsyncLock, held)
        return self._granted(await self._run(step), AsyncLock)

    async def adopt(
        self, resource: Resources, token: str, *, ttl: float | None = None, fencing_token: int | None = None
    ) -> AsyncLock:
        """A handle on a lock acquired elsewhere; see :meth:`LockManager.adopt`."""
        step = self._adopting(resource, token, ttl, fencing_token)
        return self._adopted(await self._run(step), AsyncLock, ttl, fencing_token)

    async def _run(self, step: steps.Step) -> Any:
        """Drive a step on the running loop; an exception (a cancellation) is thrown into it."""
        send: Any = None
        error: BaseException | None = None
        while True:
            try:
                effect = step.throw(error) if error is not None else step.send(send)
            except StopIteration as stop:
                return stop.value
            error = None
            try:
                send = await self._perform(effect)
            except BaseException as exc:  # noqa: BLE001 - handed to the step, which re-raises
                send, error = None, exc

    async def _perform(self, effect: Any) -> Any:
        """Do what a step asks for, on the running loop."""
        kind = type(effect)
        if kind is steps.Fan:
            return await self._fanout(effect.commands, effect.timeout, **effect.options())
        if effect is steps.NOW:
            return self.config.clock()
        if kind is steps.Sleep:
            await asyncio.sleep(effect.seconds)
            return None
        if kind is steps.Background:
            # Runs to its end even if the caller is being cancelled.
            task = asyncio.ensure_future(self._perform(effect.fan))
            _BACKGROUND.add(task)
            task.add_done_callback(_BACKGROUND.discard)
            return None
        if effect is steps.WALL:
            return time.time_ns() // 1000
        raise TypeError(f"unknown step effect {effect!r}")

    def lock(
        self,
        resource: Resources,
        ttl: float | None = None,
        *,
        blocking: bool = True,
        timeout: float | None = None,
        label: str | None = None,
        auto_extend: bool = False,
        max_hold: float | None = None,
        on_lost: Callable[[AsyncLock], Any] | None = None,
        reentrant: bool = False,
    ) -> AsyncLockContext:
        """``async with manager.lock("x") as lock:``; see :meth:`LockManager.lock`."""
        base.check_wait(blocking, timeout)
        kwargs = {"ttl": ttl, "blocking": blocking, "timeout": timeout, "label": label, "reentrant": reentrant}
        return AsyncLockContext(self, resource, kwargs, auto_extend, max_hold, on_lost)

    async def is_locked(self, resource: str) -> bool:
        """Async version of :meth:`LockManager.is_locked`; raises ``QuorumUnavailable`` when it cannot tell."""
        step = read_locked(self.config, self.node_list, self.quorum, resource)
        return cast(bool, await self._run(step))

    async def force_release(self, resource: str) -> int:
        return (await self.force_release_detail(resource)).deleted

    async def force_release_detail(self, resource: str) -> ForcedRelease:
        key = self.key(resource)
        timeout = max(self.config.node_timeout, 0.5)
        results = await self._fanout([("DEL", key)] * len(self.node_list), timeout)
        wake = self.config.release_command((resource,), "")  # wake whoever waits in line
        await self._fanout([wake] * len(self.node_list), timeout, script=RELEASE)
        return base.forced_release(resource, self.node_list, results)

    async def live_locks(self, match: str | None = None) -> AsyncIterator[LockRecord]:
        """Async version of :meth:`LockManager.live_locks`."""
        for record in (await self.lock_listing(match)).records:
            yield record

    async def lock_listing(
        self, match: str | None = None, rows: Rows | None = None, order: str = "resource"
    ) -> LockListing:
        """Async version of :meth:`LockManager.lock_listing`."""
        step = read_listing(self.config, self.node_list, self.quorum, match, rows, order)
        return cast(LockListing, await self._run(step))

    async def lock_record(self, resource: str) -> LockRecord | None:
        """Async version of :meth:`LockManager.lock_record`."""
        step = read_record(self.config, self.node_list, self.quorum, resource)
        return cast("LockRecord | None", await self._run(step))

    async def node_status(self, timeout: float = 1.0) -> list[NodeStatus]:
        timings: list[float | None] = [None] * len(self.node_list)
        results = await self._fanout([ledger.PROBE] * len(self.node_list), timeout, timings=timings)
        window, read = self.config.restart_window, clock.now()
        return [status_of(*row, window, read) for row in zip(self.node_list, results, timings)]

    async def ping(self, timeout: float | None = None) -> dict[str, float | None]:
        timings: list[float | None] = [None] * len(self.node_list)
        await self._fanout([("PING",)] * len(self.node_list), timeout, timings=timings)
        return {node.name: t for node, t in zip(self.node_list, timings)}

    async def aclose(self) -> None:
        """Close every connection made on the running loop, once the replies still due were read
        (at most the node timeout; see :meth:`LockManager.close`). The loop's shutdown
        (``asyncio.run`` ending) does the same for a program that does not call this."""
        await _settle_and_close(self.anodes)

    async def __aenter__(self) -> AsyncLockManager:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- internals used by AsyncLock -------------------------------------

    async def _release_keys(
        self, resources: tuple[str, ...], value: str, ttl: float | None = None, place: str = ""
    ) -> list[Any]:
        """Release ``value`` on every node; a cancelled caller leaves the release to a background task."""
        fan = steps.release_fan(self.config, len(self.node_list), resources, value, ttl, place, quorum=self.quorum)
        try:
            result: list[Any] = await self._perform(fan)
        except asyncio.CancelledError:
            await self._perform(steps.Background(fan))
            raise
        return result

    async def _fence(self, lock: AsyncLock) -> int:
        token: int = await self._run(steps.fence(lock, self.config, self.quorum, len(self.node_list)))
        return token

    def _forget(self, lock: AsyncLock) -> None:
        """Auto-extension tasks watch ``lock.released`` themselves."""
