"""Views that show django-redlock at work. Open each in two tabs at once."""

import asyncio
import time

from django.conf import settings
from django.http import HttpResponse
from django.shortcuts import render
from django.views import View

from django_redlock import get_lock_manager, redlock
from django_redlock.decorators import RedlockMixin, locked_response, retry_after_seconds, wants_json
from django_redlock.exceptions import QuorumUnavailable, StaleToken
from shop.models import Invoice

WORK_SECONDS = 8


def index(request):
    ports = ",".join(str(port) for port in settings.REDIS_PORTS)
    context = {"nodes": get_lock_manager().nodes, "seconds": WORK_SECONDS, "ports": ports}
    return render(request, "shop/index.html", context)


def locked(request, error):
    """REDLOCK['LOCKED_RESPONSE']: a friendlier 423 page with the same Retry-After for browsers;
    API clients keep the package's answer (JSON or problem details, as their Accept asks)."""
    if wants_json(request) or isinstance(error, QuorumUnavailable):
        return locked_response(request, error)
    seconds = retry_after_seconds(error)
    # Only the wait: the error's text names the lock nodes, which end users must not see.
    response = render(request, "shop/locked.html", {"seconds": seconds}, status=423)
    response["Retry-After"] = str(seconds)
    return response


@redlock("report-{pk}", ttl=15)
def slow_report(request, pk):
    time.sleep(WORK_SECONDS)  # the slow work only one request may do at a time
    return render(request, "shop/done.html", {"what": f"Report {pk} (sync view)"})


@redlock("report-{pk}", ttl=15)
async def async_report(request, pk):
    await asyncio.sleep(WORK_SECONDS)  # the event loop stays free for other requests
    return render(request, "shop/done.html", {"what": f"Report {pk} (async view)"})


class InvoiceView(RedlockMixin, View):
    redlock_key = "invoice-{pk}"
    redlock_ttl = 15

    def get(self, request, pk):
        time.sleep(WORK_SECONDS)
        return render(request, "shop/done.html", {"what": f"Invoice {pk} (class-based view)"})


def fencing(request):
    """Write with a fencing token, then show that an older token is refused by the database."""
    invoice, _ = Invoice.objects.get_or_create(number="INV-1")
    manager = get_lock_manager()
    with manager.lock("invoice-INV-1", ttl=10) as first:
        old_token = first.fencing_token
        Invoice.objects.filter(pk=invoice.pk).fenced_update(old_token, note=f"written with token {old_token}")
    with manager.lock("invoice-INV-1", ttl=10) as second:
        new_token = second.fencing_token
        Invoice.objects.filter(pk=invoice.pk).fenced_update(new_token, note=f"written with token {new_token}")
    try:  # a holder that was paused past its validity comes back with the old token
        Invoice.objects.filter(pk=invoice.pk).fenced_update(old_token, note="stale write")
        refused = None
    except StaleToken as exc:
        refused = str(exc)
    invoice.refresh_from_db()
    return render(
        request,
        "shop/fencing.html",
        {"invoice": invoice, "old": old_token, "new": new_token, "refused": refused},
    )


def health(request):
    return HttpResponse("ok")
