"""Benchmark django-redlock against the locks users would pick instead.

Starts five local redis-server masters (plus one for redis-py's single-node
lock) and measures, in one run:

- acquire+release latency (median, p99) and pairs per second on distinct keys;
- the same with one of the five nodes SIGSTOPped;
- how long a non-blocking acquire takes to fail with 3 of 5 nodes SIGSTOPped;
- contention: 8 worker processes take turns on ONE key with blocking acquires,
  holding it ~1 ms each time (django-redlock on 5 nodes against redis-py's Lock,
  with its default 0.1 s sleep and with sleep=1 ms, and python-redis-lock, each
  on one node): acquisitions/s, per-worker fairness, hand-off latency (a
  release to the next holder's acquisition) and how often the worker that had
  just released takes the lock again; the same workers on the floor (a
  raw-socket client of the five nodes that waits on a BLPOP wake list, see
  ``floor_handoff.py``), the loopback round trip (PING on a raw socket), and the
  validity django-redlock's locks hand over, won in line and uncontended;
- admin: ``admin_render.py`` (``redlock list`` and the admin's Locks page with
  10,000 locks), run as it is, its results read from what it prints last;
- the speed targets of the contention and admin sections (``targets.py``),
  each against its floor from this run, with a verdict: printed last, kept in
  ``--json`` and written under the tables into ``--rst``.

Each library runs each scenario in its own subprocess with a time budget, so
a client that hangs on a paused node is reported as such instead of hanging
the benchmark. Competitors run with their default settings: that is what
their users get.

    python benchmarks/bench.py [--iterations N] [--budget S] [--json out.json] [--plot out.png]
    python benchmarks/bench.py --only contention [--workers 8] [--seconds 10] [--hold-ms 1]
    python benchmarks/bench.py --render-only --json docs/benchmarks.json --rst docs/benchmarks_table.rst

With ``--only``, the sections that did not run are kept from an existing
``--json`` file, so the plot and table still show every scenario. Each section
records the date (UTC) and the command line of the run that measured it, and
the tables print them. ``--render-only`` writes the table (and plot) again
from ``--json`` without measuring anything.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import targets  # noqa: E402
from floor_handoff import ping_rtt_us  # noqa: E402

from django_redlock.testing import RedisServer, RedisServers  # noqa: E402

LIBRARIES = ("django_redlock", "redis-py Lock (1 node)", "redlock-py", "pottery")
CONTENTION_LIBRARIES = (
    "django_redlock",
    targets.FLOOR,
    "redis-py Lock (1 node)",
    "redis-py Lock (1 node) sleep=1 ms",
    "python-redis-lock (1 node)",
)
LATENCY_SECTIONS = ("healthy", "one_paused", "majority_paused")
SECTIONS = (*LATENCY_SECTIONS, "contention", "admin")
#: How long a contention worker's blocking acquire may wait: generous, so a worker only gives
#: up if the library is broken (8 workers x ~1.5 ms per turn is far below it).
CONTENTION_TIMEOUT = 30.0
#: Uncontended acquires each contention worker makes before the clock starts, for the validity they hand over.
FRESH_ACQUIRES = 5


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


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

        dlm = Redlock([{"host": "127.0.0.1", "port": _port(u)} for u in urls])

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


def blocking_client(library: str, urls: list[str], single_url: str):
    """Return (acquire(name) -> handle, release(handle)) for blocking acquires of one key.

    Every library waits with its own mechanism: django-redlock in each node's line,
    woken by the release; redis-py's Lock polls every ``sleep`` seconds (default
    0.1 s, and 1 ms as the fairest setting); python-redis-lock BLPOPs a signal
    list that the release pushes to; the floor (:mod:`floor_handoff`) does the least
    that any such waiting line on the five nodes does, on raw sockets.
    """
    if library == "django_redlock":
        from django_redlock.core import LockManager

        mgr = LockManager(urls, ttl=10.0, restart_window=0)

        def acquire(name):
            return mgr.acquire(name, blocking=True, timeout=CONTENTION_TIMEOUT)

        return acquire, _release
    if library.startswith("redis-py Lock"):
        import redis

        client = redis.Redis.from_url(single_url)
        sleep = 0.001 if library.endswith("sleep=1 ms") else 0.1  # 0.1 s is redis-py's default

        def acquire(name):
            lock = client.lock(name, timeout=10, sleep=sleep, blocking_timeout=CONTENTION_TIMEOUT)
            if not lock.acquire(blocking=True):
                raise RuntimeError("not acquired")
            return lock

        return acquire, _release
    if library == "python-redis-lock (1 node)":
        import redis
        import redis_lock

        client = redis.Redis.from_url(single_url)

        def acquire(name):
            # python-redis-lock refuses a wait longer than the lock's expiry, hence expire=timeout here.
            lock = redis_lock.Lock(client, name, expire=int(CONTENTION_TIMEOUT))
            if not lock.acquire(blocking=True, timeout=CONTENTION_TIMEOUT):
                raise RuntimeError("not acquired")
            return lock

        return acquire, _release
    if library == targets.FLOOR:
        from floor_handoff import HandoffFloor

        floor = HandoffFloor([_port(url) for url in urls], token=f"floor-{os.getpid()}")
        return floor.acquire, floor.release
    raise ValueError(library)


def _release(lock) -> None:
    lock.release()


def contention_worker(library, urls, single_url, key, seconds, hold, barrier, queue, index):
    """One of the workers: blocking acquire of ``key``, hold ``hold`` seconds, release; for ``seconds``.

    Records the wall clock (comparable across processes) when each acquire
    was called, when it returned and when each release started; and, for a
    lock that has a ``validity``, how much of it each acquire handed over,
    also on a few uncontended keys first.
    """
    try:
        acquire, release = blocking_client(library, urls, single_url)
        release(acquire(f"{key}-warm-{index}"))  # connect and load scripts before the clock starts
        fresh = []
        for i in range(FRESH_ACQUIRES):
            lock = acquire(f"{key}-fresh-{index}-{i}")
            fresh.append(getattr(lock, "validity", None))
            release(lock)
        barrier.wait(timeout=60)
        asked: list[float] = []
        acquired: list[float] = []
        released: list[float] = []
        validities: list[float | None] = []
        started = time.time()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            asked.append(time.time())
            lock = acquire(key)
            acquired.append(time.time())
            validities.append(getattr(lock, "validity", None))
            time.sleep(hold)
            released.append(time.time())
            release(lock)
        queue.put({"index": index, "asked": asked, "acquired": acquired, "released": released, "started": started,
                   "ended": time.time(), "validities": validities, "fresh_validities": fresh})
    except BaseException as exc:  # noqa: BLE001 - reported, not raised: the parent waits for every worker
        queue.put({"index": index, "error": repr(exc)})


def _percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, max(0, int(len(sorted_values) * q) - 1))]


def contention_stats(workers: list[dict]) -> dict:
    """Merge the workers' records: throughput, fairness, hand-off latency, who takes the lock next.

    A lock *won in line* is one whose acquire was called before the previous
    holder released it; the validity it handed over is summed up apart from
    the uncontended acquires' (when the library's locks have a validity).
    """
    events = []
    by_index = {record["index"]: record for record in workers}
    for index, record in by_index.items():
        events += [(t, 0, index, j) for j, t in enumerate(record["released"])]  # a release sorts first on a tie
        events += [(t, 1, index, j) for j, t in enumerate(record["acquired"])]
    events.sort()
    handoffs: list[float] = []
    waited: list[float] = []
    same = overlaps = 0
    holder = last_release = None
    for t, kind, worker, j in events:
        if kind == 0:
            holder, last_release = None, (t, worker)
            continue
        if holder is not None:
            overlaps += 1  # acquired while someone else still held it: should never happen
        if last_release is not None:
            handoffs.append(t - last_release[0])
            same += worker == last_release[1]
            record = by_index[worker]
            validity = record["validities"][j] if "validities" in record else None
            if validity is not None and record["asked"][j] < last_release[0]:
                waited.append(validity)
        holder = worker
    counts = [len(r["acquired"]) for r in workers]
    total = sum(counts)
    span = max(r["ended"] for r in workers) - min(r["started"] for r in workers)
    holds = sorted(rel - acq for r in workers for acq, rel in zip(r["acquired"], r["released"]))
    handoffs.sort()
    lowest = min(counts)
    fresh = [v for r in workers for v in r.get("fresh_validities", []) if v is not None]
    validity = {
        "won_in_line": len(waited),
        "validity_median_ms": statistics.median(waited) * 1000,
        "validity_min_ms": min(waited) * 1000,
        "fresh_validity_median_ms": statistics.median(fresh) * 1000 if fresh else None,
    } if waited else {}
    return {
        "workers": len(workers),
        "acquisitions": total,
        "seconds": span,
        "acq_per_s": total / span if span > 0 else 0.0,
        "per_worker": counts,
        "per_worker_min": lowest,
        "per_worker_max": max(counts),
        "max_over_min": max(counts) / lowest if lowest else None,
        "handoff_p50_ms": _percentile(handoffs, 0.50) * 1000 if handoffs else None,
        "handoff_p90_ms": _percentile(handoffs, 0.90) * 1000 if handoffs else None,
        "handoff_p99_ms": _percentile(handoffs, 0.99) * 1000 if handoffs else None,
        "handoff_mean_ms": statistics.fmean(handoffs) * 1000 if handoffs else None,
        "same_worker_share": same / len(handoffs) if handoffs else None,
        "hold_median_ms": statistics.median(holds) * 1000 if holds else None,
        "overlaps": overlaps,
        **validity,
    }


def scenario_contention(library, urls, single_url, workers, seconds, hold, budget) -> dict:
    """``workers`` processes, started together behind a barrier, take turns on one key."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    barrier = ctx.Barrier(workers)
    key = f"bench-contention-{library.split()[0]}-{os.getpid()}-{time.monotonic_ns()}"
    procs = [
        ctx.Process(target=contention_worker,
                    args=(library, urls, single_url, key, seconds, hold, barrier, queue, i))
        for i in range(workers)
    ]
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + max(budget, seconds + 30)
    records = []
    try:
        for _ in procs:
            records.append(queue.get(timeout=max(0.1, deadline - time.monotonic())))
    except Exception:  # noqa: BLE001 - queue.Empty: some worker hung
        return {"timeout_s": budget}
    finally:
        for proc in procs:
            proc.join(max(0.1, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join()
    errors = [r["error"] for r in records if "error" in r]
    if errors:
        return {"error": errors[0]}
    return contention_stats(sorted(records, key=lambda r: r["index"]))


def _sections(only: str | None) -> list[str]:
    if not only:
        return list(SECTIONS)
    wanted: list[str] = []
    for name in (x.strip() for x in only.split(",")):
        names = LATENCY_SECTIONS if name == "latency" else (name,)
        for section in names:
            if section not in SECTIONS:
                raise SystemExit(f"--only: unknown section {section!r}; choose from latency, {', '.join(SECTIONS)}")
            wanted.append(section)
    return wanted


def run_stamp(script: str, argv: Sequence[str] | None) -> dict:
    """When and how a run was made: today's UTC date and the command line that reproduces it."""
    args = list(sys.argv[1:] if argv is None else argv)
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
        "command": shlex.join(["python", f"benchmarks/{script}", *args]),
    }


def stamp_line(section: dict) -> str:
    """The sentence under a generated table that says when and by which command it was measured."""
    stamp = section.get("produced")
    if not stamp:
        return "Date and command of this run not recorded."
    return f"Measured on {stamp['date']} with ``{stamp['command']}``."


def render_only(args: argparse.Namespace, draw: Callable[[dict, str], None], tables: Callable[[dict], str]) -> dict:
    """``--render-only``: write ``--rst`` and ``--plot`` again from the results in ``--json``."""
    if not args.json_out or not os.path.exists(args.json_out):
        raise SystemExit("--render-only: --json must name an existing results file to render from")
    if not args.rst and not args.plot:
        raise SystemExit("--render-only: nothing to write; give --rst FILE and/or --plot FILE")
    with open(args.json_out) as fh:
        results = json.load(fh)
    write_outputs(results, args, draw, tables, write_json=False)
    return results


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=3000)
    parser.add_argument("--budget", type=float, default=60.0, help="seconds per library and scenario")
    parser.add_argument("--libraries", default=",".join(LIBRARIES))
    parser.add_argument("--only", help="comma-separated sections to run: latency (= healthy, one_paused, "
                        "majority_paused), healthy, one_paused, majority_paused, contention, admin (runs "
                        "admin_render.py); default: all. "
                        "The other sections are kept from an existing --json file")
    parser.add_argument("--contention-libraries", default=",".join(CONTENTION_LIBRARIES))
    parser.add_argument("--workers", type=int, default=8, help="contention: worker processes")
    parser.add_argument("--seconds", type=float, default=10.0, help="contention: seconds per library")
    parser.add_argument("--hold-ms", type=float, default=1.0, help="contention: how long each holder keeps the lock")
    parser.add_argument("--json", dest="json_out")
    parser.add_argument("--plot")
    parser.add_argument("--rst", help="write the results as a reStructuredText table (for the docs)")
    parser.add_argument("--quick", action="store_true",
                        help="few iterations, 2 s of contention, django_redlock only (and the contention floor); "
                        "admin_render.py only with --only admin, each case timed once")
    parser.add_argument("--render-only", action="store_true",
                        help="measure nothing: write --rst and --plot from the results already in --json")
    args = parser.parse_args(argv)
    if args.render_only:
        return render_only(args, plot, rst_table)
    stamp = run_stamp("bench.py", argv)
    sections = _sections(args.only)
    if args.quick and not args.only:
        sections.remove("admin")  # a Django project and 10,000 locks: only when asked for by name
    libraries = ["django_redlock"] if args.quick else [x.strip() for x in args.libraries.split(",")]
    contenders = (["django_redlock", targets.FLOOR] if args.quick
                  else [x.strip() for x in args.contention_libraries.split(",")])
    iterations = 200 if args.quick else args.iterations
    seconds = min(args.seconds, 2.0) if args.quick else args.seconds
    results: dict = {}
    if args.only and args.json_out and os.path.exists(args.json_out):
        with open(args.json_out) as fh:
            results = json.load(fh)  # keep the sections this run does not redo
    machine = {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}
    if any(s in sections for s in LATENCY_SECTIONS):
        results.update({"machine": machine, "iterations": iterations, "budget_s": args.budget, "produced": stamp})
        results.setdefault("libraries", {})
    with RedisServers(5) as servers:
        single = RedisServer().start()
        try:
            urls = servers.urls
            if any(s in sections for s in LATENCY_SECTIONS):
                for library in libraries:
                    row = results["libraries"].setdefault(library, {})
                    row.update(latency_row(library, urls, single.url, iterations, args.budget, servers, sections))
                    print(f"{library:24} {json.dumps(row)}", flush=True)
            if "contention" in sections:
                contention: dict = {
                    "machine": machine,
                    "workers": args.workers,
                    "seconds": seconds,
                    "hold_ms": args.hold_ms,
                    "load_before": os.getloadavg()[0],  # other jobs on the machine skew this scenario most
                    "loopback_rtt_us": ping_rtt_us(servers[0].port),
                    "produced": stamp,
                    "libraries": {},
                }
                results["contention"] = contention
                for library in contenders:
                    row = scenario_contention(
                        library, urls, single.url, args.workers, seconds, args.hold_ms / 1000, args.budget
                    )
                    contention["libraries"][library] = row
                    shown = {k: v for k, v in row.items() if k != "per_worker"}
                    print(f"contention {library:34} {json.dumps(shown)}", flush=True)
                contention["targets"] = targets.contention_targets(contention)
        finally:
            single.stop()
    if "admin" in sections:
        results["admin"] = {**admin_render(args.quick), "produced": stamp}
        results["admin"]["targets"] = targets.admin_targets(results["admin"])
    write_outputs(results, args, plot, rst_table)
    judged = [t for name in ("contention", "admin") if name in sections for t in results[name].get("targets", [])]
    if judged:
        print(targets.block(judged))
    return results


