"""Every way of holding a lock reports its loss through one rule, ``held.loss_to_report``.

Each hold's body force-releases its own lock (an operator, from the admin), so the release finds
the key gone on every node and the lock lost. Each hold must then report it: ``with`` and
``async with`` raise ``LockLost``, ``@redlock`` raises it for a function and answers 500 for a
view, ``RedlockMixin`` and REST framework views answer 500, a command exits 3, a Celery task
body raises ``LockLost``. With the rule patched to swallow every loss, none may report it: no
hold decides on its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.http import HttpResponse
from django.test import AsyncRequestFactory, RequestFactory
from django.views import View

from django_redlock import get_async_lock_manager, get_lock_manager, redlock, redlock_command
from django_redlock.core import held
from django_redlock.decorators import EXIT_LOST, RedlockMixin
from django_redlock.exceptions import LockLost


def steal(resource: str) -> None:
    assert get_lock_manager().force_release(resource) == 5


async def steal_async(resource: str) -> None:
    assert await get_async_lock_manager().force_release(resource) == 5


def raises_lost(run: Callable[[], object]) -> bool:
    try:
        run()
    except LockLost:
        return True
    return False


def with_block() -> bool:
    def run() -> None:
        with get_lock_manager().lock("hold-with"):
            steal("hold-with")

    return raises_lost(run)


def with_acquired_lock() -> bool:
    def run() -> None:
        with get_lock_manager().acquire("hold-acquired"):
            steal("hold-acquired")

    return raises_lost(run)


def async_with_block() -> bool:
    async def run() -> None:
        async with get_async_lock_manager().lock("hold-async-with", auto_extend=True):
            await steal_async("hold-async-with")

    return raises_lost(lambda: asyncio.run(run()))


def async_with_acquired_lock() -> bool:
    async def run() -> None:
        async with await get_async_lock_manager().acquire("hold-async-acquired"):
            await steal_async("hold-async-acquired")

    return raises_lost(lambda: asyncio.run(run()))


def redlock_function() -> bool:
    @redlock("hold-fn", auto_extend=True)
    def job() -> None:
        steal("hold-fn")

    return raises_lost(job)


def redlock_async_function() -> bool:
    @redlock("hold-async-fn", auto_extend=True)
    async def job() -> None:
        await steal_async("hold-async-fn")

    return raises_lost(lambda: asyncio.run(job()))


def redlock_view() -> bool:
    @redlock("hold-view-{pk}")
    def view(request, pk):
        steal(f"hold-view-{pk}")
        return HttpResponse("ok")

    return view(RequestFactory().get("/"), pk=1).status_code == 500


def redlock_async_view() -> bool:
    @redlock("hold-async-view-{pk}")
    async def view(request, pk):
        await steal_async(f"hold-async-view-{pk}")
        return HttpResponse("ok")

    return asyncio.run(view(AsyncRequestFactory().get("/"), pk=2)).status_code == 500


def mixin_view() -> bool:
    class Report(RedlockMixin, View):
        redlock_key = "hold-mixin-{pk}"

        def get(self, request, pk):
            steal(f"hold-mixin-{pk}")
            return HttpResponse("ok")

    return Report.as_view()(RequestFactory().get("/"), pk=3).status_code == 500


def rest_framework_view() -> bool:
    pytest.importorskip("rest_framework")
    from rest_framework.decorators import api_view
    from rest_framework.response import Response

    @api_view(["GET"])
    def by_hand(request):
        with get_lock_manager().lock("hold-api"):
            steal("hold-api")
        return Response({"ok": True})

    response = by_hand(RequestFactory().get("/"))
    if hasattr(response, "render"):
        response.render()
    return response.status_code == 500


def command() -> bool:
    @redlock_command("hold-command")
    class Command(BaseCommand):
        def handle(self, *args, **options):
            steal("hold-command")

    try:
        call_command(Command(), stdout=StringIO(), stderr=StringIO())
    except CommandError as error:
        return error.returncode == EXIT_LOST
    return False


def celery_task() -> bool:
    pytest.importorskip("celery")
    from django_redlock.celery import redlock_task

    @redlock_task("hold-task")
    def body() -> None:
        steal("hold-task")

    return raises_lost(body)


HOLDS = [
    with_block,
    with_acquired_lock,
    async_with_block,
    async_with_acquired_lock,
    redlock_function,
    redlock_async_function,
    redlock_view,
    redlock_async_view,
    mixin_view,
    rest_framework_view,
    command,
    celery_task,
]


@pytest.fixture(autouse=True)
def patient(redlock_settings, settings):
    """A node timeout that a loaded machine's first connections meet (the suite's is 50 ms)."""
    redlock_settings.REDLOCK = {**redlock_settings.REDLOCK, "NODE_TIMEOUT": 0.5}
    settings.REST_FRAMEWORK = {"EXCEPTION_HANDLER": "django_redlock.rest_framework.exception_handler"}


@pytest.mark.parametrize("hold", HOLDS, ids=lambda hold: hold.__name__)
def test_every_hold_reports_a_lost_lock(hold):
    assert hold(), f"{hold.__name__} did not report its lost lock"


@pytest.mark.parametrize("hold", HOLDS, ids=lambda hold: hold.__name__)
def test_every_hold_asks_the_one_rule(hold, monkeypatch):
    monkeypatch.setattr(held, "loss_to_report", lambda lock, raised=False: None)
    assert not hold(), f"{hold.__name__} reported a loss the rule swallowed: it decides on its own"
