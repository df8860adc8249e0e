"""Views the decorator tests call through the test client."""

import threading

from django.http import HttpResponse, JsonResponse, StreamingHttpResponse
from django.utils.decorators import method_decorator
from django.views import View

from django_redlock import get_lock_manager, redlock
from django_redlock.decorators import RedlockMixin
from django_redlock.exceptions import LockNotAcquired

#: Tests set these to hold a view inside its critical section.
inside = threading.Event()
proceed = threading.Event()


def _hold():
    inside.set()
    proceed.wait(10)


@redlock("invoice-{pk}", ttl=5)
def pay(request, pk):
    if request.GET.get("hold"):
        _hold()
    if request.GET.get("fail"):
        raise ValueError("boom")
    return JsonResponse({"paid": pk})


@redlock("invoice-{pk}", ttl=5)
async def pay_async(request, pk):
    return JsonResponse({"paid": pk, "async": True})


@redlock("user-{request.user.pk}-export")
def export(request):
    return HttpResponse("ok")


@redlock("stream-{pk}", ttl=5)
def stream(request, pk):
    def chunks():
        yield b"a"
        yield b"b"

    return StreamingHttpResponse(chunks())


@method_decorator(redlock("report-{pk}", ttl=5), name="get")
class ReportView(View):
    def get(self, request, pk):
        return HttpResponse(f"report {pk}")


class ReportMixinView(RedlockMixin, View):
    redlock_key = "report-{pk}"
    redlock_ttl = 5

    def get(self, request, pk):
        return HttpResponse(f"report {pk}")


def teapot(request, error):
    return HttpResponse(f"busy: {error.granted}", status=418)


@redlock("custom-{pk}", on_locked=teapot)
def custom(request, pk):
    return HttpResponse("ok")


class AccountLockMiddleware:
    """A sync middleware that holds the reentrant lock "account" around the view."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        with get_lock_manager().lock("account", reentrant=True, blocking=False):
            return self.get_response(request)


def account(request):
    """Enters the lock its middleware holds; says how deep, or that it was refused."""
    try:
        lock = get_lock_manager().acquire("account", reentrant=True, blocking=False)
    except LockNotAcquired:
        return HttpResponse("refused")
    depth = lock._depth
    lock.release()
    return HttpResponse(f"entered at depth {depth}")