def admin_render(quick: bool) -> dict:
    """Run ``admin_render.py`` (its own redis-servers and Django) and return the results it prints last.

    What it writes on stderr goes to ours; what it prints on stdout before its results is echoed.
    """
    command = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "admin_render.py")]
    if quick:
        command += ["--repeat", "1"]
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=False)
    lines = done.stdout.splitlines()
    for line in lines[:-1]:
        print(line, flush=True)
    try:
        found = json.loads(lines[-1]) if lines else None
    except ValueError:
        found = None
    if done.returncode or not isinstance(found, dict) or "cases" not in found:
        if lines:
            print(lines[-1], flush=True)
        return {"error": f"admin_render.py exited with {done.returncode} and printed no results"}
    return found


def write_outputs(
    results: dict,
    args: argparse.Namespace,
    draw: Callable[[dict, str], None],
    tables: Callable[[dict], str],
    write_json: bool = True,
) -> None:
    """Write what ``--json``, ``--plot`` and ``--rst`` asked for (``draw`` and ``tables`` make the last two)."""
    if args.json_out and write_json:
        with open(args.json_out, "w") as fh:
            json.dump(results, fh, indent=2)
    if args.plot:
        draw(results, args.plot)
    if args.rst:
        with open(args.rst, "w") as fh:
            fh.write(tables(results))


