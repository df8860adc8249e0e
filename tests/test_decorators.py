"""@redlock on sync, async and class-based views and on plain functions, against real masters."""

from __future__ import annotations

import threading

import pytest
from asgiref.sync import iscoroutinefunction
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpResponse
from django.test import AsyncClient, Client, RequestFactory
from django.views import View

from django_redlock import get_lock_manager, redlock
from django_redlock.decorators import RedlockMixin
from django_redlock.exceptions import LockNotAcquired
from tests import views
from tests.conftest import eventually

pytestmark = pytest.mark.usefixtures("redlock_settings")


def hold(resource, ttl=5):
    return get_lock_manager().acquire(resource, ttl)


def test_view_runs_and_releases():
    response = Client().get("/pay/7/")
    assert response.status_code == 200 and response.json() == {"paid": 7}
    assert not get_lock_manager().is_locked("invoice-7")


def test_contended_view_answers_423_with_retry_after():
    lock = hold("invoice-7", ttl=4)
    response = Client().get("/pay/7/")
    assert response.status_code == 423
    assert 1 <= int(response["Retry-After"]) <= 4
    assert Client().get("/pay/8/").status_code == 200  # another key is free
    lock.release()
    assert Client().get("/pay/7/").status_code == 200


def test_two_concurrent_requests_one_waits_out():
    views.inside.clear()
    views.proceed.clear()
    results = {}

    def first():
        results["first"] = Client().get("/pay/9/?hold=1").status_code

    thread = threading.Thread(target=first)
    thread.start()
    assert views.inside.wait(5)
    results["second"] = Client().get("/pay/9/").status_code
    views.proceed.set()
    thread.join(5)
    assert results == {"first": 200, "second": 423}


def test_release_on_exception():
    with pytest.raises(ValueError):
        Client(raise_request_exception=True).get("/pay/3/?fail=1")
    assert not get_lock_manager().is_locked("invoice-3")


async def test_async_view_contended_and_free():
    assert iscoroutinefunction(views.pay_async)
    client = AsyncClient()
    response = await client.get("/pay-async/5/")
    assert response.status_code == 200 and response.json()["async"] is True
    lock = hold("invoice-5")
    response = await client.get("/pay-async/5/")
    assert response.status_code == 423 and "Retry-After" in response
    lock.release()


def test_sync_view_stays_sync():
    assert not iscoroutinefunction(views.pay)


@pytest.mark.parametrize("url", ["/report/4/", "/report-mixin/4/"])
def test_class_based_views(url):
    assert Client().get(url).content == b"report 4"
    lock = hold("report-4")
    response = Client().get(url)
    assert response.status_code == 423 and response["Retry-After"]
    lock.release()


def test_class_based_view_label_and_auto_extend():
    """``redlock_label`` is the holder's label on the nodes; ``redlock_auto_extend`` keeps the lock
    alive while the handler runs past its ttl, so the view answers 200, not a lost lock's 500."""
    seen = {}

    class Export(RedlockMixin, View):
        redlock_key = "export-{pk}"
        redlock_ttl = 0.3
        redlock_label = "csv-export"
        redlock_auto_extend = True

        def get(self, request, pk):
            manager = get_lock_manager()
            seen["label"] = manager.lock_record(f"export-{pk}").holder.label
            (lock,) = manager._held.overlapping((f"export-{pk}",))
            eventually(lambda: lock.extensions >= 2, seconds=5.0)  # past its ttl twice over
            return HttpResponse("exported")

    response = Export.as_view()(RequestFactory().get("/"), pk=8)
    assert response.status_code == 200 and response.content == b"exported"
    assert seen["label"] == "csv-export"
    assert not get_lock_manager().is_locked("export-8")


@pytest.mark.django_db
def test_key_from_request_attribute(django_user_model):
    user = django_user_model.objects.create_user("ann", password="x")
    client = Client()
    client.force_login(user)
    lock = hold(f"user-{user.pk}-export")
    assert client.get("/export/").status_code == 423
    lock.release()
    assert client.get("/export/").status_code == 200


@pytest.mark.django_db  # closing a response runs request_finished handlers
def test_streaming_response_releases_after_the_stream():
    client = Client()
    response = client.get("/stream/2/")
    assert get_lock_manager().is_locked("stream-2"), "held while the body is being sent"
    assert b"".join(response.streaming_content) == b"ab"
    response.close()
    assert not get_lock_manager().is_locked("stream-2")


