"""Client CPU per acquire+release pair, and which build of the engine (pure or compiled) ran it.

    python benchmarks/cpu_per_pair.py [--pairs 5000] [--nodes 1 5]
    python benchmarks/cpu_per_pair.py --compare TREE_A TREE_B [--rounds 3]
    python benchmarks/cpu_per_pair.py --compare TREE_A TREE_B --callgrind [--pairs 1000]

Starts local masters (1 and 5 by default) and times ``time.process_time()`` (this process's
CPU, all threads, user and system) over ``--pairs`` pairs on distinct keys, after ``--warmup``
pairs, for three paths: ``LockManager.acquire(name, blocking=False).release()``, the blocking
``acquire(name).release()`` (default ``retry_count``), and ``AsyncLockManager``'s non-blocking
pair. Managers use ``ttl=10, restart_window=0, node_timeout=0.5``.

``--compare`` runs each measurement in a child process per source tree (a checkout with
``django_redlock/`` in it, e.g. one built with ``make build-compiled`` and one pure), alternating
the trees' order each round so both see the same machine load, and prints the medians and the
ratio. ``--callgrind`` counts instructions instead (valgrind, repeatable under load): each child
runs twice, with ``--pairs`` and with no measured pairs, and the difference is divided by
``--pairs``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
PATHS = ("nonblocking", "blocking", "async")
# Longer than the default 50 ms: a busy machine must not fail a pair (a reply is read as soon as it arrives).
NODE_TIMEOUT = 0.5


def build_of(tree: str | None) -> str:
    """"compiled" when the engine's steps load from a C extension (a mypyc build), else "pure"."""
    import importlib.machinery

    from django_redlock.core import steps

    where = os.path.dirname(os.path.dirname(os.path.dirname(steps.__file__ or "")))
    kind = "compiled" if (steps.__file__ or "").endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)) else "pure"
    return f"{kind} ({where})" if tree is None else kind


def sync_pairs(urls: list[str], path: str, warmup: int, pairs: int) -> float:
    from django_redlock.core import LockManager

    if path == "blocking":
        manager = LockManager(urls, ttl=10, restart_window=0, node_timeout=NODE_TIMEOUT)
        one: Callable[[str], Any] = lambda name: manager.acquire(name).release()  # noqa: E731
    else:
        manager = LockManager(urls, ttl=10, restart_window=0, retry_count=0, node_timeout=NODE_TIMEOUT)
        one = lambda name: manager.acquire(name, blocking=False).release()  # noqa: E731
    prefix = f"cpu-{os.getpid()}-{path}-"
    try:
        for i in range(warmup):
            one(f"{prefix}w{i}")
        started = time.process_time()
        for i in range(pairs):
            one(f"{prefix}k{i}")
        return time.process_time() - started
    finally:
        manager.close()


def async_pairs(urls: list[str], warmup: int, pairs: int) -> float:
    from django_redlock.core import AsyncLockManager

    async def run() -> float:
        manager = AsyncLockManager(urls, ttl=10, restart_window=0, retry_count=0, node_timeout=NODE_TIMEOUT)
        prefix = f"cpu-{os.getpid()}-async-"
        try:
            for i in range(warmup):
                lock = await manager.acquire(f"{prefix}w{i}", blocking=False)
                await lock.release()
            started = time.process_time()
            for i in range(pairs):
                lock = await manager.acquire(f"{prefix}k{i}", blocking=False)
                await lock.release()
            return time.process_time() - started
        finally:
            await manager.aclose()

    return asyncio.run(run())


def measure(urls: list[str], path: str, warmup: int, pairs: int) -> float:
    """CPU seconds for ``pairs`` pairs of ``path`` on ``urls``."""
    if path == "async":
        return async_pairs(urls, warmup, pairs)
    return sync_pairs(urls, path, warmup, pairs)


