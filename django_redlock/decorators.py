"""``@redlock`` for views (sync and async) and functions; ``@redlock_command`` for management commands."""

from __future__ import annotations

import functools
import inspect
import logging
import math
import signal
import string
import threading
import time
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, cast

from asgiref.sync import iscoroutinefunction
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.http.response import HttpResponseBase
from django.utils.module_loading import import_string

from django_redlock import conf
from django_redlock.core import base, steps
from django_redlock.exceptions import LockLost, LockNotAcquired, QuorumUnavailable

__all__ = [
    "EXIT_LOCKED",
    "EXIT_LOST",
    "EXIT_NODES_UNAVAILABLE",
    "RedlockMixin",
    "locked_response",
    "lost_response",
    "redlock",
    "redlock_command",
]

logger = logging.getLogger("django_redlock")

#: A lock key: a format string, or a callable returning the resource (or a list of them).
KeySpec = str | Callable[..., Any]
#: What ``@redlock`` takes: one key, or a list of format strings to lock together (all or nothing).
KeysSpec = KeySpec | list[str] | tuple[str, ...]

_P = ParamSpec("_P")
_R = TypeVar("_R")
_F = TypeVar("_F", bound=Callable[..., Any])  # a command class or its handle()


# -- keys ------------------------------------------------------------------------


