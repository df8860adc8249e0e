"""Render time of the admin Locks page, and of ``manage.py redlock list``, with many live locks on 5 local masters.

    python benchmarks/admin_render.py [--locks 10000] [--waiting 100] [--repeat 5] [--only CASE,...]

Fills every node with the lock keys (pipelined SETs with real holder values; ``--waiting``
of them get a waiting line of three live places), then times, as a superuser through
Django's test client: the change list's first page in every order the page offers (both
directions of resource and ttl), a search, a page past the end, and one lock's detail page;
and ``redlock list`` (text and ``--json``) with its output to memory. Prints the median and
the highest time of each case in milliseconds (one line each on stderr, then all as JSON).
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
    args = parser.parse_args(argv)

    from django_redlock.testing import RedisServers

    with RedisServers(5) as servers:
        os.environ["REDLOCK_TEST_NODES"] = ",".join(servers.urls)
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
        for url in servers.urls:
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
        only = [c for c in args.only.split(",") if c]
        result: dict = {"locks": args.locks, "nodes": 5, "waiting": args.waiting, "cases": {}}
        for name, (call, check) in cases.items():
            if only and name not in only:
                continue
            check(call())  # warm: the first call connects and loads the scripts
            times = []
            for _ in range(args.repeat):
                started = time.perf_counter()
                out = call()
                times.append(time.perf_counter() - started)
                check(out)
            median, top = round(statistics.median(times) * 1000, 1), round(max(times) * 1000, 1)
            result["cases"][name] = {"median_ms": median, "max_ms": top}
            print(f"{name:<10} median {median:7.1f} ms   max {top:7.1f} ms", file=sys.stderr)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
