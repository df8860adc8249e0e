"""The async twin of the engine, on ``redis.asyncio``: same rules, same errors.

Each node call is a task on the running event loop: every command is written
before any reply is awaited, and the manager stops waiting as soon as the
outcome is known or ``node_timeout`` passes. Calls still unanswered keep
reading in the background (bounded), holding their connection, so a late
reply can never be read by the next command; a release for a key whose
``SET`` is still unanswered is written to that same connection.
"""

from __future__ import annotations

import asyncio
import os
import time
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from types import TracebackType
from typing import Any

import redis.asyncio as aredis
from redis.exceptions import NoScriptError, ResponseError

from django_redlock.core import base
from django_redlock.core.base import ManagerBase, Scan
from django_redlock.core.lock import ContextBase, LockBase
from django_redlock.core.manager import ADMIN_TIMEOUT, SCAN_COUNT, status_of
from django_redlock.core.nodes import (
    MAX_PENDING,
    Failure,
    Node,
    PROBE,
    NodeUnavailable,
    describe,
    pack,
    script_command,
    sitting_out_failure,
)
from django_redlock.core.records import LockRecord, NodeStatus
from django_redlock.core.scripts import EXTEND, FENCE_RAISE, INSPECT, RELEASE, Script

__all__ = ["AsyncLock", "AsyncLockManager"]


class _Busy:
    """A connection with replies still to read, and the task reading them."""

    __slots__ = ("conn", "pending", "keys", "since", "task")

    def __init__(self, conn: Any, keys: list[str]) -> None:
        self.conn = conn
        self.pending = 1
        self.keys = keys
        self.since = time.monotonic()
        self.task: asyncio.Task[Any] | None = None


