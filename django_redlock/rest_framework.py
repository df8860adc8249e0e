"""Django REST framework: a held lock is answered 423 (503 when the lock nodes are down) and a
lock lost while the view ran 500, by REST framework itself.

``@redlock`` on an ``APIView`` method or an ``@api_view`` function, and ``RedlockMixin`` on an
``APIView``, raise :class:`Locked`, :class:`LockServiceUnavailable` or :class:`LockWasLost`:
REST framework's exception handler and renderers answer them (JSON for API clients, the
browsable API for a browser). For locks taken by hand inside a view (``with
lock_manager.lock(...)``), set this module's handler::

    REST_FRAMEWORK = {"EXCEPTION_HANDLER": "django_redlock.rest_framework.exception_handler"}

Importing this module imports REST framework; the rest of the package imports it only for
REST framework views.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http.response import HttpResponseBase
from rest_framework.exceptions import APIException
from rest_framework.views import exception_handler as default_exception_handler

from django_redlock.adapters.texts import (
    INVALID_DETAIL,
    LOCKED_DETAIL,
    LOST_DETAIL,
    UNAVAILABLE_DETAIL,
    retry_after_seconds,
)
from django_redlock.exceptions import InvalidResource, LockLost, LockNotAcquired, QuorumUnavailable

__all__ = ["InvalidLockKey", "LockServiceUnavailable", "LockWasLost", "Locked", "api_exception", "exception_handler"]


class LockAnswer(APIException):  # type: ignore[misc]  # REST framework ships no types
    """A lock's answer as a REST framework exception.

    Its ``detail`` is the body REST framework's handler answers: ``{"detail": ..., "code": ...}``
    plus ``"retry_after"`` (seconds, also sent as ``Retry-After``) when the lock may be free later.
    """

    detail: dict[str, Any]

    def __init__(self, retry_after: int | None = None) -> None:
        super().__init__()
        message = self.detail  # the translated default_detail, as an ErrorDetail with default_code
        body: dict[str, Any] = {"detail": message, "code": self.default_code}
        if retry_after is not None:
            body["retry_after"] = retry_after
            self.wait = retry_after  # REST framework's handler sends it as Retry-After
        self.detail = body

    def __str__(self) -> str:
        return str(self.detail["detail"])


class Locked(LockAnswer):
    """423 Locked: another holder has the lock."""

    status_code = 423
    default_detail = LOCKED_DETAIL
    default_code = "locked"


class LockServiceUnavailable(LockAnswer):
    """503 Service Unavailable: too few lock nodes answered, nobody holds the lock."""

    status_code = 503
    default_detail = UNAVAILABLE_DETAIL
    default_code = "lock_service_unavailable"


class LockWasLost(LockAnswer):
    """500 Internal Server Error: the lock was lost while the view ran; its own answer is discarded."""

    status_code = 500
    default_detail = LOST_DETAIL
    default_code = "lock_lost"


class InvalidLockKey(LockAnswer):
    """400 Bad Request: the lock key built from the request names no lock (too long, a control character)."""

    status_code = 400
    default_detail = INVALID_DETAIL
    default_code = "invalid_lock_key"


def api_exception(error: LockNotAcquired | LockLost | InvalidResource) -> LockAnswer:
    """The REST framework exception answering ``error`` (kept as its ``__cause__``)."""
    answer: LockAnswer
    if isinstance(error, InvalidResource):
        answer = InvalidLockKey()
    elif isinstance(error, LockLost):
        answer = LockWasLost()
    elif isinstance(error, QuorumUnavailable):
        answer = LockServiceUnavailable(retry_after_seconds(error))
    else:
        answer = Locked(retry_after_seconds(error))
    answer.__cause__ = error
    return answer


def answer_before_handler(view: Any, dispatch: Callable[[], HttpResponseBase], exc: LockAnswer) -> HttpResponseBase:
    """``view``'s answer to ``exc`` when its lock was refused before REST framework's dispatch ran
    (``RedlockMixin``): the dispatch runs up to the handler (authentication, permissions, content
    negotiation), and ``exc`` is raised in the handler's place."""
    initial = view.initial

    def initial_then_raise(request: Any, *args: Any, **kwargs: Any) -> None:
        initial(request, *args, **kwargs)
        raise exc

    view.initial = initial_then_raise
    try:
        return dispatch()
    finally:
        del view.initial


def answer_after_handler(view: Any, exc: LockAnswer) -> HttpResponseBase:
    """``view``'s answer to ``exc`` after REST framework's dispatch returned (``RedlockMixin``):
    its exception handler and its negotiated renderer, as for an exception of the handler's own."""
    response = view.handle_exception(exc)
    finalized: HttpResponseBase = view.finalize_response(view.request, response, *view.args, **view.kwargs)
    return finalized


def exception_handler(exc: Exception, context: dict[str, Any]) -> Any:
    """REST framework's handler, plus: :class:`~django_redlock.exceptions.LockNotAcquired` -> 423 / 503,
    :class:`~django_redlock.exceptions.LockLost` -> 500, as :class:`Locked`,
    :class:`LockServiceUnavailable` and :class:`LockWasLost` are answered."""
    if isinstance(exc, (LockNotAcquired, LockLost)):
        exc = api_exception(exc)
    return default_exception_handler(exc, context)
