"""The lock a Celery task takes when it is sent (``lock_on_send``), handed to the worker that runs it.

:class:`~django_redlock.celery.RedlockTask`'s ``apply_async`` takes the lock
on the task's resource for ``queued_ttl`` seconds, labelled with the task's id
and "(queued)", and marks the message (:data:`HEADER`: the resources and that
label, nothing secret); a send while it is held raises
:class:`TaskAlreadyQueued` or returns the holding task's result. The worker
finds the lock by its label on the nodes, releases it and takes the lock again
with the task's own label, ttl and keep-alive: a second delivery of the same
message no longer finds it, and a killed worker's lock expires by the task's
ttl. A retry's message turns the running task's lock back into a queued one;
a revoked task's lock is released by the worker that drops it.
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
from django_redlock.core import base
from django_redlock.core.records import printable
from django_redlock.exceptions import LockLost, LockNotAcquired, QuorumUnavailable

__all__ = ["HEADER", "Send", "TaskAlreadyQueued", "WhenDuplicate", "check_send"]

logger = logging.getLogger("django_redlock")

#: What sending a ``lock_on_send`` task does while the same task is queued or running.
WhenDuplicate = Literal["raise", "result"]
DUPLICATE_MODES: tuple[str, ...] = ("raise", "result")

#: The message header of a task sent under its lock: ``[resources, label]``, the lock's resources
#: and its holder's label, by which the worker finds it on the nodes.
HEADER: Final = "redlock_sent"

#: The end of a queued task's lock label.
QUEUED: Final = " (queued)"

#: Where the running task's lock is kept, on its request, for a retry's message to take over.
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
    """The label of a ``lock_on_send`` task's lock while it runs: it ends with the task's id."""
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
        """``apply_async``: take the lock, send the message that names it (released if sending
        fails); refuse a duplicate. ``resource_of(args, kwargs)`` names the resource."""
        from django_redlock.manager import get_lock_manager

        headers = dict(options.get("headers") or {})
        if HEADER in headers:
            return self._retry(task, args, kwargs, options, send)
        check = getattr(task, "__header__", None)
        if task.typing and check is not None:
            check(*(args or ()), **(kwargs or {}))  # what Celery checks when sending, before the lock is taken
        call_args = (task, *(args or ())) if _bound(task) else tuple(args or ())
        resource = resource_of(call_args, dict(kwargs or {}))
        queued_ttl = self.ttl()
        task_id = options.get("task_id") or uuid()
        manager = get_lock_manager()
        queued = label(own_label, task.name, task_id) + QUEUED
        try:
            lock = manager.acquire(resource, queued_ttl, blocking=False, label=queued)
        except QuorumUnavailable:
            raise
        except LockNotAcquired as error:
            holder = _holder_id(manager, resource, _prefix(own_label, task.name))
            if holder is not None and self.when_duplicate == "result":
                logger.info("Task %s not sent: task %s holds %r.", task.name, holder, error.resource)
                return task.AsyncResult(holder)
            who = f"task {holder} (queued or running)" if holder is not None else "another holder"
            raise TaskAlreadyQueued(
                f"Task {task.name} not sent: {error.resource!r} is locked by {who}.",
                task_id=holder, resource=error.resource, granted=error.granted, quorum=error.quorum,
                total=error.total, failures=error.failures, retry_after=error.retry_after,
            ) from None
        headers[HEADER] = [list(lock.resources), queued]
        try:
            return send(args, kwargs, **{**options, "task_id": task_id, "headers": headers})
        except BaseException:
            lock.release()  # not sent (or not known to be): nothing will take it over
            raise

    def _retry(self, task: Any, args: Any, kwargs: Any, options: dict[str, Any], send: Callable[..., Any]) -> Any:
        """A retry's message: the running task's lock becomes its retry's queued lock, as when it was sent."""
        from django_redlock.manager import get_lock_manager

        request = task.request
        mark = _header(options["headers"][HEADER])
        kept = vars(request).pop(KEPT, None) if request.id == options.get("task_id") else None
        if kept is None or mark is None:
            return send(args, kwargs, **options)  # no lock held for it: the retry takes it when it runs
        kept.release()
        try:
            queued = get_lock_manager().acquire(kept.resources, self.ttl(), blocking=False, label=mark[1])
        except LockNotAcquired:
            queued = None  # taken in between: the retry meets that lock, and when_locked decides
        try:
            return send(args, kwargs, **options)
        except BaseException:
            if queued is not None:
                queued.release()
            raise