class Key:
    """A lock key: a format string filled from the call's arguments, or a callable."""

    def __init__(self, spec: KeySpec, func: Callable[..., Any] | None) -> None:
        if not (isinstance(spec, str) and spec) and not callable(spec):
            raise ImproperlyConfigured(f"redlock key must be a non-empty format string or a callable; got {spec!r}.")
        self.spec = spec
        self.fields: list[str] = []
        self.signature: inspect.Signature | None = None
        if func is not None:
            try:
                self.signature = inspect.signature(func)
            except (TypeError, ValueError):
                self.signature = None
        if isinstance(spec, str):
            try:
                parsed = list(string.Formatter().parse(spec))
            except ValueError as exc:
                raise ImproperlyConfigured(f"redlock key {spec!r} is not a valid format string: {exc}.") from None
            for _, field, _, _ in parsed:
                if field is None:
                    continue
                root = field.split(".", 1)[0].split("[", 1)[0]
                if not root or root.isdigit():
                    raise ImproperlyConfigured(
                        f"redlock key {spec!r}: use named placeholders such as '{{pk}}', not {{{field}}}."
                    )
                self.fields.append(root)
            self._check_fields(func)

    def _check_fields(self, func: Callable[..., Any] | None) -> None:
        if self.signature is None:
            return
        params = self.signature.parameters
        if any(p.kind is p.VAR_KEYWORD for p in params.values()):
            return  # URL kwargs arrive through **kwargs: checked per call
        missing = [f for f in self.fields if f not in params]
        if missing:
            name = getattr(func, "__qualname__", repr(func))
            raise ImproperlyConfigured(
                f"redlock key {self.spec!r} uses {', '.join(map(repr, missing))}, which {name}() does not take; "
                f"available: {', '.join(params) or 'nothing'}."
            )

    def values(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        values: dict[str, Any] = {}
        if self.signature is not None:
            try:
                bound = self.signature.bind_partial(*args, **kwargs)
                bound.apply_defaults()
                values.update(bound.arguments)
                for param in self.signature.parameters.values():
                    if param.kind is param.VAR_KEYWORD:
                        values.update(values.pop(param.name, {}))
            except TypeError:
                values.update(kwargs)
        else:
            values.update(kwargs)
        request = find_request(args, kwargs)
        if request is not None:
            values.setdefault("request", request)
        return values

    def format(self, args: tuple[Any, ...], kwargs: dict[str, Any], extra: dict[str, Any] | None = None) -> str:
        values = self.values(args, kwargs)
        if extra:
            values.update(extra)
        if callable(self.spec):
            key = self.spec(*args, **kwargs)
        else:
            missing = [f for f in self.fields if f not in values]
            if missing:
                raise ImproperlyConfigured(
                    f"redlock key {self.spec!r}: no value for {', '.join(map(repr, missing))} in this call "
                    f"(have: {', '.join(sorted(values)) or 'nothing'}); refusing to lock the literal key."
                )
            try:
                key = self.spec.format(**values)
            except (AttributeError, KeyError, IndexError) as exc:
                raise ImproperlyConfigured(f"redlock key {self.spec!r} could not be filled: {exc!r}.") from None
        if callable(self.spec) and isinstance(key, (list, tuple)) and key and all(isinstance(k, str) and k for k in key):
            return list(key)  # type: ignore[return-value]  # a callable may name several resources
        if not isinstance(key, str) or not key:
            raise ImproperlyConfigured(f"redlock key {self.spec!r} produced {key!r}; expected a non-empty string.")
        return key


class Keys:
    """One :class:`Key`, or several locked together (a list or tuple of format strings)."""

    def __init__(self, spec: KeysSpec, func: Callable[..., Any] | None) -> None:
        if isinstance(spec, (list, tuple)):
            if not spec or not all(isinstance(s, str) for s in spec):
                raise ImproperlyConfigured(f"redlock keys must be a non-empty list of format strings; got {spec!r}.")
            self.keys = [Key(s, func) for s in spec]
            self.several = True
        else:
            self.keys = [Key(spec, func)]
            self.several = False

    def format(self, args: tuple[Any, ...], kwargs: dict[str, Any], extra: dict[str, Any] | None = None) -> Any:
        """The resource to lock, or the list of resources."""
        if not self.several:
            return self.keys[0].format(args, kwargs, extra)
        return [key.format(args, kwargs, extra) for key in self.keys]


def find_request(args: tuple[Any, ...], kwargs: dict[str, Any]) -> HttpRequest | None:
    """The view's request among the first arguments (a REST framework Request: the request it wraps)."""
    for value in (*args[:2], kwargs.get("request")):
        if isinstance(value, HttpRequest):
            return value
        wrapped = getattr(value, "_request", None)  # rest_framework.request.Request
        if isinstance(wrapped, HttpRequest):
            wrapped._redlock_api = True  # type: ignore[attr-defined]  # answered in JSON
            return wrapped
    return None


def wants_json(request: HttpRequest) -> bool:
    """True when the client prefers JSON to HTML (Accept), or the view is a REST framework view."""
    if getattr(request, "_redlock_api", False):
        return True
    best: dict[str, tuple[float, int]] = {}
    for order, part in enumerate(request.headers.get("Accept", "").split(",")):
        media, *params = (p.strip() for p in part.split(";"))
        q = 1.0
        for param in params:
            if param.startswith("q="):
                try:
                    q = float(param[2:])
                except ValueError:
                    q = 0.0
        kind = "json" if media == "application/json" or media.endswith("+json") else "html" if media == "text/html" else ""
        if kind and (kind not in best or q > best[kind][0]):
            best[kind] = (q, -order)
    json_rank, html_rank = best.get("json"), best.get("html")
    return json_rank is not None and json_rank[0] > 0 and (html_rank is None or json_rank > html_rank)


# -- the contended response ---------------------------------------------------

LOCKED_DETAIL = "Someone else is working on this right now. Please try again shortly."
UNAVAILABLE_DETAIL = "The lock service cannot be reached right now. Please try again shortly."


def locked_response(request: HttpRequest, error: LockNotAcquired) -> HttpResponse:
    """The default answer when the lock is held: 423 Locked with Retry-After.

    When too few lock nodes answered (:class:`~django_redlock.exceptions.QuorumUnavailable`)
    nobody holds the lock: the answer is 503 Service Unavailable instead.
    A client that prefers JSON (``Accept``), and a REST framework view, get
    ``{"detail": ..., "code": "locked" | "lock_service_unavailable",
    "retry_after": seconds}`` instead of HTML. Neither says which nodes or
    holders were involved.
    """
    retry_after = retry_after_seconds(error)
    if wants_json(request):
        unavailable = isinstance(error, QuorumUnavailable)
        response: HttpResponse = JsonResponse(
            {
                "detail": UNAVAILABLE_DETAIL if unavailable else LOCKED_DETAIL,
                "code": "lock_service_unavailable" if unavailable else "locked",
                "retry_after": retry_after,
            },
            status=503 if unavailable else 423,
        )
        response["Retry-After"] = str(retry_after)
        return response
    if isinstance(error, QuorumUnavailable):
        response = HttpResponse(
            "<!doctype html><title>503 Service Unavailable</title><h1>Service unavailable</h1>"
            f"<p>{UNAVAILABLE_DETAIL}</p>",
            status=503,
            content_type="text/html; charset=utf-8",
        )
    else:
        response = HttpResponse(
            "<!doctype html><title>423 Locked</title><h1>Locked</h1>"
            f"<p>{LOCKED_DETAIL}</p>",
            status=423,
            content_type="text/html; charset=utf-8",
        )
    response["Retry-After"] = str(retry_after)
    return response


LOST_DETAIL = (
    "The lock this request held was lost before its work was done, so the work may have overlapped "
    "another. Please check the outcome before trying again."
)


def lost_response(request: HttpRequest, error: LockLost) -> HttpResponse:
    """The answer of a view whose lock was lost while it ran: 500 Internal Server Error.

    The view's own response is discarded: its work ran, at least in part, without
    the lock, and another holder may have run beside it. A client that prefers
    JSON, and a REST framework view, get ``{"detail": ..., "code": "lock_lost"}``.
    """
    if wants_json(request):
        return JsonResponse({"detail": LOST_DETAIL, "code": "lock_lost"}, status=500)
    return HttpResponse(
        "<!doctype html><title>500 Internal Server Error</title><h1>Server error</h1>"
        f"<p>{LOST_DETAIL}</p>",
        status=500,
        content_type="text/html; charset=utf-8",
    )


def _outcome(lock: Any, result: Any, request: HttpRequest | None) -> Any:
    """The call's result once its lock is released; if the lock was lost while the code ran, a
    view (a call with a request that returned a response) answers :func:`lost_response` and
    anything else raises :class:`LockLost`."""
    error = lock._lost_error()
    if error is None:
        return result
    if request is None or not isinstance(result, HttpResponseBase):
        raise error
    roll_back_request()
    return lost_response(request, error)


def roll_back_request() -> None:
    """Mark the request's transactions (``ATOMIC_REQUESTS``) for rollback: the 500 answered for a
    lost lock is not an exception, and Django would commit the work done without the lock."""
    from django.db import connections

    for connection in connections.all(initialized_only=True):
        if connection.settings_dict.get("ATOMIC_REQUESTS") and connection.in_atomic_block:
            connection.set_rollback(True)


def retry_after_seconds(error: LockNotAcquired) -> int:
    if error.retry_after is None:
        return 1
    return max(1, math.ceil(error.retry_after))


def _handler(on_locked: Callable[..., HttpResponse] | str | None) -> Callable[..., HttpResponse]:
    if on_locked is None:
        on_locked = conf.get_config()["LOCKED_RESPONSE"]
    if on_locked is None:
        return locked_response
    if isinstance(on_locked, str):
        try:
            on_locked = import_string(on_locked)
        except ImportError as exc:
            raise ImproperlyConfigured(f"REDLOCK['LOCKED_RESPONSE'] = {on_locked!r} cannot be imported: {exc}") from None
    if not callable(on_locked):
        raise ImproperlyConfigured(f"on_locked must be a callable (request, error) -> HttpResponse; got {on_locked!r}.")
    return on_locked


# -- @redlock ----------------------------------------------------------------------


def redlock(
    key: KeysSpec,
    ttl: float | None = None,
    *,
    blocking: bool = False,
    timeout: float | None = None,
    label: str | None = None,
    auto_extend: bool = False,
    on_locked: Callable[..., HttpResponse] | str | None = None,
    reentrant: bool = False,
) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """Run the decorated view or function while holding a Redlock.

    ``key`` is a format string filled from the call's arguments (for views:
    the URL kwargs and ``request``, e.g. ``"invoice-{pk}"`` or
    ``"user-{request.user.pk}"``), or a callable taking the same arguments.
    A list of format strings (``["account-{src}", "account-{dst}"]``), or a
    callable returning a list, locks those resources together, all or
    nothing. ``reentrant=True`` lets a call made while the same thread
    (or task) already holds the lock enter it again instead of failing.
    A view whose lock is held answers 423 Locked with ``Retry-After``
    (``on_locked`` or ``REDLOCK['LOCKED_RESPONSE']`` replaces that); a plain
    function raises :class:`~django_redlock.exceptions.LockNotAcquired`.
    The lock is released when the call returns or raises; for a streaming
    response, once the stream has been consumed or closed. If the lock was
    lost while the code ran, a view answers 500 (:func:`lost_response`) and a
    plain function raises :class:`~django_redlock.exceptions.LockLost`, as
    ``with manager.lock()`` does; an exception of the code's own goes on as it
    is. A ``ttl`` above ``REDLOCK['MAX_TTL']`` raises :class:`ValueError` when
    the view is called.
    """
    if ttl is not None:
        base.check_ttl(ttl, 1.0)
    base.check_wait(blocking, timeout)
    base.check_flag(reentrant, "reentrant")

    def decorator(func: Callable[_P, _R]) -> Callable[_P, _R]:
        if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
            name = getattr(func, "__qualname__", repr(func))
            raise TypeError(
                f"@redlock cannot lock {name}(), a generator function: calling it returns before its body "
                "runs, so the lock would be released first. Take the lock inside the generator instead: "
                "with manager.lock(...) (async with for an async generator)."
            )
        spec = Keys(key, func)
        options: dict[str, Any] = {
            "ttl": ttl, "blocking": blocking, "timeout": timeout, "label": label, "reentrant": reentrant
        }

        if iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: _P.args, **kwargs: _P.kwargs) -> Any:
                from django_redlock.manager import get_async_lock_manager

                resource = spec.format(args, kwargs)
                conf.check_max_ttl(ttl)
                manager = get_async_lock_manager()
                try:
                    lock = await manager.acquire(resource, **options)
                except LockNotAcquired as error:
                    request = find_request(args, kwargs)
                    if request is None:
                        raise
                    return _handler(on_locked)(request, error)
                keeper = _start_async_keeper(lock) if auto_extend and lock._depth == 1 else None
                try:
                    result = await func(*args, **kwargs)
                except BaseException:
                    await _stop_async(keeper, lock)
                    raise
                if _is_streaming(result) and not lock.lost:
                    return _release_after_stream(result, lock, keeper)
                await _stop_async(keeper, lock)
                return _outcome(lock, result, find_request(args, kwargs))

            # func is a coroutine function: so is the wrapper, with func's parameters and result.
            return cast("Callable[_P, _R]", async_wrapper)

        @functools.wraps(func)
        def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> Any:
            from django_redlock.manager import get_lock_manager

            resource = spec.format(args, kwargs)
            conf.check_max_ttl(ttl)
            manager = get_lock_manager()
            try:
                lock = manager.acquire(resource, **options)
            except LockNotAcquired as error:
                request = find_request(args, kwargs)
                if request is None:
                    raise
                return _handler(on_locked)(request, error)
            if auto_extend and lock._depth == 1:  # a re-entered lock is kept alive by its outer call
                manager._watch(lock, None, None)
            try:
                result = func(*args, **kwargs)
            except BaseException:
                lock.release()
                raise
            if _is_streaming(result) and not lock.lost:
                return _release_after_stream(result, lock, None)
            lock.release()
            return _outcome(lock, result, find_request(args, kwargs))

        return wrapper

    return decorator


