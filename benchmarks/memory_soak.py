"""Worker memory over a long load run, under gunicorn (WSGI) and uvicorn (ASGI).

    python benchmarks/memory_soak.py [--minutes 10] [--warmup 60] [--interval 60]
        [--clients 8] [--rate 100] [--servers gunicorn,uvicorn] [--json FILE] [--keep]

Starts five local redis-server masters and serves a small Django project
(this file is its settings module, URLconf and app factory) with two workers:
gunicorn's sync workers, then uvicorn's. Threads of this script drive it at a
steady rate: locked sync and async views (``@redlock``), non-blocking,
blocking (waiting in line) and auto-extended, on keys used once and on two
contended keys.

Each worker starts ``tracemalloc`` when it imports this module (``SOAK_DIR``
set) and runs a recorder thread. When the script asks (at the end of the
warm-up, then every ``--interval`` seconds until the end of the run, all
while the load runs), the recorder collects garbage, reads its RSS, open file
descriptors and traced memory, and dumps a ``tracemalloc`` snapshot. The
report gives, per worker: RSS and traced memory at the end of the warm-up and
at the end, the slope between, and the ten lines that grew most
(``compare_to(..., "lineno")``), with the total growth of django-redlock's own
lines.

RSS is read before each snapshot, and the C allocator's free memory is given
back after it, but a snapshot still leaves its worker some fragmented memory
(and stalls it for a moment). ``--frames 0`` runs without ``tracemalloc``: RSS
and open files only, the honest RSS figures.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import http.client
import json
import linecache
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SOAK_DIR = os.environ.get("SOAK_DIR")
FRAMES = int(os.environ.get("SOAK_FRAMES", "1"))
if SOAK_DIR and FRAMES and __name__ != "__main__":  # a server worker importing its app: trace from here on
    tracemalloc.start(FRAMES)

sys.path.insert(0, str(ROOT))

from django.http import HttpRequest, HttpResponse  # noqa: E402
from django.urls import path  # noqa: E402

from django_redlock import redlock  # noqa: E402
from django_redlock.testing import RedisServers, free_port  # noqa: E402

# -- the served project: settings ------------------------------------------------------------

SECRET_KEY = "memory-soak-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1"]
INSTALLED_APPS = ["django_redlock"]
MIDDLEWARE: list[str] = []
ROOT_URLCONF = "memory_soak"
DATABASES: dict[str, Any] = {}
USE_TZ = True
REDLOCK_NODES = [url for url in os.environ.get("SOAK_NODES", "").split(",") if url]
REDLOCK = {"TTL": 5, "RESTART_WINDOW": 0, "LABEL": "memory-soak"}  # fresh masters vote at once
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "loggers": {"django_redlock": {"handlers": ["stderr"], "level": "WARNING"}},
}

# -- the served project: views (each holds its lock for HOLD seconds) ------------------------

HOLD = float(os.environ.get("SOAK_HOLD", "0.005"))
SERVED = [0]  # requests that reached a view body in this worker (approximate: not locked)


def _work() -> HttpResponse:
    SERVED[0] += 1
    time.sleep(HOLD)
    return HttpResponse(b"ok")


async def _awork() -> HttpResponse:
    import asyncio

    SERVED[0] += 1
    await asyncio.sleep(HOLD)
    return HttpResponse(b"ok")


@redlock("soak-{key}", ttl=5)
def sync_view(request: HttpRequest, key: str) -> HttpResponse:
    return _work()


@redlock("soak-{key}", ttl=5, blocking=True, timeout=2)
def sync_wait_view(request: HttpRequest, key: str) -> HttpResponse:
    return _work()


@redlock("soak-{key}", ttl=1, auto_extend=True)
def sync_extend_view(request: HttpRequest, key: str) -> HttpResponse:
    return _work()


@redlock("soak-{key}", ttl=5)
async def async_view(request: HttpRequest, key: str) -> HttpResponse:
    return await _awork()


@redlock("soak-{key}", ttl=5, blocking=True, timeout=2)
async def async_wait_view(request: HttpRequest, key: str) -> HttpResponse:
    return await _awork()


@redlock("soak-{key}", ttl=1, auto_extend=True)
async def async_extend_view(request: HttpRequest, key: str) -> HttpResponse:
    return await _awork()


def ping(request: HttpRequest) -> HttpResponse:
    return HttpResponse(b"pong")


urlpatterns = [
    path("sync/<str:key>/", sync_view),
    path("sync-wait/<str:key>/", sync_wait_view),
    path("sync-extend/<str:key>/", sync_extend_view),
    path("async/<str:key>/", async_view),
    path("async-wait/<str:key>/", async_wait_view),
    path("async-extend/<str:key>/", async_extend_view),
    path("ping/", ping),
]
HOT_KEYS = 2


def mix(kinds: str) -> list[tuple[str, bool]]:
    """(view, contended?) pairs the load picks from: ``kinds`` is "sync", "async" or both, comma-separated."""
    chosen = [kind for kind in kinds.split(",") if kind]
    if not chosen or set(chosen) - {"sync", "async"}:
        raise ValueError(f"--views: {kinds!r} is not a list of sync, async")
    pairs: list[tuple[str, bool]] = []
    for kind in chosen:
        pairs += [(view, hot) for view in (kind, f"{kind}-extend") for hot in (False, True)]
        pairs.append((f"{kind}-wait", True))  # waiting in line only happens on a contended key
    return pairs


def wsgi_app() -> Any:
    """gunicorn's app factory (``memory_soak:wsgi_app()``), called in each worker."""
    from django.core.wsgi import get_wsgi_application

    app = get_wsgi_application()
    _start_recorder()
    return app


