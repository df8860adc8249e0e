"""The engine's RESP reader (core/resp.py, pure Python) against hiredis's C ``Reader``.

Two measurements in one run, CPU time (``time.process_time``) only:

- per reply: the replies the engine reads, taken from a live ``redis-server`` (``+OK``, ``:1``,
  ``$-1``, a lock token, NOSCRIPT, the connection probe's INFO/CONFIG replies, a listing page of
  200 locks in both of its forms), each read as the drivers read it: the sync driver's lookup of a
  read that is exactly one usual reply (``USUAL``), the pure reader (``ReplyBuffer``: feed, then
  take replies until ``INCOMPLETE``) and ``hiredis.Reader`` set up to the same contract (feed, then
  ``gets`` until ``INCOMPLETE``; error replies built as redis-py's exceptions); rounds alternate
  the readers, the median round is reported;
- per acquire+release pair: the bytes the sync and asyncio drivers actually read during real
  non-blocking pairs at N = 1 and N = 5 are recorded, then replayed through each reader as that
  driver reads them; beside it, the CPU of one whole pair (measured without the recording).

hiredis is needed for the comparison (``pip install hiredis``); without it only the pure reader
is measured. Usage::

    python benchmarks/resp_reader.py [--rounds 15] [--pairs 2000] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import run_stamp  # noqa: E402

from django_redlock.core import AsyncLockManager, LockManager  # noqa: E402
from django_redlock.core import anodes, resp, wire  # noqa: E402
from django_redlock.core.ledger import PROBE  # noqa: E402
from django_redlock.core.resp import INCOMPLETE, USUAL, ReplyBuffer, pack  # noqa: E402
from django_redlock.core.scripts import LIST  # noqa: E402
from django_redlock.testing import RedisServers  # noqa: E402

try:
    import hiredis  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # the pure reader alone is measured
    hiredis = None

Reader = Callable[[], Callable[[bytes], int]]  # a new reader for one connection: feed bytes, count replies


# -- the readers, each as a driver uses it -------------------------------------------------


def reading(
    feed: Callable[[bytes], object], take: Callable[[], Any], pending: Callable[[], bool] | None = None
) -> Callable[[bytes], int]:
    """A read as a driver does it: ``feed``, then ``take`` replies until INCOMPLETE; with ``pending``,
    a read that is exactly one usual reply while nothing is buffered is a dict lookup instead."""
    usual = USUAL.get

    def parse(data: bytes) -> int:
        feed(data)
        n = 0
        while take() is not INCOMPLETE:
            n += 1
        return n

    if pending is None:
        return parse

    def read(data: bytes) -> int:
        if not pending() and usual(data, INCOMPLETE) is not INCOMPLETE:
            return 1
        return parse(data)

    return read


def pure_reader() -> Callable[[bytes], int]:
    """The reader alone: every read fed to it and parsed."""
    buffer = ReplyBuffer()
    return reading(buffer.feed, buffer.next)


def driver_reader() -> Callable[[bytes], int]:
    """The drivers' way: a read that is exactly one usual reply is a dict lookup, the rest parsed."""
    buffer = ReplyBuffer()
    return reading(buffer.feed, buffer.next, buffer.pending)


def usual_lookup() -> Callable[[bytes], int]:
    """The drivers' first look at a read: is it exactly one usual reply?"""
    usual = USUAL.get
    return lambda data: 0 if usual(data, INCOMPLETE) is INCOMPLETE else 1


def error_of_text(text: str) -> Exception:
    """An error reply's text as the redis-py exception the pure reader makes of it."""
    by_prefix, other = resp._error_types()
    return by_prefix.get(text.split(" ", 1)[0], other)(text)


def _hiredis() -> Any:
    """hiredis held to the pure reader's contract: INCOMPLETE when not whole, redis-py's error classes."""
    return hiredis.Reader(protocolError=ValueError, replyError=error_of_text, notEnoughData=INCOMPLETE)


def hiredis_reader() -> Callable[[bytes], int]:
    reader = _hiredis()
    return reading(reader.feed, reader.gets)


def driver_hiredis_reader() -> Callable[[bytes], int]:
    """The drivers' way with hiredis parsing what is not one usual reply."""
    reader = _hiredis()
    return reading(reader.feed, reader.gets, reader.has_data)


# -- real replies from a live server -------------------------------------------------------


def _exchange(sock: socket.socket, commands: list[tuple[Any, ...]]) -> bytes:
    """Send ``commands`` in one write; the bytes of all their replies."""
    sock.sendall(b"".join(pack(c) for c in commands))
    buffer, data, got = ReplyBuffer(), b"", 0
    while got < len(commands):
        chunk = sock.recv(1 << 20)
        data += chunk
        buffer.feed(chunk)
        while buffer.next() is not INCOMPLETE:
            got += 1
    return data


