"""What a lock costs against the number of Redis masters, in one run.

Starts nine local redis-server masters (plus one for redis-py's single-node
lock) and measures:

- latency: acquire+release pairs on distinct keys with N = 1, 3, 5, 7, 9
  masters, for django-redlock (non-blocking, and the default blocking acquire
  that joins the waiting line), for the *floor* (a bare fan-out on raw
  sockets: ``SET NX PX`` to all N, then a compare-and-delete script to all N)
  and for redis-py's single-node ``Lock``. Every iteration runs one pair of
  each (series, N) in a shuffled order, so all see the same machine load.
  Median and p99 per point, a least-squares line per series (fixed cost +
  cost per node), django-redlock's overhead above the floor;
- async: django-redlock's ``AsyncLockManager`` on five masters against
  redis-py's asyncio ``Lock`` on one, interleaved in one event loop;
- memory (tracemalloc): a warmed-up five-node manager, and what each held
  lock costs (10,000 held at once), sync and async, against redis-py's locks;
- the speed targets (see ``targets.py``), each against its floor from this run
  or its recorded reference, with a verdict: printed last, kept in ``--json``
  and written first into ``--rst`` (after a ``.. scaling-targets`` comment);
- with ``--rtt-ms``: a network round trip. Every node is reached through a
  delay line (a small TCP proxy process per node that forwards each chunk
  ``--rtt-ms / 2`` ms after it arrived, each way), against the same proxies
  without delay, for N = 1, 3, 5.

    python benchmarks/scaling.py [--iterations 2000] [--rtt-ms 1.0]
        [--json docs/scaling.json] [--plot docs/img/scaling.png] [--rst docs/scaling_table.rst]
    python benchmarks/scaling.py --render-only --json docs/scaling.json --rst docs/scaling_table.rst

The results record the date (UTC) and the command line of the run, and every
generated table prints them. ``--render-only`` writes the tables (and plot)
again from ``--json`` without measuring anything.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import hashlib
import multiprocessing
import os
import platform
import queue
import random
import select
import signal
import socket
import statistics
import sys
import threading
import time
import tracemalloc
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Hashable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import redis  # noqa: E402
import redis.asyncio as aredis  # noqa: E402
import targets  # noqa: E402
from bench import _percentile, _table_head, render_only, run_stamp, stamp_line, write_outputs  # noqa: E402

from django_redlock.core import AsyncLockManager, LockManager  # noqa: E402
from django_redlock.testing import RedisServers  # noqa: E402

NODE_COUNTS = (1, 3, 5, 7, 9)
RTT_NODE_COUNTS = (1, 3, 5)
#: The node count of the ratios to redis-py's single-node lock (the usual deployment).
REFERENCE_NODES = 5
SERIES = {
    "redlock": "django-redlock, non-blocking",
    "redlock_blocking": "django-redlock, blocking (joins the line)",
    "floor_quorum": "floor, SET round waits for a quorum",
    "floor_all": "floor, every round waits for all",
    "redis_py": "redis-py Lock, 1 node",
}
ASYNC_SERIES = {
    "redlock_async": f"django-redlock AsyncLockManager, {REFERENCE_NODES} nodes",
    "floor_async": f"floor, asyncio fan-out on raw sockets, {REFERENCE_NODES} nodes (every reply)",
    "redis_py_async": "redis-py asyncio Lock, 1 node",
}
#: The docs include the generated table file in parts, each starting at one of these comments.
PARTS = ("latency", "overhead", "async", "memory", "rtt")

Key = tuple[str, int]  # (series, node count)
PairFn = Callable[[str], None]


# -- the floor: a bare fan-out on raw sockets ----------------------------------------------

RELEASE_SCRIPT = b"if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"
TOKEN = b"floor-token"


def bulk(*parts: bytes) -> bytes:
    """A command's arguments in RESP, the protocol Redis speaks, without the array header."""
    return b"".join(b"$%d\r\n%s\r\n" % (len(part), part) for part in parts)