def _is_streaming(result: Any) -> bool:
    return isinstance(result, HttpResponseBase) and getattr(result, "streaming", False)


def _release_after_stream(response: Any, lock: Any, keeper: Any) -> Any:
    """Release once the server has sent the stream and closed the response."""

    def release() -> None:
        if keeper is not None:
            keeper.cancel()
        if inspect.iscoroutinefunction(lock.release):
            # Closed from a worker thread: release through the sync manager's own connections.
            _release_async_lock_sync(lock)
        else:
            lock.release()

    closers = getattr(response, "_resource_closers", None)
    if closers is not None:
        closers.append(release)
    else:  # pragma: no cover - every supported Django has _resource_closers
        release()
    return response


def _release_async_lock_sync(lock: Any) -> None:
    from django_redlock.manager import get_lock_manager

    if lock._start_release():
        lock._judge_release(get_lock_manager()._release_keys(lock.resources, lock.value, place=lock._place))


def _start_async_keeper(lock: Any) -> Any:
    import asyncio

    from django_redlock.core.async_manager import _keep_alive

    return asyncio.ensure_future(_keep_alive(lock, None, None))


async def _stop_async(keeper: Any, lock: Any) -> None:
    if keeper is not None:
        keeper.cancel()
    await lock.release()


class RedlockMixin:
    """Class-based views: hold a Redlock around ``dispatch``.

    Set ``redlock_key`` to a format string over the URL kwargs, ``request``
    and ``view`` (``"report-{pk}"``, ``"user-{request.user.pk}"``), or
    override :meth:`get_redlock_key`; a list of format strings locks them
    together. ``redlock_ttl``, ``redlock_blocking``, ``redlock_timeout``,
    ``redlock_reentrant`` and ``redlock_on_locked`` work as the arguments of
    :func:`redlock`; a lock lost while the view ran is answered as there.
    """

    redlock_key: str | list[str] | None = None
    redlock_ttl: float | None = None
    redlock_blocking: bool = False
    redlock_timeout: float | None = None
    redlock_reentrant: bool = False
    redlock_on_locked: Callable[..., HttpResponse] | str | None = None

    def get_redlock_key(self) -> str | list[str]:
        """The resource to lock for this request (or the resources, together)."""
        if not self.redlock_key:
            raise ImproperlyConfigured(f"{type(self).__name__} needs redlock_key or a get_redlock_key() method.")
        spec = Keys(self.redlock_key, None)
        kwargs: dict[str, Any] = dict(self.kwargs)  # type: ignore[attr-defined]
        resources: str | list[str] = spec.format((), kwargs, {"request": self.request, "view": self})  # type: ignore[attr-defined]
        return resources

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        from django_redlock.manager import get_lock_manager

        if _is_api_view(self):
            request._redlock_api = True  # type: ignore[attr-defined]  # answered in JSON, as @redlock does
        resource = self.get_redlock_key()
        conf.check_max_ttl(self.redlock_ttl)
        try:
            lock = get_lock_manager().acquire(
                resource,
                self.redlock_ttl,
                blocking=self.redlock_blocking,
                timeout=self.redlock_timeout,
                reentrant=self.redlock_reentrant,
            )
        except LockNotAcquired as error:
            return _handler(self.redlock_on_locked)(request, error)
        try:
            response = super().dispatch(request, *args, **kwargs)  # type: ignore[misc]
        except BaseException:
            lock.release()
            raise
        if _is_streaming(response) and not lock.lost:
            return _release_after_stream(response, lock, None)
        lock.release()
        return _outcome(lock, response, request)