def _holder_id(manager: Any, resource: Any, prefix: str) -> str | None:
    """The id of the task whose lock holds ``resource``, read from its label; None if it is no such lock."""
    try:
        record = manager.lock_record(base.check_resources(resource)[0])
    except LockNotAcquired:
        return None
    text = record.holder.label if record is not None else None
    if text and text.endswith(QUEUED):
        text = text[: -len(QUEUED)]
    if not text or not text.startswith(prefix) or not text.endswith("]"):
        return None
    task_id = text[len(prefix) : -1]
    return task_id if task_id and "[" not in task_id else None


def take_over(manager: Any, task: Any, resource: Any, describe: str) -> None:
    """Release the lock this task was sent under (found by its label), which the caller then takes
    again as its own: under another label, so that a second delivery of the same message does not
    find it, and with the task's ttl rather than ``queued_ttl``."""
    request = task.request
    mark = _header((request.headers or {}).get(HEADER))
    if mark is None:
        return
    name = base.name_of(base.check_resources(resource))
    if _sent_under(mark, request.id):
        record = manager.lock_record(base.check_resources(resource)[0])
        holder = record.holder if record is not None else None
        if holder is not None and holder.label == mark[1]:
            try:
                manager.adopt(resource, holder.token).release()
                return
            except (LockLost, ValueError):
                pass  # released or expired meanwhile
    if not request.is_eager:
        logger.warning(
            "Task %s: the lock it was sent under on %r is no longer held (it waited longer than queued_ttl, "
            "or was released); taking it now.", describe, name,
        )


def _sent_under(mark: tuple[list[str], str], task_id: Any) -> bool:
    """Whether the label of a :data:`HEADER` is a queued lock's of the task with this id."""
    return mark[1].endswith(printable(f"[{task_id}]") + QUEUED)


def _header(value: Any) -> tuple[list[str], str] | None:
    """``(resources, label)`` of a :data:`HEADER`, or None when absent or malformed (it came from the broker)."""
    if isinstance(value, (list, tuple)) and len(value) == 2:
        resources, text = value
        if isinstance(text, str) and text and isinstance(resources, list) and resources:
            if all(isinstance(r, str) for r in resources):
                return resources, text
    return None


def may_retry(task: Any, exc: BaseException) -> bool:
    """Whether Celery may retry the task after its body raised ``exc``: ``self.retry()``, ``autoretry_for``."""
    retried = tuple(getattr(task, "autoretry_for", None) or ())
    spared = tuple(getattr(task, "dont_autoretry_for", None) or ())
    return isinstance(exc, Retry) or (isinstance(exc, retried) and not isinstance(exc, spared))


def _bound(task: Any) -> bool:
    """Whether the task's body takes the task as its first argument (``bind=True``, a class's ``run``)."""
    return inspect.ismethod(getattr(task, "_orig_run", task.run))


def finished(task: Any = None, state: str | None = None, **_: Any) -> None:
    """After the task: release a lock kept for a retry that was not sent (``autoretry_for`` gave up)."""
    request = getattr(task, "request", None)
    kept = vars(request).pop(KEPT, None) if request is not None else None
    if kept is None:
        return
    kept.release()
    if kept.lost:
        logger.error(
            "Task %s ended %s and its lock %r was lost while it ran (%s).", task.name, state, kept.resource, kept.lost_reason
        )


def revoked(request: Any = None, **_: Any) -> None:
    """A revoked (or expired) task: release the lock it was sent under."""
    mark = _header((getattr(request, "headers", None) or {}).get(HEADER))
    if mark is None or not _sent_under(mark, getattr(request, "id", None)):
        return
    from django_redlock.manager import get_lock_manager

    manager = get_lock_manager()
    try:
        record = manager.lock_record(mark[0][0])
        if record is not None and record.holder.label == mark[1]:
            manager.adopt(mark[0], record.holder.token).release()
    except (LockLost, LockNotAcquired, ValueError):
        pass  # released, expired or taken over; or the nodes are down: it expires by itself


task_postrun.connect(finished, weak=False, dispatch_uid="django_redlock.celery_send.finished")
task_revoked.connect(revoked, weak=False, dispatch_uid="django_redlock.celery_send.revoked")