class FanOut:
    """The lower bound of any Python fan-out client: write a command to every node, then read.

    Blocking sockets with TCP_NODELAY and one ``poll`` object; the commands are
    pre-encoded around the key, and a reply is counted, not parsed (each is one
    line). With ``quorum=True`` the SET round returns once a majority of nodes
    answered, like django-redlock's non-blocking acquire; the late replies are
    read during the next round, which waits until every node owes nothing.
    """

    def __init__(self, ports: list[int], quorum: bool = False) -> None:
        self.socks = [socket.create_connection(("127.0.0.1", port)) for port in ports]
        self.poller = select.poll()
        self.index: dict[int, int] = {}
        for i, sock in enumerate(self.socks):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.poller.register(sock, select.POLLIN)
            self.index[sock.fileno()] = i
        self.owed = [0] * len(self.socks)
        self.set_need = len(self.socks) // 2 + 1 if quorum else len(self.socks)
        sha = b""
        for sock in self.socks:  # once, before any timing: a bulk-string reply, read plainly
            sock.sendall(b"*3\r\n" + bulk(b"SCRIPT", b"LOAD", RELEASE_SCRIPT))
            sha = _read_line(sock, 2)[1]
        # SET <key> <token> NX PX 10000, and EVALSHA <sha> 1 <key> <token>, around the key.
        self.set_head, self.set_tail = b"*6\r\n" + bulk(b"SET"), bulk(TOKEN, b"NX", b"PX", b"10000")
        self.release_head, self.release_tail = b"*5\r\n" + bulk(b"EVALSHA", sha, b"1"), bulk(TOKEN)

    def pair(self, name: str) -> None:
        key = bulk(name.encode())
        self._round(self.set_head + key + self.set_tail, self.set_need)
        self._round(self.release_head + key + self.release_tail, len(self.socks))

    def check(self, name: str) -> None:
        """One pair that waits for every reply and fails unless every node granted and released."""
        key = bulk(name.encode())
        self._round(b"", len(self.socks))  # drain what an earlier quorum round left
        replies: list[bytes] = []
        self._round(self.set_head + key + self.set_tail, len(self.socks), replies)
        self._round(self.release_head + key + self.release_tail, len(self.socks), replies)
        if sorted(replies) != sorted([b"+OK\r\n", b":1\r\n"] * len(self.socks)):
            raise RuntimeError(f"the floor client was not granted and released everywhere: {replies}")

    def _round(self, wire: bytes, need: int, replies: list[bytes] | None = None) -> None:
        owed = self.owed
        if wire:
            for i, sock in enumerate(self.socks):
                sock.send(wire)
                owed[i] += 1
        done = owed.count(0)
        while done < need:
            for fd, _event in self.poller.poll():
                i = self.index[fd]
                data = self.socks[i].recv(4096)
                if not data:
                    raise ConnectionError("a node closed the connection")
                owed[i] -= data.count(b"\n")  # every reply here is one line
                if owed[i] == 0:
                    done += 1
                if replies is not None:
                    replies.append(data)

    def close(self) -> None:
        for sock in self.socks:
            sock.close()


def _read_line(sock: socket.socket, lines: int) -> list[bytes]:
    data = b""
    while data.count(b"\r\n") < lines:
        data += sock.recv(4096)
    return data.split(b"\r\n")


# -- a network round trip, simulated: one delay line per node --------------------------------


class DelayLines:
    """One proxy process per node that forwards every chunk ``delay`` seconds (one way) after it arrived.

    netem is not available on every machine (nor in every container), so this
    stands in for a network: each direction has a reader thread that stamps
    chunks and a writer thread that sends each at its due time, so bytes in
    flight overlap like on a wire. Use the same lines with ``delay=0`` as the
    baseline: the difference is the delay, not the proxy.
    """

    def __init__(self, upstream_ports: list[int], delay: float) -> None:
        self.upstream_ports = upstream_ports
        self.delay = delay
        self.ports: list[int] = []
        self.procs: list[multiprocessing.process.BaseProcess] = []

    def __enter__(self) -> DelayLines:
        ctx = multiprocessing.get_context("fork")
        try:
            for port in self.upstream_ports:
                with socket.create_server(("127.0.0.1", 0)) as listener:
                    proc = ctx.Process(target=_serve_delayed, args=(listener, port, self.delay), daemon=True)
                    proc.start()
                    self.procs.append(proc)
                    self.ports.append(listener.getsockname()[1])
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.join(5)


def _serve_delayed(listener: socket.socket, upstream_port: int, delay: float) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops this process on Ctrl-C
    try:  # wake up on time: the default 50 µs timer slack is a tenth of the delay
        ctypes.CDLL(None).prctl(29, 1, 0, 0, 0)  # PR_SET_TIMERSLACK, 1 ns
    except (OSError, AttributeError):
        pass
    while True:
        client, _ = listener.accept()
        upstream = socket.create_connection(("127.0.0.1", upstream_port))
        for source, target in ((client, upstream), (upstream, client)):
            source.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            line: queue.SimpleQueue[tuple[float, bytes] | None] = queue.SimpleQueue()
            threading.Thread(target=_receive, args=(source, line, delay), daemon=True).start()
            threading.Thread(target=_deliver, args=(line, target), daemon=True).start()


def _receive(source: socket.socket, line: queue.SimpleQueue, delay: float) -> None:
    try:
        while data := source.recv(65536):
            line.put((time.monotonic() + delay, data))
    except OSError:
        pass
    line.put(None)


def _deliver(line: queue.SimpleQueue, target: socket.socket) -> None:
    try:
        while (item := line.get()) is not None:
            due, data = item
            if (wait := due - time.monotonic()) > 0:
                time.sleep(wait)
            target.sendall(data)
        target.shutdown(socket.SHUT_WR)
    except OSError:
        pass


# -- the series ----------------------------------------------------------------------------


def redlock_pair(manager: LockManager, blocking: bool) -> PairFn:
    if blocking:
        def pair(name: str) -> None:
            manager.acquire(name).release()
    else:
        def pair(name: str) -> None:
            manager.acquire(name, blocking=False).release()
    return pair