def _is_api_view(view: Any) -> bool:
    """True for a REST framework view (never imports REST framework)."""
    import sys

    views = sys.modules.get("rest_framework.views")
    return views is not None and isinstance(view, views.APIView)


# -- @redlock_command -------------------------------------------------------------

SKIP, WAIT, FAIL = "skip", "wait", "fail"

#: Exit codes of a command decorated with :func:`redlock_command` (0: done, or skipped because held).
EXIT_LOCKED = 1  # held by another host, with --lock-fail or after --lock-wait
EXIT_LOST = 3  # the lock was lost while the command ran; the command was stopped
EXIT_NODES_UNAVAILABLE = 4  # too few lock nodes answered: nobody can hold the lock
# A signal N (SIGTERM, SIGINT) stops the command with 128 + N, after the lock is released.


def redlock_command(
    key: KeySpec | None = None,
    ttl: float | None = None,
    *,
    when_locked: str = SKIP,
    wait_timeout: float | None = None,
    stop_on_lost: bool = True,
) -> Callable[[_F], _F]:
    """Let a management command run on one host at a time (cron on many hosts).

    Decorate a ``BaseCommand`` subclass (or its ``handle``). The lock key
    defaults to ``command:<name>``; a watchdog thread extends it while the
    command runs, so a short ttl (``REDLOCK['COMMAND_TTL']``, 60 s) covers
    hours of work. When the lock is held: ``when_locked="skip"`` exits 0 with a
    one-line notice on stderr, ``"wait"`` waits (up to ``wait_timeout``),
    ``"fail"`` exits 1. When too few nodes answer
    (:class:`~django_redlock.exceptions.QuorumUnavailable`) the command does
    not run and exits 4 in every mode: that is an outage, not a skip. If the
    lock is lost while the command runs, it is logged, ``lock_lost`` is sent
    and the command is stopped with exit code 3, also inside a blocking call
    (a signal to the main thread, when run from the command line; see the docs
    for what cannot be interrupted); ``stop_on_lost=False``, and a command run
    by ``call_command()``, only log, and still exit 3 when ``handle`` ends.
    ``handle`` sees ``self.redlock`` (the lock) and ``self.redlock_lost`` (an
    event set on a loss). SIGTERM and SIGINT stop the command, the lock is
    released and the process exits 128 + the signal number. The command gains
    ``--lock-wait SECONDS``, ``--lock-fail`` and ``--lock-ttl SECONDS``.
    """
    if when_locked not in (SKIP, WAIT, FAIL):
        raise ImproperlyConfigured(f"when_locked must be 'skip', 'wait' or 'fail'; got {when_locked!r}.")
    if ttl is not None:
        base.check_ttl(ttl, 1.0)

    def decorate(target: _F) -> _F:
        if inspect.isclass(target):
            _wrap_command_class(target, key, ttl, when_locked, wait_timeout, stop_on_lost)
            return target
        return cast("_F", _wrap_handle(target, key, ttl, when_locked, wait_timeout, stop_on_lost))

    return decorate


