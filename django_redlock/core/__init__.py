"""The Redlock engine: plain Python and redis-py, no Django.

Use it directly from any Python program::

    from django_redlock.core import LockManager

    manager = LockManager(["redis://a:6379", "redis://b:6379", "redis://c:6379"])
    with manager.lock("invoice-42", ttl=10) as lock:
        ...

The managers are loaded on first use, so importing a pure module of the engine (the decisions,
the scripts, the wire format) loads no I/O library.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django_redlock import lazy

__all__ = [
    "AsyncLock",
    "AsyncLockManager",
    "Holder",
    "Hooks",
    "Lock",
    "LockManager",
    "LockRecord",
    "NodeEntry",
    "NodeStatus",
]

#: Public name -> the module that defines it.
_HOMES = {
    "AsyncLock": "django_redlock.core.async_manager",
    "AsyncLockManager": "django_redlock.core.async_manager",
    "Holder": "django_redlock.core.records",
    "Hooks": "django_redlock.core.hooks",
    "Lock": "django_redlock.core.lock",
    "LockManager": "django_redlock.core.sync_manager",
    "LockRecord": "django_redlock.core.records",
    "NodeEntry": "django_redlock.core.records",
    "NodeStatus": "django_redlock.core.records",
}

if TYPE_CHECKING:
    from django_redlock.core.async_manager import AsyncLock, AsyncLockManager
    from django_redlock.core.hooks import Hooks
    from django_redlock.core.lock import Lock
    from django_redlock.core.records import Holder, LockRecord, NodeEntry, NodeStatus
    from django_redlock.core.sync_manager import LockManager

__getattr__, __dir__ = lazy.exports(__name__, _HOMES, globals())