def redis_py_pair(client: redis.Redis) -> PairFn:
    def pair(name: str) -> None:
        lock = client.lock(name, timeout=10)
        if not lock.acquire(blocking=False):
            raise RuntimeError(f"redis-py did not get {name}")
        lock.release()
    return pair


def sync_series(
    stack: ExitStack, urls: list[str], ports: list[int], single_url: str, counts: Iterable[int], names: Iterable[str]
) -> dict[Key, PairFn]:
    """One pair function per (series, N), its connections closed by ``stack``."""
    pairs: dict[Key, PairFn] = {}
    for series in names:
        if series == "redis_py":
            client = redis.Redis.from_url(single_url)
            stack.callback(client.close)
            pairs[series, 1] = redis_py_pair(client)
            continue
        for n in counts:
            if series.startswith("floor"):
                fan_out = FanOut(ports[:n], quorum=series == "floor_quorum")
                stack.callback(fan_out.close)
                fan_out.check(f"check-{series}-{n}")
                pairs[series, n] = fan_out.pair
            else:
                blocking = series == "redlock_blocking"
                manager = LockManager(urls[:n], ttl=10, restart_window=0, **({} if blocking else {"retry_count": 0}))
                stack.callback(manager.close)
                pairs[series, n] = redlock_pair(manager, blocking)
    return pairs


def schedule(keys: Iterable[Hashable], iterations: int, warmup: int, seed: int) -> Iterator[tuple[bool, Any, str]]:
    """Yield (counted, key, lock name): every key once per iteration, in a new random order each time."""
    order = list(keys)
    rng = random.Random(seed)
    for i in range(-warmup, iterations):
        rng.shuffle(order)
        for key in order:
            yield i >= 0, key, f"scaling-{'-'.join(map(str, key))}-{i}"


class Timings:
    """How long each counted pair took, per key, and how many of them failed.

    A failed pair (e.g. a node timeout while another job stalls the machine)
    keeps its time, which is what its caller waited, and is counted; the run
    goes on.
    """

    def __init__(self) -> None:
        self.samples: dict[Any, list[float]] = defaultdict(list)
        self.cpu: dict[Any, list[float]] = defaultdict(list)  # the client process's CPU time per pair
        self.failed: Counter[Any] = Counter()
        self.errors: dict[Any, str] = {}

    def add(self, key: Any, counted: bool, elapsed: float, cpu: float, error: Exception | None) -> None:
        if counted:
            self.samples[key].append(elapsed)
            self.cpu[key].append(cpu)
        if error is not None:
            self.failed[key] += counted
            self.errors.setdefault(key, repr(error))

    def summary(self, key: Any) -> dict[str, Any]:
        ordered = sorted(self.samples[key])
        row = {"median_us": statistics.median(ordered) * 1e6, "p99_us": _percentile(ordered, 0.99) * 1e6,
               "cpu_median_us": statistics.median(self.cpu[key]) * 1e6, "pairs": len(ordered),
               "failed": self.failed[key]}
        if key in self.errors:
            row["first_error"] = self.errors[key]
        return row

    def by_series(self, keep: Callable[[Any], Key | None] = lambda key: key) -> dict[str, dict[str, dict[str, Any]]]:
        """{series: {str(N): summary}}, the shape of the JSON file, for the keys ``keep`` maps to (series, N)."""
        table: dict[str, dict[str, dict[str, Any]]] = {}
        picked = [(kept, key) for key in self.samples if (kept := keep(key)) is not None]
        for (series, n), key in sorted(picked, key=lambda item: (list(SERIES).index(item[0][0]), item[0][1])):
            table.setdefault(series, {})[str(n)] = self.summary(key)
        return table


def interleaved(pairs: dict[Any, PairFn], iterations: int, warmup: int, seed: int) -> Timings:
    timings = Timings()
    clock, cpu_clock = time.perf_counter, time.process_time
    for counted, key, name in schedule(pairs, iterations, warmup, seed):
        pair = pairs[key]
        error = None
        cpu = cpu_clock()
        started = clock()
        try:
            pair(name)
        except Exception as exc:  # noqa: BLE001 - counted, see Timings
            error = exc
        elapsed = clock() - started
        timings.add(key, counted, elapsed, cpu_clock() - cpu, error)
    return timings


def fit(points: dict[str, dict[str, float]]) -> dict[str, float] | None:
    """Least-squares lines through the medians: fixed cost (intercept) and cost per node (slope).

    The same for the client's CPU time: what of the slope the client itself spends.
    """
    if len(points) < 2:
        return None
    ns = [int(n) for n in points]
    slope, intercept = statistics.linear_regression(ns, [points[str(n)]["median_us"] for n in ns])
    cpu_slope, cpu_intercept = statistics.linear_regression(ns, [points[str(n)]["cpu_median_us"] for n in ns])
    return {"fixed_us": intercept, "per_node_us": slope, "cpu_fixed_us": cpu_intercept, "cpu_per_node_us": cpu_slope}


def ratio(ours: dict[str, float], theirs: dict[str, float]) -> dict[str, float]:
    return {"median": ours["median_us"] / theirs["median_us"], "p99": ours["p99_us"] / theirs["p99_us"]}