def sample_replies(url: str, port: int) -> dict[str, bytes]:
    """Each kind of reply the engine reads, as its bytes on the wire."""
    manager = LockManager([url], ttl=60, retry_count=0, restart_window=0, node_timeout=0.5)
    held = [manager.acquire(f"listed-{i}", blocking=False) for i in range(200)]
    config = manager.config
    sock = socket.create_connection(("127.0.0.1", port))
    try:
        _exchange(sock, [("SET", "bench:token", "a3f9c2d417e84b6c9d0e5f1a2b3c4d5e"), ("SCRIPT", "LOAD", LIST.source)])
        pattern = config.pattern(config.line_keys("")[0])
        out = {
            "+OK": _exchange(sock, [("SET", "bench:ok", "1")]),
            ":1": _exchange(sock, [("EXISTS", "bench:ok")]),
            "$-1": _exchange(sock, [("GET", "bench:missing")]),
            "token (bulk, 32 B)": _exchange(sock, [("GET", "bench:token")]),
            "-NOSCRIPT": _exchange(sock, [("EVALSHA", "0" * 40, 0)]),
            "probe (2 INFO + 2 CONFIG GET)": _exchange(sock, list(PROBE)),
            "listing page, 200 locks": _exchange(sock, [config.list_command("0", pattern, 1000, "vt")]),
            "listing page, 200 locks, arrays": _exchange(sock, [config.list_command("0", pattern, 1000, "vt", True)]),
        }
    finally:
        sock.close()
        for lock in held:
            lock.release()
        manager.close()
    return out


# -- timing --------------------------------------------------------------------------------


def cpu_per_call(make: Reader, chunks: list[bytes], iterations: int) -> float:
    """CPU seconds to read ``chunks`` once with a fresh reader, averaged over ``iterations``."""
    readers = [make() for _ in range(iterations)]
    clock = time.process_time
    start = clock()
    for read in readers:
        for chunk in chunks:
            read(chunk)
    return (clock() - start) / iterations


def alternating(readers: dict[str, Reader], chunks: list[bytes], rounds: int, iterations: int) -> dict[str, float]:
    """Median over ``rounds`` of each reader's CPU per read of ``chunks``, the readers taking turns."""
    seen: dict[str, list[float]] = defaultdict(list)
    for i in range(rounds):
        order = list(readers) if i % 2 == 0 else list(reversed(readers))
        for name in order:
            seen[name].append(cpu_per_call(readers[name], chunks, iterations))
    return {name: statistics.median(times) for name, times in seen.items()}


# -- what a pair reads -----------------------------------------------------------------------


class _Recording:
    """A socket that keeps every chunk its ``recv`` returns (the sync driver reads through ``recv`` only)."""

    def __init__(self, inner: Any, chunks: list[bytes]) -> None:
        self.inner = inner
        self.chunks = chunks

    def recv(self, size: int) -> bytes:
        data: bytes = self.inner.recv(size)
        if data:
            self.chunks.append(data)
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@contextmanager
def recorded(manager: LockManager) -> Iterator[dict[int, list[bytes]]]:
    """Every chunk of bytes the two drivers read, by connection, while the block runs (the sync
    driver's: on the connections ``manager`` has, and those it makes meanwhile)."""
    chunks: dict[int, list[bytes]] = defaultdict(list)
    made, received = wire.Wire.__init__, anodes.AConn.data_received
    wires = [conn for node in manager.node_list for conn in [c for c, _ in node.books.idle] + list(node.books.parked)]

    def record(conn: Any) -> None:
        conn._sock = _Recording(conn._sock, chunks[id(conn)])
        wires.append(conn)

    def init(self: Any, conn: Any, timeout: float) -> None:
        made(self, conn, timeout)
        record(self)

    def data_received(self: Any, data: bytes) -> None:
        chunks[id(self)].append(data)
        received(self, data)

    for conn in list(wires):
        wires.remove(conn)
        record(conn)
    wire.Wire.__init__, anodes.AConn.data_received = init, data_received  # type: ignore[method-assign]
    try:
        yield chunks
    finally:
        wire.Wire.__init__, anodes.AConn.data_received = made, received  # type: ignore[method-assign]
        for conn in wires:
            if isinstance(conn._sock, _Recording):
                conn._sock = conn._sock.inner


def sync_pairs(manager: LockManager, pairs: int, tag: str) -> float:
    """CPU seconds per non-blocking acquire+release."""
    start = time.process_time()
    for i in range(pairs):
        manager.acquire(f"{tag}-{i}", blocking=False).release()
    return (time.process_time() - start) / pairs


def async_pairs(manager: AsyncLockManager, pairs: int, tag: str) -> float:
    async def run() -> float:
        start = time.process_time()
        for i in range(pairs):
            lock = await manager.acquire(f"{tag}-{i}", blocking=False)
            await lock.release()
        return (time.process_time() - start) / pairs

    return asyncio.run(run())


