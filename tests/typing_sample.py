"""Typed uses of the decorators, for ``mypy --strict`` only (tests/test_typing.py); never imported or run.

Each ``assert_type`` states the exact signature a decorated callable must keep:
parameter names, kinds and defaults, and the result (a coroutine for
``async def``). The calls under ``if REJECTED:`` must each be rejected with the
error code in their comment; the test checks them in a run of their own.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from django.core.management.base import BaseCommand
from django.http import HttpRequest, HttpResponse
from mypy_extensions import Arg, DefaultNamedArg, KwArg, VarArg
from typing_extensions import assert_type  # typing.assert_type is 3.11+

from django_redlock import redlock, redlock_command

REJECTED = False  # mypy --always-false REJECTED skips the calls that must fail


@redlock("report-{account}", ttl=10)
def build_report(account: int, *, full: bool = False) -> str:
    return f"{account}:{full}"


@redlock("sync-{account}", blocking=True, timeout=2.0)
async def sync_account(account: int) -> list[str]:
    return [str(account)]


@redlock("invoice-{pk}")
def invoice(request: HttpRequest, pk: int) -> HttpResponse:
    return HttpResponse(str(pk))


@redlock("user-{request.user.pk}", on_locked="myapp.views.busy")
async def profile(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@redlock_command(when_locked="fail")
class Nightly(BaseCommand):
    def handle(self, *args: Any, **options: Any) -> None:
        pass


class Reindex(BaseCommand):
    @redlock_command("reindex-{name}")
    def handle(self, *args: Any, **options: Any) -> str:
        return "done"


assert_type(build_report, Callable[[Arg(int, "account"), DefaultNamedArg(bool, "full")], str])
assert_type(build_report(7, full=True), str)

assert_type(sync_account, Callable[[Arg(int, "account")], Coroutine[Any, Any, list[str]]])

assert_type(invoice, Callable[[Arg(HttpRequest, "request"), Arg(int, "pk")], HttpResponse])
assert_type(profile, Callable[[Arg(HttpRequest, "request")], Coroutine[Any, Any, HttpResponse]])

assert_type(Nightly, type[Nightly])
assert_type(Nightly(), Nightly)
assert_type(Reindex.handle, Callable[[Arg(Reindex, "self"), VarArg(Any), KwArg(Any)], str])


async def awaits() -> None:
    assert_type(await sync_account(account=7), list[str])
    assert_type(await profile(HttpRequest()), HttpResponse)


if REJECTED:
    build_report("7")  # rejected: arg-type
    build_report(7, fast=True)  # rejected: call-arg
    pending = sync_account(account="7")  # rejected: arg-type
    invoice(HttpRequest(), pk="7")  # rejected: arg-type
    Reindex().handle(verbosity=1) + 1  # rejected: operator
    Nightly(no_such_option=True)  # rejected: call-arg
