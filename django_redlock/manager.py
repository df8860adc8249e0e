"""The default lock managers, built from settings on first use.

``get_lock_manager()`` returns one :class:`~django_redlock.core.LockManager`
per process, built from ``REDLOCK_NODES`` and ``REDLOCK``; async code uses
``get_async_lock_manager()``. Both are rebuilt when a test changes those
settings. Their events become Django signals and log lines.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any, TypeVar, cast

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string

from django_redlock import conf, signals
from django_redlock.adapters import transactions
from django_redlock.core import AsyncLockManager, Hooks, LockManager, forks
from django_redlock.core.config import CombinedHooks
from django_redlock.core.nodes import parse_nodes

__all__ = ["async_lock_manager", "get_async_lock_manager", "get_lock_manager", "lock_manager", "reset"]

logger = logging.getLogger("django_redlock")

_lock = forks.mutex(sys.modules[__name__], "_lock")
_managers: dict[str, Any] = {}
_M = TypeVar("_M", LockManager, AsyncLockManager)


class SignalHooks(Hooks):
    """Turn engine events into Django signals and log lines."""

    def __init__(self) -> None:
        self.sender: Any = None

    def acquired(self, lock: Any) -> None:
        logger.debug("Acquired lock %r (%s, holder digest %s)", lock.resource, lock.holder, lock.holder.digest)
        signals.lock_acquired.send(sender=self.sender, lock=lock)

    def released(self, lock: Any) -> None:
        logger.debug("Released lock %r (holder digest %s)", lock.resource, lock.holder.digest)
        signals.lock_released.send(sender=self.sender, lock=lock)
        transactions.warn_if_in_transaction(lock)  # last: under -W error it raises, and the hook is left there

    def extended(self, lock: Any) -> None:
        logger.debug("Extended lock %r by %.1f s (holder digest %s)", lock.resource, lock.ttl, lock.holder.digest)
        signals.lock_extended.send(sender=self.sender, lock=lock)

    def recreated(self, lock: Any, nodes: Any) -> None:
        logger.info("Lock %r: its key was set again on %s (lost there, a restart or an expiry)", lock.resource,
                    ", ".join(nodes))

    def lost(self, lock: Any, reason: str) -> None:
        signals.lock_lost.send(sender=self.sender, lock=lock, reason=reason)

    def not_acquired(self, resource: str, error: Any) -> None:
        logger.info("%s", error)
        signals.lock_not_acquired.send(sender=self.sender, resource=resource, error=error)


def configured_hooks() -> list[Hooks]:
    """The hooks ``REDLOCK['HOOKS']`` lists, each a dotted path to a
    :class:`~django_redlock.core.Hooks` subclass (made with no arguments) or instance, or an instance."""
    entries = conf.get_config()["HOOKS"]
    _hooks_list(entries)
    return [_hooks_of(entry, i) for i, entry in enumerate(entries)]


def hooks_problems(entries: Any) -> list[str]:
    """Every reason ``REDLOCK['HOOKS']`` = ``entries`` cannot be used, one per entry (for the checks)."""
    try:
        _hooks_list(entries)
    except ImproperlyConfigured as exc:
        return [str(exc)]
    problems = []
    for i, entry in enumerate(entries):
        try:
            _hooks_of(entry, i)
        except ImproperlyConfigured as exc:
            problems.append(str(exc))
        except Exception as exc:  # noqa: BLE001 - its module raised while importing: report it, do not crash
            problems.append(f"REDLOCK['HOOKS'][{i}] = {entry!r} cannot be imported: {type(exc).__name__}: {exc}")
    return problems


def _hooks_list(entries: Any) -> None:
    if isinstance(entries, (str, bytes, Hooks)) or not isinstance(entries, (list, tuple)):
        raise ImproperlyConfigured(
            "REDLOCK['HOOKS'] must be a list of dotted paths to Hooks subclasses or instances, e.g. "
            f"['django_redlock.metrics.PrometheusHooks']; got {type(entries).__name__}."
        )


def _hooks_of(entry: Any, index: int) -> Hooks:
    where = f"REDLOCK['HOOKS'][{index}]"
    found = entry
    if isinstance(entry, str):
        try:
            found = import_string(entry)
        except ImportError as exc:
            raise ImproperlyConfigured(f"{where} = {entry!r} cannot be imported: {exc}") from None
    if isinstance(found, type) and issubclass(found, Hooks):
        try:
            found = found()
        except (ImportError, ValueError, TypeError) as exc:
            raise ImproperlyConfigured(f"{where}: {found.__qualname__}() failed: {exc}") from None
    if not isinstance(found, Hooks):
        named = f"{entry!r} names" if isinstance(entry, str) else "got"
        raise ImproperlyConfigured(
            f"{where} must name a django_redlock.core.Hooks subclass or instance; {named} a {type(found).__name__}."
        )
    return found


def _build(cls: type[_M]) -> _M:
    signal_hooks = SignalHooks()
    problem = None
    try:
        specs, options = conf.get_nodes(), conf.engine_options()
        # Parsed here to name each entry as written (REDLOCK_NODES[i]), not as the engine's argument.
        nodes = parse_nodes(specs, options["node_timeout"], "REDLOCK_NODES")
        more = configured_hooks()
        hooks = CombinedHooks(signal_hooks, *more) if more else signal_hooks
        manager = cls(nodes, hooks=hooks, **options)
    except ValueError as exc:
        problem = str(exc)  # credential-free; what it was raised from may not be
    if problem is not None:
        raise ImproperlyConfigured(problem if problem.startswith("REDLOCK") else f"REDLOCK_NODES / REDLOCK: {problem}")
    signal_hooks.sender = manager
    return manager


def _get(kind: str, cls: type[_M]) -> _M:
    manager: _M | None = _managers.get(kind)
    if manager is None:
        with _lock:
            manager = _managers.get(kind)
            if manager is None:
                manager = _managers[kind] = _build(cls)
    return manager


def get_lock_manager() -> LockManager:
    """The process-wide :class:`~django_redlock.core.LockManager` for ``REDLOCK_NODES``."""
    return _get("sync", LockManager)


def get_async_lock_manager() -> AsyncLockManager:
    """The process-wide :class:`~django_redlock.core.AsyncLockManager` (connections per event loop)."""
    return _get("async", AsyncLockManager)


class _Current:
    """Stands for the manager the settings describe now: every attribute is looked up on it per use.

    Keep this at module level (``from django_redlock import lock_manager``),
    not the result of ``get_lock_manager()``: that object keeps the nodes it
    was built with after ``override_settings`` or a settings change, and
    its connections are closed by the change.
    """

    def __init__(self, get: Callable[[], Any]) -> None:
        self._get = get

    def __getattr__(self, name: str) -> Any:
        return getattr(self._get(), name)

    def __repr__(self) -> str:
        return f"<current {self._get()!r}>"


#: The current :class:`~django_redlock.core.LockManager`, safe to keep at module level.
lock_manager: LockManager = cast(LockManager, _Current(get_lock_manager))
#: The current :class:`~django_redlock.core.AsyncLockManager`, safe to keep at module level.
async_lock_manager: AsyncLockManager = cast(AsyncLockManager, _Current(get_async_lock_manager))


def reset() -> None:
    """Forget the managers (settings changed); close the sync one's connections."""
    with _lock:
        old = dict(_managers)
        _managers.clear()
    sync = old.get("sync")
    if sync is not None:
        sync.close()


@receiver(setting_changed)
def _settings_changed(setting: str, **kwargs: Any) -> None:
    if setting in conf.SETTINGS:
        reset()
