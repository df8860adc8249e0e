"""The lock a Celery task takes when it is sent (``lock_on_send``), handed to the worker that runs it.

:class:`~django_redlock.celery.RedlockTask`'s ``apply_async`` takes the lock
on the task's resource for ``queued_ttl`` seconds, labelled with the task's id,
and sends the holder's token in a message header (:data:`HEADER`); a send
while it is held raises :class:`TaskAlreadyQueued` or returns the holding
task's result. The worker adopts the lock and releases it, then takes it
again with the task's own ttl and keep-alive: a second delivery of the same
message can no longer adopt it, and a killed worker's lock expires by the
task's ttl. A retry keeps the lock (queued again); anything else Celery does
with the task releases it (:func:`finished`, :func:`revoked`).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

from celery import states
from celery.exceptions import Retry
from celery.signals import task_postrun, task_revoked
from celery.utils import uuid
from django.core.exceptions import ImproperlyConfigured

from django_redlock import conf
from django_redlock.core import Lock, base
from django_redlock.core.records import printable
from django_redlock.exceptions import LockLost, LockNotAcquired, QuorumUnavailable

__all__ = ["HEADER", "Send", "TaskAlreadyQueued", "WhenDuplicate", "check_send"]

logger = logging.getLogger("django_redlock")

#: What sending a ``lock_on_send`` task does while the same task is queued or running.
WhenDuplicate = Literal["raise", "result"]
DUPLICATE_MODES: tuple[str, ...] = ("raise", "result")

#: The message header of a task sent under its lock: ``[resources, token]``, what the worker
#: needs to take the lock over (:meth:`~django_redlock.core.LockManager.adopt`).
HEADER: Final = "redlock_hold"

#: Where a lock waits, on the task's request, for what Celery does after the body raised.
KEPT: Final = "_redlock_kept"


class TaskAlreadyQueued(LockNotAcquired):
    """Sending a ``lock_on_send`` task refused: the same task (the same lock) is queued or running.

    ``task_id`` is that task's id when the lock's label tells it; None when something
    else holds the resource.
    """

    def __init__(self, message: str, *, task_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        #: The id of the queued or running task that holds the lock, or None.
        self.task_id = task_id


def check_send(lock_on_send: Any, queued_ttl: Any, when_duplicate: Any) -> None:
    if not isinstance(lock_on_send, bool):
        raise ImproperlyConfigured(f"lock_on_send must be True or False; got {lock_on_send!r}.")
    if when_duplicate not in DUPLICATE_MODES:
        raise ImproperlyConfigured(
            f"when_duplicate must be one of {', '.join(map(repr, DUPLICATE_MODES))}; got {when_duplicate!r}."
        )
    if not lock_on_send and (queued_ttl is not None or when_duplicate != "raise"):
        raise ImproperlyConfigured("queued_ttl and when_duplicate are only used with lock_on_send=True.")
    if queued_ttl is not None:
        base.check_ttl(queued_ttl, 1.0, "queued_ttl")


def label(own: str | None, name: str, task_id: Any) -> str:
    """The label of a ``lock_on_send`` task's lock: it ends with the task's id, which a duplicate may be given."""
    return printable(f"{_prefix(own, name)}{task_id}]")


def _prefix(own: str | None, name: str) -> str:
    return printable(f"{own}[" if own is not None else f"celery {name}[")


@dataclass(frozen=True)
class Send:
    """``lock_on_send``'s options: how long the lock lives while the task is queued, what a duplicate gets."""

    queued_ttl: float | None
    when_duplicate: str

    def ttl(self) -> float:
        """The queued lock's ttl: ``queued_ttl``, at most ``REDLOCK['MAX_TTL']`` (its default)."""
        limit = float(conf.get_config()["MAX_TTL"])
        if self.queued_ttl is None:
            return limit
        if self.queued_ttl > limit:
            raise ValueError(
                f"queued_ttl ({self.queued_ttl:g} s) is above REDLOCK['MAX_TTL'] ({limit:g} s): use a shorter "
                "queued_ttl, or raise MAX_TTL on every client of these nodes."
            )
        return self.queued_ttl

    def send(
        self, resource_of: Callable[..., Any], own_label: str | None, task: Any, args: Any, kwargs: Any,
        options: dict[str, Any], send: Callable[..., Any],
    ) -> Any:
        """``apply_async``: take the lock, send the message that carries it (released if sending
        fails); refuse a duplicate. ``resource_of(args, kwargs)`` names the resource."""
        from django_redlock.manager import get_lock_manager

        headers = dict(options.get("headers") or {})
        if HEADER in headers:
            return send(args, kwargs, **options)  # a retry: the lock is kept for it
        check = getattr(task, "__header__", None)
        if task.typing and check is not None:
            check(*(args or ()), **(kwargs or {}))  # what Celery checks when sending, before the lock is taken
        call_args = (task, *(args or ())) if _bound(task) else tuple(args or ())
        resource = resource_of(call_args, dict(kwargs or {}))
        queued_ttl = self.ttl()
        task_id = options.get("task_id") or uuid()
        manager = get_lock_manager()
        try:
            lock = manager.acquire(resource, queued_ttl, blocking=False, label=label(own_label, task.name, task_id))
        except QuorumUnavailable:
            raise
        except LockNotAcquired as error:
            queued = _queued_id(manager, resource, _prefix(own_label, task.name))
            if queued is not None and self.when_duplicate == "result":
                logger.info("Task %s not sent: task %s holds %r.", task.name, queued, error.resource)
                return task.AsyncResult(queued)
            holder = f"task {queued} (queued or running)" if queued is not None else "another holder"
            raise TaskAlreadyQueued(
                f"Task {task.name} not sent: {error.resource!r} is locked by {holder}.",
                task_id=queued, resource=error.resource, granted=error.granted, quorum=error.quorum,
                total=error.total, failures=error.failures, retry_after=error.retry_after,
            ) from None
        headers[HEADER] = [list(lock.resources), lock.token]
        try:
            return send(args, kwargs, **{**options, "task_id": task_id, "headers": headers})
        except BaseException:
            lock.release()  # not sent (or not known to be): nothing will take it over
            raise