def latency_row(library, urls, single_url, iterations, budget, servers, sections) -> dict:
    """The uncontended scenarios for one library: healthy, one node paused, a majority paused."""
    row: dict = {}

    def run(section, target):
        if section not in sections:
            return
        if library == "redis-py Lock (1 node)" and section != "healthy":
            row[section] = {"n/a": "single node"}
        else:
            row[section] = run_budgeted(target, library, urls, single_url, iterations, budget)

    run("healthy", scenario_pairs)
    servers.heal()
    servers[4].pause()
    run("one_paused", scenario_pairs)
    servers[2].pause()
    servers[3].pause()
    run("majority_paused", scenario_fail)
    servers.heal()
    return row


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


#: The docs include the generated file twice, split here: the latency table, then the contention table.
CONTENTION_MARKER = ".. contention-table"


def rst_table(results: dict) -> str:
    return (rst_latency_table(results) + f"\n{CONTENTION_MARKER}\n\n" + rst_contention_table(results)
            + rst_targets(results))


def rst_targets(results: dict) -> str:
    """The targets of the sections that judged them (older results have none: nothing then)."""
    sections = [results[name] for name in ("contention", "admin") if results.get(name, {}).get("targets")]
    if not sections:
        return ""
    lines = ["", "Targets:", "", *targets.rst([t for section in sections for t in section["targets"]]), ""]
    for stamp in dict.fromkeys(stamp_line(section) for section in sections):
        lines += [stamp, ""]
    return "\n".join(lines)


