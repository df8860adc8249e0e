"""One table of exit codes for every command of the package (``redlock`` and ``@redlock_command``), as
a shell sees them: nodes down is a failure (4), not a skip; a quorum but not every node is 6; a lock
held elsewhere is 5; nothing to release is 7; signals stop and release."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from io import StringIO

import pytest
from django.core.management import CommandError, ManagementUtility, call_command

from django_redlock import get_lock_manager
from django_redlock.core import LockManager
from django_redlock.decorators import EXIT_LOCKED, EXIT_LOST, EXIT_NODES_UNAVAILABLE, ExitCode
from tests.test_command_decorator import ROOT, start, wait_for

pytestmark = pytest.mark.usefixtures("redlock_settings")


def kill_majority(servers):
    for server in servers[: len(servers) // 2 + 1]:
        server.kill()


def test_exit_code_is_four():
    assert EXIT_NODES_UNAVAILABLE == 4


def test_one_table_of_codes():
    assert {code.name: int(code) for code in ExitCode} == {
        "OK": 0,
        "ERROR": 1,
        "USAGE": 2,
        "LOST": 3,
        "NO_QUORUM": 4,
        "LOCKED": 5,
        "DEGRADED": 6,
        "NOT_HELD": 7,
    }
    assert (EXIT_LOCKED, EXIT_LOST, EXIT_NODES_UNAVAILABLE) == (ExitCode.LOCKED, ExitCode.LOST, ExitCode.NO_QUORUM)


def manage(capsys, *argv):
    """``manage.py *argv`` in this process, as Django runs it from the shell: (exit code, stdout, stderr)."""
    try:
        ManagementUtility(["manage.py", *argv]).execute()
        code = 0
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_redlock_status_codes(servers, capsys):
    assert manage(capsys, "redlock", "status")[0] == ExitCode.OK
    servers[0].kill()
    code, out, err = manage(capsys, "redlock", "status")
    assert code == ExitCode.DEGRADED and "4 of 5 nodes can vote; quorum is 3." in out, err
    assert "Degraded: 4 of 5 nodes can vote" in err
    servers[1].pause()  # a node that does not answer in time is down too
    code, out, err = manage(capsys, "redlock", "status", "--json", "--timeout", "0.2")
    assert code == ExitCode.DEGRADED and json.loads(out)["voting"] == 3
    servers[2].kill()
    code, out, err = manage(capsys, "redlock", "status", "--timeout", "0.2")
    assert code == ExitCode.NO_QUORUM and "No quorum: 2 of 5 nodes can vote, 3 needed." in err


def test_redlock_list_codes(servers, capsys):
    get_lock_manager().acquire("listed", ttl=30)
    code, out, _ = manage(capsys, "redlock", "list")
    assert code == ExitCode.OK and "listed" in out and "5 of 5" in out
    servers[4].kill()
    code, out, err = manage(capsys, "redlock", "list", "--json")
    assert code == ExitCode.DEGRADED and json.loads(out)[0]["nodes_holding"] == 4
    assert "Degraded: 4 of 5 nodes answered" in err
    kill_majority(servers)
    code, out, err = manage(capsys, "redlock", "list")
    assert code == ExitCode.NO_QUORUM and "Only 1 of 5 nodes answered, 3 needed" in err


def test_redlock_release_codes(servers, capsys):
    manager = get_lock_manager()
    manager.acquire("gone", ttl=30)
    code, out, _ = manage(capsys, "redlock", "release", "gone")
    assert code == ExitCode.OK and "Released 'gone' on 5 of 5 nodes." in out
    code, out, err = manage(capsys, "redlock", "release", "gone")
    assert code == ExitCode.NOT_HELD and "Nothing to release: no node held a lock on 'gone'." in err
    manager.acquire("gone", ttl=30)
    servers[0].kill()
    code, out, err = manage(capsys, "redlock", "release", "gone")
    assert code == ExitCode.DEGRADED and "Released 'gone' on 4 of 5 nodes." in out
    assert not manager.is_locked("gone")
    code, out, err = manage(capsys, "redlock", "release", "gone")  # nothing there, and a node down
    assert code == ExitCode.NOT_HELD and "no node that answered held a lock on 'gone'" in err
    servers[1].kill()
    servers[2].kill()
    code, out, err = manage(capsys, "redlock", "release", "gone")
    assert code == ExitCode.NO_QUORUM and "may still be held on a quorum" in err


@pytest.mark.parametrize(
    "argv", [("redlock",), ("redlock", "stats"), ("redlock", "status", "--no-such-option"), ("redlock", "release")]
)
def test_usage_errors_alone_exit_two(servers, capsys, argv):
    code, _, err = manage(capsys, *argv)
    assert code == ExitCode.USAGE and "usage:" in err


def test_other_errors_exit_one(settings, capsys):
    settings.REDLOCK_NODES = ["redis://127.0.0.1:1/0", "redis://127.0.0.1:2/0", "memcached://127.0.0.1:3"]
    code, _, err = manage(capsys, "redlock", "status", "--skip-checks")
    assert code == ExitCode.ERROR and "memcached" in err


@pytest.mark.parametrize("argv", [("--lock-fail",), ("--lock-wait", "0.2")])
def test_a_lock_held_elsewhere_exits_five(servers, capsys, argv):
    holder = get_lock_manager().acquire("command:nightly", ttl=30)
    code, out, err = manage(capsys, "nightly", *argv)
    assert code == ExitCode.LOCKED and "nightly done" not in out and "command:nightly" in err
    assert manage(capsys, "nightly")[0] == ExitCode.OK  # skipped: the default
    holder.release()
    code, out, _ = manage(capsys, "nightly", *argv)
    assert code == ExitCode.OK and "nightly done" in out


def test_traceback_keeps_the_exit_code(servers, capsys):
    holder = get_lock_manager().acquire("command:nightly", ttl=30)
    code, _, err = manage(capsys, "nightly", "--lock-fail", "--traceback")
    assert code == ExitCode.LOCKED and "Traceback (most recent call last)" in err
    holder.release()
    servers[0].kill()
    code, _, err = manage(capsys, "redlock", "status", "--traceback")
    assert code == ExitCode.DEGRADED and "Traceback (most recent call last)" in err
    kill_majority(servers)
    code, _, err = manage(capsys, "redlock", "status", "--timeout", "0.2", "--traceback")
    assert code == ExitCode.NO_QUORUM and "CommandError: No quorum" in err


@pytest.mark.parametrize("extra", [(), ("--lock-fail",), ("--lock-wait", "0.3")])
def test_nodes_down_fails_with_its_own_exit_code(servers, tmp_path, extra):
    kill_majority(servers)
    proc = start(servers, tmp_path / "a", 0.0, *extra)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == EXIT_NODES_UNAVAILABLE, err
    assert "Skipped" not in err
    assert "nodes" in err and "command:nightly" in err
    assert not (tmp_path / "a").exists()  # the work did not run


def test_nodes_down_in_process(servers):
    kill_majority(servers)
    with pytest.raises(CommandError) as info:
        call_command("nightly", stdout=StringIO(), stderr=StringIO())
    assert info.value.returncode == EXIT_NODES_UNAVAILABLE


def test_one_sigterm_releases_then_exits_143(servers, tmp_path):
    marker = tmp_path / "busy"
    proc = start_busy(servers, marker)
    wait_for(marker, proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "Stopped by SIGTERM" in err and "released" in err
    assert not get_lock_manager().is_locked("command:busy")


def test_held_lock_still_skips_with_zero(servers):
    holder = get_lock_manager().acquire("command:nightly", ttl=5)
    err = StringIO()
    call_command("nightly", stdout=StringIO(), stderr=err)  # no CommandError: exit 0
    assert err.getvalue().startswith("Skipped")
    holder.release()


def start_busy(servers, marker):
    env = dict(os.environ, REDLOCK_TEST_NODES=",".join(servers.urls), DJANGO_SETTINGS_MODULE="tests.settings")
    return subprocess.Popen(
        [sys.executable, "-m", "django", "busy", "--marker", str(marker)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_repeated_signals_during_node_calls_exit_and_release(servers, tmp_path, signum):
    marker = tmp_path / "busy"
    proc = start_busy(servers, marker)
    wait_for(marker, proc)
    checker = LockManager(servers.urls, retry_count=0, restart_window=0)
    try:
        assert checker.is_locked("command:busy")
        deadline = time.monotonic() + 10
        while proc.poll() is None and time.monotonic() < deadline:
            proc.send_signal(signum)
            try:
                proc.wait(timeout=0.005)  # the exit is the event awaited; the timeout paces the signals
            except subprocess.TimeoutExpired:
                pass
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
            pytest.fail("the command hung after signals (deadlock in the signal handler)")
        out, err = proc.communicate()
        assert not checker.is_locked("command:busy")  # released on the way out, not left for the ttl
        # 128+N from the command, or -N when a later signal hit the restored default handler after
        # the release (so may a KeyboardInterrupt at interpreter exit): a shell reports both as 128+N.
        assert proc.returncode in (128 + signum, -signum), err
        assert proc.returncode == -signum or "Stopped by" in err
    finally:
        checker.close()


def test_lock_taken_over_while_the_command_ran_exits_three(servers):
    """The watchdog has not ticked yet (long ttl), but the release finds the lock gone: exit 3, not 0."""
    from django.core.management.base import BaseCommand

    from django_redlock import redlock_command
    from django_redlock.decorators import EXIT_LOST

    other = LockManager(servers.urls, restart_window=0, retry_count=0)
    taken = []

    @redlock_command(key="takeover", ttl=30)
    class Command(BaseCommand):
        def handle(self, *args, **options):
            get_lock_manager().force_release("takeover")  # an operator, from the admin
            taken.append(other.acquire("takeover", ttl=5))

    with pytest.raises(CommandError) as info:
        call_command(Command(), stdout=StringIO(), stderr=StringIO())
    assert info.value.returncode == EXIT_LOST
    assert taken[0].owned(), "the new holder's lock must survive the command's exit"
    taken[0].release()
    other.close()
