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

import importlib
from typing import TYPE_CHECKING, Any

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
    "Hooks": "django_redlock.core.base",
    "Lock": "django_redlock.core.lock",
    "LockManager": "django_redlock.core.sync_manager",
    "LockRecord": "django_redlock.core.records",
    "NodeEntry": "django_redlock.core.records",
    "NodeStatus": "django_redlock.core.records",
}

if TYPE_CHECKING:
    from django_redlock.core.async_manager import AsyncLock, AsyncLockManager
    from django_redlock.core.base import Hooks
    from django_redlock.core.lock import Lock
    from django_redlock.core.records import Holder, LockRecord, NodeEntry, NodeStatus
    from django_redlock.core.sync_manager import LockManager


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'django_redlock.core' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