def _table_head(*columns: str) -> list[str]:
    return [".. list-table::", "   :header-rows: 1", "", "   * - Library", *(f"     - {c}" for c in columns)]


def rst_latency_table(results: dict) -> str:
    if not results.get("libraries"):
        return ""
    lines = _table_head(
        "acquire+release, median",
        "p99",
        "pairs/s",
        "median, 1 of 5 nodes SIGSTOPped",
        "non-blocking acquire fails after (3 of 5 SIGSTOPped)",
    )
    for name, row in results["libraries"].items():
        fail = row.get("majority_paused", {})
        if "fail_ms" in fail:
            fail_text = f"{fail['fail_ms']:,.0f} ms"
        else:
            fail_text = _cell(fail, "fail_ms", "ms")
        lines += [
            f"   * - {name}",
            f"     - {_cell(row.get('healthy', {}), 'median_us')}",
            f"     - {_cell(row.get('healthy', {}), 'p99_us')}",
            f"     - {_cell(row.get('healthy', {}), 'pairs_per_s', '')}",
            f"     - {_cell(row.get('one_paused', {}), 'median_us')}",
            f"     - {fail_text}",
        ]
    machine = results["machine"]
    lines += [
        "",
        f"{results['iterations']} pairs per library and scenario; {machine['cpus']} CPUs, Python {machine['python']}, "
        f"{machine['platform']}. Budget per scenario: {results['budget_s']:.0f} s.",
        "",
        stamp_line(results),
        "",
    ]
    return "\n".join(lines)