def child(args: argparse.Namespace) -> None:
    """One measurement, in this process: prints {"build": ..., "seconds": ...} as JSON."""
    if args.tree:
        sys.path.insert(0, os.path.abspath(args.tree))
    seconds = measure(args.urls, args.path, args.warmup, args.pairs)
    print(json.dumps({"build": build_of(args.tree), "seconds": seconds}))


def run(command: list[str]) -> dict[str, Any]:
    """Run a child measurement; its result, or exit with its error output."""
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"error: {' '.join(command)} failed:\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def run_child(tree: str, urls: list[str], path: str, warmup: int, pairs: int, callgrind: bool) -> tuple[str, float]:
    command = [sys.executable, os.path.abspath(__file__), "--child", "--tree", tree, "--path", path]
    command += ["--warmup", str(warmup), "--pairs", str(pairs), "--urls", *urls]
    if not callgrind:
        result = run(command)
        return result["build"], result["seconds"]
    with tempfile.TemporaryDirectory() as tmp:
        out_file = os.path.join(tmp, "callgrind.out")
        build = run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out_file}", *command])["build"]
        with open(out_file) as f:
            totals = [line for line in f if line.startswith("totals:")]
        return build, float(totals[0].split()[1])


def compare(args: argparse.Namespace, urls_by_n: dict[int, list[str]]) -> None:
    trees = [os.path.abspath(tree) for tree in args.compare]
    unit = "instructions" if args.callgrind else "us CPU"
    print(f"{unit} per acquire+release pair; {args.pairs} pairs after {args.warmup}, {args.rounds} round(s)")
    for n, urls in urls_by_n.items():
        for path in args.paths:
            samples: dict[str, list[float]] = {tree: [] for tree in trees}
            builds: dict[str, str] = {}
            for r in range(args.rounds):
                for tree in trees if r % 2 == 0 else trees[::-1]:
                    build, value = run_child(tree, urls, path, args.warmup, args.pairs, args.callgrind)
                    if args.callgrind:  # the same run without measured pairs, taken off
                        value -= run_child(tree, urls, path, args.warmup, 0, True)[1]
                    builds[tree] = build
                    samples[tree].append(value / args.pairs * (1 if args.callgrind else 1e6))
            medians = [statistics.median(samples[tree]) for tree in trees]
            cells = "  ".join(
                f"{os.path.basename(tree)} ({builds[tree]}): {median:,.0f} [{', '.join(f'{v:,.0f}' for v in samples[tree])}]"
                for tree, median in zip(trees, medians)
            )
            ratio = medians[0] / medians[-1] if medians[-1] else float("nan")
            print(f"N={n} {path:<11} {cells}  ratio first/last {ratio:.2f}x", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=5000)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 5])
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    parser.add_argument("--compare", nargs="+", metavar="TREE", help="source trees to measure in turn")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--callgrind", action="store_true", help="count instructions (with --compare)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tree", help=argparse.SUPPRESS)
    parser.add_argument("--path", choices=PATHS, help=argparse.SUPPRESS)
    parser.add_argument("--urls", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.pairs < 1 and not args.child:
        parser.error("--pairs must be at least 1")
    if args.callgrind and not args.compare:
        parser.error("--callgrind needs --compare")
    if args.child:
        child(args)
        return
    sys.path.insert(0, os.path.dirname(HERE))
    from django_redlock.testing import RedisServers

    with RedisServers(sum(args.nodes)) as servers:
        urls_by_n, start = {}, 0
        for n in args.nodes:
            urls_by_n[n] = servers.urls[start : start + n]
            start += n
        if args.compare:
            compare(args, urls_by_n)
            return
        print(f"engine build: {build_of(None)}")
        print(f"us CPU per acquire+release pair; {args.pairs} pairs after {args.warmup}")
        for n, urls in urls_by_n.items():
            for path in args.paths:
                seconds = measure(urls, path, args.warmup, args.pairs)
                print(f"N={n} {path:<11} {seconds / args.pairs * 1e6:,.1f}", flush=True)


if __name__ == "__main__":
    main()
