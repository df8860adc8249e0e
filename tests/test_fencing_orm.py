"""Fencing tokens checked by the database, on SQLite and PostgreSQL (equal tokens: test_fencing_all_or_nothing)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from django_redlock.exceptions import LockLost, StaleToken
from tests.postgres import usable_server

pytestmark = pytest.mark.django_db


@pytest.fixture
def invoice():
    from tests.models import Invoice

    return Invoice.objects.create(number="INV-1")


def test_newer_token_writes_older_is_refused(invoice, manager):
    from tests.models import Invoice

    first = manager.acquire("invoice-1")
    old_token = first.fencing_token
    first.release()
    second = manager.acquire("invoice-1")
    new_token = second.fencing_token
    assert new_token > old_token
    assert Invoice.objects.filter(pk=invoice.pk).fenced_update(new_token, status="paid") == 1
    with pytest.raises(StaleToken) as info:
        Invoice.objects.filter(pk=invoice.pk).fenced_update(old_token, status="void")
    assert isinstance(info.value, LockLost)
    assert info.value.stored == new_token and info.value.token == old_token
    invoice.refresh_from_db()
    assert (invoice.status, invoice.fencing_token) == ("paid", new_token)
    second.release()


def test_missing_row_is_not_an_error(db):
    from tests.models import Invoice

    assert Invoice.objects.filter(pk=12345).fenced_update(5, status="x") == 0


@pytest.mark.parametrize("token", [0, -1, "5", 1.5, True, None])
def test_bad_token_is_a_clear_error(invoice, token):
    from tests.models import Invoice

    with pytest.raises(ValueError, match="token must be a positive int"):
        Invoice.objects.filter(pk=invoice.pk).fenced_update(token, status="x")


def test_field_deconstructs_cleanly():
    from django_redlock.fencing import FencingTokenField

    name, path, args, kwargs = FencingTokenField().deconstruct()
    assert path == "django_redlock.fencing.FencingTokenField" and kwargs == {}


@pytest.mark.skipif(os.environ.get("REDLOCK_TEST_PG_PORT") is not None, reason="already inside the PostgreSQL run")
def test_the_same_on_postgresql():
    server = usable_server()
    server.start()
    try:
        env = dict(os.environ, REDLOCK_TEST_PG_PORT=str(server.port))
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--ds=tests.settings_postgres",
             __file__, os.path.join(os.path.dirname(__file__), "test_fencing_all_or_nothing.py"),
             "-k", "not postgresql"],
            env=env, capture_output=True, text=True, timeout=300,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        assert "passed" in proc.stdout and "skipped" not in proc.stdout.splitlines()[-1]
    finally:
        server.stop()
