"""``@redlock_command``: a management command that runs on one host at a time, stopped when its lock is lost."""

from __future__ import annotations

import functools
import inspect
import logging
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar, cast

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import CommandError

from django_redlock import conf
from django_redlock.core import base
from django_redlock.adapters.keys import Key, KeySpec
from django_redlock.adapters.stop import Guard
from django_redlock.exceptions import LockNotAcquired, QuorumUnavailable
from django_redlock.exit_codes import ExitCode

__all__ = ["EXIT_LOCKED", "EXIT_LOST", "EXIT_NODES_UNAVAILABLE", "ExitCode", "keep_exit_code", "redlock_command"]

logger = logging.getLogger("django_redlock")

_F = TypeVar("_F", bound=Callable[..., Any])  # a command class or its handle()

SKIP, WAIT, FAIL = "skip", "wait", "fail"


class _How(NamedTuple):
    """The decorator's arguments."""

    key: Any
    ttl: float | None
    when_locked: str
    wait_timeout: float | None
    stop_on_lost: bool
    label: str | None


#: Names of :class:`~django_redlock.exit_codes.ExitCode` members, kept for imports that use them.
EXIT_LOCKED = ExitCode.LOCKED  # held by another host, with --lock-fail or after --lock-wait
EXIT_LOST = ExitCode.LOST  # the lock was lost while the command ran; the command was stopped
EXIT_NODES_UNAVAILABLE = ExitCode.NO_QUORUM  # too few lock nodes answered: nobody can hold the lock
# A signal N (SIGTERM, SIGINT) stops the command with 128 + N, after the lock is released.


def keep_exit_code(run_from_argv: Callable[[list[str]], None], argv: list[str]) -> None:
    """Run a command from the command line and exit with its ``CommandError``'s code also under
    ``--traceback`` (Django then lets the error go on, and Python exits 1)."""
    try:
        run_from_argv(argv)
    except CommandError as error:  # only with --traceback: otherwise Django has exited already
        traceback.print_exc()
        sys.exit(error.returncode)


def redlock_command(
    key: KeySpec | None = None,
    ttl: float | None = None,
    *,
    when_locked: str = SKIP,
    wait_timeout: float | None = None,
    stop_on_lost: bool = True,
    label: str | None = None,
) -> Callable[[_F], _F]:
    """Let a management command run on one host at a time (cron on many hosts).

    Decorate a ``BaseCommand`` subclass (or its ``handle``). The lock key
    defaults to ``command:<name>``; a watchdog thread extends it while the
    command runs, so a short ttl (``REDLOCK['COMMAND_TTL']``, 60 s) covers
    hours of work. When the lock is held: ``when_locked="skip"`` exits 0 with a
    one-line notice on stderr, ``"wait"`` waits (up to ``wait_timeout``, then
    exits 5), ``"fail"`` exits 5 (``ExitCode.LOCKED``). When too few nodes answer
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
    The lock's holder label (shown by ``redlock list`` and the admin) is
    ``label``, by default ``command:<name>``.
    """
    if when_locked not in (SKIP, WAIT, FAIL):
        raise ImproperlyConfigured(f"when_locked must be 'skip', 'wait' or 'fail'; got {when_locked!r}.")
    if ttl is not None:
        base.check_ttl(ttl, 1.0)
    base.check_label(label)
    how = _How(key, ttl, when_locked, wait_timeout, stop_on_lost, label)

    def decorate(target: _F) -> _F:
        if inspect.isclass(target):
            _wrap_command_class(target, how)
            return target
        return cast("_F", _wrap_handle(target, how))

    return decorate


def _wrap_command_class(cls: Any, how: _How) -> None:
    original_add_arguments = cls.add_arguments
    original_run_from_argv = cls.run_from_argv

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
            "--lock-fail",
            action="store_true",
            help=f"If another host holds the lock, exit with status {int(ExitCode.LOCKED)}.",
        )
        group.add_argument(
            "--lock-ttl", type=float, metavar="SECONDS", default=None, help="The lock's ttl (kept alive while running)."
        )

    def run_from_argv(self: Any, argv: list[str]) -> None:
        keep_exit_code(functools.partial(original_run_from_argv, self), argv)

    cls.add_arguments = add_arguments
    cls.run_from_argv = run_from_argv
    cls.handle = _wrap_handle(cls.handle, how)


def _command_name(command: Any) -> str:
    module = type(command).__module__
    return module.rsplit(".", 1)[-1] if ".management.commands." in module else type(command).__name__.lower()


def _wrap_handle(handle: Callable[..., Any], how: _How) -> Any:
    key, stop = how.key, how.stop_on_lost

    @functools.wraps(handle)
    def wrapped(self: Any, *args: Any, **options: Any) -> Any:
        from django_redlock.manager import get_lock_manager

        name = _command_name(self)
        resource = (
            Key(key, None).format((), dict(options), {"command": self, "name": name})
            if key is not None
            else f"command:{name}"
        )
        lock_ttl = options.get("lock_ttl") or how.ttl or conf.get_config()["COMMAND_TTL"]
        mode, timeout = how.when_locked, how.wait_timeout
        if options.get("lock_wait") is not None:
            mode, timeout = WAIT, options["lock_wait"]
        if options.get("lock_fail"):
            mode = FAIL
        try:
            conf.check_max_ttl(lock_ttl)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        lost = threading.Event()
        # Signals are the process's: only a command run from the command line, in the main
        # thread, takes them over. Run by call_command in a server or a worker, it leaves them to
        # the host, and a loss is reported when handle() returns.
        on_command_line = getattr(self, "_called_from_command_line", False)
        guard = Guard(lost, on_command_line and threading.current_thread() is threading.main_thread())

        def on_lost(_: Any) -> None:
            lost.set()
            if stop:
                guard.interrupt()  # the command must not go on unprotected

        waits = mode == WAIT
        hold = get_lock_manager().lock(
            resource,
            lock_ttl,
            blocking=waits,
            timeout=(timeout if timeout is not None else 3600.0) if waits else None,
            auto_extend=True,
            on_lost=on_lost,
            label=how.label if how.label is not None else f"command:{name}",
        )
        try:
            lock = hold.__enter__()
        except QuorumUnavailable as error:
            # Every host would "skip" here and monitoring would see success: fail instead.
            raise CommandError(f"Lock nodes unavailable: {error}", returncode=EXIT_NODES_UNAVAILABLE) from None
        except LockNotAcquired as error:
            if mode == SKIP:
                self.stderr.write(f"Skipped: {error}")
                return None
            raise CommandError(str(error), returncode=EXIT_LOCKED) from None
        self.redlock, self.redlock_lost = lock, lost  # for handle() and the threads it starts
        result, failure, loss = None, None, None
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
                loss = hold.leave()  # not told of failure: a loss outranks how handle() ended
            finally:
                guard.restore()
        if loss is not None:  # also a loss the release itself found (taken over, expired)
            logger.error("Command %s: its lock %r was lost (%s).", name, resource, lock.lost_reason)
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
