"""Django REST framework: answer a held lock with 423 (or 503 when the nodes are down) in JSON,
and a lock lost while the view ran with 500.

``@redlock`` on an ``APIView`` method or an ``@api_view`` function already
answers in JSON. For locks taken by hand inside a view (``with
lock_manager.lock(...)``), set this as the exception handler::

    REST_FRAMEWORK = {"EXCEPTION_HANDLER": "django_redlock.rest_framework.exception_handler"}
"""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse

from django_redlock.adapters.answers import locked_response, lost_response
from django_redlock.adapters.keys import find_request
from django_redlock.exceptions import LockLost, LockNotAcquired

__all__ = ["exception_handler"]


def exception_handler(exc: Exception, context: dict[str, Any]) -> HttpResponse | None:
    """REST framework's handler, plus: :class:`~django_redlock.exceptions.LockNotAcquired` -> 423 / 503 JSON,
    :class:`~django_redlock.exceptions.LockLost` -> 500 JSON."""
    from rest_framework.views import exception_handler as default_handler
    from rest_framework.views import set_rollback

    if isinstance(exc, (LockNotAcquired, LockLost)):
        request = find_request((context.get("request"),), {})
        if request is not None:
            set_rollback()  # a handled exception: REST framework would commit ATOMIC_REQUESTS work
            if isinstance(exc, LockLost):
                return lost_response(request, exc)
            return locked_response(request, exc)
    response: HttpResponse | None = default_handler(exc, context)
    return response
