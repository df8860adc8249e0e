"""``@redlock`` for views (sync and async) and functions; ``@redlock_command`` for management commands.

Each is a thin adapter over the hold, ``manager.lock()``: keys (:mod:`.keys`), what a view answers
(:mod:`.answers`), views (:mod:`.views`), commands (:mod:`.commands`) and their stop guard (:mod:`.stop`).
"""

from django_redlock.decorators.answers import (
    LOCKED_DETAIL,
    LOST_DETAIL,
    UNAVAILABLE_DETAIL,
    locked_response,
    lost_response,
    retry_after_seconds,
    wants_json,
)
from django_redlock.decorators.commands import EXIT_LOCKED, EXIT_LOST, EXIT_NODES_UNAVAILABLE, redlock_command
from django_redlock.decorators.keys import Key, Keys, KeySpec, KeysSpec, find_request
from django_redlock.decorators.views import RedlockMixin, redlock

__all__ = [
    "EXIT_LOCKED",
    "EXIT_LOST",
    "EXIT_NODES_UNAVAILABLE",
    "LOCKED_DETAIL",
    "LOST_DETAIL",
    "UNAVAILABLE_DETAIL",
    "Key",
    "KeySpec",
    "Keys",
    "KeysSpec",
    "RedlockMixin",
    "find_request",
    "locked_response",
    "lost_response",
    "redlock",
    "redlock_command",
    "retry_after_seconds",
    "wants_json",
]
