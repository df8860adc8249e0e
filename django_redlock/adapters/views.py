"""``@redlock`` for views (sync and async) and functions, and ``RedlockMixin`` for class-based views:
thin adapters over the hold, ``manager.lock()``."""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar, cast

from asgiref.sync import iscoroutinefunction
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase

from django_redlock import conf
from django_redlock.core import base, held
from django_redlock.core.async_manager import AsyncLockContext
from django_redlock.core.lock import LockContext
from django_redlock.adapters import transactions
from django_redlock.adapters.answers import ApiView, answer_invalid_key, answer_locked, answer_loss
from django_redlock.adapters.keys import Keys, KeysSpec, check_key, find_request
from django_redlock.exceptions import InvalidResource, LockNotAcquired

__all__ = ["RedlockMixin", "redlock"]

_P = ParamSpec("_P")
_R = TypeVar("_R")


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
    base.check_label(label)

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

        def lock_for(manager: Callable[[], Any], args: Any, kwargs: Any) -> tuple[Any, Any]:
            """The call's lock from ``manager()``, or the 400 answer when the key built from the request names none."""
            try:
                resource = spec.format(args, kwargs)
            except InvalidResource as error:  # built from the request: the client's error
                return None, answer_invalid_key(find_request(args, kwargs), error)
            conf.check_max_ttl(ttl)
            return manager().lock(resource, auto_extend=auto_extend, **options), None

        if iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: _P.args, **kwargs: _P.kwargs) -> Any:
                from django_redlock.manager import get_async_lock_manager

                hold, refusal = lock_for(get_async_lock_manager, args, kwargs)
                if hold is None:
                    return refusal
                return await _run_held_async(hold, lambda: func(*args, **kwargs), find_request(args, kwargs), on_locked)

            # func is a coroutine function: so is the wrapper, with func's parameters and result.
            return cast("Callable[_P, _R]", async_wrapper)

        @functools.wraps(func)
        def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> Any:
            from django_redlock.manager import get_lock_manager

            hold, refusal = lock_for(get_lock_manager, args, kwargs)
            if hold is None:
                return refusal
            return _run_held(hold, lambda: func(*args, **kwargs), find_request(args, kwargs), on_locked, owner=wrapper)

        # Resolved as a view, it opens the request's transactions inside its lock (Django would open them outside).
        transactions.claim(wrapper, wrapper)
        return wrapper

    return decorator


def _run_held(
    hold: LockContext,
    call: Callable[[], Any],
    request: HttpRequest | None,
    on_locked: Any,
    api: ApiView | None = None,
    owner: object = None,
) -> Any:
    """Run ``call`` in ``hold``; a held lock is answered for a view (``api``: a REST framework view
    held around its dispatch, which answers), raised otherwise.

    The lock is released after the transactions written under it end: ``owner`` (the view function or
    class Django resolved) opens the request's ``ATOMIC_REQUESTS`` transactions inside the lock and
    commits them while it is still held; a call inside a request transaction opened before the lock
    leaves it once that transaction has ended (see :mod:`django_redlock.adapters.transactions`)."""
    try:
        lock = hold.__enter__()
    except LockNotAcquired as error:
        if request is None:
            raise
        return answer_locked(request, error, on_locked, api)
    enclosing = transactions.Enclosing(request)
    try:
        result = transactions.run(transactions.request_aliases(request, owner), lock, lambda: _checked(call))
    except BaseException:
        if enclosing:
            enclosing.leave_after(lambda: hold.leave(raised=True))
        else:
            hold.leave(raised=True)
        raise
    if _is_streaming(result) and lock.locked():
        return _leave_after_stream(result, hold.leave)
    if enclosing and isinstance(result, HttpResponseBase):
        # The request's transaction commits after this returns: checked now, released once it has ended.
        loss = None if transactions.still_held(lock) else held.loss_to_report(lock)
        enclosing.leave_after(lambda: hold.leave(raised=True))  # a loss found then is logged and signalled
        return answer_loss(loss, result, request, api)
    return answer_loss(hold.leave(), result, request, api)


def _checked(call: Callable[[], Any]) -> Any:
    result = call()
    if inspect.isawaitable(result):
        _refuse_awaitable(result)
    return result


def _refuse_awaitable(result: Any) -> None:
    """A sync call under the lock returned an awaitable: its work would run after the release."""
    if inspect.iscoroutine(result):
        result.close()
    raise TypeError(
        f"A call locked by @redlock or RedlockMixin returned an awaitable ({type(result).__name__}): its work "
        "would run after the lock is released. Lock an 'async def' function (RedlockMixin: async handlers "
        "are held by the asyncio manager), or await it inside the locked call."
    )