def test_custom_locked_handler():
    lock = hold("custom-1")
    response = Client().get("/custom/1/")
    assert response.status_code == 418 and response.content == b"busy: 0"
    lock.release()


def test_locked_response_setting(settings):
    settings.REDLOCK = {**settings.REDLOCK, "LOCKED_RESPONSE": "tests.views.teapot"}
    lock = hold("invoice-6")
    assert Client().get("/pay/6/").status_code == 418
    lock.release()


def test_plain_function_raises():
    @redlock("job-{name}", ttl=5)
    def job(name, retries=3):
        return f"did {name}"

    assert job("sync") == "did sync"
    lock = hold("job-sync")
    with pytest.raises(LockNotAcquired):
        job(name="sync")
    lock.release()


async def test_plain_async_function():
    @redlock("ajob-{n}")
    async def ajob(n):
        return n * 2

    assert iscoroutinefunction(ajob)
    assert await ajob(4) == 8


def test_missing_placeholder_fails_at_decoration():
    with pytest.raises(ImproperlyConfigured, match="'pk'.*does not take"):

        @redlock("invoice-{pk}")
        def view(request, id):
            pass


def test_missing_placeholder_with_kwargs_fails_at_call_not_locking_literal():
    @redlock("thing-{pk}")
    def view(request, **kwargs):
        return "ran"

    with pytest.raises(ImproperlyConfigured, match="refusing to lock the literal key"):
        view(None, other=1)
    assert not get_lock_manager().is_locked("thing-{pk}")


def test_positional_placeholder_rejected():
    with pytest.raises(ImproperlyConfigured, match="named placeholders"):
        redlock("x-{0}")(lambda a: a)


def test_callable_key():
    @redlock(lambda order: f"order-{order['id']}")
    def ship(order):
        return get_lock_manager().is_locked(f"order-{order['id']}")

    assert ship({"id": 11}) is True


def test_nodes_down_is_503_not_423(servers):
    for server in servers[:3]:
        server.kill()
    response = Client().get("/pay/12/")
    assert response.status_code == 503 and response["Retry-After"] == "1"


def test_several_keys_lock_every_resource_together():
    seen = {}

    @redlock(["account-{src}", "account-{dst}"], ttl=5)
    def transfer(src, dst):
        manager = get_lock_manager()
        seen["locked"] = (manager.is_locked(f"account-{src}"), manager.is_locked(f"account-{dst}"))
        return "moved"

    assert transfer(1, 2) == "moved"
    assert seen["locked"] == (True, True)
    held = hold("account-2")
    with pytest.raises(LockNotAcquired, match="account-1, account-2"):
        transfer(1, 2)
    held.release()
    assert not get_lock_manager().is_locked("account-1")  # all or nothing: account-1 was not left behind

    @redlock(lambda ids: [f"row-{i}" for i in ids])
    def touch(ids):
        return sorted(get_lock_manager().is_locked(f"row-{i}") for i in ids)

    assert touch([3, 1, 2]) == [True, True, True]


def test_reentrant_decorated_functions_may_call_each_other():
    @redlock("ledger-{pk}", reentrant=True)
    def inner(pk):
        return get_lock_manager().is_locked(f"ledger-{pk}")

    @redlock("ledger-{pk}", reentrant=True)
    def outer(pk):
        return inner(pk) and get_lock_manager().is_locked(f"ledger-{pk}")  # still held after inner's exit

    assert outer(5) is True
    assert not get_lock_manager().is_locked("ledger-5")

    @redlock("ledger-{pk}")
    def plain(pk):
        return inner(pk)

    with pytest.raises(LockNotAcquired, match="held by this very thread"):
        plain_inner = redlock("ledger-{pk}")(lambda pk: None)

        @redlock("ledger-{pk}")
        def nested(pk):
            return plain_inner(pk=pk)

        nested(6)
    assert plain(7) is True  # the inner call opted in: it enters the outer lock


def test_bad_several_keys_and_flags_are_refused_at_decoration():
    with pytest.raises(ImproperlyConfigured, match="non-empty list of format strings"):
        redlock([])(lambda: None)
    with pytest.raises(ImproperlyConfigured, match="non-empty list of format strings"):
        redlock(["a-{pk}", 3])(lambda pk: None)
    with pytest.raises(ValueError, match="reentrant must be True or False"):
        redlock("k", reentrant="yes")
