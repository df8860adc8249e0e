"""fenced_update under a primary/replica router, on a real PostgreSQL primary and a lagging standby.

The driver test starts both servers and runs this module again in a child pytest with
tests.settings_postgres_replica: reads go to the standby, which applies every commit
STANDBY_DELAY_MS late; writes go to the primary.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from django.db import DatabaseError, connections, transaction
from django.test.utils import CaptureQueriesContext

from django_redlock.exceptions import StaleToken
from tests.postgres import usable_server

STANDBY_DELAY_MS = 3000
INSIDE = os.environ.get("REDLOCK_TEST_PG_STANDBY_PORT") is not None


@pytest.mark.skipif(INSIDE, reason="already inside the primary/standby run")
def test_under_a_router_on_a_primary_and_a_lagging_standby():
    primary = usable_server()
    primary.start()
    try:
        standby = primary.standby(STANDBY_DELAY_MS)
        try:
            # The child reuses a test database the standby already shows (it cannot connect before).
            primary.psql("CREATE DATABASE test_postgres")
            primary.wait_replayed(standby)
            env = dict(os.environ, REDLOCK_TEST_PG_PORT=str(primary.port),
                       REDLOCK_TEST_PG_STANDBY_PORT=str(standby.port))
            proc = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--tb=short",
                 "--ds=tests.settings_postgres_replica", "--reuse-db", __file__, "-k", "not lagging_standby"],
                env=env, capture_output=True, text=True, timeout=300,
            )
        finally:
            standby.stop()
    finally:
        primary.stop()
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "passed" in proc.stdout and "skipped" not in proc.stdout.splitlines()[-1]


def inside(test):
    """A test of the child run: real commits on the primary, reads from the standby allowed."""
    test = pytest.mark.django_db(transaction=True, databases=["default", "replica"])(test)
    return pytest.mark.skipif(not INSIDE, reason="runs inside the primary/standby run")(test)


def wait_replayed():
    """Wait until the standby shows everything committed on the primary so far."""
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_lsn()")
        lsn = cursor.fetchone()[0]
    deadline = time.monotonic() + STANDBY_DELAY_MS / 1000 + 30
    with connections["replica"].cursor() as cursor:
        while True:
            cursor.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", [lsn])
            if cursor.fetchone()[0]:
                return
            if time.monotonic() > deadline:
                pytest.fail(f"the standby did not replay up to {lsn}")
            time.sleep(0.05)


def states():
    from tests.models import Invoice

    return list(Invoice.objects.using("default").order_by("pk").values_list("status", "fencing_token"))


@pytest.fixture
def rows():
    """Two invoices, committed on the primary and shown by the standby (token 0 on both)."""
    from tests.models import Invoice

    made = [Invoice.objects.create(number="A"), Invoice.objects.create(number="B")]
    wait_replayed()
    assert list(Invoice.objects.order_by("pk").values_list("fencing_token", flat=True)) == [0, 0]  # read: standby
    return made


@pytest.fixture
def tokens(manager):
    """An older holder's token and the newer holder's, from real locks on one resource."""
    first = manager.acquire("invoices")
    old = first.fencing_token
    first.release()
    second = manager.acquire("invoices")
    new = second.fencing_token
    second.release()
    assert new > old
    return old, new


@inside
def test_a_stale_holder_is_refused_although_the_standby_lags(rows, tokens):
    """A holder paused past its validity writes both rows after the newer holder wrote row B."""
    from tests.models import Invoice

    old, new = tokens
    a, b = rows
    with transaction.atomic():  # as ATOMIC_REQUESTS or the caller's own transaction would
        assert Invoice.objects.filter(pk=b.pk).fenced_update(new, status="new") == 1
    try:
        with transaction.atomic():
            outcome = Invoice.objects.filter(pk__in=[a.pk, b.pk]).fenced_update(old, status="stale")
    except StaleToken as exc:
        outcome = (exc.token, exc.stored)
    assert (outcome, states()) == ((old, new), [("open", 0), ("new", new)])  # refused, A untouched


@inside
def test_without_an_outer_transaction_as_in_a_celery_task(rows, tokens):
    from tests.models import Invoice

    old, new = tokens
    a, b = rows
    assert Invoice.objects.filter(pk=b.pk).fenced_update(new, status="new") == 1
    with pytest.raises(StaleToken):
        Invoice.objects.filter(pk__in=[a.pk, b.pk]).fenced_update(old, status="stale")
    assert Invoice.objects.filter(pk__in=[a.pk, b.pk]).fenced_update(new, status="done") == 2
    assert states() == [("done", new), ("done", new)]


@inside
def test_every_statement_goes_to_the_write_alias(rows, tokens):
    from tests.models import Invoice

    old, new = tokens
    everything = Invoice.objects.filter(pk__in=[r.pk for r in rows])
    with CaptureQueriesContext(connections["replica"]) as on_replica:
        with CaptureQueriesContext(connections["default"]) as on_primary:
            assert everything.fenced_update(new, status="new") == 2
            with pytest.raises(StaleToken):
                everything.fenced_update(old, status="stale")
    assert [q["sql"] for q in on_replica.captured_queries] == []
    assert len(on_primary.captured_queries) >= 6  # lock, update and check, twice


@inside
def test_a_queryset_pinned_with_using_stays_there(rows):
    """``.using()`` wins over the router: pinned to the standby, the write fails there."""
    from tests.models import Invoice

    with CaptureQueriesContext(connections["default"]) as on_primary:
        with pytest.raises(DatabaseError, match="read-only"):
            Invoice.objects.using("replica").filter(pk=rows[0].pk).fenced_update(5, status="x")
    assert on_primary.captured_queries == []
    assert states() == [("open", 0), ("open", 0)]
