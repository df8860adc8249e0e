"""Celery tasks that run under a Redlock: ``@redlock_task`` and ``base=RedlockTask``.

The lock is taken when the task starts running (in a worker, or eagerly), on a
resource named from the task's arguments, kept alive by the watchdog while the
body runs, and released when the body returns or raises. When another holder
has it, the task is skipped, retried (after ``retry_countdown``, or the lock's
Retry-After), waits in line, or fails, as configured per task. With
``lock_on_send`` the lock is taken when the task is sent instead, and a
duplicate is refused then (:mod:`django_redlock.celery_send`). A lock lost
while the body ran fails the task with :class:`~django_redlock.exceptions.LockLost`;
too few lock nodes (:class:`~django_redlock.exceptions.QuorumUnavailable`)
fails it too: neither is ever reported as success or as a skip.

Celery is an optional dependency: ``pip install 'django-redlock[celery]'``.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeVar

try:
    import celery
    from celery import current_task
    from celery.exceptions import Retry
    from celery.local import Proxy
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "django_redlock.celery needs Celery 5.3 or later: pip install 'django-redlock[celery]'"
    ) from exc

from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS

from django_redlock import celery_send, conf
from django_redlock.core import Lock, base
from django_redlock.adapters import transactions
from django_redlock.core.records import printable
from django_redlock.adapters.answers import retry_after_seconds
from django_redlock.adapters.keys import Keys, KeysSpec
from django_redlock.celery_send import TaskAlreadyQueued, WhenDuplicate
from django_redlock.exceptions import LockLost, LockNotAcquired, QuorumUnavailable

__all__ = [
    "SKIPPED", "RedlockTask", "TaskAlreadyQueued", "WhenDuplicate", "WhenLocked", "current_lock", "redlock_task",
]

logger = logging.getLogger("django_redlock")

#: What a task skipped with ``when_locked="skip"`` returns (a plain string, so
#: every result backend and serializer stores it).
SKIPPED: Final = "django_redlock:skipped"

#: What a task does when another holder has its lock.
WhenLocked = Literal["skip", "retry", "wait", "fail"]
MODES: tuple[str, ...] = ("skip", "retry", "wait", "fail")

F = TypeVar("F", bound=Callable[..., Any])

_current: ContextVar[Lock | None] = ContextVar("django_redlock_task_lock", default=None)


def current_lock() -> Lock | None:
    """The lock held by the task body running in this thread, or None outside one.

    Long bodies can check ``current_lock().lost`` between steps and stop early,
    and pass ``current_lock().fencing_token`` to the storage they write to.
    """
    return _current.get()


def redlock_task(
    key: KeysSpec,
    ttl: float | None = None,
    *,
    when_locked: WhenLocked = "retry",
    wait_timeout: float | None = None,
    auto_extend: bool = True,
    label: str | None = None,
    atomic: bool | str | Sequence[str] = False,
    retry_countdown: float | None = None,
    lock_on_send: bool = False,
    queued_ttl: float | None = None,
    when_duplicate: WhenDuplicate = "raise",
) -> Callable[[F], F]:
    """Run a Celery task's body while holding a Redlock; stack it under ``@app.task``.

    .. code-block:: python

        @app.task(bind=True, max_retries=10)
        @redlock_task("report-{customer_id}", when_locked="retry")
        def build_report(self, customer_id): ...

    ``key`` is a format string over the task's parameters
    (``"report-{customer_id}"``; with ``bind=True`` also ``self``, the task),
    a list of them locked together (all or nothing), or a callable taking the
    task's arguments and returning the resource (or a list of resources).
    A placeholder the function does not take is an ``ImproperlyConfigured``
    error when the module is imported.

    ``ttl`` defaults to ``REDLOCK['TTL']``; with ``auto_extend`` (the default)
    the watchdog extends the lock while the body runs, so the ttl only bounds
    how long a crashed worker keeps it. When another holder has the lock:

    - ``"retry"`` (default): ``self.retry(countdown=...)``, the countdown being
      ``retry_countdown`` seconds when given, else the lock's Retry-After (at
      least 1 s; about one ttl while the holder keeps it alive), within the
      task's ``max_retries``; past them the task fails with ``LockNotAcquired``;
    - ``"skip"``: the body does not run, the task succeeds with :data:`SKIPPED`
      (logged at INFO);
    - ``"wait"``: wait in line up to ``wait_timeout`` seconds (required), then
      fail with ``LockNotAcquired``; the worker slot is busy meanwhile;
    - ``"fail"``: fail at once with ``LockNotAcquired``.

    Too few lock nodes answering raises
    :class:`~django_redlock.exceptions.QuorumUnavailable` in every mode: the
    task fails (add it to ``autoretry_for`` to retry instead). A lock lost
    while the body ran fails the task with
    :class:`~django_redlock.exceptions.LockLost` (its return value is
    discarded); the body is not interrupted, see :func:`current_lock`. The
    lock is released when the body returns or raises, ``self.retry()``
    included. ``label`` (default: the task's name and id) is shown by
    ``manage.py redlock list``.

    ``atomic=True`` runs the body in a transaction on the default database
    (a database alias, or a list of them: on each), opened inside the lock
    and committed before the release, only if the lock is still held then
    (the nodes are asked); otherwise it is rolled back and the task fails
    with ``LockLost``. A body that raises (``self.retry()`` included) is
    rolled back. Its ``on_commit`` callbacks run under the lock.

    ``lock_on_send=True`` takes the lock when the task is sent instead
    (``.delay()``, ``.apply_async()``; the task's class must be
    :class:`RedlockTask`): while the task is queued or running, sending it
    again raises :class:`TaskAlreadyQueued`, or with
    ``when_duplicate="result"`` returns the queued task's ``AsyncResult``.
    The lock lives ``queued_ttl`` seconds while queued (default:
    ``REDLOCK['MAX_TTL']``); the worker that runs the task takes it over
    as its own, with ``ttl``, kept alive while the body runs. A retry keeps
    it; success, failure, a rejection or a revoke release it. See
    :ref:`celery-lock-on-send`.
    """
    celery_send.check_send(lock_on_send, queued_ttl, when_duplicate)
    if when_locked not in MODES:
        raise ImproperlyConfigured(f"when_locked must be one of {', '.join(map(repr, MODES))}; got {when_locked!r}.")
    if when_locked == "wait":
        if wait_timeout is None:
            raise ImproperlyConfigured(
                "when_locked='wait' needs wait_timeout (seconds): a worker slot waits that long at most."
            )
        base.check_seconds(wait_timeout, "wait_timeout", allow_zero=True)
    elif wait_timeout is not None:
        raise ImproperlyConfigured(
            f"wait_timeout={wait_timeout!r} is only used with when_locked='wait'; got when_locked={when_locked!r}."
        )
    if retry_countdown is not None:
        if when_locked != "retry":
            raise ImproperlyConfigured(
                f"retry_countdown={retry_countdown!r} is only used with when_locked='retry'; "
                f"got when_locked={when_locked!r}."
            )
        base.check_seconds(retry_countdown, "retry_countdown", allow_zero=True)
    if ttl is not None:
        base.check_ttl(ttl, 1.0)
    base.check_flag(auto_extend, "auto_extend")
    if label is not None and not isinstance(label, str):
        raise ImproperlyConfigured(f"label must be a string or None; got {label!r}.")
    aliases = _atomic_aliases(atomic)
    base.check_label(label)

    def decorator(func: F) -> F:
        _check_target(func)
        spec = Keys(key, func)
        send = celery_send.Send(queued_ttl, when_duplicate) if lock_on_send else None
        runner = _Runner(func, spec, ttl, when_locked, wait_timeout, auto_extend, label, aliases, retry_countdown, send)

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return runner(wrapper, args, kwargs)

        # Celery checks call arguments against this signature (task.__header__).
        wrapper.__signature__ = inspect.signature(func)  # type: ignore[attr-defined]
        wrapper._redlock_runner = runner  # type: ignore[attr-defined]  # RedlockTask.apply_async takes it when sent
        return wrapper  # type: ignore[return-value]

    return decorator


def _atomic_aliases(atomic: Any) -> tuple[str, ...]:
    """The databases ``atomic=`` names, the first one's transaction innermost."""
    if atomic is True or atomic is False:
        return (DEFAULT_DB_ALIAS,) if atomic else ()
    if isinstance(atomic, str):
        atomic = [atomic]
    if isinstance(atomic, (list, tuple)) and atomic and all(isinstance(a, str) and a for a in atomic):
        return tuple(atomic)
    raise ImproperlyConfigured(
        f"atomic must be True, False, a database alias or a list of aliases (e.g. ['default']); got {atomic!r}."
    )


def _check_target(func: Any) -> None:
    if issubclass(type(func), (Proxy, celery.Task)):
        raise ImproperlyConfigured(
            "@redlock_task decorates the task's function: put it below @app.task / @shared_task, not above."
        )
    if not callable(func):
        raise ImproperlyConfigured(f"@redlock_task decorates a function; got {func!r}.")
    if inspect.iscoroutinefunction(func):
        raise ImproperlyConfigured("@redlock_task cannot decorate an async def function: Celery runs sync tasks.")


@dataclass(frozen=True)
class _Runner:
    """One decorated task body: acquire (after releasing the lock it was sent under), run under the
    watchdog, release (or keep for a retry), judge."""

    func: Callable[..., Any]
    spec: Keys
    ttl: float | None
    when_locked: str
    wait_timeout: float | None
    auto_extend: bool
    label: str | None
    atomic: tuple[str, ...]
    retry_countdown: float | None = None
    send: celery_send.Send | None = None

    def __call__(self, wrapper: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        from django_redlock.manager import get_lock_manager

        task = _running_task(wrapper)
        name = task.name if task is not None else getattr(self.func, "__qualname__", repr(self.func))
        resource = self.spec.format(args, kwargs)
        conf.check_max_ttl(self.ttl)
        sent = self.send is not None and task is not None and not task.request.called_directly
        if sent and not isinstance(task, RedlockTask):
            raise ImproperlyConfigured(
                f"Task {name} uses lock_on_send=True: its class must be RedlockTask, which takes the lock when "
                "the task is sent: @app.task(base=RedlockTask, ...)."
            )
        manager = get_lock_manager()
        label = self.label if self.label is not None else _label(task)
        if sent:
            celery_send.take_over(manager, task, resource, _describe(task, name))
            label = celery_send.label(self.label, name, task.request.id)
        waits = self.when_locked == "wait"
        hold = manager.lock(
            resource,
            self.ttl,
            blocking=waits,
            timeout=self.wait_timeout if waits else None,
            label=label,
            auto_extend=self.auto_extend,
        )
        try:
            lock = hold.__enter__()
        except QuorumUnavailable:
            # Nobody can hold the lock: an outage, never a skip or an ordinary retry.
            raise
        except LockNotAcquired as error:
            # The engine has logged why (INFO) and sent lock_not_acquired; say what the task does.
            if self.when_locked == "skip":
                logger.info("Task %s skipped: %r is locked.", _describe(task, name), error.resource)
                return SKIPPED
            if self.when_locked == "retry" and task is not None:
                countdown = self.retry_countdown if self.retry_countdown is not None else retry_after_seconds(error)
                logger.info("Task %s retries in %g s: %r is locked.", _describe(task, name), countdown, error.resource)
                raise task.retry(countdown=countdown, exc=error) from None
            raise
        if sent:
            vars(task.request)[celery_send.KEPT] = lock  # a retry's message takes it over
        token = _current.set(lock)
        try:
            # A transaction asked for commits inside the lock, while it is still held, before the release.
            result = transactions.run(list(self.atomic), lock, lambda: self.func(*args, **kwargs))
        except BaseException as exc:
            _current.reset(token)
            if sent and celery_send.may_retry(task, exc) and vars(task.request).get(celery_send.KEPT) is lock:
                raise  # kept for the retry autoretry_for may send; released after the task if it does not
            if sent:
                vars(task.request).pop(celery_send.KEPT, None)
            # Asked as if the body had ended well, for the log line: the body's own exception goes on.
            if hold.leave() is not None and not isinstance(exc, Retry):
                logger.error(
                    "Task %s raised %s and its lock %r was lost while it ran (%s).",
                    _describe(task, name), type(exc).__name__, lock.resource, lock.lost_reason,
                )
            raise
        _current.reset(token)
        if sent:
            vars(task.request).pop(celery_send.KEPT, None)
        lost = hold.leave()  # found by the watchdog while the body ran, or by the release itself
        if lost is not None:
            raise LockLost(
                f"Task {_describe(task, name)}: {lost} (while the task ran); the task's result is discarded.",
                resource=lock.resource,
            )
        return result


def _running_task(wrapper: Callable[..., Any]) -> Any:
    """The Celery task whose body ``wrapper`` is, when it runs as that task; else None.

    Celery puts the running task on a per-thread stack (worker, ``apply()``,
    eager mode and direct calls alike). It is ours when its ``run`` is
    ``wrapper``, possibly wrapped again (``autoretry_for``); a body called as
    a plain function from inside another task gets None, not that task.
    """
    task = current_task._get_current_object()
    if task is None:
        return None
    run = getattr(task, "run", None)
    for _ in range(8):
        if run is None:
            break
        if getattr(run, "__func__", run) is wrapper:
            return task
        run = getattr(run, "__wrapped__", None)
    return None


def _label(task: Any) -> str | None:
    """The default label: the task's name and id, which its sender chose (escaped, so that a label may hold them)."""
    if task is None:
        return None
    task_id = getattr(task.request, "id", None)
    return printable(f"celery {task.name}[{task_id}]" if task_id else f"celery {task.name}")


def _describe(task: Any, name: str) -> str:
    task_id = getattr(task.request, "id", None) if task is not None else None
    return printable(f"{name}[{task_id}]") if task_id else name


#: The keys of ``RedlockTask.redlock``: ``key`` (required) and :func:`redlock_task`'s keyword arguments.
OPTION_KEYS: tuple[str, ...] = (
    "key", "ttl", "when_locked", "wait_timeout", "auto_extend", "label", "atomic",
    "retry_countdown", "lock_on_send", "queued_ttl", "when_duplicate",
)


class RedlockTask(celery.Task):  # type: ignore[misc]
    """A task base class: ``@app.task(base=RedlockTask, redlock={...})``.

    .. code-block:: python

        @app.task(base=RedlockTask, redlock={"key": "report-{customer_id}", "when_locked": "skip"})
        def build_report(customer_id): ...

    ``redlock`` takes ``key`` and the keyword arguments of :func:`redlock_task`
    (``ttl``, ``when_locked``, ``wait_timeout``, ``auto_extend``, ``label``, ``atomic``,
    ``retry_countdown``, ``lock_on_send``, ``queued_ttl``, ``when_duplicate``),
    with the same behaviour; a body decorated with :func:`redlock_task` needs
    no ``redlock``. Its ``apply_async`` (``delay``) takes the lock of a
    ``lock_on_send`` task. It also works for class-based tasks (set the
    ``redlock`` attribute and define ``run``). Mistakes are reported when
    Celery creates the task class, which for ``@shared_task`` and lazy apps is
    when the app is finalized rather than at import; :func:`redlock_task`
    reports them at import.
    """

    #: ``{"key": ..., "ttl": ..., "when_locked": ..., ...}``: see :func:`redlock_task`.
    redlock: Mapping[str, Any] | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own_run = cls.__dict__.get("run")
        if own_run is None:
            if "redlock" not in cls.__dict__:
                return  # inherits its parent's body and options as they are
            own_run = _raw_run(cls)  # new options for an inherited body
            if own_run is None:
                return  # an intermediate base class without a body: nothing to lock yet
        options = cls.redlock
        if options is None and _runner_of(own_run) is not None:
            return  # @redlock_task below @app.task(base=RedlockTask): its options are the decorator's
        if options is None:
            raise ImproperlyConfigured(
                f"Task {cls.__name__} uses RedlockTask but sets no redlock={{'key': ...}} option."
            )
        if not isinstance(options, Mapping) or "key" not in options:
            raise ImproperlyConfigured(
                f"Task {cls.__name__}: redlock must be a dict with at least 'key'; got {options!r}."
            )
        unknown = sorted(set(options) - set(OPTION_KEYS))
        if unknown:
            raise ImproperlyConfigured(
                f"Task {cls.__name__}: unknown redlock option(s) {', '.join(map(repr, unknown))}; "
                f"valid: {', '.join(OPTION_KEYS)}."
            )
        is_static = isinstance(own_run, staticmethod)
        func = own_run.__func__ if is_static else own_run
        settings = dict(options)
        wrapped = redlock_task(settings.pop("key"), **settings)(func)
        cls._redlock_raw_run = own_run
        cls.run = staticmethod(wrapped) if is_static else wrapped

    def apply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        """Send the task; a ``lock_on_send`` task takes its lock first (see :func:`redlock_task`)."""
        runner = _runner_of(getattr(self, "_orig_run", self.run))
        if runner is None or runner.send is None:
            return super().apply_async(args, kwargs, **options)
        return runner.send.send(runner.spec.format, runner.label, self, args, kwargs, options, super().apply_async)


def _runner_of(run: Any) -> _Runner | None:
    """The :class:`_Runner` of a body decorated with :func:`redlock_task` (a function, method or staticmethod)."""
    func = getattr(run, "__func__", run)
    return getattr(func, "_redlock_runner", None)


def _raw_run(cls: type) -> Any:
    """The undecorated body an ancestor locked, or None."""
    for klass in cls.__mro__[1:]:
        if "_redlock_raw_run" in klass.__dict__:
            return klass.__dict__["_redlock_raw_run"]
    return None