def _wrap_command_class(cls: Any, key: Any, ttl: Any, when_locked: str, wait_timeout: Any, stop: bool) -> None:
    original_add_arguments = cls.add_arguments

    def add_arguments(self: Any, parser: Any) -> None:
        original_add_arguments(self, parser)
        group = parser.add_argument_group("redlock")
        group.add_argument(
            "--lock-wait",
            type=float,
            metavar="SECONDS",
            default=None,
            help="If another host holds the lock, wait up to SECONDS for it instead of skipping.",
        )
        group.add_argument(
            "--lock-fail", action="store_true", help="If another host holds the lock, exit with status 1."
        )
        group.add_argument(
            "--lock-ttl", type=float, metavar="SECONDS", default=None, help="The lock's ttl (kept alive while running)."
        )

    cls.add_arguments = add_arguments
    cls.handle = _wrap_handle(cls.handle, key, ttl, when_locked, wait_timeout, stop)


def _command_name(command: Any) -> str:
    module = type(command).__module__
    return module.rsplit(".", 1)[-1] if ".management.commands." in module else type(command).__name__.lower()


def _wrap_handle(handle: Callable[..., Any], key: Any, ttl: Any, when_locked: str, wait_timeout: Any, stop: bool) -> Any:
    @functools.wraps(handle)
    def wrapped(self: Any, *args: Any, **options: Any) -> Any:
        from django.core.management.base import CommandError

        from django_redlock.manager import get_lock_manager

        resource = (
            Key(key, None).format((), dict(options), {"command": self, "name": _command_name(self)})
            if key is not None
            else f"command:{_command_name(self)}"
        )
        lock_ttl = options.get("lock_ttl") or ttl or conf.get_config()["COMMAND_TTL"]
        mode, timeout = when_locked, wait_timeout
        if options.get("lock_wait") is not None:
            mode, timeout = WAIT, options["lock_wait"]
        if options.get("lock_fail"):
            mode = FAIL
        try:
            conf.check_max_ttl(lock_ttl)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        manager = get_lock_manager()
        try:
            if mode == WAIT:
                lock = manager.acquire(resource, lock_ttl, blocking=True, timeout=timeout if timeout is not None else 3600.0)
            else:
                lock = manager.acquire(resource, lock_ttl, blocking=False)
        except QuorumUnavailable as error:
            # Every host would "skip" here and monitoring would see success: fail instead.
            raise CommandError(f"Lock nodes unavailable: {error}", returncode=EXIT_NODES_UNAVAILABLE) from None
        except LockNotAcquired as error:
            if mode == SKIP:
                self.stderr.write(f"Skipped: {error}")
                return None
            raise CommandError(str(error), returncode=EXIT_LOCKED) from None
        lost = threading.Event()
        # Signals are the process's: only a command run from the command line, in the main
        # thread, takes them over. Run by call_command in a server or a worker, it leaves them to
        # the host, and a loss is reported when handle() returns.
        on_command_line = getattr(self, "_called_from_command_line", False)
        guard = _Guard(lost, on_command_line and threading.current_thread() is threading.main_thread())
        self.redlock, self.redlock_lost = lock, lost  # for handle() and the threads it starts

        def on_lost(_: Any) -> None:
            lost.set()
            if stop:
                guard.interrupt()  # the command must not go on unprotected

        manager._watch(lock, None, on_lost)
        result, failure = None, None
        try:
            guard.install()
            try:
                result = handle(self, *args, **options)
            finally:
                guard.disarm()  # from here on signals are only recorded: nothing interrupts the release
        except BaseException as exc:  # noqa: BLE001 - a loss or a signal outranks how handle() ended
            failure = exc
        finally:
            guard.disarm()
            try:
                lock.release()
            finally:
                guard.restore()
        if lock._lost_error() is not None:  # also a loss the release itself found (taken over, expired)
            logger.error("Command %s: its lock %r was lost (%s).", _command_name(self), resource, lock.lost_reason)
            what = "Stopped: the lock" if guard.sent else "The lock"
            raise CommandError(f"{what} {resource!r} was lost ({lock.lost_reason}).", returncode=EXIT_LOST) from failure
        if guard.signum is not None:
            name = signal.Signals(guard.signum).name
            raise CommandError(
                f"Stopped by {name}; the lock {resource!r} was released.", returncode=128 + guard.signum
            ) from failure
        if failure is not None:
            raise failure  # the command's own error, or an outer command's stop going on out
        return result

    return wrapped


