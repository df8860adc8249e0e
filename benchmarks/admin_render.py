"""Render time of the admin Locks page, and of ``manage.py redlock list``, with many live locks on 5 local masters.

    python benchmarks/admin_render.py [--locks 10000] [--waiting 100] [--repeat 5] [--only CASE,...]
                                      [--nodes URL,...]

Fills every node with the lock keys (pipelined SETs with real holder values; ``--waiting``
of them get a waiting line of three live places), then times, as a superuser through
Django's test client: the change list's first page in every order the page offers (both
directions of resource and ttl), a search, a page past the end, and one lock's detail page;
``redlock list`` (text and ``--json``, called in-process with ``call_command``, its output to
memory); and the engine's full ``lock_listing()`` alone. Prints the median and the highest
wall time of each case and its median CPU time (this process's) in milliseconds, one line each
on stderr; then each target (every page and ``redlock list`` in either form under 150 ms,
median wall time; judged by ``targets.py``, as ``bench.py`` judges them) with its measure and
verdict; then all as JSON.

``--nodes`` uses five running masters instead of starting its own (filled only if they hold no
keys): several runs, of different checkouts, can then time the same keys in turn.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import targets  # noqa: E402 (benchmarks/targets.py, beside this script)

#: Change list queries timed, by case name.
PAGES = {
    "resource": {},
    "-resource": {"o": "-resource"},
    "search": {"q": "job-0999"},
    "past_end": {"p": "999"},
    "ttl": {"o": "ttl"},
    "-ttl": {"o": "-ttl"},
    "state": {"o": "state"},
    "nodes": {"o": "nodes"},
    "waiting": {"o": "-waiting"},
    "holder": {"o": "holder"},
    "acquired": {"o": "-acquired"},
}


def fill(url: str, locks: int, waiting: int) -> None:
    import redis

    from django_redlock.core.records import Holder

    client = redis.Redis.from_url(url)
    pipe = client.pipeline(transaction=False)
    for i in range(locks):
        holder = Holder(f"{i:040x}", "bench-host", 4242, "bench", 1_700_000_000.0 + i % 997)
        pipe.set(f"redlock:lock:job-{i:05d}", holder.encode(), px=600_000 - (i * 7919) % 100_000)
    seconds, micros = client.time()
    expiry = seconds * 1000 + micros // 1000 + 600_000
    for i in range(0, locks, max(1, locks // max(1, waiting)))[:waiting]:
        places = {f"place-{i}-{n}": n for n in range(3)}
        pipe.zadd(f"redlock:queue:job-{i:05d}", places)
        pipe.zadd(f"redlock:places:job-{i:05d}", {place: expiry for place in places})
    pipe.execute()
    client.close()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--locks", type=int, default=10_000)
    parser.add_argument("--waiting", type=int, default=100, help="locks with a waiting line (default 100)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--only", default="", help="comma-separated cases to time (default: all)")
    parser.add_argument("--nodes", default="", help="comma-separated URLs of 5 running masters (default: start them)")
    args = parser.parse_args(argv)
    if args.nodes:
        urls = args.nodes.split(",")
        if len(urls) != 5:
            parser.error(f"--nodes takes 5 URLs; got {len(urls)}")
        return run(args, urls)
    from django_redlock.testing import RedisServers

    with RedisServers(5) as servers:
        return run(args, servers.urls)


def run(args: argparse.Namespace, urls: list[str]) -> dict:
    import redis

    os.environ["REDLOCK_TEST_NODES"] = ",".join(urls)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client
    from django.test.utils import setup_test_environment

    setup_test_environment()
    settings.ALLOWED_HOSTS = ["*"]
    call_command("migrate", verbosity=0, run_syncdb=True)
    for url in urls:
        with redis.Redis.from_url(url) as node:
            empty = not node.dbsize()
        if empty:
            fill(url, args.locks, args.waiting)
    user = get_user_model().objects.create_superuser("bench", "b@example.com", "pw")
    client = Client()
    client.force_login(user)
    last = f"job-{args.locks - 1:05d}"

    def page(query, path="/admin/django_redlock/lock/"):
        def get():
            response = client.get(path, query)
            assert response.status_code == 200, response.status_code
            return response.content.decode()

        return get

    def listed(*flags):
        def run():
            out = io.StringIO()
            call_command("redlock", "list", *flags, stdout=out)
            return out.getvalue()

        return run

    def shows(*texts):
        def check(out):
            missing = [t for t in texts if t not in out]
            assert not missing, f"{missing} not in {out[:300]}..."

        return check

    checks = {
        "resource": shows(">job-00000</a>", f"{args.locks} locks"),
        "-resource": shows(f">{last}</a>"),
        "search": shows(">job-09990</a>"),
        "past_end": shows(f">{last}</a>"),
        "-ttl": shows(f"{args.locks} locks"),
        "waiting": shows('<td class="field-waiting">3</td>'),
    }
    cases = {name: (page(query), checks.get(name, shows(f"{args.locks} locks"))) for name, query in PAGES.items()}
    cases["detail"] = (
        page({"resource": "job-04321"}, "/admin/django_redlock/lock/detail/"),
        shows("Held on 5 of 5 nodes", "job-04321"),
    )
    cases["list_text"] = (listed(), lambda out: out.count("\n") == args.locks + 1 or sys.exit(f"{out[:200]}..."))
    cases["list_json"] = (listed("--json"), lambda out: len(json.loads(out)) == args.locks or sys.exit("short JSON"))
    from django_redlock.manager import get_lock_manager

    manager = get_lock_manager()
    cases["listing"] = (manager.lock_listing, lambda out: len(out.records) == args.locks or sys.exit("short listing"))
    only = [c for c in args.only.split(",") if c]
    result: dict = {"locks": args.locks, "nodes": 5, "waiting": args.waiting, "cases": {}}
    for name, (call, check) in cases.items():
        if only and name not in only:
            continue
        check(call())  # warm: the first call connects and loads the scripts
        times, cpus = [], []
        for _ in range(args.repeat):
            started, cpu = time.perf_counter(), time.process_time()
            out = call()
            times.append(time.perf_counter() - started)
            cpus.append(time.process_time() - cpu)
            check(out)
        median, top = round(statistics.median(times) * 1000, 1), round(max(times) * 1000, 1)
        cpu = round(statistics.median(cpus) * 1000, 1)
        result["cases"][name] = {"median_ms": median, "max_ms": top, "cpu_ms": cpu}
        print(f"{name:<10} median {median:7.1f} ms   max {top:7.1f} ms   cpu {cpu:7.1f} ms", file=sys.stderr)
    print(targets.block(targets.admin_targets(result)), file=sys.stderr)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
