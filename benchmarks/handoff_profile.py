"""Where the time of one hand-off goes, under contention (django-redlock on 5 nodes).

Runs the contention scenario of ``bench.py`` (workers taking turns on one key,
holding it ~1 ms) with two probes that do not change the engine:

- in each worker, every fan-out round of the sync engine is timed (wrapping
  ``django_redlock.core.sync_manager.fanout``): its kind (acquire vote "join"/"wait",
  release), when it started and when it returned;
- ``redis-cli monitor`` on every node logs when each node ran the release's
  DEL and the next holder's SET (server clock = the same wall clock).

Then each hand-off (a release by one worker, the next acquisition by another)
is cut into stages, reported as medians and p90s in microseconds::

    release call -> release round written      (client: release() bookkeeping)
    round start  -> 1st node ran the DEL       (client write + node wake-up)
    1st DEL      -> 3rd node ran the next SET  (server side: the quorum of the next vote)
    3rd SET      -> next holder's round returned (waiter wake-up, reading and judging replies)
    round return -> acquire() returned          (client: granting the Lock)

    python benchmarks/handoff_profile.py [--workers 8] [--seconds 3] [--hold-ms 1] [--no-monitor]

MONITOR costs the nodes some CPU: compare the total with ``bench.py --only
contention`` run without it.
"""

from __future__ import annotations

import argparse
import bisect
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import redis  # noqa: E402

from django_redlock.testing import RedisServers  # noqa: E402

KEY = "profile-handoff"


def worker(urls, seconds, hold, barrier, queue, index, rest=0.0):
    from django_redlock.core import LockManager, scripts, sync_manager as manager_module

    acquire_script = getattr(scripts, "ACQUIRE", None)  # absent before the waiting line: a plain SET

    rounds: list[tuple[str, float, float]] = []  # (kind, started, returned), wall clock
    real_fanout = manager_module.fanout

    def timed_fanout(nodes, *args, **options):
        # fanout(nodes, fan, timeout) today; fanout(nodes, commands, **options) in older versions
        fan = args[0] if args and hasattr(args[0], "commands") else None
        commands = fan.commands if fan is not None else args[0]
        if fan is not None:
            options = {"script": fan.script, "block": fan.block}  # what the timing reads
        started = time.time()
        try:
            return real_fanout(nodes, *args, **options) if fan is None else real_fanout(nodes, *args)
        finally:
            script = options.get("script")
            first = next((c for c in commands if c is not None), ("",))
            if script is not None and script is acquire_script:
                kind = "wait" if options.get("block") else "vote"
            elif script is scripts.RELEASE:
                kind = "release"
            elif first[0] == "SET":
                kind = "vote"
            else:
                kind = "other"
            rounds.append((kind, started, time.time()))

    manager_module.fanout = timed_fanout
    mgr = LockManager(urls, ttl=10.0, restart_window=0)
    mgr.acquire(f"{KEY}-warm-{index}", timeout=30).release()
    rounds.clear()
    barrier.wait(timeout=60)
    cpu0 = os.times()
    calls = []  # (acquire called, acquire returned, release called, release returned)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        a0 = time.time()
        lock = mgr.acquire(KEY, timeout=30)
        a1 = time.time()
        time.sleep(hold)
        r0 = time.time()
        lock.release()
        calls.append((a0, a1, r0, time.time()))
        if rest:
            time.sleep(rest)  # diagnostic only: keep the releaser off the CPU during the hand-off
    cpu1 = os.times()
    cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    queue.put({"index": index, "calls": calls, "rounds": rounds, "cpu": cpu})


