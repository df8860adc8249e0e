"""The Redlock engine: plain Python and redis-py, no Django.

Use it directly from any Python program::

    from django_redlock.core import LockManager

    manager = LockManager(["redis://a:6379", "redis://b:6379", "redis://c:6379"])
    with manager.lock("invoice-42", ttl=10) as lock:
        ...
"""

from django_redlock.core.async_manager import AsyncLock, AsyncLockManager
from django_redlock.core.base import Hooks
from django_redlock.core.lock import Lock
from django_redlock.core.sync_manager import LockManager
from django_redlock.core.records import Holder, LockRecord, NodeEntry, NodeStatus

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
