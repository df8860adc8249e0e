"""What a view answers for a lock: 423 (or 503) when it is held, 500 when it was lost; HTML, JSON or
problem details (RFC 9457), as the client's ``Accept`` header asks. REST framework views raise
REST framework exceptions instead (:mod:`django_redlock.rest_framework`), rendered by REST framework."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.http.response import HttpResponseBase
from django.utils.cache import patch_vary_headers
from django.utils.html import format_html
from django.utils.module_loading import import_string
from django.utils.translation import get_language

from django_redlock import conf
from django_redlock.adapters.texts import (
    INVALID_DETAIL,
    INVALID_TITLE,
    LOCKED_DETAIL,
    LOCKED_TITLE,
    LOST_DETAIL,
    LOST_TITLE,
    UNAVAILABLE_DETAIL,
    UNAVAILABLE_TITLE,
    retry_after_seconds,
)
from django_redlock.exceptions import InvalidResource, LockLost, LockNotAcquired, QuorumUnavailable

__all__ = [
    "ABOUT_BLANK",
    "HTML",
    "JSON",
    "PROBLEM_JSON",
    "answer_invalid_key",
    "invalid_key_response",
    "locked_response",
    "lost_response",
    "preferred_type",
    "problem_type",
    "retry_after_seconds",
    "wants_json",
]

HTML = "text/html"
JSON = "application/json"
PROBLEM_JSON = "application/problem+json"

#: RFC 9457's ``type`` when none is configured: the problem is what the status code says.
ABOUT_BLANK = "about:blank"


# -- content negotiation ---------------------------------------------------------


def _media_ranges(accept: str) -> Iterator[tuple[str, float]]:
    """The media ranges of an ``Accept`` header, lower-cased, with their q-values (0 to 1)."""
    for part in accept.split(","):
        media, *params = (p.strip() for p in part.split(";"))
        if media.count("/") != 1:
            continue
        q = 1.0
        for param in params:
            name, _sep, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = min(1.0, max(0.0, float(value.strip())))
                except ValueError:
                    q = 0.0
        yield media.lower(), q


def _specificity(media_range: str, offered: str) -> int:
    """How closely ``media_range`` names ``offered``: 3 exactly, 2 another ``+json`` type than problem+json for JSON
    (``application/vnd.api+json``), 1 ``type/*``, 0 ``*/*``; -1 when it does not match."""
    if media_range == offered:
        return 3
    if offered == JSON and media_range.endswith("+json") and media_range != PROBLEM_JSON:
        return 2
    kind, _sep, subtype = media_range.partition("/")
    if subtype == "*" and offered.startswith(kind + "/"):
        return 1
    return 0 if media_range == "*/*" else -1


def preferred_type(request: HttpRequest, offered: tuple[str, ...] = (HTML, JSON, PROBLEM_JSON)) -> str:
    """The type among ``offered`` that the request's ``Accept`` header prefers.

    Each offered type takes the q-value of the most specific range that matches it (RFC 9110:
    ``text/html;q=0, */*`` refuses HTML); the highest q wins, then the more specific match,
    then the range listed first, then the order of ``offered``. A request without ``Accept``,
    or that accepts none of them, gets the first one. A REST framework request is never
    offered HTML.
    """
    if getattr(request, "_redlock_api", False):
        offered = tuple(kind for kind in offered if kind != HTML) or offered
    ranges = list(_media_ranges(request.headers.get("Accept", "")))
    best = offered[0]
    best_rank: tuple[float, int, int, int] | None = None
    for preference, kind in enumerate(offered):
        matches = [(_specificity(media, kind), -order, q) for order, (media, q) in enumerate(ranges)]
        matches = [match for match in matches if match[0] >= 0]
        if not matches:
            continue
        specificity, order, q = max(matches)  # the most specific range decides; first listed on a tie
        rank = (q, specificity, order, -preference)
        if q > 0 and (best_rank is None or rank > best_rank):
            best, best_rank = kind, rank
    return best


def wants_json(request: HttpRequest) -> bool:
    """True when the client prefers JSON (``application/json``, a ``+json`` type or
    ``application/problem+json``) to HTML, or the view is a REST framework view."""
    return preferred_type(request) != HTML


# -- the bodies -------------------------------------------------------------------


def problem_type(code: str) -> str:
    """The RFC 9457 ``type`` of a problem by its code (``locked``, ``lock_service_unavailable``,
    ``lock_lost``, ``invalid_lock_key``): ``REDLOCK['PROBLEM_TYPE_BASE']``, the page that
    describes the problems, with the code's anchor; ``about:blank`` when that is not set."""
    base = conf.get_config()["PROBLEM_TYPE_BASE"]
    if base is None:
        return ABOUT_BLANK
    return f"{base}#problem-{code.replace('_', '-')}"


def _answer(
    request: HttpRequest, status: int, code: str, title: Any, detail: Any, retry_after: int | None
) -> HttpResponse:
    """The answer in the type the client prefers; ``Retry-After`` when ``retry_after`` is given."""
    kind = preferred_type(request)
    response: HttpResponse
    if kind == HTML:
        response = HttpResponse(
            format_html(
                '<!doctype html><html lang="{}"><meta charset="utf-8"><title>{} {}</title><h1>{}</h1><p>{}</p></html>',
                get_language() or "en",
                status,
                title,
                title,
                detail,
            ),
            status=status,
            content_type="text/html; charset=utf-8",
        )
    else:
        body: dict[str, Any] = {}
        if kind == PROBLEM_JSON:
            body = {"type": problem_type(code), "title": str(title), "status": status}
        body.update({"detail": str(detail), "code": code})
        if retry_after is not None:
            body["retry_after"] = retry_after
        response = JsonResponse(body, status=status, content_type=kind)
    if retry_after is not None:
        response["Retry-After"] = str(retry_after)
    patch_vary_headers(response, ("Accept",))  # the body depends on it: a cache must not mix them
    return response


def locked_response(request: HttpRequest, error: LockNotAcquired) -> HttpResponse:
    """The default answer when the lock is held: 423 Locked with Retry-After.

    When too few lock nodes answered (:class:`~django_redlock.exceptions.QuorumUnavailable`)
    nobody holds the lock: the answer is 503 Service Unavailable instead.
    The body follows the ``Accept`` header (:func:`preferred_type`): an HTML page;
    ``{"detail": ..., "code": "locked" | "lock_service_unavailable", "retry_after": seconds}``
    for ``application/json``; the same with RFC 9457's ``type``, ``title`` and ``status``
    for ``application/problem+json``. None says which nodes or holders were involved.
    """
    if isinstance(error, QuorumUnavailable):
        return _answer(request, 503, "lock_service_unavailable", UNAVAILABLE_TITLE, UNAVAILABLE_DETAIL, retry_after_seconds(error))
    return _answer(request, 423, "locked", LOCKED_TITLE, LOCKED_DETAIL, retry_after_seconds(error))


def lost_response(request: HttpRequest, error: LockLost) -> HttpResponse:
    """The answer of a view whose lock was lost while it ran: 500 Internal Server Error.

    The view's own response is discarded: its work ran, at least in part, without
    the lock, and another holder may have run beside it. The body follows the
    ``Accept`` header as for :func:`locked_response`, with the code ``lock_lost``.
    """
    return _answer(request, 500, "lock_lost", LOST_TITLE, LOST_DETAIL, None)


def invalid_key_response(request: HttpRequest, error: InvalidResource) -> HttpResponse:
    """The answer of a view whose lock key, built from the request, names no lock a view may take
    (too long, a control character, text UTF-8 cannot encode): 400 Bad Request.

    The client's error, not the server's: Django logs it as a warning. The body follows the
    ``Accept`` header as for :func:`locked_response`, with the code ``invalid_lock_key``; it does not
    repeat the name.
    """
    return _answer(request, 400, "invalid_lock_key", INVALID_TITLE, INVALID_DETAIL, None)


# -- who answers ------------------------------------------------------------------


def _is_api(request: HttpRequest) -> bool:
    """True for the request of a REST framework view (marked when found inside a REST framework Request)."""
    return bool(getattr(request, "_redlock_api", False))


#: A REST framework view held by ``RedlockMixin`` around its dispatch, and that dispatch (bound to
#: the request): the view answers its exceptions itself.
ApiView = tuple[Any, Callable[[], Any]]


def answer_locked(request: HttpRequest, error: LockNotAcquired, on_locked: Any, api: ApiView | None = None) -> Any:
    """The view's answer to a held lock: ``on_locked`` if the view has one; for a REST framework
    view, its REST framework exception (raised inside the handler; for ``RedlockMixin``, ``api``
    answers it); else ``REDLOCK['LOCKED_RESPONSE']``, else :func:`locked_response`."""
    if on_locked is None and _is_api(request):
        from django_redlock import rest_framework

        exc = rest_framework.api_exception(error)
        if api is None:
            raise exc
        return rest_framework.answer_before_handler(*api, exc)
    return locked_handler(on_locked)(request, error)


def answer_invalid_key(request: HttpRequest | None, error: InvalidResource, api: ApiView | None = None) -> Any:
    """A view's answer to a key built from its request that no lock may name: :func:`invalid_key_response`
    (a REST framework view: its exception, raised in the handler or answered by ``api``); anything but a
    view (no request) raises ``error``."""
    if request is None:
        raise error
    if _is_api(request):
        from django_redlock import rest_framework

        exc = rest_framework.api_exception(error)
        if api is None:
            raise exc
        return rest_framework.answer_before_handler(*api, exc)
    return invalid_key_response(request, error)


def answer_loss(error: LockLost | None, result: Any, request: HttpRequest | None, api: ApiView | None = None) -> Any:
    """The call's result once its lock is released, given the loss to report (or None): a view (a
    call with a request that returned a response) answers :func:`lost_response` for it (a REST
    framework view: its exception, raised in the handler or answered by ``api``), anything else
    raises it."""
    if error is None:
        return result
    if request is None or not isinstance(result, HttpResponseBase):
        raise error
    roll_back_request()
    if _is_api(request):
        from django_redlock import rest_framework

        exc = rest_framework.api_exception(error)
        if api is None:
            raise exc
        return rest_framework.answer_after_handler(api[0], exc)
    return lost_response(request, error)


def roll_back_request() -> None:
    """Mark the request's transactions (``ATOMIC_REQUESTS``) for rollback: the 500 answered for a
    lost lock is not an exception, and Django would commit the work done without the lock."""
    from django.db import connections

    for connection in connections.all(initialized_only=True):
        if connection.settings_dict.get("ATOMIC_REQUESTS") and connection.in_atomic_block:
            connection.set_rollback(True)


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
