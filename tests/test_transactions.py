"""A lock is released after the transaction its holder's writes are in ends, on real PostgreSQL.

Under ``ATOMIC_REQUESTS`` requests read, add one to and write one row while they hold a lock, waiting
in line for it; the commit is slowed by a deferred trigger, as a busy database's is. A release before
the commit lets the next holder read the old value: increments are lost while every request answers
200. A ``lock_released`` receiver reads the row through a connection of its own at every release: the
holder's transaction must be over by then (it is idle, and the value it wrote is visible).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import warnings

import pytest

from tests.postgres import PostgresServer

ON_POSTGRES = os.environ.get("REDLOCK_TEST_PG_PORT") is not None
postgres_only = pytest.mark.skipif(not ON_POSTGRES, reason="needs PostgreSQL (run by test_the_same_on_postgresql)")
pytestmark = pytest.mark.urls("tests.urls_transactions")

KINDS = ["function", "mixin", "method", "api_mixin", "api_viewset", "api_handler", "api_function"]
REQUESTS = 12
SLOW_COMMIT = """
CREATE OR REPLACE FUNCTION redlock_slow_commit() RETURNS trigger AS $$
BEGIN PERFORM pg_sleep(0.1); RETURN NULL; END $$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS redlock_slow_commit ON tests_reading;
CREATE CONSTRAINT TRIGGER redlock_slow_commit AFTER UPDATE ON tests_reading
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION redlock_slow_commit();
"""


@pytest.fixture
def requests_atomic(monkeypatch, redlock_settings, transactional_db):
    """``ATOMIC_REQUESTS`` on the default database; ``SEEN`` notes, at each release of a ``probe-*``
    lock, whether this thread's connection is still in a transaction."""
    pytest.importorskip("rest_framework")
    from django.db import connection

    from django_redlock.signals import lock_released
    from tests.urls_transactions import SEEN

    def released(sender, lock, **kwargs):
        if lock.resource.startswith("probe-"):
            SEEN.append(("released: in a transaction", connection.in_atomic_block))

    redlock_settings.REDLOCK = {**redlock_settings.REDLOCK, "NODE_TIMEOUT": 0.5}
    monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", True)
    SEEN.clear()
    lock_released.connect(released, weak=False)
    yield SEEN
    lock_released.disconnect(released)


@pytest.fixture
def atomic_requests(requests_atomic):
    """``ATOMIC_REQUESTS``, a slow commit, and a row to count in (PostgreSQL)."""
    from django.db import connection

    from tests.models import Reading

    with connection.cursor() as cursor:
        cursor.execute(SLOW_COMMIT)
    yield Reading.objects.create(value=0)
    with connection.cursor() as cursor:
        cursor.execute("DROP TRIGGER IF EXISTS redlock_slow_commit ON tests_reading")


@pytest.fixture
def releases():
    """What another connection saw at each release of a ``counter-*`` lock: (the value the holder
    wrote, the value read, whether the holder's transaction was over)."""
    import psycopg
    from django.db import connection

    from django_redlock.signals import lock_released
    from tests.urls_transactions import WRITTEN

    dsn = {k.lower(): connection.settings_dict[k] for k in ("HOST", "PORT", "USER", "NAME")}
    dsn["dbname"] = dsn.pop("name")
    seen: list[tuple[int | None, int, bool]] = []

    def read(sender, lock, **kwargs):
        if not lock.resource.startswith("counter-"):
            return
        with psycopg.connect(**dsn, autocommit=True) as own:
            (value,) = own.execute("SELECT value FROM tests_reading").fetchone()
            (state,) = own.execute("SELECT state FROM pg_stat_activity WHERE pid = %s", (WRITTEN.pid,)).fetchone()
        seen.append((getattr(WRITTEN, "value", None), value, state == "idle"))  # idle: not in a transaction
        WRITTEN.value = None

    lock_released.connect(read, weak=False)
    yield seen
    lock_released.disconnect(read)


def post(kind: str, pk: int, then: str = "") -> int:
    """POST to the view as a client would, through Django's handler (and its ATOMIC_REQUESTS)."""
    from django.db import connections
    from django.test import Client

    try:
        query = f"?then={then}" if then else ""
        return Client(raise_request_exception=False).post(f"/{kind}/{pk}/{query}").status_code
    finally:
        connections.close_all()


