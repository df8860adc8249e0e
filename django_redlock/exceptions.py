"""Errors raised by django-redlock. Imports no Django, so the engine can use them."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["InvalidResource", "LockError", "LockNotAcquired", "QuorumUnavailable", "LockLost", "StaleToken", "FencingUnverifiable"]


class LockError(Exception):
    """Base class of every error raised by django-redlock."""

    def __init__(self, message: str, *, resource: str | None = None) -> None:
        super().__init__(message)
        self.resource = resource


class LockNotAcquired(LockError):
    """The lock is held by someone else: fewer than a quorum of nodes granted it."""

    def __init__(
        self,
        message: str,
        *,
        resource: str | None = None,
        granted: int = 0,
        quorum: int = 0,
        total: int = 0,
        failures: Mapping[str, str] | None = None,
        retry_after: float | None = None,
        holder: str | None = None,
    ) -> None:
        super().__init__(message, resource=resource)
        #: Nodes that granted the lock in the last attempt.
        self.granted = granted
        #: Nodes needed (N // 2 + 1).
        self.quorum = quorum
        #: Nodes configured.
        self.total = total
        #: Node name (never with credentials) -> why it did not grant the lock.
        self.failures: dict[str, str] = dict(failures or {})
        #: Seconds until the current holder's key expires, when known.
        self.retry_after = retry_after
        #: Who holds it, where a quorum of nodes agree: ``host:pid (label)``, escaped; never its token.
        self.holder = holder


class QuorumUnavailable(LockNotAcquired):
    """Too few nodes answered to reach a quorum: the nodes, not a holder, are the problem."""


class LockLost(LockError):
    """The lock expired or was taken over: the holder must stop working on the resource."""


class StaleToken(LockLost):
    """The storage already accepted a higher fencing token: this holder is stale and must stop."""

    def __init__(self, message: str, *, resource: str | None = None, token: int = 0, stored: int = 0) -> None:
        super().__init__(message, resource=resource)
        #: The token this writer carried.
        self.token = token
        #: The higher token the storage holds.
        self.stored = stored


class FencingUnverifiable(LockError):
    """A fenced write was refused unwritten: its transaction's snapshot may hide a newer holder's rows."""


class InvalidResource(ValueError):
    """A resource no lock may name (too long, with a control character, or text UTF-8 cannot encode), or
    more resources than one lock may take.

    A :class:`ValueError` (the caller's input is wrong; no node was asked), of its own class so that a
    view can answer a key built from request data with 400 Bad Request.
    """
