"""``@redlock`` for views (sync and async) and functions; ``@redlock_command`` for management commands.

Each is a thin adapter over the hold, ``manager.lock()``; they live in :mod:`django_redlock.adapters`, by topic.
"""

from django_redlock.adapters.answers import locked_response, lost_response, wants_json
from django_redlock.adapters.texts import LOCKED_DETAIL, LOST_DETAIL, UNAVAILABLE_DETAIL, retry_after_seconds
from django_redlock.adapters.commands import EXIT_LOCKED, EXIT_LOST, EXIT_NODES_UNAVAILABLE, redlock_command
from django_redlock.adapters.keys import Key, Keys, KeySpec, KeysSpec, find_request
from django_redlock.adapters.views import RedlockMixin, redlock
from django_redlock.exit_codes import ExitCode

__all__ = [
    "EXIT_LOCKED",
    "EXIT_LOST",
    "EXIT_NODES_UNAVAILABLE",
    "ExitCode",
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
