"""The words of a lock's answers, shared by the views' answers and REST framework's exceptions."""

from __future__ import annotations

import math

from django.utils.translation import gettext_lazy as _

from django_redlock.exceptions import LockNotAcquired

__all__ = [
    "INVALID_DETAIL",
    "INVALID_TITLE",
    "LOCKED_DETAIL",
    "LOCKED_TITLE",
    "LOST_DETAIL",
    "LOST_TITLE",
    "UNAVAILABLE_DETAIL",
    "UNAVAILABLE_TITLE",
    "retry_after_seconds",
]

LOCKED_TITLE = _("Locked")
LOCKED_DETAIL = _("Someone else is working on this right now. Please try again shortly.")
UNAVAILABLE_TITLE = _("Lock service unavailable")
UNAVAILABLE_DETAIL = _("The lock service cannot be reached right now. Please try again shortly.")
INVALID_TITLE = _("Bad request")
INVALID_DETAIL = _(
    "This request names a lock that cannot be taken: its name is too long or holds a control character."
)
LOST_TITLE = _("Lock lost")
LOST_DETAIL = _(
    "The lock this request held was lost before its work was done, so the work may have overlapped "
    "another. Please check the outcome before trying again."
)


def retry_after_seconds(error: LockNotAcquired) -> int:
    """Whole seconds until the lock may be free (at least 1): the ``Retry-After`` of the answer."""
    if error.retry_after is None:
        return 1
    return max(1, math.ceil(error.retry_after))
