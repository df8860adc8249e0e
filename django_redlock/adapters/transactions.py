"""A lock and the database transactions written under it: the release comes after they end.

Released before its holder's transaction commits, a lock lets the next holder read the state from
before that holder's writes (a read-modify-write loses updates). So:

- a view that holds the lock (``@redlock`` on the view Django resolves, ``RedlockMixin``) asks
  Django not to open the ``ATOMIC_REQUESTS`` transactions around it (:func:`claim`) and opens them
  itself inside the lock (:func:`run`): lock, atomic, view, still held?, commit (or rollback), release;
- a locked call that runs inside the request's transaction, opened before its lock (``@redlock`` on a
  handler method or under ``@api_view``), leaves its lock once that transaction has committed, or,
  rolled back, once the response is closed (:class:`Enclosing`);
- any other release while a transaction is open (``with manager.lock()`` inside
  ``transaction.atomic()``) is warned about (:func:`warn_if_in_transaction`).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from django.db import connections, transaction
from django.http import HttpRequest

from django_redlock.exceptions import QuorumUnavailable

__all__ = ["Enclosing", "LockFirst", "ReleasedInTransaction", "claim", "run", "still_held", "warn_if_in_transaction"]


class ReleasedInTransaction(RuntimeWarning):
    """A lock was released while a database transaction it was held in is still open: what was
    written under the lock commits after the release, and the next holder may read the state from
    before it. Take the lock outside the transaction (lock, then ``transaction.atomic()``)."""


class LockFirst(set[str]):
    """``_non_atomic_requests`` of a view that holds a lock: Django reads every alias as "not atomic"
    and opens no ``ATOMIC_REQUESTS`` transaction around it; the view opens them inside its lock.

    Its members are the aliases the view itself leaves without one (``transaction.non_atomic_requests``,
    applied before or after the lock: Django's decorator adds to this set)."""

    def __init__(self, owner: object, opted_out: Iterable[str]) -> None:
        super().__init__(opted_out)
        #: The view function or class that opens the transactions.
        self.owner = owner

    def __contains__(self, alias: object) -> bool:
        return True


def claim(view: Any, owner: object) -> None:
    """Mark ``view`` (a function Django may resolve) as opening its own request transactions, for ``owner``."""
    view._non_atomic_requests = LockFirst(owner, getattr(view, "_non_atomic_requests", ()))


def request_aliases(request: HttpRequest | None, owner: object) -> list[str]:
    """The ``ATOMIC_REQUESTS`` aliases Django left to ``owner`` for this request, innermost first (Django's
    order): none unless ``owner`` claimed the view Django resolved for it."""
    match = getattr(request, "resolver_match", None)
    claimed = getattr(getattr(match, "func", None), "_non_atomic_requests", None)
    if not isinstance(claimed, LockFirst) or claimed.owner is not owner:
        return []
    return [
        alias
        for alias, settings in connections.settings.items()
        if settings.get("ATOMIC_REQUESTS") and not set.__contains__(claimed, alias)
    ]


def still_held(lock: Any) -> bool:
    """Whether the lock may still be counted on just before a commit: valid, and a quorum of nodes
    still stores it (a force-release or a takeover is seen); if not, it is marked lost. Too few
    answers to tell leave it to the validity, which no other holder can outlast."""
    try:
        return bool(lock.owned())
    except QuorumUnavailable:
        return bool(lock.locked())


def run(aliases: list[str], lock: Any, call: Callable[[], Any]) -> Any:
    """``call()`` in a transaction on each alias (the first one innermost), each committed only if
    the lock is still held then; otherwise, or when ``call`` raises, rolled back."""
    if not aliases:
        return call()
    *inner, outer = aliases
    with transaction.atomic(using=outer):
        result = run(inner, lock, call)
        connection = transaction.get_connection(outer)
        if not connection.get_rollback() and not still_held(lock):
            connection.set_rollback(True)  # the loss is reported at the release
    return result


def in_transaction(connection: Any) -> bool:
    """True while a transaction other than a test case's is open on ``connection``."""
    blocks = getattr(connection, "atomic_blocks", None)
    if blocks is None:  # pragma: no cover - every supported Django keeps atomic_blocks
        return bool(connection.in_atomic_block)
    return any(not getattr(block, "_from_testcase", False) for block in blocks)


def open_aliases(only_atomic_requests: bool = False) -> list[str]:
    """The aliases whose connection (in this thread) is in a transaction that is not a test case's."""
    return [
        connection.alias
        for connection in connections.all(initialized_only=True)
        if (not only_atomic_requests or connection.settings_dict.get("ATOMIC_REQUESTS")) and in_transaction(connection)
    ]


class Enclosing:
    """The request's ``ATOMIC_REQUESTS`` transactions already open when a locked call starts: opened
    around it (by Django, for a lock taken in a handler method), they commit after it returns."""

    def __init__(self, request: HttpRequest | None) -> None:
        self.request = request
        self.aliases = open_aliases(only_atomic_requests=True) if request is not None else []

    def __bool__(self) -> bool:
        return bool(self.aliases)

    def leave_after(self, leave: Callable[[], Any]) -> None:
        """Call ``leave`` once every enclosing transaction has committed, or, if one is rolled back,
        once the response is closed (Django closes the request with it, after the rollback)."""
        once = _Once(leave)
        pending = len(self.aliases)

        def committed() -> None:  # run by each alias's commit, in this thread
            nonlocal pending
            pending -= 1
            if pending == 0:
                once()

        for alias in self.aliases:
            transaction.on_commit(committed, using=alias, robust=True)
        request = self.request
        close = request.close  # type: ignore[union-attr]  # not None when there are aliases

        def closing() -> None:
            try:
                once()
            finally:
                close()

        request.close = closing  # type: ignore[method-assign, union-attr]  # Django calls it when the response closes


class _Once:
    def __init__(self, call: Callable[[], Any]) -> None:
        self._call: Callable[[], Any] | None = call
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            call, self._call = self._call, None
        if call is not None:
            call()


def warn_if_in_transaction(lock: Any) -> None:
    """Warn (:class:`ReleasedInTransaction`) when ``lock`` is released while a transaction is open in
    this thread: what it protected commits after the release."""
    aliases = open_aliases()
    if aliases:
        names = ", ".join(repr(alias) for alias in aliases)
        warnings.warn(
            f"Lock {lock.resource!r} was released inside a transaction that is still open (database {names}): "
            "what was written under the lock commits after the release, and the next holder may read the "
            "state from before it. Take the lock outside the transaction: lock, then transaction.atomic().",
            ReleasedInTransaction,
            stacklevel=2,
        )