def latency_section(servers: RedisServers, counts: tuple[int, ...], iterations: int, warmup: int) -> dict:
    nodes = max(counts)
    urls, ports = servers.urls[:nodes], [server.port for server in servers[:nodes]]
    with ExitStack() as stack:
        pairs = sync_series(stack, urls, ports, servers.urls[nodes], counts, SERIES)
        timings = interleaved(pairs, iterations, warmup, seed=1)
    points = timings.by_series()
    single = points["redis_py"]["1"]
    overhead = {
        str(n): {
            f"{ours} - {floor}": points[ours][str(n)]["median_us"] - points[floor][str(n)]["median_us"]
            for ours, floor in (("redlock", "floor_quorum"), ("redlock", "floor_all"),
                                ("redlock_blocking", "floor_all"))
        }
        for n in counts
    }
    reference = str(REFERENCE_NODES if REFERENCE_NODES in counts else counts[-1])
    return {
        "series": {name: {"label": SERIES[name], "points": values, "fit": fit(values)} for name, values in points.items()},
        "overhead_us": overhead,
        "ratio_nodes": int(reference),
        "ratio_to_redis_py": {
            name: ratio(points[name][reference], single) for name in points if name != "redis_py"
        },
    }


# -- async ---------------------------------------------------------------------------------


class AsyncFanOut(asyncio.Protocol):
    """The asyncio floor: :class:`FanOut`'s two rounds over one protocol per node, every reply awaited."""

    def __init__(self) -> None:
        self.transports: list[asyncio.Transport] = []
        self.owed = 0
        self.done: asyncio.Future[None] | None = None

    @classmethod
    async def connect(cls, ports: list[int]) -> AsyncFanOut:
        fan = cls()
        loop = asyncio.get_running_loop()
        for port in ports:
            transport, _ = await loop.create_connection(lambda: fan, "127.0.0.1", port)
            transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            fan.transports.append(transport)
        await fan._round(b"*3\r\n" + bulk(b"SCRIPT", b"LOAD", RELEASE_SCRIPT))  # once, before any timing
        sha = hashlib.sha1(RELEASE_SCRIPT).hexdigest().encode()
        fan.set_head, fan.set_tail = b"*6\r\n" + bulk(b"SET"), bulk(TOKEN, b"NX", b"PX", b"10000")
        fan.release_head, fan.release_tail = b"*5\r\n" + bulk(b"EVALSHA", sha, b"1"), bulk(TOKEN)
        return fan

    def data_received(self, data: bytes) -> None:
        self.owed -= data.count(b"\n")  # a SCRIPT LOAD reply is two lines, every other reply here one
        if self.owed <= 0 and self.done is not None and not self.done.done():
            self.done.set_result(None)

    async def _round(self, wire: bytes) -> None:
        self.done = asyncio.get_running_loop().create_future()
        self.owed = len(self.transports) * (2 if wire.startswith(b"*3") else 1)  # SCRIPT LOAD: a bulk string
        for transport in self.transports:
            transport.write(wire)
        await self.done

    async def pair(self, name: str) -> None:
        key = bulk(name.encode())
        await self._round(self.set_head + key + self.set_tail)
        await self._round(self.release_head + key + self.release_tail)

    def close(self) -> None:
        for transport in self.transports:
            transport.close()


async def async_section(urls: list[str], single_url: str, iterations: int, warmup: int) -> dict:
    manager = AsyncLockManager(urls, ttl=10, retry_count=0, restart_window=0)
    client = aredis.Redis.from_url(single_url)
    floor = await AsyncFanOut.connect([int(url.rsplit(":", 1)[1].split("/")[0]) for url in urls])

    async def ours(name: str) -> None:
        lock = await manager.acquire(name, blocking=False)
        await lock.release()

    async def theirs(name: str) -> None:
        lock = client.lock(name, timeout=10)
        if not await lock.acquire(blocking=False):
            raise RuntimeError(f"redis-py did not get {name}")
        await lock.release()

    pairs: dict[Key, Callable[[str], Awaitable[None]]] = {("redlock_async", len(urls)): ours,
                                                          ("floor_async", len(urls)): floor.pair,
                                                          ("redis_py_async", 1): theirs}
    timings = Timings()
    clock, cpu_clock = time.perf_counter, time.process_time
    try:
        for counted, key, name in schedule(pairs, iterations, warmup, seed=2):
            pair = pairs[key]
            error = None
            cpu = cpu_clock()
            started = clock()
            try:
                await pair(name)
            except Exception as exc:  # noqa: BLE001 - counted, see Timings
                error = exc
            elapsed = clock() - started
            timings.add(key, counted, elapsed, cpu_clock() - cpu, error)
    finally:
        floor.close()
        await manager.aclose()
        await client.aclose()
    result = {series: {"label": ASYNC_SERIES[series], **timings.summary((series, n))} for series, n in pairs}
    return {"nodes": len(urls), "series": result,
            "ratio": ratio(result["redlock_async"], result["redis_py_async"]),
            "floor_ratio": ratio(result["floor_async"], result["redis_py_async"])}


# -- memory --------------------------------------------------------------------------------