def asgi_app() -> Any:
    """uvicorn's app factory (``--factory memory_soak:asgi_app``), called in each worker."""
    from django.core.asgi import get_asgi_application

    app = get_asgi_application()
    _start_recorder()
    return app


# -- in each worker: the recorder ----------------------------------------------------------


def _proc_status_kb(field: str, pid: str = "self") -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _measure() -> dict[str, Any]:
    traced, peak = tracemalloc.get_traced_memory()
    return {
        "time": time.time(),
        "rss_kb": _proc_status_kb("VmRSS"),
        "traced": traced,
        "traced_peak": peak,
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": threading.active_count(),
        "served": SERVED[0],
    }


def _return_free_memory() -> None:
    """Give the C allocator's free memory back to the system, so that a snapshot leaves no RSS behind."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _read_tick(folder: Path) -> int:
    try:
        return int((folder / "tick").read_text())
    except (OSError, ValueError):
        return -1


def _append(log: Path, row: dict[str, Any]) -> None:
    with open(log, "a") as out:
        out.write(json.dumps(row) + "\n")


def _record(folder: Path) -> None:
    """Answer each tick the driver writes with a row of numbers and (from tick 1) a snapshot."""
    pid = os.getpid()
    log = folder / f"worker-{pid}.jsonl"
    _append(log, {"pid": pid, "tick": -1, **_measure()})  # "up": the driver waits for every worker's
    seen = -1
    idle = threading.Event()
    while True:
        tick = _read_tick(folder)
        if tick > seen:
            seen = tick
            try:
                gc.collect()
                row = {"pid": pid, "tick": tick, **_measure()}  # before the snapshot, which inflates RSS
                if tick >= 1 and tracemalloc.is_tracing():
                    snapshot = tracemalloc.take_snapshot()
                    snapshot.dump(str(folder / f"{pid}-{tick}.snap"))
                    del snapshot
                _return_free_memory()  # at every tick, so each reading follows the same clean-up
                _append(log, row)
            except OSError as exc:  # out of file descriptors, say: the driver sees the tick unanswered
                print(f"memory_soak recorder: tick {tick}: {exc}", file=sys.stderr, flush=True)
        idle.wait(0.2)  # polls the tick file; nothing to await across processes


def _start_recorder() -> None:
    if SOAK_DIR:
        threading.Thread(target=_record, args=(Path(SOAK_DIR),), name="soak-recorder", daemon=True).start()


# -- the driver: servers -------------------------------------------------------------------


def server_command(kind: str, port: int) -> list[str]:
    if kind == "gunicorn":
        return [
            sys.executable, "-m", "gunicorn", "--workers", "2", "--worker-class", "sync",
            "--bind", f"127.0.0.1:{port}", "--timeout", "120", "--log-level", "warning",
            "memory_soak:wsgi_app()",
        ]
    if kind == "uvicorn":
        return [
            sys.executable, "-m", "uvicorn", "--workers", "2", "--factory", "memory_soak:asgi_app",
            "--host", "127.0.0.1", "--port", str(port), "--loop", "asyncio", "--http", "h11",
            "--lifespan", "off", "--no-access-log", "--log-level", "warning",
        ]
    raise ValueError(f"--servers: unknown server {kind!r} (gunicorn, uvicorn)")


def worker_rows(folder: Path) -> dict[int, list[dict[str, Any]]]:
    rows: dict[int, list[dict[str, Any]]] = {}
    for log in folder.glob("worker-*.jsonl"):
        lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        if lines:
            rows[lines[0]["pid"]] = lines
    return rows


def alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def wait_for(what: str, condition: Any, server: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if server.poll() is not None:
            sys.exit(f"the server exited ({server.returncode}) before {what}:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            sys.exit(f"timed out waiting for {what}:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)  # polling other processes' files: no event to await


def write_tick(folder: Path, tick: int) -> None:
    new = folder / "tick.new"
    new.write_text(str(tick))
    new.replace(folder / "tick")


def answered(folder: Path, tick: int) -> bool:
    """Every live worker wrote its row for ``tick``."""
    rows = worker_rows(folder)
    live = [pid for pid in rows if alive(pid)]
    return bool(live) and all(any(row["tick"] == tick for row in rows[pid]) for pid in live)


# -- the driver: load ----------------------------------------------------------------------


class Load:
    """``clients`` threads, each with one HTTP connection, at ``rate`` requests/s in all."""

    def __init__(self, port: int, clients: int, rate: float, seed: int, pairs: list[tuple[str, bool]]) -> None:
        self.port, self.clients, self.rate, self.seed, self.pairs = port, clients, rate, seed, pairs
        self.started = time.monotonic()
        self.stop = threading.Event()
        #: (seconds into the run, path, status, start of the body) of answers other than 200 and 423, the first 200
        self.unusual: list[tuple[float, str, str, str]] = []
        self.counts: list[Counter[tuple[str, str, str]]] = [Counter() for _ in range(clients)]
        self.slowest = [0.0] * clients
        self.threads = [threading.Thread(target=self.client, args=(i,), daemon=True) for i in range(clients)]

    def start(self) -> None:
        self.started = time.monotonic()
        for thread in self.threads:
            thread.start()

    def finish(self) -> Counter[tuple[str, str, str]]:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)
        return sum(self.counts, Counter())

    def client(self, i: int) -> None:
        rnd = random.Random(self.seed * 1000 + i)
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        period = self.clients / self.rate
        due = time.monotonic()
        n = 0
        while not self.stop.is_set():
            view, hot = rnd.choice(self.pairs)
            key = f"hot-{rnd.randrange(HOT_KEYS)}" if hot else f"c{i}-{n}"
            n += 1
            started = time.monotonic()
            body = b""
            try:
                # A connection per request: the listening socket spreads them over the workers
                # (a kept-alive connection stays with the worker that accepted it).
                conn.request("GET", f"/{view}/{key}/", headers={"Connection": "close"})
                response = conn.getresponse()
                body = response.read()
                status = str(response.status)
            except (OSError, http.client.HTTPException) as exc:
                status = type(exc).__name__
            conn.close()
            self.slowest[i] = max(self.slowest[i], time.monotonic() - started)
            if status not in ("200", "423") and len(self.unusual) < 200:
                text = body.decode("utf-8", "replace")[:160]
                self.unusual.append((started - self.started, f"/{view}/{key}/", status, text))
            self.counts[i][(view, "contended" if hot else "distinct", status)] += 1
            due += period
            late = time.monotonic() - due
            if late < 0:
                self.stop.wait(-late)  # pacing: a steady rate, not a synchronisation
            elif late > period:
                due = time.monotonic()  # fell behind: no burst to catch up


# -- the driver: analysis ------------------------------------------------------------------


def short(filename: str) -> str:
    for marker in ("site-packages/", str(ROOT) + "/", "lib/python3"):
        at = filename.find(marker)
        if at >= 0:
            return filename[at + len(marker):] if marker != "lib/python3" else "stdlib " + filename[at:].split("/", 2)[-1]
    return filename


def slope_per_minute(rows: list[dict[str, Any]], field: str) -> float:
    """Least-squares growth of ``field`` per minute over ``rows``."""
    xs = [row["time"] / 60 for row in rows]
    ys = [row[field] for row in rows]
    if len(xs) < 2:
        return 0.0
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


def package_sources() -> dict[str, list[str]]:
    """The package's source as the workers load it (the files may change while a run goes on)."""
    return {str(file): file.read_text().splitlines() for file in (ROOT / "django_redlock").rglob("*.py")}