def _ms(value) -> str:
    return "–" if value is None else f"{value:,.2f} ms" if value < 10 else f"{value:,.0f} ms"


def rst_contention_table(results: dict) -> str:
    contention = results.get("contention")
    if not contention:
        return ""
    lines = _table_head(
        "acquisitions/s",
        "per worker, min – max (max/min)",
        "hand-off p50",
        "hand-off p99",
        "taken again by the worker that just released",
    )
    for name, row in contention["libraries"].items():
        if "acq_per_s" not in row:
            text = _cell(row, "acq_per_s", "")
            lines += [f"   * - {name}"] + [f"     - {text}"] * 5
            continue
        ratio = row["max_over_min"]
        lines += [
            f"   * - {name}",
            f"     - {row['acq_per_s']:,.0f}",
            f"     - {row['per_worker_min']:,} – {row['per_worker_max']:,} "
            f"({'∞' if ratio is None else f'{ratio:.2f}'})",
            f"     - {_ms(row['handoff_p50_ms'])}",
            f"     - {_ms(row['handoff_p99_ms'])}",
            f"     - {row['same_worker_share'] * 100:.0f} %",
        ]
    machine = contention["machine"]
    lines += [
        "",
        f"{contention['workers']} worker processes, one key, each holding it {contention['hold_ms']:g} ms per turn, "
        f"{contention['seconds']:g} s per library; {machine['cpus']} CPUs shared by the workers and the "
        f"redis-servers, Python {machine['python']}, {machine['platform']}."
        + (f" 1-minute load average when the run started: {contention['load_before']:.1f}."
           if "load_before" in contention else ""),
        "",
        stamp_line(contention),
        "",
    ]
    return "\n".join(lines)


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    contention = results.get("contention")
    panels = int(bool(results.get("libraries"))) + int(bool(contention))
    fig, axes = plt.subplots(1, panels, figsize=(8 * panels, 4.5), squeeze=False)
    axes = list(axes[0])
    if results.get("libraries"):
        plot_latency(axes.pop(0), results)
    if contention:
        plot_contention(axes.pop(0), contention)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_latency(ax, results: dict) -> None:
    names = list(results["libraries"])
    healthy = [results["libraries"][n].get("healthy", {}).get("median_us", 0) for n in names]
    paused = [results["libraries"][n].get("one_paused", {}).get("median_us", 0) for n in names]
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], healthy, width=0.4, label="all nodes up")
    ax.bar([x + 0.2 for x in xs], paused, width=0.4, label="one node SIGSTOPped")
    for x, n in zip(xs, names):
        row = results["libraries"][n].get("one_paused", {})
        if "timeout_s" in row:
            ax.text(x + 0.2, 50, f"hung\n>{row['timeout_s']:.0f} s", ha="center", fontsize=8)
    ax.set_xticks(list(xs), names, fontsize=8)
    ax.set_ylabel("acquire + release, median (µs)")
    ax.set_title("Lock latency, 5 local Redis masters (lower is better)")
    ax.legend()