@contextmanager
def traced_growth() -> Iterator[list[int]]:
    """Yields a one-item list that holds, after the block, how much traced memory it added."""
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    grown = [0]
    yield grown
    gc.collect()
    grown[0] = tracemalloc.get_traced_memory()[0] - before


#: Long enough for every lock to outlive acquiring them all under tracemalloc.
MEMORY_TTL = 60  # the engine's default max_ttl


def memory_section(servers: RedisServers, locks: int) -> dict:
    """A warmed-up manager's footprint, and the memory each held lock adds (``locks`` held at once).

    The held locks are dropped, not released (they would expire; releasing
    10,000 locks one by one only costs time), and the servers emptied.
    """
    urls, single_url = servers.urls[:REFERENCE_NODES], servers.urls[-1]
    names = [f"memory-{i}" for i in range(locks)]  # the caller's strings: not the locks' cost

    def warm(manager: LockManager) -> LockManager:
        for i in range(20):
            manager.acquire(f"memory-warm-{i}", blocking=False).release()
            manager.acquire(f"memory-warm-blocking-{i}").release()
        return manager

    warm(LockManager(urls, ttl=MEMORY_TTL, restart_window=0)).close()  # first use: lazy imports, caches
    tracemalloc.start()
    try:
        with traced_growth() as footprint:
            manager = warm(LockManager(urls, ttl=MEMORY_TTL, restart_window=0))
        with traced_growth() as held:
            locks_held = [manager.acquire(name, blocking=False) for name in names]
        client = redis.Redis.from_url(single_url)
        redis_py_pair(client)("memory-warm")
        with traced_growth() as held_redis_py:
            redis_py_locks = [client.lock(name, timeout=MEMORY_TTL) for name in names]
            if not all(lock.acquire(blocking=False) for lock in redis_py_locks):
                raise RuntimeError("redis-py did not get every lock")
        del locks_held, redis_py_locks
        manager.close()
        client.close()
        for server in servers:
            server.flushall()
        async_result = asyncio.run(async_memory(urls, single_url, names))
    finally:
        tracemalloc.stop()
        for server in servers:
            server.flushall()
    return {
        "nodes": len(urls),
        "locks": locks,
        "manager_bytes": footprint[0],
        "per_lock_bytes": held[0] / locks,
        "redis_py_per_lock_bytes": held_redis_py[0] / locks,
        **async_result,
    }


async def async_memory(urls: list[str], single_url: str, names: list[str]) -> dict:
    """:func:`memory_section` for the async engine and redis-py's asyncio lock."""
    async def warm(manager: AsyncLockManager) -> AsyncLockManager:
        for i in range(20):
            await (await manager.acquire(f"memory-warm-{i}", blocking=False)).release()
            await (await manager.acquire(f"memory-warm-blocking-{i}")).release()
        return manager

    await (await warm(AsyncLockManager(urls, ttl=MEMORY_TTL, restart_window=0))).aclose()
    await asyncio.sleep(0.1)  # closed transports finish closing on the loop: not freed inside the window
    with traced_growth() as footprint:
        manager = await warm(AsyncLockManager(urls, ttl=MEMORY_TTL, restart_window=0))
    with traced_growth() as held:
        locks_held = [await manager.acquire(name, blocking=False) for name in names]
    client = aredis.Redis.from_url(single_url)
    warm_lock = client.lock("memory-warm", timeout=10)
    await warm_lock.acquire(blocking=False)
    await warm_lock.release()
    with traced_growth() as held_redis_py:
        redis_py_locks = [client.lock(name, timeout=MEMORY_TTL) for name in names]
        if not all([await lock.acquire(blocking=False) for lock in redis_py_locks]):
            raise RuntimeError("redis-py did not get every lock")
    del locks_held, redis_py_locks
    await manager.aclose()
    await client.aclose()
    return {
        "async_manager_bytes": footprint[0],
        "async_per_lock_bytes": held[0] / len(names),
        "redis_py_async_per_lock_bytes": held_redis_py[0] / len(names),
    }


# -- a round trip --------------------------------------------------------------------------

RTT_SERIES = ("redlock", "floor_all", "redis_py")


