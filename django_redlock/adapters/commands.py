"""``@redlock_command``: a management command that runs on one host at a time, stopped when its lock is lost."""

from __future__ import annotations

import functools
import inspect
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
from django_redlock.adapters.options import lock_ttl, lock_wait, option_type, option_value
from django_redlock.adapters.stop import Guard
from django_redlock.core.lock import LockContext
from django_redlock.exceptions import LockNotAcquired, QuorumUnavailable
from django_redlock.exit_codes import ExitCode

__all__ = ["EXIT_LOCKED", "EXIT_LOST", "EXIT_NODES_UNAVAILABLE", "ExitCode", "keep_exit_code", "redlock_command"]


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
    event set on a loss). SIGTERM and SIGINT stop the command whenever they
    arrive, from before the acquire to the end of the release: a lock that was
    granted is released and the process exits 128 + the signal number. The
    command gains ``--lock-wait SECONDS``, ``--lock-fail`` and ``--lock-ttl
    SECONDS``; a value they refuse is a usage error naming the option (exit 2).
    The lock's holder label (shown by ``redlock list`` and the admin) is
    ``label``, by default ``command:<name>``.
    """
    if when_locked not in (SKIP, WAIT, FAIL):
        raise ImproperlyConfigured(f"when_locked must be 'skip', 'wait' or 'fail'; got {when_locked!r}.")
    if ttl is not None:
        base.check_ttl(ttl, 1.0)
    base.check_seconds(wait_timeout, "wait_timeout", allow_none=True, allow_zero=True)
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
        seconds: dict[str, Any] = {"metavar": "SECONDS", "default": None}
        group.add_argument(
            "--lock-wait",
            type=option_type(lock_wait),
            help="If another host holds the lock, wait up to SECONDS for it instead of skipping.",
            **seconds,
        )
        group.add_argument(
            "--lock-fail",
            action="store_true",
            help=f"If another host holds the lock, exit with status {int(ExitCode.LOCKED)}.",
        )
        group.add_argument(
            "--lock-ttl", type=option_type(lock_ttl), help="The lock's ttl (kept alive while running).", **seconds
        )

    def run_from_argv(self: Any, argv: list[str]) -> None:
        keep_exit_code(functools.partial(original_run_from_argv, self), argv)

    cls.add_arguments = add_arguments
    cls.run_from_argv = run_from_argv
    cls.handle = _wrap_handle(cls.handle, how)


def _command_name(command: Any) -> str:
    module = type(command).__module__
    return module.rsplit(".", 1)[-1] if ".management.commands." in module else type(command).__name__.lower()


def _hold(
    command: Any, name: str, options: dict[str, Any], how: _How, lost: threading.Event, guard: Guard | None
) -> tuple[LockContext, str, str]:
    """The command's hold, not entered yet, its resource, and what to do when another host holds it
    (:data:`SKIP`, :data:`WAIT` or :data:`FAIL`). ``guard``: stop the command when the lock is lost."""
    from django_redlock.manager import get_lock_manager

    resource = (
        Key(how.key, None).format((), dict(options), {"command": command, "name": name})
        if how.key is not None
        else f"command:{name}"
    )
    ttl = given = option_value(options, "lock_ttl", "--lock-ttl", lock_ttl)
    if ttl is None:
        ttl = how.ttl if how.ttl is not None else conf.get_config()["COMMAND_TTL"]
    try:
        conf.check_max_ttl(ttl)
    except ValueError as exc:
        raise CommandError(f"--lock-ttl: {exc}" if given is not None else str(exc)) from None
    mode, timeout = how.when_locked, how.wait_timeout
    wait = option_value(options, "lock_wait", "--lock-wait", lock_wait)
    if wait is not None:
        mode, timeout = WAIT, wait
    if options.get("lock_fail"):
        mode = FAIL

    def on_lost(_: Any) -> None:
        lost.set()
        if guard is not None:
            guard.interrupt()  # the command must not go on unprotected

    waits = mode == WAIT
    hold = get_lock_manager().lock(
        resource,
        ttl,
        blocking=waits,
        timeout=(timeout if timeout is not None else 3600.0) if waits else None,
        auto_extend=True,
        on_lost=on_lost,
        label=how.label if how.label is not None else f"command:{name}",
    )
    return hold, resource, mode


def _wrap_handle(handle: Callable[..., Any], how: _How) -> Any:
    stop = how.stop_on_lost

    @functools.wraps(handle)
    def wrapped(self: Any, *args: Any, **options: Any) -> Any:
        lost = threading.Event()
        # Signals are the process's: only a command run from the command line, in the main
        # thread, takes them over. Run by call_command in a server or a worker, it leaves them to
        # the host, and a loss is reported when handle() returns.
        on_command_line = getattr(self, "_called_from_command_line", False)
        guard = Guard(lost, on_command_line and threading.current_thread() is threading.main_thread())
        name = _command_name(self)
        hold: LockContext | None = None
        resource, mode = None, SKIP
        result, failure, loss = None, None, None
        try:
            try:
                # First: a signal from here on stops the command, and the lock is released whenever
                # it was granted (a signal that finds it granted before the guard is in place would
                # end the process with the lock left on the nodes for its ttl).
                guard.install()
                hold, resource, mode = _hold(self, name, options, how, lost, guard if stop else None)
                self.redlock, self.redlock_lost = hold.__enter__(), lost  # for handle() and the threads it starts
                # On the command line the loss is told once, by the error line below; elsewhere it is
                # logged (the CommandError goes to the caller).
                self.redlock.reports_own_loss = on_command_line
                guard.check()  # a signal that came during the acquire: the work does not begin
                result = handle(self, *args, **options)
            finally:
                guard.disarm()  # from here on signals are only recorded: nothing interrupts the release
        except BaseException as exc:  # noqa: BLE001 - a loss or a signal outranks how handle() ended
            failure = exc
        finally:
            guard.disarm()
            try:
                loss = hold.leave() if hold is not None else None  # not told of failure: a loss outranks it
            finally:
                guard.restore()
        lock = hold.lock if hold is not None else None  # set once granted, whatever stopped the command
        if loss is not None:  # also a loss the release itself found (taken over, expired)
            assert lock is not None
            what = "Stopped: the lock" if guard.sent else "The lock"
            raise CommandError(f"{what} {resource!r} was lost ({lock.lost_reason}).", returncode=EXIT_LOST) from failure
        if guard.signum is not None:
            signame = signal.Signals(guard.signum).name
            done = f"the lock {resource!r} was released" if lock is not None else "the lock was not held"
            raise CommandError(f"Stopped by {signame}; {done}.", returncode=128 + guard.signum) from failure
        if isinstance(failure, LockNotAcquired) and lock is None:  # the command's own lock, not handle()'s
            if isinstance(failure, QuorumUnavailable):
                # Every host would "skip" here and monitoring would see success: fail instead.
                raise CommandError(f"Lock nodes unavailable: {failure}", returncode=EXIT_NODES_UNAVAILABLE) from None
            if mode == SKIP:
                self.stderr.write(f"Skipped: {failure}")
                return None
            raise CommandError(str(failure), returncode=EXIT_LOCKED) from None
        if failure is not None:
            raise failure  # the command's own error, or an outer command's stop going on out
        return result

    return wrapped
