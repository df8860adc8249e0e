"""Benchmark django-redlock against the locks users would pick instead.

Starts five local redis-server masters (plus one for redis-py's single-node
lock) and measures, in one run:

- acquire+release latency (median, p99) and pairs per second on distinct keys;
- the same with one of the five nodes SIGSTOPped;
- how long a non-blocking acquire takes to fail with 3 of 5 nodes SIGSTOPped.

Each library runs each scenario in its own subprocess with a time budget, so
a client that hangs on a paused node is reported as such instead of hanging
the benchmark. Competitors run with their default settings: that is what
their users get.

    python benchmarks/bench.py [--iterations N] [--budget S] [--json out.json] [--plot out.png]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from django_redlock.testing import RedisServer, RedisServers  # noqa: E402

LIBRARIES = ("django_redlock", "redis-py Lock (1 node)", "redlock-py", "pottery")


def make_client(library: str, urls: list[str], single_url: str):
    """Return (acquire(name) -> handle, release(handle), try_once(name) -> bool)."""
    if library == "django_redlock":
        from django_redlock.core import LockManager

        mgr = LockManager(urls, ttl=10.0, retry_count=0, restart_window=0)

        def acquire(name):
            return mgr.acquire(name, blocking=False)

        def release(lock):
            lock.release()

        def try_once(name):
            try:
                mgr.acquire(name, blocking=False)
                return True
            except Exception:  # noqa: BLE001
                return False

        return acquire, release, try_once
    if library == "redis-py Lock (1 node)":
        import redis

        client = redis.Redis.from_url(single_url)

        def acquire(name):
            lock = client.lock(name, timeout=10)
            if not lock.acquire(blocking=False):
                raise RuntimeError("not acquired")
            return lock

        def release(lock):
            lock.release()

        def try_once(name):
            return bool(client.lock(name, timeout=10).acquire(blocking=False))

        return acquire, release, try_once
    if library == "redlock-py":
        from redlock import Redlock

        dlm = Redlock([{"host": "127.0.0.1", "port": int(u.rsplit(":", 1)[1].split("/")[0])} for u in urls])

        def acquire(name):
            lock = dlm.lock(name, 10000)
            if not lock:
                raise RuntimeError("not acquired")
            return lock

        def release(lock):
            dlm.unlock(lock)

        def try_once(name):
            dlm.retry_count = 1
            return bool(dlm.lock(name, 10000))

        return acquire, release, try_once
    if library == "pottery":
        import redis
        from pottery import Redlock as PotteryRedlock

        masters = {redis.Redis.from_url(u) for u in urls}

        def acquire(name):
            lock = PotteryRedlock(key=name, masters=masters, auto_release_time=10)
            if not lock.acquire(blocking=False):
                raise RuntimeError("not acquired")
            return lock

        def release(lock):
            lock.release()

        def try_once(name):
            return bool(PotteryRedlock(key=name, masters=masters, auto_release_time=10).acquire(blocking=False))

        return acquire, release, try_once
    raise ValueError(library)


def scenario_pairs(library, urls, single_url, iterations, queue):
    acquire, release, _ = make_client(library, urls, single_url)
    prefix = f"bench-{os.getpid()}-"
    for i in range(min(50, iterations)):  # warm up connections and scripts
        release(acquire(f"{prefix}warm-{i}"))
    samples = []
    started = time.perf_counter()
    for i in range(iterations):
        t0 = time.perf_counter()
        release(acquire(f"{prefix}{i}"))
        samples.append(time.perf_counter() - t0)
    total = time.perf_counter() - started
    samples.sort()
    queue.put(
        {
            "median_us": statistics.median(samples) * 1e6,
            "p99_us": samples[int(len(samples) * 0.99) - 1] * 1e6,
            "pairs_per_s": iterations / total,
        }
    )


def scenario_fail(library, urls, single_url, iterations, queue):
    _, _, try_once = make_client(library, urls, single_url)
    t0 = time.perf_counter()
    ok = try_once(f"bench-fail-{os.getpid()}")
    queue.put({"fail_ms": (time.perf_counter() - t0) * 1000, "acquired": ok})


def run_budgeted(target, library, urls, single_url, iterations, budget):
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=target, args=(library, urls, single_url, iterations, queue))
    proc.start()
    proc.join(budget)
    if proc.is_alive():
        proc.kill()
        proc.join()
        return {"timeout_s": budget}
    try:
        return queue.get(timeout=1)
    except Exception:  # noqa: BLE001
        return {"error": f"exit code {proc.exitcode}"}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=3000)
    parser.add_argument("--budget", type=float, default=60.0, help="seconds per library and scenario")
    parser.add_argument("--libraries", default=",".join(LIBRARIES))
    parser.add_argument("--json", dest="json_out")
    parser.add_argument("--plot")
    parser.add_argument("--rst", help="write the results as a reStructuredText table (for the docs)")
    parser.add_argument("--quick", action="store_true", help="few iterations, django_redlock only")
    args = parser.parse_args(argv)
    libraries = ["django_redlock"] if args.quick else [x.strip() for x in args.libraries.split(",")]
    iterations = 200 if args.quick else args.iterations
    results: dict = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "iterations": iterations,
        "budget_s": args.budget,
        "libraries": {},
    }
    with RedisServers(5) as servers:
        single = RedisServer().start()
        try:
            urls = servers.urls
            for library in libraries:
                row: dict = {}
                row["healthy"] = run_budgeted(scenario_pairs, library, urls, single.url, iterations, args.budget)
                servers.heal()
                servers[4].pause()
                if library == "redis-py Lock (1 node)":
                    row["one_paused"] = {"n/a": "single node"}
                else:
                    row["one_paused"] = run_budgeted(
                        scenario_pairs, library, urls, single.url, iterations, args.budget
                    )
                servers[2].pause()
                servers[3].pause()
                if library == "redis-py Lock (1 node)":
                    row["majority_paused"] = {"n/a": "single node"}
                else:
                    row["majority_paused"] = run_budgeted(
                        scenario_fail, library, urls, single.url, iterations, args.budget
                    )
                servers.heal()
                results["libraries"][library] = row
                print(f"{library:24} {json.dumps(row)}", flush=True)
        finally:
            single.stop()
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump(results, fh, indent=2)
    if args.plot:
        plot(results, args.plot)
    if args.rst:
        with open(args.rst, "w") as fh:
            fh.write(rst_table(results))
    return results


def _cell(row: dict, key: str, unit: str = "µs") -> str:
    if "timeout_s" in row:
        return f"hung (> {row['timeout_s']:.0f} s)"
    if "n/a" in row:
        return "n/a"
    if "error" in row:
        return "error"
    value = row.get(key)
    if value is None:
        return "–"
    return f"{value:,.0f} {unit}" if unit else f"{value:,.0f}"


def rst_table(results: dict) -> str:
    lines = [
        ".. list-table::",
        "   :header-rows: 1",
        "",
        "   * - Library",
        "     - acquire+release, median",
        "     - p99",
        "     - pairs/s",
        "     - median, 1 of 5 nodes SIGSTOPped",
        "     - non-blocking acquire fails after (3 of 5 SIGSTOPped)",
    ]
    for name, row in results["libraries"].items():
        fail = row["majority_paused"]
        if "fail_ms" in fail:
            fail_text = f"{fail['fail_ms']:,.0f} ms"
        else:
            fail_text = _cell(fail, "fail_ms", "ms")
        lines += [
            f"   * - {name}",
            f"     - {_cell(row['healthy'], 'median_us')}",
            f"     - {_cell(row['healthy'], 'p99_us')}",
            f"     - {_cell(row['healthy'], 'pairs_per_s', '')}",
            f"     - {_cell(row['one_paused'], 'median_us')}",
            f"     - {fail_text}",
        ]
    machine = results["machine"]
    lines += [
        "",
        f"{results['iterations']} pairs per library and scenario; {machine['cpus']} CPUs, Python {machine['python']}, "
        f"{machine['platform']}. Budget per scenario: {results['budget_s']:.0f} s.",
        "",
    ]
    return "\n".join(lines)


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["libraries"])
    healthy = [results["libraries"][n]["healthy"].get("median_us", 0) for n in names]
    paused = [results["libraries"][n]["one_paused"].get("median_us", 0) for n in names]
    fig, ax = plt.subplots(figsize=(8, 4))
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], healthy, width=0.4, label="all nodes up")
    ax.bar([x + 0.2 for x in xs], paused, width=0.4, label="one node SIGSTOPped")
    for x, n in zip(xs, names):
        row = results["libraries"][n]["one_paused"]
        if "timeout_s" in row:
            ax.text(x + 0.2, 50, f"hung\n>{row['timeout_s']:.0f} s", ha="center", fontsize=8)
    ax.set_xticks(list(xs), names, fontsize=8)
    ax.set_ylabel("acquire + release, median (µs)")
    ax.set_title("Lock latency, 5 local Redis masters (lower is better)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