def rtt_section(servers: RedisServers, rtt_ms: float, iterations: int, warmup: int) -> dict:
    """The same pairs through delay lines with and without ``rtt_ms`` of round trip, interleaved."""
    nodes = max(RTT_NODE_COUNTS)
    upstream = [server.port for server in servers[:nodes]] + [servers[-1].port]
    pairs: dict[tuple[str, int, str], PairFn] = {}
    with ExitStack() as stack:
        for delayed in ("0", "rtt"):
            lines = stack.enter_context(DelayLines(upstream, rtt_ms / 2000 if delayed == "rtt" else 0.0))
            urls = [f"redis://127.0.0.1:{port}/0" for port in lines.ports]
            made = sync_series(stack, urls[:nodes], lines.ports[:nodes], urls[nodes], RTT_NODE_COUNTS, RTT_SERIES)
            pairs.update({(series, n, delayed): pair for (series, n), pair in made.items()})
        timings = interleaved(pairs, iterations, warmup, seed=3)
    points = {
        delayed: timings.by_series(lambda key, delayed=delayed: key[:2] if key[2] == delayed else None)
        for delayed in ("0", "rtt")
    }
    # A floor pair on one node is two round trips: half the difference is the round trip added.
    added = (points["rtt"]["floor_all"]["1"]["median_us"] - points["0"]["floor_all"]["1"]["median_us"]) / 2
    return {
        "rtt_ms": rtt_ms,
        "iterations": iterations,
        "measured_rtt_us": added,
        "points": points,
        "fits": {delayed: {series: fit(values) for series, values in rows.items()} for delayed, rows in points.items()},
        "added_us": {
            series: {n: point["median_us"] - points["0"][series][n]["median_us"] for n, point in row.items()}
            for series, row in points["rtt"].items()
        },
        "ratio_to_redis_py": {
            delayed: ratio(rows["redlock"][str(nodes)], rows["redis_py"]["1"]) for delayed, rows in points.items()
        },
    }


# -- output --------------------------------------------------------------------------------


def _us(value: float) -> str:
    return f"{value:,.0f} µs"


def _pair_cell(point: dict[str, float] | None) -> str:
    return "–" if point is None else f"{point['median_us']:,.0f} / {point['p99_us']:,.0f}"


def _cpu_cell(point: dict[str, float] | None) -> str:
    return "–" if point is None else f"{point['cpu_median_us']:,.0f}"


def _head(first: str, *columns: str) -> list[str]:
    lines = _table_head(*columns)
    lines[3] = f"   * - {first}"  # bench.py's tables name their first column "Library"
    return lines


def rst_tables(results: dict) -> str:
    parts = {part: [] for part in PARTS}
    latency = results["latency"]
    counts = results["node_counts"]
    lines = parts["latency"]
    fitted = ("fixed_us", "per_node_us", "cpu_fixed_us", "cpu_per_node_us")
    lines += _head("median / p99 (µs)", *(f"N = {n}" for n in counts), "fixed", "per node", "client CPU: fixed",
                   "client CPU: per node")
    for row in latency["series"].values():
        line = row["fit"]
        lines += [f"   * - {row['label']}", *(f"     - {_pair_cell(row['points'].get(str(n)))}" for n in counts),
                  *(f"     - {_us(line[name]) if line else '–'}" for name in fitted)]
    machine = results["machine"]
    lines += ["", f"{results['iterations']:,} pairs per point after {results['warmup']} of warm-up, interleaved; "
              f"*fixed* and *per node* are the least-squares line through the medians, *client CPU* the same for the "
              f"benchmark process's CPU time per pair (``time.process_time``). {machine['cpus']} CPUs "
              f"shared by the client and the redis-servers, Python {machine['python']}, {machine['platform']}; "
              f"1-minute load average when the run started: {results['load_before']:.1f}.", "",
              stamp_line(results), ""]

    lines = parts["overhead"]
    lines += _head("N", "non-blocking − floor (quorum)", "non-blocking − floor (all)", "blocking − floor (all)")
    for n, row in latency["overhead_us"].items():
        lines += [f"   * - {n}", *(f"     - {_us(v)}" for v in row.values())]
    reference = latency["ratio_nodes"]
    lines += ["", f"Against redis-py's single-node ``Lock``, at N = {reference}:", ""]
    for name, value in latency["ratio_to_redis_py"].items():
        lines.append(f"- {SERIES[name]}: {value['median']:.2f} × (median), {value['p99']:.2f} × (p99)")
    lines += ["", stamp_line(results), ""]

    lines = parts["async"]
    lines += _table_head("acquire+release, median", "p99")
    for row in results["async"]["series"].values():
        lines += [f"   * - {row['label']}", f"     - {_us(row['median_us'])}", f"     - {_us(row['p99_us'])}"]
    value = results["async"]["ratio"]
    lines += ["", f"Ratio: {value['median']:.2f} × (median), {value['p99']:.2f} × (p99)."]
    if "floor_ratio" in results["async"]:
        value = results["async"]["floor_ratio"]
        lines += [f"The floor's own ratio: {value['median']:.2f} × (median), {value['p99']:.2f} × (p99)."]
    lines += ["", stamp_line(results), ""]

    memory = results["memory"]
    lines = parts["memory"]
    lines += _head("Engine", "manager, warmed up", "each held lock")
    lines += [
        f"   * - django-redlock ``LockManager``, {memory['nodes']} nodes", f"     - {memory['manager_bytes']:,} B",
        f"     - {memory['per_lock_bytes']:,.0f} B",
        f"   * - django-redlock ``AsyncLockManager``, {memory['nodes']} nodes",
        f"     - {memory['async_manager_bytes']:,} B", f"     - {memory['async_per_lock_bytes']:,.0f} B",
        "   * - redis-py ``Lock``, 1 node", "     - –", f"     - {memory['redis_py_per_lock_bytes']:,.0f} B",
        "   * - redis-py asyncio ``Lock``, 1 node", "     - –", f"     - {memory['redis_py_async_per_lock_bytes']:,.0f} B",
        "", f"tracemalloc, after ``gc.collect()``; {memory['locks']:,} locks held at once, the list holding them "
        "included (8 B a lock).", "", stamp_line(results), "",
    ]

    rtt = results.get("rtt")
    lines = parts["rtt"]
    if rtt:
        delay = f"+{rtt['rtt_ms']:g} ms"
        lines += _head("median / p99 (µs)", *(f"N = {n}" for n in RTT_NODE_COUNTS), "per node")
        for series in RTT_SERIES:
            for delayed, suffix in (("0", "+0"), ("rtt", delay)):
                row, line = rtt["points"][delayed][series], rtt["fits"][delayed][series]
                lines += [f"   * - {SERIES[series]}, {suffix}",
                          *(f"     - {_pair_cell(row.get(str(n)))}" for n in RTT_NODE_COUNTS),
                          f"     - {_us(line['per_node_us']) if line else '–'}"]
            added = rtt["added_us"][series]
            lines += [f"   * - {SERIES[series]}, added by the delay (medians)",
                      *(f"     - {_us(added[str(n)]) if str(n) in added else '–'}" for n in RTT_NODE_COUNTS), "     -"]
        at = rtt["ratio_to_redis_py"]
        lines += ["", f"Every node behind its own delay-line proxy process; *+0* is the same proxies without delay. "
                  f"Round trip added, measured: {rtt['measured_rtt_us']:,.0f} µs. {rtt['iterations']:,} pairs per "
                  f"point. django-redlock at N = {max(RTT_NODE_COUNTS)} against redis-py's single node: "
                  f"{at['0']['median']:.2f} × without delay, {at['rtt']['median']:.2f} × with it (medians).", "",
                  stamp_line(results), ""]
    else:
        lines += ["(not measured in this run: see ``--rtt-ms``)", ""]
    failed = failures(results)
    if failed:
        parts["latency"] += ["Failed pairs (their time is in the numbers):", "", *(f"- {line}" for line in failed), ""]
    judged = "" if "targets" not in results else "\n".join(
        [".. scaling-targets", "", *targets.rst(results["targets"]), "", stamp_line(results), "", ""])
    return judged + "".join(f".. scaling-{part}\n\n" + "\n".join(parts[part]) + "\n" for part in PARTS)


