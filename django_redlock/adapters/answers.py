"""What a view answers for a lock: 423 (or 503) when it is held, 500 when it was lost; HTML or JSON."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.http.response import HttpResponseBase
from django.utils.module_loading import import_string

from django_redlock import conf
from django_redlock.exceptions import LockLost, LockNotAcquired, QuorumUnavailable

__all__ = ["locked_response", "lost_response", "retry_after_seconds", "wants_json"]


def wants_json(request: HttpRequest) -> bool:
    """True when the client prefers JSON to HTML (Accept), or the view is a REST framework view."""
    if getattr(request, "_redlock_api", False):
        return True
    best: dict[str, tuple[float, int]] = {}
    for order, part in enumerate(request.headers.get("Accept", "").split(",")):
        media, *params = (p.strip() for p in part.split(";"))
        q = 1.0
        for param in params:
            if param.startswith("q="):
                try:
                    q = float(param[2:])
                except ValueError:
                    q = 0.0
        kind = "json" if media == "application/json" or media.endswith("+json") else "html" if media == "text/html" else ""
        if kind and (kind not in best or q > best[kind][0]):
            best[kind] = (q, -order)
    json_rank, html_rank = best.get("json"), best.get("html")
    return json_rank is not None and json_rank[0] > 0 and (html_rank is None or json_rank > html_rank)


# -- the contended response ---------------------------------------------------

LOCKED_DETAIL = "Someone else is working on this right now. Please try again shortly."
UNAVAILABLE_DETAIL = "The lock service cannot be reached right now. Please try again shortly."


def locked_response(request: HttpRequest, error: LockNotAcquired) -> HttpResponse:
    """The default answer when the lock is held: 423 Locked with Retry-After.

    When too few lock nodes answered (:class:`~django_redlock.exceptions.QuorumUnavailable`)
    nobody holds the lock: the answer is 503 Service Unavailable instead.
    A client that prefers JSON (``Accept``), and a REST framework view, get
    ``{"detail": ..., "code": "locked" | "lock_service_unavailable",
    "retry_after": seconds}`` instead of HTML. Neither says which nodes or
    holders were involved.
    """
    retry_after = retry_after_seconds(error)
    if wants_json(request):
        unavailable = isinstance(error, QuorumUnavailable)
        response: HttpResponse = JsonResponse(
            {
                "detail": UNAVAILABLE_DETAIL if unavailable else LOCKED_DETAIL,
                "code": "lock_service_unavailable" if unavailable else "locked",
                "retry_after": retry_after,
            },
            status=503 if unavailable else 423,
        )
        response["Retry-After"] = str(retry_after)
        return response
    if isinstance(error, QuorumUnavailable):
        response = HttpResponse(
            "<!doctype html><title>503 Service Unavailable</title><h1>Service unavailable</h1>"
            f"<p>{UNAVAILABLE_DETAIL}</p>",
            status=503,
            content_type="text/html; charset=utf-8",
        )
    else:
        response = HttpResponse(
            "<!doctype html><title>423 Locked</title><h1>Locked</h1>"
            f"<p>{LOCKED_DETAIL}</p>",
            status=423,
            content_type="text/html; charset=utf-8",
        )
    response["Retry-After"] = str(retry_after)
    return response


LOST_DETAIL = (
    "The lock this request held was lost before its work was done, so the work may have overlapped "
    "another. Please check the outcome before trying again."
)


def lost_response(request: HttpRequest, error: LockLost) -> HttpResponse:
    """The answer of a view whose lock was lost while it ran: 500 Internal Server Error.

    The view's own response is discarded: its work ran, at least in part, without
    the lock, and another holder may have run beside it. A client that prefers
    JSON, and a REST framework view, get ``{"detail": ..., "code": "lock_lost"}``.
    """
    if wants_json(request):
        return JsonResponse({"detail": LOST_DETAIL, "code": "lock_lost"}, status=500)
    return HttpResponse(
        "<!doctype html><title>500 Internal Server Error</title><h1>Server error</h1>"
        f"<p>{LOST_DETAIL}</p>",
        status=500,
        content_type="text/html; charset=utf-8",
    )


def answer_loss(error: LockLost | None, result: Any, request: HttpRequest | None) -> Any:
    """The call's result once its lock is released, given the loss to report (or None): a view (a
    call with a request that returned a response) answers :func:`lost_response` for it, anything
    else raises it."""
    if error is None:
        return result
    if request is None or not isinstance(result, HttpResponseBase):
        raise error
    roll_back_request()
    return lost_response(request, error)


def roll_back_request() -> None:
    """Mark the request's transactions (``ATOMIC_REQUESTS``) for rollback: the 500 answered for a
    lost lock is not an exception, and Django would commit the work done without the lock."""
    from django.db import connections

    for connection in connections.all(initialized_only=True):
        if connection.settings_dict.get("ATOMIC_REQUESTS") and connection.in_atomic_block:
            connection.set_rollback(True)


def retry_after_seconds(error: LockNotAcquired) -> int:
    if error.retry_after is None:
        return 1
    return max(1, math.ceil(error.retry_after))


def locked_handler(on_locked: Callable[..., HttpResponse] | str | None) -> Callable[..., HttpResponse]:
    """The view's answer to a held lock: ``on_locked``, else ``REDLOCK['LOCKED_RESPONSE']``, else
    :func:`locked_response`."""
    if on_locked is None:
        on_locked = conf.get_config()["LOCKED_RESPONSE"]
    if on_locked is None:
        return locked_response
    if isinstance(on_locked, str):
        try:
            on_locked = import_string(on_locked)
        except ImportError as exc:
            raise ImproperlyConfigured(f"REDLOCK['LOCKED_RESPONSE'] = {on_locked!r} cannot be imported: {exc}") from None
    if not callable(on_locked):
        raise ImproperlyConfigured(f"on_locked must be a callable (request, error) -> HttpResponse; got {on_locked!r}.")
    return on_locked