def source_line(sources: dict[str, list[str]], filename: str, lineno: int) -> str:
    lines = sources.get(filename)
    if lines is None:
        return linecache.getline(filename, lineno).strip()
    return lines[lineno - 1].strip() if 0 < lineno <= len(lines) else ""


def analyse(folder: Path, top: int, sources: dict[str, list[str]]) -> list[dict[str, Any]]:
    ignore = [tracemalloc.Filter(False, tracemalloc.__file__)]
    workers = []
    for pid, rows in sorted(worker_rows(folder).items()):
        ticks = [row for row in rows if row["tick"] >= 1]
        if len(ticks) < 2:
            workers.append({"pid": pid, "complete": False, "rows": rows})
            continue
        first, last = ticks[0], ticks[-1]
        stats = []
        if (folder / f"{pid}-{first['tick']}.snap").exists():  # not with --frames 0
            before = tracemalloc.Snapshot.load(str(folder / f"{pid}-{first['tick']}.snap")).filter_traces(ignore)
            after = tracemalloc.Snapshot.load(str(folder / f"{pid}-{last['tick']}.snap")).filter_traces(ignore)
            stats = after.compare_to(before, "lineno")
        ours = sum(s.size_diff for s in stats if "/django_redlock/" in s.traceback[0].filename)
        growing = []
        for stat in [s for s in stats if s.size_diff > 0][:top]:
            frame = stat.traceback[0]
            growing.append({
                "where": f"{short(frame.filename)}:{frame.lineno}",
                "code": source_line(sources, frame.filename, frame.lineno)[:70],
                "size_diff": stat.size_diff,
                "count_diff": stat.count_diff,
                "size": stat.size,
            })
        workers.append({
            "pid": pid,
            "complete": True,
            "minutes": (last["time"] - first["time"]) / 60,
            "warm": first,
            "end": last,
            "start": rows[0],
            "rss_slope_kb_min": slope_per_minute(ticks, "rss_kb"),
            "traced_slope_b_min": slope_per_minute(ticks, "traced"),
            "django_redlock_diff": ours,
            "growing": growing,
            "series": [(row["tick"], row["rss_kb"], row["traced"], row["fds"]) for row in rows if row["tick"] >= 0],
        })
    return workers