class AsyncNode:
    """One node's asyncio connections (per event loop, fork-aware)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.name = node.name
        self.node_timeout = node.node_timeout
        kwargs = dict(node.kwargs)
        kwargs.pop("retry", None)
        kwargs.pop("parser_class", None)
        kwargs.pop("connection_class", None)
        # Replies left behind by an early decision are read in the background for
        # up to stale_limit; the fan-out itself waits only node_timeout.
        kwargs["socket_timeout"] = node.stale_limit
        self.kwargs = kwargs
        self.connection_class = _async_class(node)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = os.getpid()
        self._idle: list[Any] = []
        self._busy: dict[Any, _Busy] = {}
        self._down_until = 0.0
        self._down_reason = ""

    def _check_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop or os.getpid() != self._pid:
            # Connections belong to one loop (and one process): start afresh.
            if os.getpid() == self._pid:
                for conn in [*self._idle, *(b.conn for b in self._busy.values())]:
                    _abandon(conn)
            self._loop = loop
            self._pid = os.getpid()
            self._idle = []
            self._busy = {}
            self._down_until = 0.0

    def lagging(self) -> bool:
        now = time.monotonic()
        return any(b.pending and now - b.since > self.node_timeout for b in self._busy.values())

    def busy_for(self, key: str) -> _Busy | None:
        for busy in self._busy.values():
            if key in busy.keys and busy.pending < MAX_PENDING:
                return busy
        return None

    def ready(self, allow_lagging: bool) -> Any:
        """An idle connection, or None when a new one must be made. Raises when the node is skipped."""
        self._check_loop()
        if not allow_lagging and self.lagging():
            raise NodeUnavailable(f"no reply to an earlier command for over {self.node_timeout * 1000:.0f} ms")
        if time.monotonic() < self._down_until:
            raise NodeUnavailable(self._down_reason)
        while self._idle:
            conn = self._idle.pop()
            reader = getattr(conn, "_reader", None)
            if reader is not None and not reader.at_eof() and not reader._buffer:
                return conn
            asyncio.ensure_future(_adisconnect(conn))  # closed by the server: make a new one
        return None

    async def connect(self) -> Any:
        conn = None
        try:
            conn = self.connection_class(**self.kwargs)
            await asyncio.wait_for(conn.connect(), self.node_timeout)
            conn._redlock_probed = False  # learn uptime and persistence with the next vote
        except Exception as exc:  # noqa: BLE001 - a failed connect is a failed vote
            reason = self.node.redact(describe(exc, self.node_timeout))
            self._down_until = time.monotonic() + 0.5
            self._down_reason = reason
            if conn is not None:
                await _adisconnect(conn)
            raise NodeUnavailable(reason) from None
        return conn

    def checkin(self, conn: Any) -> None:
        if os.getpid() == self._pid:
            self._idle.append(conn)

    async def close(self) -> None:
        conns = list(self._idle) + [b.conn for b in self._busy.values()]
        for busy in self._busy.values():
            if busy.task is not None:
                busy.task.cancel()
        self._idle, self._busy = [], {}
        for conn in conns:
            await _adisconnect(conn)


def _async_class(node: Node) -> type:
    if node.path:
        return aredis.UnixDomainSocketConnection
    if node.connection_class.__name__ == "SSLConnection":
        return aredis.SSLConnection
    return aredis.Connection


def _abandon(conn: Any) -> None:
    """Drop a connection of another event loop: abort it if that loop still runs, else leave it to GC."""
    transport = getattr(getattr(conn, "_writer", None), "transport", None)
    loop = getattr(transport, "_loop", None)
    try:
        if transport is not None and loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(transport.abort)
    except Exception:  # noqa: BLE001
        pass


async def _adisconnect(conn: Any) -> None:
    try:
        await conn.disconnect()
    except Exception:  # noqa: BLE001
        pass


def _write(conn: Any, data: bytes) -> None:
    """Queue bytes on a connected stream; a broken connection shows up when reading."""
    conn._writer.write(data)


async def _call(anode: AsyncNode, conn: Any, command: tuple[Any, ...], script: Script | None, probe: bool) -> Any:
    """Read the reply to a command already written (after the probe's replies, if one was sent)."""
    if probe:
        replies: list[Any] = []
        for _ in PROBE:
            try:
                replies.append(await conn.read_response(timeout=None))
            except ResponseError as exc:
                replies.append(exc)
        anode.node.learn(replies, time.monotonic())
    try:
        return await conn.read_response(timeout=None)
    except NoScriptError:
        if script is None:
            raise
        _write(conn, pack(("EVAL", script.source, *command[2:])))
        return await conn.read_response(timeout=None)


def _leave(anode: AsyncNode, conn: Any, task: asyncio.Task[Any], keys: list[str], since: float) -> None:
    """Let an unanswered call finish in the background; free or drop its connection after."""
    busy = _Busy(conn, keys)
    busy.since = since
    busy.task = task
    anode._busy[conn] = busy

    def after(finished: asyncio.Task[Any]) -> None:
        if finished.cancelled() or (finished.exception() and not isinstance(finished.exception(), ResponseError)):
            anode._busy.pop(conn, None)
            asyncio.ensure_future(_adisconnect(conn))
            return
        busy.pending -= 1
        if busy.pending > 0:  # a release was queued behind it: read that reply too
            busy.since = time.monotonic()
            follow = asyncio.ensure_future(conn.read_response(timeout=None))
            busy.task = follow
            follow.add_done_callback(after)
            return
        anode._busy.pop(conn, None)
        anode.checkin(conn)

    task.add_done_callback(after)


async def afanout(
    anodes: Sequence[AsyncNode],
    commands: Sequence[tuple[Any, ...] | None],
    *,
    timeout: float,
    done: Callable[[list[Any]], bool] | None = None,
    script: Script | None = None,
    keys: Sequence[str] = (),
    ordered_after_key: str | None = None,
    allow_lagging: bool = True,
    timings: list[float | None] | None = None,
    restart_window: float = 0.0,
) -> list[Any]:
    """The asyncio version of :func:`django_redlock.core.nodes.fanout`."""
    results: list[Any] = [None] * len(anodes)
    started = time.monotonic()
    checkouts: dict[int, Any] = {}
    conns: dict[int, Any] = {}
    for i, (anode, command) in enumerate(zip(anodes, commands)):
        if command is None:
            results[i] = Failure("skipped")
            continue
        anode._check_loop()
        if ordered_after_key is not None:
            busy = anode.busy_for(ordered_after_key)
            if busy is not None:
                queued = command
                if script is not None and queued[0] == "EVALSHA":
                    queued = ("EVAL", script.source, *queued[2:])
                busy.pending += 1  # the background reader now expects one more reply
                try:
                    _write(busy.conn, pack(queued))
                    results[i] = Failure("queued behind an unanswered command")
                except Exception as exc:  # noqa: BLE001 - the reader drops the broken connection
                    results[i] = Failure(anode.node.redact(describe(exc, anode.node_timeout)))
                continue
        try:
            conn = anode.ready(allow_lagging)
        except NodeUnavailable as exc:
            results[i] = Failure(str(exc))
            continue
        if conn is not None:
            conns[i] = conn
        else:
            checkouts[i] = asyncio.ensure_future(anode.connect())
    if checkouts:
        await asyncio.wait(checkouts.values())
    for i, fut in checkouts.items():
        exc = fut.exception()
        if exc is not None:
            results[i] = Failure(str(exc) if isinstance(exc, NodeUnavailable) else describe(exc, timeout))
        else:
            conns[i] = fut.result()
    tasks: dict[asyncio.Task[Any], int] = {}
    packed: dict[Any, bytes] = {}
    for i in sorted(conns):
        command = commands[i]
        data = packed.get(command)
        if data is None:
            data = packed[command] = pack(command)  # the same command usually goes to every node
        probe = restart_window > 0 and getattr(conns[i], "_redlock_probed", True) is False
        if probe:
            conns[i]._redlock_probed = True
            data = b"".join(pack(c) for c in PROBE) + data
        try:
            _write(conns[i], data)
        except Exception as exc:  # noqa: BLE001
            results[i] = Failure(anodes[i].node.redact(describe(exc, anodes[i].node_timeout)))
            asyncio.ensure_future(_adisconnect(conns[i]))
            continue
        call = _call(anodes[i], conns[i], command, script, probe)  # type: ignore[arg-type]
        tasks[asyncio.ensure_future(call)] = i
    deadline = time.monotonic() + timeout
    pending = set(tasks)
    while pending and not (done is not None and done(results)):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        finished, pending = await asyncio.wait(pending, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        for task in finished:
            _settle(anodes, conns, tasks[task], task, results, timings, started, restart_window)
    for task in list(pending):
        if task.done():
            pending.discard(task)
            _settle(anodes, conns, tasks[task], task, results, timings, started, restart_window)
    for task in pending:
        i = tasks[task]
        _leave(anodes[i], conns[i], task, list(keys), started)
        results[i] = Failure(f"no reply within {anodes[i].node_timeout * 1000:.0f} ms")
    return results


def _settle(
    anodes: Sequence[AsyncNode],
    conns: dict[int, Any],
    i: int,
    task: asyncio.Task[Any],
    results: list[Any],
    timings: list[float | None] | None,
    started: float,
    window: float,
) -> None:
    anode = anodes[i]
    exc = task.exception()
    if exc is None:
        results[i] = (window > 0 and sitting_out_failure(anode.node, window)) or task.result()
        if timings is not None:
            timings[i] = time.monotonic() - started
        anode.checkin(conns[i])
    elif isinstance(exc, ResponseError):
        results[i] = Failure(anode.node.redact(describe(exc, anode.node_timeout)), answered=True)
        anode.checkin(conns[i])
    else:
        results[i] = Failure(anode.node.redact(describe(exc, anode.node_timeout)))
        asyncio.ensure_future(_adisconnect(conns[i]))


class AsyncLock(LockBase):
    """An async Redlock: ``await lock.extend()``, ``await lock.release()``, ``async with``."""

    manager: AsyncLockManager

    async def extend(self, ttl: float | None = None) -> None:
        """Reset the ttl on a quorum within the current validity; see :meth:`Lock.extend`."""
        await self._extend(ttl, counted=True)

    async def _extend(self, ttl: float | None, *, counted: bool) -> None:
        new_ttl = self._check_extendable(ttl, counted)
        manager = self.manager
        old_deadline = self._deadline
        started = time.monotonic()
        command = script_command(EXTEND, [self.key], [self.value, base.ms(new_ttl)])
        results = await manager._fanout(
            [command] * len(manager.node_list),
            timeout=self._extend_timeout(),
            done=base.until_outcome(manager.quorum, len(manager.node_list), lambda r: r == 1),
            script=EXTEND,
            keys=[self.key],
            allow_lagging=False,
        )
        self._judge_extend(results, started, old_deadline, new_ttl)

    async def release(self) -> bool:
        """Delete this holder's key on every node; idempotent; never raises. See :meth:`Lock.release`."""
        if not self._start_release():
            return False
        self.manager._forget(self)
        results = await self.manager._release_keys(self.key, self.value)
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
        """GET the key on every node, in one fan-out."""
        total = len(self.manager.node_list)
        return await self.manager._fanout(
            [("GET", self.key)] * total,
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
        if self.lost and exc_type is None and not self._forked():
            raise base.lost_error(self.resource, self.lost_reason or "it expired while held")


class AsyncLockContext(ContextBase):
    """``async with manager.lock(...) as lock:``; auto-extension runs as a task on the loop."""

    manager: AsyncLockManager
    _task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> AsyncLock:
        lock = await self.manager.acquire(self.resource, **self.kwargs)
        self.lock = lock
        if self.auto_extend:
            self._task = asyncio.ensure_future(_keep_alive(lock, self.max_hold, self.on_lost))
        return lock

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
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

    stop_at = time.monotonic() + max_hold if max_hold is not None else None
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
                await lock._extend(None, counted=watch.stop_extending_at is None)
                watch.failure = None
            except Exception as exc:  # noqa: BLE001 - judged by note_extend_error
                note_extend_error(watch, lock, exc)
        elif action == "check" and lock._can_ask():
            lock._judge_owned(await lock._read_values())
        if action == "stop" or lock.lost or lock.released:
            return
        now = time.monotonic()
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
        resource: str,
        ttl: float | None = None,
        *,
        blocking: bool = True,
        timeout: float | None = None,
        label: str | None = None,
    ) -> AsyncLock:
        """Acquire ``resource`` on a quorum; see :meth:`LockManager.acquire`."""
        plan = base.Attempts(self.config, resource, ttl, blocking, timeout, label)
        total = len(self.node_list)
        while True:
            started = time.monotonic()
            results = await self._fanout(
                [base.set_command(plan.key, plan.value, plan.ttl)] * total,
                done=base.until_outcome(self.quorum, total),
                keys=[plan.key],
                allow_lagging=False,
                restart_window=plan.window,
            )
            if plan.won(results, started, self.quorum):
                lock = AsyncLock(self, plan.resource, plan.holder, plan.ttl, started)
                base.call_hook(self.config.hooks, "acquired", lock)
                return lock
            await self._release_keys(plan.key, plan.value)
            pause = plan.pause()
            if pause is None:
                break
            await asyncio.sleep(pause)
        error = plan.error(self.node_list, self.quorum, await self._retry_after(plan.key))
        base.call_hook(self.config.hooks, "not_acquired", plan.resource, error)
        raise error

    def lock(
        self,
        resource: str,
        ttl: float | None = None,
        *,
        blocking: bool = True,
        timeout: float | None = None,
        label: str | None = None,
        auto_extend: bool = False,
        max_hold: float | None = None,
        on_lost: Callable[[AsyncLock], Any] | None = None,
    ) -> AsyncLockContext:
        """``async with manager.lock("x") as lock:``; see :meth:`LockManager.lock`."""
        kwargs = {"ttl": ttl, "blocking": blocking, "timeout": timeout, "label": label}
        return AsyncLockContext(self, resource, kwargs, auto_extend, max_hold, on_lost)

    async def is_locked(self, resource: str) -> bool:
        key = self.key(resource)
        results = await self._fanout([("PTTL", key)] * len(self.node_list))
        return base.count(results, lambda r: isinstance(r, int) and (r > 0 or r == -1)) >= self.quorum

    async def force_release(self, resource: str) -> int:
        key = self.key(resource)
        results = await self._fanout([("DEL", key)] * len(self.node_list), max(self.config.node_timeout, 0.5))
        return base.count(results, lambda r: r == 1)

    async def live_locks(self, match: str | None = None) -> AsyncIterator[LockRecord]:
        """Async version of :meth:`LockManager.live_locks`."""
        scan = Scan(self.config, self.node_list, self.quorum, match)
        timeout = max(self.config.node_timeout, ADMIN_TIMEOUT)
        while scan.running:
            commands = scan.scan_commands(SCAN_COUNT)
            inspect = scan.inspect_commands(commands, await self._fanout(commands, timeout))
            if any(inspect):
                scan.take(inspect, await self._fanout(inspect, timeout, script=INSPECT))
        for record in scan.records():
            yield record

    async def node_status(self, timeout: float = 1.0) -> list[NodeStatus]:
        timings: list[float | None] = [None] * len(self.node_list)
        results = await self._fanout([("INFO",)] * len(self.node_list), timeout, timings=timings)
        fsync = await self._fanout([("CONFIG", "GET", "appendfsync")] * len(self.node_list), timeout)
        window = self.config.window()
        return [status_of(*row, window) for row in zip(self.node_list, results, fsync, timings)]

    async def ping(self, timeout: float | None = None) -> dict[str, float | None]:
        timings: list[float | None] = [None] * len(self.node_list)
        await self._fanout([("PING",)] * len(self.node_list), timeout, timings=timings)
        return {node.name: t for node, t in zip(self.node_list, timings)}

    async def aclose(self) -> None:
        """Close every connection made on the running loop."""
        for anode in self.anodes:
            await anode.close()

    async def __aenter__(self) -> AsyncLockManager:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- internals used by AsyncLock -------------------------------------

    async def _release_keys(self, key: str, value: str) -> list[Any]:
        command = script_command(RELEASE, [key], [value])
        return await self._fanout(
            [command] * len(self.node_list),
            script=RELEASE,
            keys=[key],
            ordered_after_key=key,
            allow_lagging=False,
        )

    async def _retry_after(self, key: str) -> float | None:
        results = await self._fanout([("PTTL", key)] * len(self.node_list), allow_lagging=False)
        return base.retry_after_of(results, self.quorum)

    async def _fence(self, lock: AsyncLock) -> int:
        if not lock.locked():
            raise base.lost_error(lock.resource, lock.lost_reason or "it is no longer valid")
        total = len(self.node_list)
        fence_key = self.config.fence_key(lock.resource)
        window = self.config.window()
        reads = await self._fanout(
            [("GET", fence_key)] * total,
            done=base.until_outcome(self.quorum, total, lambda r: True),
            restart_window=window,
        )
        token = base.next_fence(reads, self.quorum, lock.resource)
        command = script_command(FENCE_RAISE, [fence_key], [token])
        writes = await self._fanout(
            [command] * total,
            done=base.until_outcome(self.quorum, total, lambda r: isinstance(r, int) and r >= token),
            script=FENCE_RAISE,
            restart_window=window,
        )
        base.check_fence_written(lock, writes, token, self.quorum)
        return token

    def _forget(self, lock: AsyncLock) -> None:
        """Auto-extension tasks watch ``lock.released`` themselves."""
