"""@redlock_command exit codes: nodes down is a failure (4), not a skip; signals stop and release."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from django_redlock import get_lock_manager
from django_redlock.core import LockManager
from django_redlock.decorators import EXIT_NODES_UNAVAILABLE
from tests.test_command_decorator import ROOT, start, wait_for

pytestmark = pytest.mark.usefixtures("redlock_settings")


def kill_majority(servers):
    for server in servers[: len(servers) // 2 + 1]:
        server.kill()


def test_exit_code_is_four():
    assert EXIT_NODES_UNAVAILABLE == 4


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