def report(kind: str, result: dict[str, Any]) -> None:
    print(f"\n== {kind} ({result['views']} views): {result['requests']:,} requests in {result['seconds']:.0f} s"
          f" ({result['rate']:.0f}/s)")
    if result["stopped_early"]:
        print(f"   stopped early: {result['stopped_early']}")
    print("   responses: " + ", ".join(f"{status} {n:,}" for status, n in sorted(result["statuses"].items())))
    print(f"   slowest response {result['slowest']:.2f} s")
    unusual = Counter((path.split("/")[1], status, text.split("\n")[0][:100]) for _t, path, status, text in result["unusual"])
    for (view, status, text), n in unusual.most_common(5):
        print(f"   {n} x {view} {status}: {text}")
    if result["unusual"]:
        print("   first unusual answers at (s): " + " ".join(f"{t:.0f}" for t, *_ in result["unusual"][:30]))
    for worker in result["workers"]:
        if not worker["complete"]:
            print(f"   worker {worker['pid']}: incomplete ({len(worker['rows'])} rows)")
            continue
        warm, end = worker["warm"], worker["end"]
        print(
            f"   worker {worker['pid']}: served {end['served'] - warm['served']:,} over {worker['minutes']:.1f} min after warm-up\n"
            f"     RSS    {warm['rss_kb'] / 1024:7.1f} MB -> {end['rss_kb'] / 1024:7.1f} MB"
            f"  ({(end['rss_kb'] - warm['rss_kb']) / 1024:+.2f} MB; slope {worker['rss_slope_kb_min']:+.1f} KB/min)\n"
            f"     traced {warm['traced'] / 2**20:7.2f} MB -> {end['traced'] / 2**20:7.2f} MB"
            f"  ({(end['traced'] - warm['traced']) / 1024:+.1f} KB; slope {worker['traced_slope_b_min'] / 1024:+.1f} KB/min)\n"
            f"     fds {warm['fds']} -> {end['fds']}, threads {warm['threads']} -> {end['threads']};"
            f" django_redlock/ lines {worker['django_redlock_diff'] / 1024:+.1f} KB"
        )
        print("     per tick (tick, RSS MB, traced MB, fds): " + "  ".join(
            f"{t}:{rss / 1024:.1f}/{traced / 2**20:.2f}/{fds}" for t, rss, traced, fds in worker["series"]))
        print("     lines that grew most from warm-up to end:")
        for line in worker["growing"]:
            print(f"       {line['size_diff'] / 1024:+8.1f} KB {line['count_diff']:+6d} blocks  {line['where']}  {line['code']}")


