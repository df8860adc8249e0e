"""@redlock_command: one host runs, the others skip; watchdog; loss stops the command; signals release."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from io import StringIO

import pytest
import redis
from django.core.management import BaseCommand, CommandError, call_command

from django_redlock import get_lock_manager, redlock_command
from django_redlock.exit_codes import ExitCode

pytestmark = pytest.mark.usefixtures("redlock_settings")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start(servers, marker, seconds, *extra):
    env = dict(os.environ, REDLOCK_TEST_NODES=",".join(servers.urls), DJANGO_SETTINGS_MODULE="tests.settings")
    return subprocess.Popen(
        [sys.executable, "-m", "django", "nightly", "--seconds", str(seconds), "--marker", str(marker), *extra],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(marker, proc, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if marker.exists() and "started" in marker.read_text():
            return
        if proc.poll() is not None:
            raise AssertionError(f"command exited early: {proc.communicate()}")
        time.sleep(0.02)  # polling another process's file: there is no event to await
    raise AssertionError("command never started")


def test_two_hosts_one_runs_the_other_skips(servers, tmp_path):
    first = start(servers, tmp_path / "a", 2.0)  # 2 s with a 0.5 s ttl: the watchdog must extend it
    wait_for(tmp_path / "a", first)
    second = start(servers, tmp_path / "b", 0.0)
    out, err = second.communicate(timeout=30)
    assert second.returncode == 0
    assert "Skipped" in err and "command:nightly" in err
    assert not (tmp_path / "b").exists()
    out, err = first.communicate(timeout=30)
    assert first.returncode == 0, err
    assert "nightly done" in out
    assert "done" in (tmp_path / "a").read_text()
    assert not get_lock_manager().is_locked("command:nightly")


def test_stolen_lock_stops_the_command_non_zero(servers, tmp_path):
    proc = start(servers, tmp_path / "a", 20.0)
    wait_for(tmp_path / "a", proc)
    manager = get_lock_manager()
    manager.force_release("command:nightly")
    thief = manager.acquire("command:nightly", ttl=10)
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 3, err
    assert "was lost" in err
    assert "done" not in (tmp_path / "a").read_text()
    thief.release()


def test_sigterm_releases_the_lock(servers, tmp_path):
    proc = start(servers, tmp_path / "a", 20.0)
    wait_for(tmp_path / "a", proc)
    assert get_lock_manager().is_locked("command:nightly")
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=10)
    assert proc.returncode != 0
    assert not get_lock_manager().is_locked("command:nightly")


def test_in_process_options():
    out, err = StringIO(), StringIO()
    call_command("nightly", stdout=out, stderr=err)
    assert "nightly done" in out.getvalue()
    lock = get_lock_manager().acquire("command:nightly", ttl=5)
    err = StringIO()
    call_command("nightly", stdout=StringIO(), stderr=err)
    assert err.getvalue().startswith("Skipped")
    with pytest.raises(CommandError) as info:
        call_command("nightly", lock_fail=True, stdout=StringIO(), stderr=StringIO())
    assert info.value.returncode == ExitCode.LOCKED
    started = time.monotonic()
    with pytest.raises(CommandError) as info:
        call_command("nightly", lock_wait=0.3, stdout=StringIO(), stderr=StringIO())
    assert 0.2 < time.monotonic() - started < 2 and info.value.returncode == ExitCode.LOCKED
    lock.release()
    out = StringIO()
    call_command("nightly", lock_wait=1, lock_ttl=2, stdout=out)
    assert "nightly done" in out.getvalue()


@pytest.mark.parametrize("stop", ["sigterm", "lock lost"])
def test_a_command_waiting_in_line_inside_manager_lock_stops(servers, tmp_path, stop):
    """``with manager.lock(...)`` counts as an engine call until it owns the lock, but not while it
    waits in line: the stop must not wait for the whole timeout."""
    from tests.conftest import eventually

    manager = get_lock_manager()
    held = manager.acquire("other", ttl=60)
    marker = tmp_path / "blocked"
    env = dict(os.environ, REDLOCK_TEST_NODES=",".join(servers.urls), DJANGO_SETTINGS_MODULE="tests.settings")
    proc = subprocess.Popen(
        [sys.executable, "-m", "django", "blocked", "--block", "redlock", "--seconds", "40", "--marker", str(marker)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    queue = manager.config.line_keys("other")[1]

    def in_line():
        with redis.Redis.from_url(servers[0].url, socket_timeout=2) as node:
            return proc.poll() is not None or node.zcard(queue) > 0

    try:
        eventually(in_line, 30)
        assert proc.poll() is None, proc.communicate()
        started = time.monotonic()
        if stop == "sigterm":
            proc.send_signal(signal.SIGTERM)
        else:
            assert manager.force_release("command:blocked") >= 3
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - started
        assert proc.returncode != 0, err
        assert took < 5, f"the command ran on for {took:.1f} s after it was told to stop"
        assert not manager.is_locked("command:blocked")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        held.release()



def listed_while_running(decorator, view=None):
    """Run a command decorated with ``decorator``; inside its handle(), read ``redlock list`` (JSON and
    text) and, given a test client, the admin's list of locks."""
    seen = {}

    @decorator
    class Reindex(BaseCommand):
        def handle(self, *args, **options):
            out = StringIO()
            call_command("redlock", "list", "--json", stdout=out)
            seen["json"] = {r["resource"]: r["holder"]["label"] for r in json.loads(out.getvalue())}
            out = StringIO()
            call_command("redlock", "list", stdout=out)
            seen["text"] = out.getvalue()
            seen["lock"] = self.redlock.holder.label
            if view is not None:
                seen["admin"] = view()

    call_command(Reindex(), stdout=StringIO(), stderr=StringIO())
    return seen


