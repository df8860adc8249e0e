"""The async engine against redis-py's asyncio single-node Lock, interleaved in one event loop.

    python benchmarks/bench_async.py [--iterations 2000]

Starts five local masters for django-redlock and one for redis-py, then times
acquire+release pairs on distinct keys, alternating the two libraries so both
see the same machine load. Prints medians and p99 in microseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import redis.asyncio as aredis  # noqa: E402

from django_redlock.core import AsyncLockManager  # noqa: E402
from django_redlock.testing import RedisServers  # noqa: E402


def summary(samples: list[float]) -> str:
    samples = sorted(samples)
    p99 = samples[max(0, int(len(samples) * 0.99) - 1)]
    return f"median {statistics.median(samples) * 1e6:,.0f} us, p99 {p99 * 1e6:,.0f} us"


async def run(urls: list[str], single: str, iterations: int) -> None:
    manager = AsyncLockManager(urls, ttl=10, retry_count=0, restart_window=0)
    client = aredis.Redis.from_url(single)
    ours, theirs = [], []
    for i in range(-200, iterations):  # the first 200 warm up connections and scripts
        started = time.perf_counter()
        lock = await manager.acquire(f"async-{i}", blocking=False)
        await lock.release()
        middle = time.perf_counter()
        other = client.lock(f"async-{i}", timeout=10)
        await other.acquire(blocking=False)
        await other.release()
        if i >= 0:
            ours.append(middle - started)
            theirs.append(time.perf_counter() - middle)
    print(f"django-redlock AsyncLockManager, 5 nodes: {summary(ours)}")
    print(f"redis-py asyncio Lock, 1 node:            {summary(theirs)}")
    await manager.aclose()
    await client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=2000)
    args = parser.parse_args()
    with RedisServers(6) as servers:
        asyncio.run(run(servers.urls[:5], servers.urls[5], args.iterations))


if __name__ == "__main__":
    main()