def post_concurrently(kind: str, pk: int, count: int) -> list[int]:
    statuses: list[int] = []
    threads = [threading.Thread(target=lambda: statuses.append(post(kind, pk))) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(t.is_alive() for t in threads)
    return statuses


@postgres_only
@pytest.mark.parametrize("kind", KINDS)
def test_no_increment_is_lost_and_the_release_comes_after_the_commit(kind, atomic_requests, releases):
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        statuses = post_concurrently(kind, atomic_requests.pk, REQUESTS)
    assert [w.message for w in warned if w.category.__name__ == "ReleasedInTransaction"] == []
    assert statuses == [200] * REQUESTS
    atomic_requests.refresh_from_db()
    lost = REQUESTS - atomic_requests.value
    # At the release the holder's transaction is over and its write visible (or a later holder's already).
    early = [(wrote, read, over) for wrote, read, over in releases if not (over and read >= wrote)]
    assert (lost, early) == (0, []), (
        f"{lost} of {REQUESTS} increments lost; {len(early)} of {len(releases)} releases before the "
        f"commit (wrote, read elsewhere, transaction over): {early[:4]}"
    )
    assert len(releases) == REQUESTS


@postgres_only
@pytest.mark.parametrize(
    "kind, then, status",
    [(kind, "raise", 500) for kind in KINDS]
    + [(kind, "invalid", 400) for kind in ("api_mixin", "api_viewset", "api_handler", "api_function")],
)
def test_the_release_comes_after_the_rollback(kind, then, status, atomic_requests, releases):
    assert post(kind, atomic_requests.pk, then) == status
    atomic_requests.refresh_from_db()
    assert atomic_requests.value == 0  # rolled back
    assert releases == [(1, 0, True)]  # released once the rollback had ended the transaction


@postgres_only
@pytest.mark.parametrize("kind", KINDS)
def test_a_lock_lost_before_the_commit_rolls_back(kind, atomic_requests, releases):
    assert post(kind, atomic_requests.pk, "lose") == 500  # force-released by an operator mid-view
    atomic_requests.refresh_from_db()
    assert atomic_requests.value == 0


# -- the order, seen from inside (SQLite and PostgreSQL) ---------------------------------------

IN_ORDER = [("view: in a transaction", True), ("on_commit: locked", True), ("released: in a transaction", False)]


@pytest.mark.parametrize("name", ["function", "mixin"])
def test_the_view_s_transaction_opens_inside_the_lock_and_ends_before_the_release(name, requests_atomic):
    from django.test import Client

    from tests.models import Reading

    assert Client().get(f"/probe/{name}/").status_code == 200
    assert requests_atomic == IN_ORDER  # on_commit callbacks run under the lock too
    assert Reading.objects.filter(value=7).count() == 1


@pytest.mark.parametrize("name", ["opted_out_above", "opted_out_below"])
def test_non_atomic_requests_on_a_locked_view_is_kept(name, requests_atomic):
    from django.test import Client

    assert Client().get(f"/probe/{name}/").status_code == 200
    assert requests_atomic == [("view: in a transaction", False), *IN_ORDER[1:]]


def test_a_streamed_response_commits_before_it_is_sent_and_is_released_after(requests_atomic):
    from django.test import Client

    response = Client().get("/probe/streaming/")
    assert b"".join(response.streaming_content) == b"ok"
    response.close()
    assert requests_atomic == [
        *IN_ORDER[:2], ("stream: in a transaction", False), ("stream: locked", True), IN_ORDER[2]
    ]


@pytest.fixture
def other_database(requests_atomic, monkeypatch):
    """A second alias, ``other``, on the same database, with ``ATOMIC_REQUESTS`` too."""
    from django.db import connections

    monkeypatch.setitem(connections.settings, "other", dict(connections.settings["default"]))
    connections["other"].connect()  # the test case allows the aliases it knew; connected, this one is used as is
    yield requests_atomic
    connections["other"].close()
    del connections["other"]


@pytest.mark.parametrize("name, opened", [("databases", (True, True)), ("databases_opted_out", (True, False))])
def test_each_database_s_transaction_opens_inside_the_lock(name, opened, other_database):
    from django.db import connections
    from django.test import Client

    from django_redlock.signals import lock_released

    def released(sender, lock, **kwargs):
        in_transactions = tuple(connections[a].in_atomic_block for a in ("default", "other"))
        other_database.append(("released: in transactions", in_transactions))

    lock_released.connect(released)
    try:
        assert Client().get(f"/probe/{name}/").status_code == 200
    finally:
        lock_released.disconnect(released)
    assert other_database == [
        ("view: in transactions", opened), IN_ORDER[2], ("released: in transactions", (False, False))
    ]


def test_a_lock_that_expired_before_the_commit_rolls_the_request_back(requests_atomic):
    from django.test import Client

    from tests.models import Reading

    response = Client(raise_request_exception=False).get("/probe/expiring/", headers={"Accept": "application/json"})
    assert (response.status_code, response.json()["code"]) == (500, "lock_lost")
    assert not Reading.objects.filter(value=7).exists()
    assert requests_atomic == [IN_ORDER[0], IN_ORDER[2]]  # rolled back: no on_commit


def test_async_views_under_atomic_requests_are_refused_as_django_refuses_them(requests_atomic):
    from django.core.handlers.base import BaseHandler
    from django.http import HttpResponse
    from django.views import View

    from django_redlock import redlock
    from django_redlock.decorators import RedlockMixin

    @redlock("async-view", ttl=5)
    async def function(request):
        return HttpResponse()

    class Mixin(RedlockMixin, View):
        redlock_key = "async-mixin"

        async def get(self, request):
            return HttpResponse()

    for view in (function, Mixin.as_view()):
        with pytest.raises(RuntimeError, match="You cannot use ATOMIC_REQUESTS with async views"):
            BaseHandler().make_view_atomic(view)


@pytest.mark.django_db(transaction=True)
def test_a_lock_released_inside_a_transaction_warns(redlock_settings):
    from django.db import transaction

    from django_redlock import get_lock_manager
    from django_redlock.adapters.transactions import ReleasedInTransaction
    from django_redlock.signals import lock_released

    message = r"'in-atomic' was released inside a transaction that is still open \(database 'default'\)"
    with transaction.atomic(), pytest.warns(ReleasedInTransaction, match=message):
        with get_lock_manager().lock("in-atomic", ttl=5):
            pass
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        with get_lock_manager().lock("lock-then-atomic", ttl=5), transaction.atomic():
            pass
    assert [w for w in warned if w.category is ReleasedInTransaction] == []
    # Made an error, it is logged rather than raised: the release and its signal happen all the same.
    released = []
    lock_released.connect(receiver := lambda sender, lock, **kwargs: released.append(lock.resource))
    try:
        with transaction.atomic(), warnings.catch_warnings():
            warnings.simplefilter("error", ReleasedInTransaction)
            with get_lock_manager().lock("in-atomic", ttl=5):
                pass
    finally:
        lock_released.disconnect(receiver)
    assert released == ["in-atomic"] and not get_lock_manager().is_locked("in-atomic")


@pytest.mark.django_db
def test_a_test_case_s_own_transaction_is_no_reason_to_warn(redlock_settings):
    from django_redlock import get_lock_manager

    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        with get_lock_manager().lock("in-a-test", ttl=5):
            pass
    assert [w for w in warned if w.category.__name__ == "ReleasedInTransaction"] == []


# -- Celery: atomic=True ------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_task_s_transaction_commits_inside_its_lock_and_only_while_it_is_held(redlock_settings):
    celery = pytest.importorskip("celery", minversion="5.3")
    from django.db import connection, transaction

    from django_redlock import get_lock_manager
    from django_redlock.celery import redlock_task
    from django_redlock.exceptions import LockLost
    from tests.models import Reading

    app = celery.Celery("transactions", set_as_current=False)
    seen = []

    @app.task
    @redlock_task("task-{n}", ttl=10, when_locked="fail", atomic=True)
    def write(n, lose=False):
        Reading.objects.create(value=n)
        seen.append(("body: in a transaction", connection.in_atomic_block))
        transaction.on_commit(lambda: seen.append(("on_commit: locked", get_lock_manager().is_locked(f"task-{n}"))))
        if lose:
            get_lock_manager().force_release(f"task-{n}")  # an operator
        return n

    assert write.apply((1,)).get() == 1
    assert seen == [("body: in a transaction", True), ("on_commit: locked", True)]
    assert isinstance(write.apply((2, True)).result, LockLost)
    assert list(Reading.objects.values_list("value", flat=True)) == [1]  # the second was rolled back


@pytest.mark.parametrize("atomic", ["", [], ["default", 3], 1, None])
def test_a_task_s_atomic_must_name_databases(atomic):
    pytest.importorskip("celery", minversion="5.3")
    from django.core.exceptions import ImproperlyConfigured

    from django_redlock.celery import redlock_task

    with pytest.raises(ImproperlyConfigured, match="atomic must be True, False, a database alias or a list"):
        redlock_task("k", atomic=atomic)


@pytest.mark.skipif(ON_POSTGRES, reason="already inside the PostgreSQL run")
def test_the_same_on_postgresql():
    server = PostgresServer()
    if not server.available:
        pytest.skip("PostgreSQL is not installed (Debian: apt-get install postgresql)")
    pytest.importorskip("psycopg")
    pytest.importorskip("rest_framework")
    server.start()
    try:
        env = dict(os.environ, REDLOCK_TEST_PG_PORT=str(server.port))
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--ds=tests.settings_postgres",
             __file__, "-k", "not the_same_on_postgresql"],
            env=env, capture_output=True, text=True, timeout=600,
        )
        assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
        assert "passed" in proc.stdout and "skipped" not in proc.stdout.splitlines()[-1]
    finally:
        server.stop()
