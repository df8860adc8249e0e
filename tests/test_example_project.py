"""The example project: its checks pass with five masters, show W001 with one, and W014 when none runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MANAGE = ROOT / "example_project" / "manage.py"


def manage(*args, **env):
    environment = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    environment.update(env)
    return subprocess.run(
        [sys.executable, str(MANAGE), *args], capture_output=True, text=True, env=environment, timeout=120
    )


def test_check_passes_with_five_masters():
    from django_redlock.testing import RedisServers

    with RedisServers(5) as masters:
        result = manage("check", DEMO_REDIS_PORTS=",".join(str(m.port) for m in masters))
    assert result.returncode == 0, result.stderr
    assert "no issues" in result.stdout


def test_check_says_when_the_masters_are_not_running():
    from django_redlock.testing import free_port

    ports = [str(free_port()) for _ in range(5)]
    result = manage("check", DEMO_REDIS_PORTS=",".join(ports))
    assert result.returncode == 0, result.stderr  # a warning: the masters may start later
    assert "no issues" not in result.stdout
    assert "django_redlock.W014" in result.stderr and "Only 0 of 5 Redlock nodes answered" in result.stderr


def test_single_node_switch_shows_w001():
    result = manage("check", DEMO_SINGLE_NODE="1")
    assert result.returncode == 0
    assert "django_redlock.W001" in result.stderr and "1 independent Redis master" in result.stderr


def test_migrations_are_complete():
    result = manage("makemigrations", "--check", "--dry-run")
    assert result.returncode == 0, result.stdout + result.stderr


def test_pages_423_admin_and_fencing(tmp_path):
    from django_redlock.testing import RedisServers

    durable = ["--appendonly", "yes", "--appendfsync", "always"]  # as make demo runs them
    with RedisServers(5, extra_args=durable) as masters:
        ports = ",".join(str(s.port) for s in masters)
        env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
        env.update(DEMO_REDIS_PORTS=ports, DEMO_DB=str(tmp_path / "demo.sqlite3"))
        result = subprocess.run(
            [sys.executable, str(ROOT / "tests" / "example_driver.py")],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            cwd=ROOT,
        )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "example project OK" in result.stdout


def test_nightly_report_runs_exactly_the_seconds_asked(tmp_path):
    from django_redlock.testing import RedisServers

    durable = ["--appendonly", "yes", "--appendfsync", "always"]
    with RedisServers(3, extra_args=durable) as masters:
        ports = ",".join(str(s.port) for s in masters)
        result = manage("nightly_report", "--seconds", "5.3", DEMO_REDIS_PORTS=ports)
    assert result.returncode == 0, result.stderr
    progress = [line.strip() for line in result.stdout.splitlines() if line.strip().startswith("…")]
    # Steps of at most 5 s, the last one cut to the deadline (a whole second step would end at 10 s).
    assert progress == ["… 5 s", "… 5 s"], result.stdout