def failures(results: dict) -> list[str]:
    """One line per point with failed pairs, in every section."""
    rows = [(row["label"], n, point) for row in results["latency"]["series"].values() for n, point in row["points"].items()]
    rows += [(row["label"], results["async"]["nodes"], row) for row in results["async"]["series"].values()]
    for delayed, table in results.get("rtt", {}).get("points", {}).items():
        rows += [(f"{SERIES[series]} (+{delayed})", n, point) for series, row in table.items() for n, point in row.items()]
    return [f"{label}, N = {n}: {point['failed']} of {point['pairs']} failed (first: {point['first_error']})"
            for label, n, point in rows if point["failed"]]


def print_summary(results: dict) -> None:
    latency = results["latency"]
    counts = results["node_counts"]
    print(f"\nacquire+release, median / p99 (µs), {results['iterations']} interleaved pairs per point")
    print(f"{'series':44}" + "".join(f"{'N=' + str(n):>15}" for n in counts) + f"{'fixed':>9}{'per node':>10}{'CPU/node':>10}")
    for row in latency["series"].values():
        line = row["fit"]
        print(f"{row['label']:44}" + "".join(f"{_pair_cell(row['points'].get(str(n))):>15}" for n in counts)
              + (f"{line['fixed_us']:9.0f}{line['per_node_us']:10.1f}{line['cpu_per_node_us']:10.1f}" if line else ""))
    print("\nclient CPU per pair, median (µs, time.process_time)")
    for row in latency["series"].values():
        print(f"{row['label']:44}" + "".join(f"{_cpu_cell(row['points'].get(str(n))):>15}" for n in counts))
    print("\noverhead above the floor (medians, µs)")
    for n, row in latency["overhead_us"].items():
        print(f"  N={n}: " + ", ".join(f"{name} {value:,.0f}" for name, value in row.items()))
    print(f"\nratio to redis-py single node at N={latency['ratio_nodes']}:")
    for name, value in latency["ratio_to_redis_py"].items():
        print(f"  {SERIES[name]:44} median {value['median']:.2f}x  p99 {value['p99']:.2f}x")
    if "async" in results:
        print("\nasync, median / p99 (µs)")
        for row in results["async"]["series"].values():
            print(f"  {row['label']:44} {row['median_us']:8,.0f} {row['p99_us']:8,.0f}")
        print(f"  ratio: median {results['async']['ratio']['median']:.2f}x  p99 {results['async']['ratio']['p99']:.2f}x")
        if "floor_ratio" in results["async"]:
            floor = results["async"]["floor_ratio"]
            print(f"  the floor's own ratio: median {floor['median']:.2f}x  p99 {floor['p99']:.2f}x")
    if "memory" in results:
        print("\nmemory (bytes): " + ", ".join(f"{k} {v:,.0f}" for k, v in results["memory"].items()))
    for line in failures(results):
        print(f"FAILED PAIRS: {line}")
    if rtt := results.get("rtt"):
        print(f"\nround trip +{rtt['rtt_ms']:g} ms (measured {rtt['measured_rtt_us']:,.0f} µs), medians (µs)")
        for delayed in ("0", "rtt"):
            for series, row in rtt["points"][delayed].items():
                cells = "  ".join(f"N={n} {p['median_us']:7,.0f}" for n, p in row.items())
                print(f"  {'+0' if delayed == '0' else '+rtt':5} {SERIES[series]:44} {cells}")


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rtt = results.get("rtt")
    fig, axes = plt.subplots(1, 2 if rtt else 1, figsize=(15 if rtt else 8, 5.5), squeeze=False)
    colors = dict(zip(SERIES, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    ax = axes[0][0]
    for name, row in results["latency"]["series"].items():
        line = row["fit"]
        label = row["label"] + (f": {line['fixed_us']:,.0f} µs + {line['per_node_us']:,.0f} µs/node" if line else "")
        _plot_medians(ax, row["points"], colors[name], "-", label)
    _finish(ax, results["node_counts"], "Redis masters (N)", "Cost against node count, loopback (lower is better)")
    if rtt:
        ax = axes[0][1]
        for delayed, style, suffix in (("0", "--", ", proxies without delay"), ("rtt", "-", f", +{rtt['rtt_ms']:g} ms")):
            for series, row in rtt["points"][delayed].items():
                _plot_medians(ax, row, colors[series], style, SERIES[series] + suffix)
        _finish(ax, RTT_NODE_COUNTS, "Redis masters (N), each behind a delay-line proxy",
                f"With a simulated {rtt['rtt_ms']:g} ms round trip (measured {rtt['measured_rtt_us']:,.0f} µs)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _plot_medians(ax: Any, points: dict[str, dict[str, float]], color: str, style: str, label: str) -> None:
    medians = [point["median_us"] for point in points.values()]
    if len(medians) == 1:  # the single-node reference: a level line across the plot
        ax.axhline(medians[0], color=color, linestyle=style, label=f"{label}: {medians[0]:,.0f} µs")
    else:
        ax.plot([int(n) for n in points], medians, marker="o", color=color, linestyle=style, label=label)


def _finish(ax: Any, counts: Iterable[int], xlabel: str, title: str) -> None:
    ax.set_xticks(list(counts))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("acquire + release, median (µs); p99 in the tables")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.4)  # room for the legend above the lines
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper left")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=2000, help="pairs per (series, N)")
    parser.add_argument("--warmup", type=int, default=100, help="uncounted iterations first")
    parser.add_argument("--memory-locks", type=int, default=10_000, help="locks held at once for the per-lock cost")
    parser.add_argument("--rtt-ms", type=float, default=0.0,
                        help="also measure N = 1, 3, 5 with this round trip added by delay-line proxies (0: skip)")
    parser.add_argument("--rtt-iterations", type=int, default=400)
    parser.add_argument("--json", dest="json_out")
    parser.add_argument("--plot")
    parser.add_argument("--rst", help="write the tables as reStructuredText (for the docs)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: few iterations and locks, N = 1, 3")
    parser.add_argument("--render-only", action="store_true",
                        help="measure nothing: write --rst and --plot from the results already in --json")
    args = parser.parse_args(argv)
    if args.render_only:
        return render_only(args, plot, rst_tables)
    counts = (1, 3) if args.quick else NODE_COUNTS
    iterations = min(args.iterations, 50) if args.quick else args.iterations
    warmup = min(args.warmup, 10) if args.quick else args.warmup
    rtt_iterations = min(args.rtt_iterations, 30) if args.quick else args.rtt_iterations
    memory_locks = min(args.memory_locks, 200) if args.quick else args.memory_locks
    results: dict = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "iterations": iterations,
        "warmup": warmup,
        "node_counts": list(counts),
        "load_before": os.getloadavg()[0],  # other jobs on the 2 cores skew every number here
        "produced": run_stamp("scaling.py", argv),
    }
    with RedisServers(max(NODE_COUNTS) + 1) as servers:
        single_url = servers.urls[-1]
        started = time.monotonic()
        results["latency"] = latency_section(servers, counts, iterations, warmup)
        print(f"latency: {time.monotonic() - started:.0f} s", flush=True)
        urls = servers.urls[:REFERENCE_NODES]
        results["async"] = asyncio.run(async_section(urls, single_url, iterations, warmup))
        print(f"async: {time.monotonic() - started:.0f} s", flush=True)
        results["memory"] = memory_section(servers, memory_locks)
        print(f"memory: {time.monotonic() - started:.0f} s", flush=True)
        if args.rtt_ms > 0:
            results["rtt"] = rtt_section(servers, args.rtt_ms, rtt_iterations, min(warmup, 20))
            print(f"round trip: {time.monotonic() - started:.0f} s", flush=True)
    results["targets"] = targets.scaling_targets(results)
    print_summary(results)
    write_outputs(results, args, plot, rst_tables)
    print(targets.block(results["targets"]))
    return results


if __name__ == "__main__":
    main()
