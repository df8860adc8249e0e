"""Distributed locks for Django over several independent Redis masters (Redlock)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django_redlock import lazy
from django_redlock.exceptions import (
    FencingUnverifiable,
    InvalidResource,
    LockError,
    LockLost,
    LockNotAcquired,
    QuorumUnavailable,
    StaleToken,
)

__version__ = "0.1.0"

__all__ = [
    "AsyncLock",
    "AsyncLockManager",
    "FencingUnverifiable",
    "InvalidResource",
    "Lock",
    "LockError",
    "LockLost",
    "LockManager",
    "LockNotAcquired",
    "QuorumUnavailable",
    "StaleToken",
    "async_lock_manager",
    "get_async_lock_manager",
    "get_lock_manager",
    "lock_manager",
    "redlock",
    "redlock_command",
]

# Names loaded on first use: the engine's (so importing the package stays cheap)
# and the Django-bound ones (so the engine stays usable without Django settings).
_LAZY = {
    **dict.fromkeys(["AsyncLock", "AsyncLockManager", "Lock", "LockManager"], "django_redlock.core"),
    **dict.fromkeys(
        ["async_lock_manager", "get_async_lock_manager", "get_lock_manager", "lock_manager"], "django_redlock.manager"
    ),
    **dict.fromkeys(["redlock", "redlock_command"], "django_redlock.decorators"),
}

if TYPE_CHECKING:
    from django_redlock.core import AsyncLock, AsyncLockManager, Lock, LockManager
    from django_redlock.decorators import redlock, redlock_command
    from django_redlock.manager import async_lock_manager, get_async_lock_manager, get_lock_manager, lock_manager

__getattr__, __dir__ = lazy.exports(__name__, _LAZY, globals())