def plot_contention(ax, contention: dict) -> None:
    names = list(contention["libraries"])
    rows = [contention["libraries"][n] for n in names]
    xs = list(range(len(names)))
    seconds = [r.get("seconds") or 1 for r in rows]
    rates = [r.get("acq_per_s", 0) for r in rows]
    low = [r.get("per_worker_min", 0) * contention["workers"] / s for r, s in zip(rows, seconds)]
    high = [r.get("per_worker_max", 0) * contention["workers"] / s for r, s in zip(rows, seconds)]
    ax.bar(xs, rates, width=0.6, label="acquisitions/s, all workers")
    ax.errorbar(xs, rates, yerr=[[max(0, r - lo) for r, lo in zip(rates, low)],
                                 [max(0, hi - r) for r, hi in zip(rates, high)]],
                fmt="none", ecolor="black", capsize=6,
                label=f"slowest – fastest worker, x {contention['workers']}")
    top = max([*rates, *high, 1])
    for x, row in zip(xs, rows):
        if "acq_per_s" not in row:
            ax.text(x, top * 0.05, "error" if "error" in row else "hung", ha="center", fontsize=8)
            continue
        p50, p99 = row["handoff_p50_ms"], row["handoff_p99_ms"]
        ax.text(x, top * 1.04, f"hand-off p50 {p50:.1f} ms\np99 {p99:.1f} ms\n"
                f"{row['same_worker_share'] * 100:.0f} % same worker", ha="center", va="bottom", fontsize=7)
    ax.set_ylim(0, top * 1.35)
    short = [n.replace(" (1 node)", "\n(1 node)").replace("django_redlock", "django_redlock\n(5 nodes)") for n in names]
    ax.set_xticks(xs, short, fontsize=8)
    ax.set_ylabel("acquisitions per second (higher is better)")
    ax.set_title(f"{contention['workers']} processes, one key, {contention['hold_ms']:g} ms hold")
    ax.legend(fontsize=7, loc="upper left")


if __name__ == "__main__":
    main()
