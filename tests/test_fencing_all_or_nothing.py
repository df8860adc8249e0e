"""fenced_update writes every row or none; equal tokens pass; NULL counts as no token yet.

Also run on PostgreSQL by test_fencing_orm.py's PostgreSQL run, where the
concurrent case below is exercised with two real connections.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, connections, transaction

from django_redlock.exceptions import StaleToken

pytestmark = pytest.mark.django_db


@pytest.fixture
def invoices():
    from tests.models import Invoice

    return [Invoice.objects.create(number=f"INV-{i}") for i in range(3)]


def states(model):
    return list(model.objects.order_by("pk").values_list("status", "fencing_token"))


def test_one_newer_row_refuses_the_whole_queryset(invoices):
    from tests.models import Invoice

    Invoice.objects.filter(pk=invoices[1].pk).update(fencing_token=100)
    before = states(Invoice)
    with pytest.raises(StaleToken) as info:
        Invoice.objects.all().fenced_update(50, status="paid")
    assert (info.value.token, info.value.stored) == (50, 100)
    assert "nothing was written" in str(info.value)
    assert states(Invoice) == before  # not even the rows with a lower token


def test_all_rows_written_when_none_is_newer(invoices):
    from tests.models import Invoice

    Invoice.objects.filter(pk=invoices[1].pk).update(fencing_token=40)
    assert Invoice.objects.all().fenced_update(50, status="paid") == 3
    assert states(Invoice) == [("paid", 50)] * 3


def test_same_holder_writes_twice_with_its_token(invoices):
    from tests.models import Invoice

    rows = Invoice.objects.filter(pk=invoices[0].pk)
    assert rows.fenced_update(100, status="a") == 1
    assert rows.fenced_update(100, status="b") == 1  # equal is not stale
    assert states(Invoice)[0] == ("b", 100)
    with pytest.raises(StaleToken):
        rows.fenced_update(99, status="c")  # lower is
    assert states(Invoice)[0] == ("b", 100)


def test_null_token_counts_as_no_token_yet(db):
    from tests.models import Reading

    row = Reading.objects.create(value=1)
    assert row.fencing_token is None
    assert Reading.objects.filter(pk=row.pk).fenced_update(5, value=2) == 1
    row.refresh_from_db()
    assert (row.value, row.fencing_token) == (2, 5)
    with pytest.raises(StaleToken):
        Reading.objects.filter(pk=row.pk).fenced_update(4, value=3)


def test_refusal_inside_an_outer_transaction_keeps_the_outer_work(invoices):
    from tests.models import Invoice

    Invoice.objects.filter(pk=invoices[2].pk).update(fencing_token=100)
    with transaction.atomic():
        Invoice.objects.create(number="INV-outer")
        with pytest.raises(StaleToken):
            Invoice.objects.all().fenced_update(50, status="paid")
        assert Invoice.objects.filter(number="INV-outer").exists()  # the outer transaction goes on
    assert Invoice.objects.filter(status="paid").count() == 0
    assert Invoice.objects.count() == 4


@pytest.mark.django_db(transaction=True)
def test_concurrent_newer_writer_waits_then_refuses():
    """A lower token's multi-row write waits on a row a newer holder is writing, then writes nothing."""
    if connection.vendor != "postgresql":
        pytest.skip("needs two real connections to one database (PostgreSQL run)")
    from tests.models import Invoice

    a = Invoice.objects.create(number="A")
    b = Invoice.objects.create(number="B")
    newer = connections.create_connection("default")
    outcome: dict[str, object] = {}

    def older_writer():
        try:
            outcome["updated"] = Invoice.objects.filter(pk__in=[a.pk, b.pk]).fenced_update(5, status="old")
        except Exception as exc:  # noqa: BLE001 - checked below
            outcome["error"] = exc
        finally:
            connections.close_all()

    try:
        newer.set_autocommit(False)
        with newer.cursor() as cursor:
            cursor.execute("UPDATE tests_invoice SET status = 'new', fencing_token = 7 WHERE id = %s", [b.pk])
            writer = threading.Thread(target=older_writer)
            writer.start()
            # Wait until the older writer is blocked on B's row lock (an event seen in pg_stat_activity).
            cursor.execute("SELECT pg_backend_pid()")
            own = cursor.fetchone()[0]
            deadline = time.monotonic() + 30
            while True:
                cursor.execute("SELECT pg_stat_clear_snapshot()")  # else the view is frozen for this transaction
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid <> %s", [own]
                )
                if cursor.fetchone()[0]:
                    break
                if not writer.is_alive() or time.monotonic() > deadline:
                    pytest.fail(f"the older writer did not wait for the newer one's row lock: {outcome}")
                writer.join(0.005)
        newer.commit()
        writer.join(10)
        assert not writer.is_alive()
    finally:
        newer.close()
    assert isinstance(outcome.get("error"), StaleToken), outcome
    assert states(Invoice) == [("open", 0), ("new", 7)]  # A untouched: all or nothing
