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


def needs_postgresql():
    if connection.vendor != "postgresql":
        pytest.skip("needs two real connections to one database and its isolation levels (PostgreSQL run)")


@pytest.fixture
def newer_holder():
    """A second connection to the database: a newer holder's process, committing at once."""
    newer = connections.create_connection("default")
    yield newer
    newer.close()


NEWER_WRITES = {
    "adds a row": "INSERT INTO tests_invoice (number, status, fencing_token) VALUES ('C', 'new', 7)",
    "changes a row": "UPDATE tests_invoice SET status = 'new', fencing_token = 7 WHERE number = 'B'",
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("level", ["REPEATABLE READ", "SERIALIZABLE"])
@pytest.mark.parametrize("newer_write", NEWER_WRITES)
def test_an_outer_snapshot_older_than_a_newer_holders_write_is_refused(level, newer_write, newer_holder):
    """Holder A reads its rows in a transaction, pauses; B writes with a higher token; A writes.

    A's snapshot cannot show B's write, so fenced_update cannot tell whether A is stale: it
    refuses, writes nothing, and A's transaction goes on.
    """
    needs_postgresql()
    from django_redlock.exceptions import FencingUnverifiable
    from tests.models import Invoice

    Invoice.objects.create(number="A")
    Invoice.objects.create(number="B")
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
        assert Invoice.objects.count() == 2  # A's snapshot is taken here
        with newer_holder.cursor() as cursor:
            cursor.execute(NEWER_WRITES[newer_write])  # autocommit: committed before A goes on
        try:
            outcome = Invoice.objects.filter(number__in="ABC").fenced_update(5, status="stale")
        except Exception as exc:  # noqa: BLE001 - compared below
            outcome = exc
        assert Invoice.objects.count() == 2  # still usable: the refusal rolled back its savepoint only
    written = [r for r in states(Invoice) if r[0] == "stale"]
    assert isinstance(outcome, FencingUnverifiable) and not written, (outcome, states(Invoice))
    assert level in str(outcome) and "nothing was written" in str(outcome)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("level", ["REPEATABLE READ", "SERIALIZABLE"])
def test_its_own_transaction_sees_every_earlier_commit_at_any_level(level, newer_holder):
    """Outside a transaction, fenced_update's snapshot is taken in the call: B's earlier row refuses A."""
    needs_postgresql()
    from tests.models import Invoice

    Invoice.objects.create(number="A")
    Invoice.objects.create(number="B")
    with connection.cursor() as cursor:
        cursor.execute(f"SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL {level}")
    try:
        assert Invoice.objects.filter(number__in="AB").fenced_update(5, status="first") == 2
        with newer_holder.cursor() as cursor:
            cursor.execute(NEWER_WRITES["adds a row"])
        with pytest.raises(StaleToken) as info:
            Invoice.objects.filter(number__in="ABC").fenced_update(6, status="stale")
        assert (info.value.token, info.value.stored) == (6, 7)
        assert Invoice.objects.filter(number__in="ABC").fenced_update(7, status="newest") == 3
    finally:
        connection.close()  # the session's isolation level goes with it
    assert states(Invoice) == [("newest", 7)] * 3


@pytest.mark.django_db(transaction=True)
def test_read_committed_outer_transaction_sees_the_newer_row(newer_holder):
    """At READ COMMITTED (Django's default) each statement sees every earlier commit: A is stale."""
    needs_postgresql()
    from tests.models import Invoice

    Invoice.objects.create(number="A")
    with transaction.atomic():
        assert Invoice.objects.count() == 1
        with newer_holder.cursor() as cursor:
            cursor.execute(NEWER_WRITES["adds a row"])
        with pytest.raises(StaleToken):
            Invoice.objects.filter(number__in="AC").fenced_update(5, status="stale")
    assert states(Invoice) == [("open", 0), ("new", 7)]