# -- the driver: one server's run ----------------------------------------------------------


def open_files_limit(pid: int) -> int:
    with open(f"/proc/{pid}/limits") as limits:
        for line in limits:
            if line.startswith("Max open files"):
                return int(line.split()[3])
    return 1 << 20


def over_a_guard(folder: Path, max_rss_mb: float) -> str | None:
    """Why the run must stop early (a worker near its file limit or above ``max_rss_mb``), or None."""
    for pid in worker_rows(folder):
        try:
            fds, limit = len(os.listdir(f"/proc/{pid}/fd")), open_files_limit(pid)
            rss_mb = _proc_status_kb("VmRSS", str(pid)) / 1024
        except OSError:
            continue  # gone
        if fds > 0.8 * limit:
            return f"worker {pid} had {fds} files open (limit {limit})"
        if rss_mb > max_rss_mb:
            return f"worker {pid} used {rss_mb:.0f} MB (--max-rss-mb {max_rss_mb:.0f})"
    return None


def schedule(args: argparse.Namespace) -> list[float]:
    """Seconds into the run of each tick from 1: the end of the warm-up, then every interval, and the end."""
    end = args.minutes * 60
    ticks = [args.warmup]
    while ticks[-1] + args.interval < end - 1:
        ticks.append(ticks[-1] + args.interval)
    return ticks + [end]