def server_cpu(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def parse_monitor(path: str) -> tuple[list[float], list[float]]:
    """Times the node ran the lock key's DEL (a release) and SET (a grant), from MONITOR output."""
    dels, sets = [], []
    lock_key = f'"redlock:lock:{KEY}"'
    with open(path, errors="replace") as fh:
        for line in fh:
            if "lua]" not in line or lock_key not in line:
                continue
            parts = line.split(" ", 3)
            if len(parts) < 4:
                continue
            if parts[3].startswith('"del" ' + lock_key) or parts[3].startswith('"DEL" ' + lock_key):
                dels.append(float(parts[0]))
            elif parts[3].lower().startswith('"set" ' + lock_key):
                sets.append(float(parts[0]))
    return dels, sets


def stats(name: str, values: list[float]) -> str:
    if not values:
        return f"{name:48} (none)"
    values = sorted(values)
    p90 = values[min(len(values) - 1, int(len(values) * 0.9))]
    return f"{name:48} median {statistics.median(values) * 1e6:7.0f} us   p90 {p90 * 1e6:7.0f} us   n={len(values)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--hold-ms", type=float, default=1.0)
    parser.add_argument("--no-monitor", action="store_true")
    parser.add_argument("--rest-ms", type=float, default=0.0,
                        help="diagnostic: each worker sleeps this long after its release before it queues again")
    args = parser.parse_args()
    ctx = multiprocessing.get_context("fork")
    tmp = tempfile.mkdtemp(prefix="handoff-")
    with RedisServers(5) as servers:
        monitors = []
        if not args.no_monitor:
            for i, server in enumerate(servers):
                out = open(os.path.join(tmp, f"node{i}.log"), "w")
                monitors.append((subprocess.Popen(["redis-cli", "-u", server.url, "monitor"], stdout=out), out))
            time.sleep(0.3)
        queue = ctx.Queue()
        barrier = ctx.Barrier(args.workers)
        procs = [ctx.Process(target=worker, args=(servers.urls, args.seconds, args.hold_ms / 1000, barrier, queue, i,
                                                        args.rest_ms / 1000))
                 for i in range(args.workers)]
        servers_cpu0 = [server_cpu(server.pid) for server in servers]
        for p in procs:
            p.start()
        records = [queue.get(timeout=args.seconds + 60) for _ in procs]
        for p in procs:
            p.join()
        servers_cpu = sum(server_cpu(server.pid) for server in servers) - sum(servers_cpu0)
        commandstats = redis.Redis.from_url(servers.urls[0]).info("commandstats")
        time.sleep(0.3)
        for proc, out in monitors:
            proc.terminate()
            proc.wait()
            out.close()
    node_dels, node_sets = [], []
    for i in range(len(monitors)):
        d, s = parse_monitor(os.path.join(tmp, f"node{i}.log"))
        node_dels.append(d)
        node_sets.append(s)

    acquisitions = []  # (acquire returned, worker, record of that call)
    releases = []  # (release called, worker, release returned)
    rounds_by_worker = {}
    for r in records:
        rounds_by_worker[r["index"]] = r["rounds"]
        for a0, a1, r0, r1 in r["calls"]:
            acquisitions.append((a1, r["index"], a0))
            releases.append((r0, r["index"], r1))
    acquisitions.sort()
    releases.sort()
    total = len(acquisitions)
    span = max(a[0] for a in acquisitions) - min(a[2] for a in acquisitions)
    print(f"{args.workers} workers, {args.seconds:g} s, hold {args.hold_ms:g} ms, monitor "
          f"{'off' if args.no_monitor else 'on'}: {total} acquisitions, {total / span:.0f}/s")
    kinds: dict[str, int] = {}
    for r in records:
        for kind, _, _ in r["rounds"]:
            kinds[kind] = kinds.get(kind, 0) + 1
    print("fan-out rounds per acquisition: " + ", ".join(f"{k} {v / total:.2f}" for k, v in sorted(kinds.items())))
    workers_cpu = sum(r["cpu"] for r in records)
    print(f"CPU per acquisition: workers {workers_cpu / total * 1e6:.0f} us, redis-servers "
          f"{servers_cpu / total * 1e6:.0f} us (of {os.cpu_count()} cores x {span / total * 1e6:.0f} us per turn)")

    stages: dict[str, list[float]] = {k: [] for k in (
        "hand-off (release call -> next acquire returned)",
        "release call -> release round started",
        "release round (started -> returned)",
        "release round started -> 1st node DEL",
        "1st node DEL -> 3rd node's next SET",
        "  per node: DEL -> next SET on that node",
        "3rd node SET -> next holder's round returned",
        "next holder's round returned -> acquire returned",
    )}
    won_by = {"wait": 0, "vote": 0, "other": 0}
    for r0, who, r1 in releases:
        k = bisect.bisect_right(acquisitions, (r0, float("inf"), 0))
        if k >= len(acquisitions):
            continue
        a1, nxt, a0 = acquisitions[k]
        stages["hand-off (release call -> next acquire returned)"].append(a1 - r0)
        rel = [x for x in rounds_by_worker[who] if x[0] == "release" and r0 <= x[1] <= r1]
        if rel:
            stages["release call -> release round started"].append(rel[0][1] - r0)
            stages["release round (started -> returned)"].append(rel[0][2] - rel[0][1])
        win = [x for x in rounds_by_worker[nxt] if x[0] in ("wait", "vote") and a0 <= x[1] and x[2] <= a1]
        if win:
            last = win[-1]
            won_by[last[0]] += 1
            stages["next holder's round returned -> acquire returned"].append(a1 - last[2])
        else:
            last = None
        if not node_dels or not rel:
            continue
        start = rel[0][1]
        node_del_times, node_set_times = [], []
        for dels, sets in zip(node_dels, node_sets):
            j = bisect.bisect_left(dels, start)
            if j >= len(dels) or dels[j] > a1 + 0.01:
                continue
            node_del_times.append(dels[j])
            m = bisect.bisect_right(sets, dels[j])
            if m < len(sets):
                node_set_times.append(sets[m])
                stages["  per node: DEL -> next SET on that node"].append(sets[m] - dels[j])
        if node_del_times:
            stages["release round started -> 1st node DEL"].append(min(node_del_times) - start)
        if len(node_set_times) >= 3 and node_del_times:
            third = sorted(node_set_times)[2]
            stages["1st node DEL -> 3rd node's next SET"].append(third - min(node_del_times))
            if last is not None:
                stages["3rd node SET -> next holder's round returned"].append(last[2] - third)
    for name, values in stages.items():
        print(stats(name, values))
    print(f"winning vote of the next holder: {won_by['wait']} woken in line (BLPOP + vote), "
          f"{won_by['vote']} a plain vote")
    shown = ", ".join(f"{name.removeprefix('cmdstat_')} {row['calls']} calls x {row['usec_per_call']:.0f} us"
                      for name, row in sorted(commandstats.items()) if row["calls"] > 50)
    print(f"node 0 commands (server CPU per call, not counting I/O): {shown}")
    if not args.no_monitor:
        print(f"monitor logs: {tmp}")


if __name__ == "__main__":
    main()