#: The signal that stops a command whose lock was lost, sent to the main thread alone. SIGINT:
#: the guard handles it anyway while the command runs, so no other handler is displaced, and
#: libraries take it as "stop now" (psycopg 3 cancels the query it is waiting for).
STOP_SIGNAL = signal.SIGINT
#: How often a stop deferred until the main thread leaves an engine call is sent again (seconds).
REDELIVERY = 0.005


class _Stop(KeyboardInterrupt):
    """Raised in the main thread to stop the command (a signal, or the lock was lost).

    A ``KeyboardInterrupt``, so that code which cleans up after Ctrl-C does so here too.
    """


class _Guard:
    """SIGTERM/SIGINT handlers that only stop the main thread; the wrapper then releases the lock.

    The handler never touches the nodes: it may run while the main thread holds
    a node's mutex, and releasing from there would deadlock.
    """

    #: Installed guards, outermost first: a command may run another.
    active: list[_Guard] = []

    def __init__(self, lost: threading.Event, in_main: bool) -> None:
        self.lost = lost
        self.main = threading.main_thread().ident if in_main else None
        self.armed = False  # True while handle() runs: a signal raises _Stop there
        self.sent = False  # the stop signal was sent: the lock was lost
        self.mutex = threading.Lock()  # no stop signal is sent once disarmed
        self.signum: int | None = None  # the first signal received from outside
        self.previous: dict[int, Any] = {}
        self.deferred = threading.Event()  # a signal arrived inside an engine call

    def handler(self, signum: int, frame: Any) -> None:
        ours = signum == STOP_SIGNAL and any(guard.sent for guard in _Guard.active)  # a lost lock's stop
        if self.signum is None and not ours:
            self.signum = signum
        if self.armed:
            if steps.engine_calls.depth:
                # Inside a lock call of the command's own (an item's acquire or release): unwinding
                # it half done would leave that lock on the nodes. Stop once it has returned: the
                # signal goes again the moment the call ends (and every few ms, as a fallback).
                steps.engine_calls.on_leave = self.resend
                self.deferred.set()
                return
            raise _Stop()

    def resend(self) -> None:
        """Send the stop again to the main thread (it left the engine call that deferred it)."""
        if self.armed and self.main is not None:
            signal.pthread_kill(self.main, STOP_SIGNAL)

    def redeliver(self) -> None:
        """Send the stop again, every few milliseconds, while the handler defers it."""
        while self.deferred.wait():
            with self.mutex:
                if not self.armed:
                    return
                self.deferred.clear()
                signal.pthread_kill(self.main, STOP_SIGNAL)  # type: ignore[arg-type]
            time.sleep(REDELIVERY)

    def interrupt(self) -> None:
        """Stop the main thread from another thread (the watchdog saw the lock lost).

        A real signal: its handler raises in the main thread, which also ends a
        sleep, a socket read or a lock wait there. ``_thread.interrupt_main()``
        only flags the main thread, which then runs on until its blocking call returns.
        """
        with self.mutex:
            if not (self.armed and self.main is not None):
                return
            self.sent = True
            if hasattr(signal, "pthread_kill"):
                signal.pthread_kill(self.main, STOP_SIGNAL)
            else:  # pragma: no cover - Windows: flags the main thread only
                import _thread

                _thread.interrupt_main(STOP_SIGNAL)

    def disarm(self) -> None:
        with self.mutex:
            self.armed = False
        self.deferred.set()  # ends redeliver()

    def install(self) -> None:
        if self.main is None:
            return
        for signum in (signal.SIGTERM, signal.SIGINT):
            try:
                self.previous[signum] = signal.signal(signum, self.handler)
            except (ValueError, OSError):  # pragma: no cover
                pass
        _Guard.active.append(self)
        self.armed = True
        if hasattr(signal, "pthread_kill"):
            threading.Thread(target=self.redeliver, name="redlock-command-stop", daemon=True).start()

    def restore(self) -> None:
        """Put the previous handlers back. A signal received meanwhile goes on to a handler of the
        host's (a graceful shutdown); Python's own handlers are answered by the exit code."""
        if self in _Guard.active:
            _Guard.active.remove(self)
        for signum, old in self.previous.items():
            try:
                signal.signal(signum, old)
            except (ValueError, OSError, TypeError):  # pragma: no cover
                pass
        hosts = self.previous.get(self.signum) if self.signum is not None else None
        self.previous.clear()
        if self.signum is not None and callable(hosts) and hosts is not signal.default_int_handler:
            signal.raise_signal(self.signum)
