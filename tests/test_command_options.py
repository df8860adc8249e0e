"""``@redlock_command``'s options refuse values the lock cannot use: a usage error that names the
option and what it expects, before anything is locked (never a traceback, never a silent default)."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from django_redlock import get_lock_manager
from django_redlock.exit_codes import ExitCode
from tests.test_command_exit_codes import manage

pytestmark = pytest.mark.usefixtures("redlock_settings")

BAD = [("--lock-ttl", value) for value in ("-1", "nan", "0.001", "0", "inf")] + [
    ("--lock-wait", value) for value in ("-1", "nan", "inf")
]


@pytest.mark.parametrize(("option", "value"), BAD)
def test_a_bad_value_on_the_command_line_is_a_usage_error_naming_the_option(servers, capsys, option, value):
    code, out, err = manage(capsys, "nightly", option, value)
    assert code == ExitCode.USAGE, err
    assert f"argument {option}: expected" in err and "seconds" in err and repr(value) in err, err
    assert "usage:" in err and "Traceback" not in err
    assert "nightly done" not in out  # the work did not run
    assert not get_lock_manager().is_locked("command:nightly")


@pytest.mark.parametrize(("option", "value"), BAD)
def test_a_bad_value_from_call_command_is_the_same_error(servers, option, value):
    as_number = float(value)
    for args, kwargs in [((option, value), {}), ((), {option[2:].replace("-", "_"): as_number})]:
        with pytest.raises(CommandError, match=f"argument {option}: expected .*seconds") as info:
            call_command("nightly", *args, stdout=StringIO(), stderr=StringIO(), **kwargs)
        if kwargs:  # the parser's own errors keep Django's code (1) under call_command()
            assert info.value.returncode == ExitCode.USAGE


def test_the_expectation_is_stated(servers, capsys):
    err = manage(capsys, "nightly", "--lock-ttl", "0")[2]
    assert "expected a number of seconds, 0.01 or more (up to REDLOCK['MAX_TTL'])" in err
    err = manage(capsys, "nightly", "--lock-wait", "inf")[2]
    assert "expected a finite number of seconds, 0 or more" in err


def test_a_ttl_above_max_ttl_names_the_option(servers, settings):
    settings.REDLOCK = {**settings.REDLOCK, "MAX_TTL": 30}
    with pytest.raises(CommandError, match=r"--lock-ttl: ttl 31 s is above REDLOCK\['MAX_TTL'\]") as info:
        call_command("nightly", "--lock-ttl", "31", stdout=StringIO(), stderr=StringIO())
    assert info.value.returncode == ExitCode.ERROR


@pytest.mark.parametrize(("option", "value"), [("--lock-ttl", "2"), ("--lock-wait", "0"), ("--lock-wait", "0.5")])
def test_good_values_still_run(servers, option, value):
    out = StringIO()
    call_command("nightly", option, value, stdout=out, stderr=StringIO())
    assert "nightly done" in out.getvalue()


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "0"])
def test_redlock_status_timeout_refuses_what_no_node_can_answer_in(servers, capsys, value):
    """The same rule for the package's own command: ``--timeout inf`` ended in an OverflowError
    traceback, ``-1``, ``nan`` and ``0`` were taken."""
    code, _, err = manage(capsys, "redlock", "status", "--timeout", value)
    assert code == ExitCode.USAGE and "argument --timeout: expected a finite number of seconds above 0" in err, err
    assert "Traceback" not in err
    with pytest.raises(CommandError, match="argument --timeout: expected") as info:
        call_command("redlock", "status", timeout=float(value), stdout=StringIO(), stderr=StringIO())
    assert info.value.returncode == ExitCode.USAGE


@pytest.mark.parametrize("wait_timeout", [-1, float("nan"), float("inf"), "10"])
def test_the_decorators_wait_timeout_is_checked_where_it_is_written(wait_timeout):
    from django_redlock import redlock_command

    with pytest.raises(ValueError, match="wait_timeout must be"):
        redlock_command(when_locked="wait", wait_timeout=wait_timeout)


def test_a_quorum_error_of_handles_own_goes_on_as_it_is(servers):
    """Only the command's own lock maps to the exit codes 4 and 5: an error of a lock call inside
    ``handle`` is the command's own failure."""
    from django.core.management.base import BaseCommand

    from django_redlock import redlock_command
    from django_redlock.exceptions import QuorumUnavailable

    @redlock_command(key="outer-job")
    class Command(BaseCommand):
        def handle(self, *args, **options):
            raise QuorumUnavailable("inner", resource="inner", granted=0, quorum=3, total=5, failures={})

    with pytest.raises(QuorumUnavailable):
        call_command(Command(), stdout=StringIO(), stderr=StringIO())
    assert not get_lock_manager().is_locked("outer-job")
