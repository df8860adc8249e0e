"""Render time of the admin Locks page, and of ``manage.py redlock list``, with many live locks on 5 local masters.

    python benchmarks/admin_render.py [--locks 10000] [--repeat 5]

Fills every node with the lock keys (pipelined SETs with real holder values),
then renders the change list as a superuser through Django's test client
(first page, a search, the page sorted by ttl), and runs ``redlock list``
(text and ``--json``) with its output to memory.
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


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--locks", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)

    import redis

    from django_redlock.core.records import Holder
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
            client = redis.Redis.from_url(url)
            pipe = client.pipeline(transaction=False)
            for i in range(args.locks):
                holder = Holder(f"{i:040x}", "bench-host", 4242, "bench", 1_700_000_000.0)
                pipe.set(f"redlock:lock:job-{i:05d}", holder.encode(), px=600_000)
            pipe.execute()
        user = get_user_model().objects.create_superuser("bench", "b@example.com", "pw")
        client = Client()
        client.force_login(user)

        def timed(call, check=lambda out: None):
            times = []
            for _ in range(args.repeat):
                started = time.perf_counter()
                out = call()
                times.append(time.perf_counter() - started)
                check(out)
            return times

        def page(query):
            return lambda: client.get("/admin/django_redlock/lock/", query)

        def listed(*flags):
            def run():
                out = io.StringIO()
                call_command("redlock", "list", *flags, stdout=out)
                return out.getvalue()

            return run

        def shows_first_lock(response):
            assert response.status_code == 200 and b"job-00000" in response.content

        times = timed(page({}), shows_first_lock)
        searched = timed(page({"q": "job-0999"}))
        by_ttl = timed(page({"o": "-ttl"}))
        text = timed(listed(), lambda out: out.count("\n") == args.locks + 1 or sys.exit(f"{out[:200]}..."))
        as_json = timed(listed("--json"), lambda out: len(json.loads(out)) == args.locks or sys.exit("short JSON"))
    result = {
        "locks": args.locks,
        "nodes": 5,
        "render_median_ms": round(statistics.median(times) * 1000, 1),
        "render_max_ms": round(max(times) * 1000, 1),
        "search_median_ms": round(statistics.median(searched) * 1000, 1),
        "sorted_by_ttl_median_ms": round(statistics.median(by_ttl) * 1000, 1),
        "list_text_median_ms": round(statistics.median(text) * 1000, 1),
        "list_json_median_ms": round(statistics.median(as_json) * 1000, 1),
    }
    print(result)
    return result


if __name__ == "__main__":
    main()