@pytest.mark.django_db
def test_a_command_lock_is_labelled_with_the_command_name(admin_client):
    from django.urls import reverse

    def admin_page():
        response = admin_client.get(reverse("admin:django_redlock_lock_changelist"))
        assert response.status_code == 200
        return response.content.decode()

    seen = listed_while_running(redlock_command(ttl=5), admin_page)
    assert seen["json"] == {"command:reindex": "command:reindex"} and seen["lock"] == "command:reindex"
    row = next(line for line in seen["text"].splitlines() if line.startswith("command:reindex "))
    assert row.endswith(f":{os.getpid()} (command:reindex)")
    assert "(command:reindex)" in seen["admin"]  # the holder's label, after host:pid


def test_a_command_lock_with_its_own_key_is_labelled_with_the_command_name(settings):
    settings.REDLOCK = {**settings.REDLOCK, "LABEL": "web"}  # the command's label goes before the default
    seen = listed_while_running(redlock_command("reindex-{name}", ttl=5))
    assert seen["json"] == {"reindex-reindex": "command:reindex"}


def test_an_explicit_label_is_kept():
    seen = listed_while_running(redlock_command(ttl=5, label="nightly reindex"))
    assert seen["json"] == {"command:reindex": "nightly reindex"} and seen["lock"] == "nightly reindex"


def test_a_label_that_is_not_text_is_refused():
    with pytest.raises(ValueError, match="label must be a string"):
        redlock_command(label=5)


@pytest.mark.parametrize("how", ["keys deleted", "expired"])
def test_a_lost_lock_is_told_once(servers, tmp_path, how):
    """With the project's log lines on the console (tests.settings_logged), a command whose lock is
    lost says so in one line: its error line (exit 3), not also a log line or two."""
    marker = tmp_path / "a"
    env = dict(os.environ, REDLOCK_TEST_NODES=",".join(servers.urls), DJANGO_SETTINGS_MODULE="tests.settings_logged")
    proc = subprocess.Popen(
        [sys.executable, "-m", "django", "nightly", "--seconds", "20", "--marker", str(marker)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    wait_for(marker, proc)
    if how == "keys deleted":  # the next extension finds the holder's value gone
        for url in servers.urls:
            with redis.Redis.from_url(url) as client:
                assert client.delete("redlock:lock:command:nightly") == 1
    else:  # three of five nodes stop answering: extensions fail and the 0.5 s ttl runs out
        for server in servers[:3]:
            server.pause()
    try:
        out, err = proc.communicate(timeout=30)
    finally:
        for server in servers[:3]:
            server.resume()
    assert proc.returncode == ExitCode.LOST, err
    told = [line for line in err.splitlines() if "lost" in line]
    assert len(told) == 1 and told[0].startswith("CommandError: Stopped: the lock 'command:nightly' was lost ("), err
    assert "done" not in marker.read_text()


def test_a_lost_lock_in_process_is_logged_once(servers, caplog):
    """Run by call_command (a worker, a test), the loss is one ERROR log line and the CommandError to the caller."""
    import logging

    @redlock_command(key="lost-once", ttl=1)
    class Command(BaseCommand):
        def handle(self, *args, **options):
            for url in servers.urls:
                with redis.Redis.from_url(url) as client:
                    client.delete("redlock:lock:lost-once")
            self.redlock.extend()  # finds the value gone on every node: lost

    with caplog.at_level(logging.DEBUG, logger="django_redlock"), pytest.raises(CommandError) as info:
        call_command(Command(), stdout=StringIO(), stderr=StringIO())
    assert info.value.returncode == ExitCode.LOST and "'lost-once' was lost" in str(info.value)
    logged = [r for r in caplog.records if "was lost" in r.getMessage()]
    assert len(logged) == 1 and logged[0].levelname == "ERROR", caplog.text