def _queued_id(manager: Any, resource: Any, prefix: str) -> str | None:
    """The id of the task whose lock holds ``resource``, read from its label; None if it is no such lock."""
    try:
        record = manager.lock_record(base.check_resources(resource)[0])
    except LockNotAcquired:
        return None
    text = record.holder.label if record is not None else None
    if not text or not text.startswith(prefix) or not text.endswith("]"):
        return None
    task_id = text[len(prefix) : -1]
    return task_id if task_id and "[" not in task_id else None


def take_over(manager: Any, task: Any, resource: Any, describe: str) -> None:
    """Release the lock this task was sent under, which the caller then takes again as its own.

    Its token travelled in the message: a second delivery of it must not find it
    adoptable while this one runs, and the lock taken again lives by the task's
    ttl, not by ``queued_ttl``.
    """
    header = _header((task.request.headers or {}).get(HEADER))
    if header is None:
        return
    try:
        manager.adopt(resource, header[1]).release()
    except QuorumUnavailable:
        raise
    except (LockLost, ValueError) as error:
        why = "it waited longer than queued_ttl, or was released" if isinstance(error, LockLost) else "other arguments"
        logger.warning(
            "Task %s: the lock taken when it was sent on %r is no longer held (%s); taking it now.",
            describe, base.name_of(base.check_resources(resource)), why,
        )


def _header(value: Any) -> tuple[list[str], str] | None:
    """``(resources, token)`` of a :data:`HEADER`, or None when absent or malformed (it came from the broker)."""
    if isinstance(value, (list, tuple)) and len(value) == 2:
        resources, token = value
        if isinstance(token, str) and token and isinstance(resources, list) and resources:
            if all(isinstance(r, str) for r in resources):
                return resources, token
    return None


def carry(task: Any, lock: Lock) -> None:
    """Put the lock in the request's headers: a retry's message carries them, and the lock, on."""
    task.request.headers = {**(task.request.headers or {}), HEADER: [list(lock.resources), lock.token]}


def may_retry(task: Any, exc: BaseException) -> bool:
    """Whether Celery may retry the task after its body raised ``exc``: ``self.retry()``, ``autoretry_for``."""
    retried = tuple(getattr(task, "autoretry_for", None) or ())
    spared = tuple(getattr(task, "dont_autoretry_for", None) or ())
    return isinstance(exc, Retry) or (isinstance(exc, retried) and not isinstance(exc, spared))


def _bound(task: Any) -> bool:
    """Whether the task's body takes the task as its first argument (``bind=True``, a class's ``run``)."""
    return inspect.ismethod(getattr(task, "_orig_run", task.run))


def finished(task: Any = None, state: str | None = None, **_: Any) -> None:
    """After a body raised what may be retried: a retry keeps the lock (queued again), anything else releases it."""
    request = getattr(task, "request", None)
    kept = vars(request).pop(KEPT, None) if request is not None else None
    if kept is None:
        return
    lock, send = kept
    if state == states.RETRY:
        try:
            lock.extend(send.ttl())  # it waits in the queue again
        except (LockLost, LockNotAcquired, ValueError) as error:
            logger.warning("Task %s: its lock %r could not be kept for the retry (%s).", task.name, lock.resource, error)
        finally:
            lock.manager._forget(lock)  # the retry's run keeps it alive again
        return
    lock.release()
    if lock.lost:
        logger.error(
            "Task %s ended %s and its lock %r was lost while it ran (%s).", task.name, state, lock.resource, lock.lost_reason
        )


def revoked(request: Any = None, **_: Any) -> None:
    """A revoked (or expired) task: release the lock taken when it was sent."""
    header = _header((getattr(request, "headers", None) or {}).get(HEADER))
    if header is None:
        return
    from django_redlock.manager import get_lock_manager

    try:
        get_lock_manager().adopt(header[0], header[1]).release()
    except (LockLost, LockNotAcquired, ValueError):
        pass  # already released, expired or taken over; or the nodes are down: it expires by itself


task_postrun.connect(finished, weak=False, dispatch_uid="django_redlock.celery_send.finished")
task_revoked.connect(revoked, weak=False, dispatch_uid="django_redlock.celery_send.revoked")
