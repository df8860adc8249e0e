"""Numeric values of the package's command-line options (``@redlock_command``'s ``--lock-ttl`` and
``--lock-wait``, ``redlock status --timeout``), judged by the engine's rules.

A value the lock cannot use is a usage error that names the option and what it expects: from the
command line argparse's (the usage, exit 2), and the same text in a ``CommandError`` with
``returncode`` 2 when ``call_command()`` passes the value as a keyword, which the parser never sees.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from django.core.management.base import CommandError

from django_redlock.core import base
from django_redlock.exit_codes import ExitCode

__all__ = ["lock_ttl", "lock_wait", "node_wait", "option_type", "option_value"]

Check = Callable[[Any], float]


def _seconds(rule: Callable[[float], float], expected: str) -> Check:
    """A check: the value (an option's text, or a number) if ``rule`` accepts it, else a
    ``ValueError`` saying what is expected."""

    def check(value: Any) -> float:
        try:
            return rule(float(value) if isinstance(value, str) else value)
        except ValueError:
            raise ValueError(f"expected {expected}; got {value!r}") from None

    return check


#: ``--lock-ttl``: a lock's ttl (at least 10 ms; ``MAX_TTL`` is checked with the settings).
lock_ttl = _seconds(base.check_duration, "a number of seconds, 0.01 or more (up to REDLOCK['MAX_TTL'])")
#: ``--lock-wait``: how long to wait in line, as an acquire's ``timeout`` (0: one attempt).
lock_wait = _seconds(
    lambda s: base.check_seconds(s, "timeout", allow_zero=True), "a finite number of seconds, 0 or more"
)
#: ``redlock status --timeout``: how long to wait for each node.
node_wait = _seconds(lambda s: base.check_seconds(s, "timeout"), "a finite number of seconds above 0")


def option_type(check: Check) -> Callable[[str], float]:
    """``check`` as an argparse ``type``: a value it refuses is a usage error naming the option."""

    def parse(text: str) -> float:
        try:
            return check(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def option_value(options: dict[str, Any], dest: str, flag: str, check: Check) -> float | None:
    """The option's value (None when not given), checked again: ``call_command(..., dest=value)``
    bypasses the parser."""
    value = options.get(dest)
    if value is None:
        return None
    try:
        return check(value)
    except ValueError as exc:
        raise CommandError(f"Error: argument {flag}: {exc}", returncode=ExitCode.USAGE) from None