async def _run_held_async(
    hold: AsyncLockContext, call: Callable[[], Awaitable[Any]], request: HttpRequest | None, on_locked: Any
) -> Any:
    """:func:`_run_held` for a coroutine function."""
    try:
        lock = await hold.__aenter__()
    except LockNotAcquired as error:
        if request is None:
            raise
        return answer_locked(request, error, on_locked)
    try:
        result = await call()
    except BaseException:
        await hold.leave(raised=True)
        raise
    if _is_streaming(result) and lock.locked():

        def leave() -> None:
            # Closed by the server from a worker thread: released through the sync manager's connections.
            from django_redlock.manager import get_lock_manager

            hold.leave_from_thread(get_lock_manager())

        return _leave_after_stream(result, leave)
    return answer_loss(await hold.leave(), result, request)


def _is_streaming(result: Any) -> bool:
    return isinstance(result, HttpResponseBase) and getattr(result, "streaming", False)


def _leave_after_stream(response: Any, leave: Callable[[], Any]) -> Any:
    """Leave the hold once the server has sent the stream and closed the response."""
    closers = getattr(response, "_resource_closers", None)
    if closers is not None:
        closers.append(leave)
    else:  # pragma: no cover - every supported Django has _resource_closers
        leave()
    return response


class RedlockMixin:
    """Class-based views: hold a Redlock around ``dispatch``.

    Set ``redlock_key`` to a format string over the URL kwargs, ``request``
    and ``view`` (``"report-{pk}"``, ``"user-{request.user.pk}"``), or
    override :meth:`get_redlock_key`; a list of format strings locks them
    together. ``redlock_ttl``, ``redlock_blocking``, ``redlock_timeout``,
    ``redlock_label``, ``redlock_auto_extend``, ``redlock_reentrant`` and
    ``redlock_on_locked`` work as the arguments of :func:`redlock`; a lock
    lost while the view ran is answered as there.
    """

    redlock_key: str | list[str] | None = None
    redlock_ttl: float | None = None
    redlock_blocking: bool = False
    redlock_timeout: float | None = None
    redlock_label: str | None = None
    redlock_auto_extend: bool = False
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
        """Run the handler while holding the lock: on the asyncio manager for a view whose handlers
        are ``async def`` (Django awaits what ``dispatch`` returns), else on the sync one."""
        from django_redlock.manager import get_async_lock_manager, get_lock_manager

        if _is_api_view(self):
            request._redlock_api = True  # type: ignore[attr-defined]  # answered in JSON, as @redlock does
        try:
            resource = check_key(self.get_redlock_key())
        except InvalidResource as error:  # built from the request: the client's error
            return _invalid_key(self, request, error, args, kwargs)
        conf.check_max_ttl(self.redlock_ttl)
        options: dict[str, Any] = {
            "blocking": self.redlock_blocking,
            "timeout": self.redlock_timeout,
            "label": self.redlock_label,
            "auto_extend": self.redlock_auto_extend,
            "reentrant": self.redlock_reentrant,
        }
        dispatch = super().dispatch  # type: ignore[misc]
        call = functools.partial(dispatch, request, *args, **kwargs)
        if getattr(type(self), "view_is_async", False):
            ahold = get_async_lock_manager().lock(resource, self.redlock_ttl, **options)
            return _run_held_async(ahold, call, request, self.redlock_on_locked)
        hold = get_lock_manager().lock(resource, self.redlock_ttl, **options)
        api = (self, call) if _is_api_view(self) else None  # REST framework answers for its views
        return _run_held(hold, call, request, self.redlock_on_locked, api, owner=type(self))

    @classmethod
    def as_view(cls, *args: Any, **initkwargs: Any) -> Callable[..., Any]:
        """The view (``args``: a REST framework ViewSet's actions); a sync one opens the request's
        ``ATOMIC_REQUESTS`` transactions inside its lock (Django refuses ``ATOMIC_REQUESTS`` for async views)."""
        view: Callable[..., Any] = super().as_view(*args, **initkwargs)  # type: ignore[misc]
        if not cls.view_is_async:  # type: ignore[attr-defined]
            transactions.claim(view, cls)
        return view


def _invalid_key(view: Any, request: HttpRequest, error: InvalidResource, args: Any, kwargs: Any) -> Any:
    """``RedlockMixin``'s answer to a key no lock may name; awaitable for an async view."""
    api = (view, functools.partial(super(RedlockMixin, view).dispatch, request, *args, **kwargs))
    answer = answer_invalid_key(request, error, api if _is_api_view(view) else None)
    if getattr(type(view), "view_is_async", False):

        async def answered() -> Any:
            return answer

        return answered()
    return answer


def _is_api_view(view: Any) -> bool:
    """True for a REST framework view (never imports REST framework)."""
    views = sys.modules.get("rest_framework.views")
    return views is not None and isinstance(view, views.APIView)
