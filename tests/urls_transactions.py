"""Views that read, modify and write a row under a lock, for tests/test_transactions.py.

Each view locks ``counter-<kind>``, waits in line for it, reads the row ``Reading(pk)``, adds one and
saves it, and notes in ``WRITTEN`` (per thread) the value it wrote: a ``lock_released`` receiver
compares it with what another connection reads at the release.
"""

from __future__ import annotations

import threading

from django.db import transaction
from django.http import HttpResponse
from django.urls import path
from django.utils.decorators import method_decorator
from django.views import View
from rest_framework.decorators import api_view
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView
from rest_framework.viewsets import ViewSet

from django_redlock import get_lock_manager, redlock
from django_redlock.decorators import RedlockMixin

WAIT = {"ttl": 10, "blocking": True, "timeout": 60}
WRITTEN = threading.local()


def increment(pk: int, request) -> int:
    """The read-modify-write the lock protects; ``?then=`` says what happens after the write."""
    from django.db import connection

    from tests.models import Reading

    row = Reading.objects.get(pk=pk)
    row.value += 1
    row.save(update_fields=["value"])
    WRITTEN.pid = connection.connection.info.backend_pid
    WRITTEN.value = row.value
    then = request.GET.get("then")
    if then == "raise":
        raise RuntimeError("the view failed after its write")
    if then == "invalid":
        raise ValidationError("refused after the write")  # REST framework: 400, and set_rollback()
    if then == "lose":
        get_lock_manager().force_release(f"counter-{request.resolver_match.url_name}")  # an operator
    return row.value


@redlock("counter-function", **WAIT)
def function(request, pk):
    return HttpResponse(str(increment(pk, request)))


class Mixin(RedlockMixin, View):
    redlock_key = "counter-mixin"
    redlock_ttl, redlock_blocking, redlock_timeout = 10, True, 60

    def post(self, request, pk):
        return HttpResponse(str(increment(pk, request)))


@method_decorator(redlock("counter-method", **WAIT), name="post")
class Method(View):
    def post(self, request, pk):
        return HttpResponse(str(increment(pk, request)))


class ApiMixin(RedlockMixin, APIView):
    redlock_key = "counter-api_mixin"
    redlock_ttl, redlock_blocking, redlock_timeout = 10, True, 60

    def post(self, request, pk):
        return Response({"value": increment(pk, request)})


class ApiHandler(APIView):
    @redlock("counter-api_handler", **WAIT)
    def post(self, request, pk):
        return Response({"value": increment(pk, request)})


class ApiViewSet(RedlockMixin, ViewSet):
    redlock_key = "counter-api_viewset"
    redlock_ttl, redlock_blocking, redlock_timeout = 10, True, 60

    def create(self, request, pk):
        return Response({"value": increment(pk, request)})


@api_view(["POST"])
@redlock("counter-api_function", **WAIT)
def api_function(request, pk):
    return Response({"value": increment(pk, request)})


# -- what a view sees of its transaction and lock -----------------------------------------------

SEEN: list[tuple[str, bool]] = []


def probe(name: str) -> HttpResponse:
    """Note whether the request's transaction is open and whether ``probe-<name>`` is held, now and
    once the transaction has committed."""
    from django.db import connection, transaction

    from tests.models import Reading

    Reading.objects.create(value=7)
    SEEN.append(("view: in a transaction", connection.in_atomic_block))
    transaction.on_commit(lambda: SEEN.append(("on_commit: locked", get_lock_manager().is_locked(f"probe-{name}"))))
    return HttpResponse("ok")


@redlock("probe-function", ttl=10)
def probe_function(request):
    return probe("function")


class ProbeMixin(RedlockMixin, View):
    redlock_key, redlock_ttl = "probe-mixin", 10

    def get(self, request):
        return probe("mixin")


@transaction.non_atomic_requests
@redlock("probe-opted_out_above", ttl=10)
def probe_opted_out_above(request):
    return probe("opted_out_above")


@redlock("probe-opted_out_below", ttl=10)
@transaction.non_atomic_requests
def probe_opted_out_below(request):
    return probe("opted_out_below")


@redlock("probe-expiring", ttl=0.3)
def probe_expiring(request):
    from tests.conftest import eventually

    response = probe("expiring")
    eventually(lambda: not get_lock_manager().is_locked("probe-expiring"), 30)  # past its validity
    return response


@redlock("probe-streaming", ttl=10)
def probe_streaming(request):
    from django.db import connection
    from django.http import StreamingHttpResponse

    probe("streaming")

    def body():
        SEEN.append(("stream: in a transaction", connection.in_atomic_block))
        SEEN.append(("stream: locked", get_lock_manager().is_locked("probe-streaming")))
        yield b"ok"

    return StreamingHttpResponse(body())


@redlock("probe-databases", ttl=10)
def probe_databases(request):
    from django.db import connections

    SEEN.append(("view: in transactions", tuple(connections[a].in_atomic_block for a in ("default", "other"))))
    return HttpResponse("ok")


@transaction.non_atomic_requests(using="other")
@redlock("probe-databases_opted_out", ttl=10)
def probe_databases_opted_out(request):
    return probe_databases.__wrapped__(request)


PROBES = {
    "function": probe_function,
    "mixin": ProbeMixin.as_view(),
    "opted_out_above": probe_opted_out_above,
    "opted_out_below": probe_opted_out_below,
    "expiring": probe_expiring,
    "streaming": probe_streaming,
    "databases": probe_databases,
    "databases_opted_out": probe_databases_opted_out,
}

KINDS = {
    "function": function,
    "mixin": Mixin.as_view(),
    "method": Method.as_view(),
    "api_mixin": ApiMixin.as_view(),
    "api_handler": ApiHandler.as_view(),
    "api_viewset": ApiViewSet.as_view({"post": "create"}),
    "api_function": api_function,
}

urlpatterns = [path(f"{kind}/<int:pk>/", view, name=kind) for kind, view in KINDS.items()] + [
    path(f"probe/{name}/", view) for name, view in PROBES.items()
]