def run_server(kind: str, urls: list[str], args: argparse.Namespace, seed: int) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix=f"memory-soak-{kind}-"))
    port = free_port()
    log = folder / "server.log"
    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="memory_soak",
        PYTHONPATH=os.pathsep.join([str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")]),
        SOAK_DIR=str(folder),
        SOAK_NODES=",".join(urls),
        SOAK_FRAMES=str(args.frames),
        SOAK_HOLD=str(args.hold_ms / 1000),
    )
    print(f"{kind}: serving on :{port}, snapshots in {folder}", flush=True)
    sources = package_sources()
    with open(log, "wb") as out:
        server = subprocess.Popen(server_command(kind, port), env=env, stdout=out, stderr=subprocess.STDOUT,
                                  cwd=str(HERE), start_new_session=True)
    stopped_early = None
    try:
        wait_for("two workers", lambda: len(worker_rows(folder)) >= 2, server, log, 120)
        load = Load(port, args.clients, args.rate, seed, mix(args.views))
        write_tick(folder, 0)
        load.start()
        for tick, at in enumerate(schedule(args), start=1):
            while stopped_early is None and (left := load.started + at - time.monotonic()) > 0:
                load.stop.wait(min(left, 2.0))  # the schedule, not a synchronisation
                stopped_early = over_a_guard(folder, args.max_rss_mb)
            write_tick(folder, tick)
            deadline = time.monotonic() + 120
            while not answered(folder, tick) and time.monotonic() < deadline and server.poll() is None:
                time.sleep(0.1)  # polling other processes' files: no event to await
            if not answered(folder, tick):
                stopped_early = stopped_early or f"the workers did not answer tick {tick} within 120 s"
            print(f"  {kind} tick {tick} at {time.monotonic() - load.started:.0f} s", flush=True)
            if stopped_early:
                print(f"  {kind}: stopped early: {stopped_early}", flush=True)
                break
        seconds = time.monotonic() - load.started
        counts = load.finish()
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
    statuses: Counter[str] = Counter()
    for (_view, _hot, status), n in counts.items():
        statuses[status] += n
    requests = sum(statuses.values())
    result = {
        "server": kind,
        "views": args.views,
        "seconds": seconds,
        "stopped_early": stopped_early,
        "requests": requests,
        "rate": requests / seconds,
        "statuses": dict(statuses),
        "by_view": {f"{view} {hot} {status}": n for (view, hot, status), n in sorted(counts.items())},
        "unusual": load.unusual,
        "slowest": max(load.slowest),
        "workers": analyse(folder, args.top, sources),
        "log_tail": log.read_text()[-2000:],
    }
    if not args.keep:
        shutil.rmtree(folder, ignore_errors=True)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10, help="length of each server's load run")
    parser.add_argument("--warmup", type=float, default=60, help="seconds of load before the first snapshot")
    parser.add_argument("--interval", type=float, default=60, help="seconds between snapshots after the warm-up")
    parser.add_argument("--clients", type=int, default=8, help="concurrent HTTP clients")
    parser.add_argument("--rate", type=float, default=100, help="requests per second from all clients together")
    parser.add_argument("--hold-ms", type=float, default=5, help="how long each view holds its lock")
    parser.add_argument("--frames", type=int, default=1,
                        help="tracemalloc frames kept per allocation (0: no tracemalloc, RSS and files only)")
    parser.add_argument("--top", type=int, default=10, help="growing lines reported per worker")
    parser.add_argument("--servers", default="gunicorn,uvicorn")
    parser.add_argument("--views", default="sync,async", help="which locked views the load calls: sync, async or both")
    parser.add_argument("--max-rss-mb", type=float, default=1500, help="stop a run early when a worker grows past this")
    parser.add_argument("--json", dest="json_out", help="write the results here")
    parser.add_argument("--keep", action="store_true", help="keep the snapshots and server logs")
    args = parser.parse_args(argv)
    if args.warmup >= args.minutes * 60:
        parser.error("--warmup must be shorter than --minutes")
    kinds = [kind for kind in args.servers.split(",") if kind]
    try:
        mix(args.views)
        for kind in kinds:
            server_command(kind, 0)  # an unknown name fails here, before anything starts
    except ValueError as exc:
        parser.error(str(exc))
    results: dict[str, Any] = {
        "command": "python benchmarks/memory_soak.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "python": sys.version.split()[0],
        "commit": subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True,
                                 text=True).stdout.strip(),
        "load_before": os.getloadavg()[0],
        "runs": {},
    }
    with RedisServers(5) as servers:
        for seed, kind in enumerate(kinds):
            results["runs"][kind] = run_server(kind, servers.urls, args, seed)
            report(kind, results["runs"][kind])
    results["load_after"] = os.getloadavg()[0]
    print(f"\nload average {results['load_before']:.1f} before, {results['load_after']:.1f} after")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