def per_pair(urls: list[str], n: int, pairs: int, rounds: int, readers: dict[str, Reader]) -> dict[str, Any]:
    """For the sync and the asyncio driver at ``n`` nodes: replies and reads per pair, each reader's
    CPU to read what ``pairs`` pairs read (per pair), and the CPU of a whole pair."""
    out: dict[str, Any] = {}
    # A generous node timeout: a busy machine must not turn a pair into a failed one.
    sync_manager = LockManager(urls[:n], ttl=10, retry_count=0, restart_window=0, node_timeout=0.5)
    async_manager = AsyncLockManager(urls[:n], ttl=10, retry_count=0, restart_window=0, node_timeout=0.5)
    drivers: dict[str, Callable[[int, str], float]] = {
        "sync": lambda count, tag: sync_pairs(sync_manager, count, tag),
        "async": lambda count, tag: async_pairs(async_manager, count, tag),
    }
    try:
        for driver, run in drivers.items():
            run(200, f"warm-{driver}-{n}")  # connections made, probes read, scripts loaded
            with recorded(sync_manager) as chunks:
                run(pairs, f"rec-{driver}-{n}")
            streams = list(chunks.values())
            reads = sum(len(s) for s in streams)
            replies = sum(pure_reader_count(s) for s in streams)
            timings: dict[str, list[float]] = defaultdict(list)
            for i in range(rounds):
                names = list(readers) if i % 2 == 0 else list(reversed(readers))
                for name in names:
                    timings[name].append(sum(cpu_per_call(readers[name], s, 1) for s in streams) / pairs)
                timings["whole pair"].append(run(max(50, pairs // 10), f"cpu-{driver}-{n}-{i}"))
            out[driver] = {
                "replies per pair": replies / pairs,
                "reads per pair": reads / pairs,
                **{name: statistics.median(t) for name, t in timings.items()},
            }
    finally:
        sync_manager.close()
        asyncio.run(async_manager.aclose())
    return out


def pure_reader_count(stream: list[bytes]) -> int:
    read = pure_reader()
    return sum(read(chunk) for chunk in stream)


# -- main --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--iterations", type=int, default=2000, help="reads of one reply per round")
    parser.add_argument("--pairs", type=int, default=2000, help="pairs recorded per driver and node count")
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args(argv)

    per_reply_readers: dict[str, Reader] = {"pure (ReplyBuffer)": pure_reader}
    pair_readers: dict[str, Reader] = {"pure, as the drivers read": driver_reader, "pure, every read parsed": pure_reader}
    if hiredis is not None:
        per_reply_readers["hiredis.Reader"] = hiredis_reader
        pair_readers["hiredis behind the lookup"] = driver_hiredis_reader
        pair_readers["hiredis, every read parsed"] = hiredis_reader
    else:
        print("hiredis is not installed: the pure reader alone is measured.")

    results: dict[str, Any] = {"produced": run_stamp("resp_reader.py", argv), "hiredis": getattr(hiredis, "__version__", None)}
    with RedisServers(5) as servers:
        port = servers[0].port
        assert port is not None
        samples = sample_replies(servers.urls[0], port)
        print(f"CPU per reply read, µs (median of {args.rounds} alternating rounds)")
        names = list(per_reply_readers)
        print(f"  {'reply':34} {'bytes':>7} {'USUAL lookup':>13} " + " ".join(f"{n:>20}" for n in names))
        table = {}
        for label, data in samples.items():
            iterations = args.iterations if len(data) < 1000 else max(20, args.iterations // 20)
            readers = dict(per_reply_readers)
            if data in USUAL:
                readers = {"USUAL lookup": usual_lookup, **readers}
            row = alternating(readers, [data], args.rounds, iterations)
            table[label] = {"bytes": len(data), **row}
            usual = f"{row['USUAL lookup'] * 1e6:13.3f}" if "USUAL lookup" in row else f"{'-':>13}"
            print(f"  {label:34} {len(data):7d} {usual} " + " ".join(f"{row[n] * 1e6:20.3f}" for n in names))
        results["per reply"] = table

        results["per pair"] = {}
        for n in (1, 5):
            found = per_pair(servers.urls, n, args.pairs, args.rounds, pair_readers)
            results["per pair"][n] = found
            for driver, row in found.items():
                print(
                    f"N={n} {driver:5}: {row['replies per pair']:.2f} replies in {row['reads per pair']:.2f} reads a pair; "
                    f"whole pair {row['whole pair'] * 1e6:.0f} µs CPU; reading them: "
                    + ", ".join(f"{k} {v * 1e6:.2f} µs" for k, v in row.items() if k not in ("replies per pair", "reads per pair", "whole pair"))
                )
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(results, f, indent=2)
    return results


if __name__ == "__main__":
    main()
