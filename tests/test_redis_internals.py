"""The redis-py the engine runs on: a missing private attribute fails at import, naming redis-py's
version; the tested bounds agree in pyproject.toml, the matrix and the check."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import redis
import redis.asyncio as aredis

from django_redlock.core import redis_internals
from django_redlock.core.redis_internals import NEWEST, OLDEST, UnsupportedRedisPy

ROOT = Path(__file__).resolve().parent.parent


def test_the_installed_redis_py_has_everything_the_engine_uses():
    assert redis_internals.missing() == []
    redis_internals.check()


def test_a_missing_method_is_named_with_redis_py_version(monkeypatch):
    monkeypatch.delattr(redis.Connection, "_connect")
    with pytest.raises(UnsupportedRedisPy) as caught:
        redis_internals.check()
    text = str(caught.value)
    assert f"django-redlock cannot use redis-py {redis.__version__}: redis.Connection has no '_connect'" in text
    assert f"tested with redis-py {OLDEST} to {NEWEST}.x" in text and f"'redis>={OLDEST},<" in text


def test_a_missing_instance_attribute_is_found_on_an_unconnected_connection(monkeypatch):
    original = aredis.Connection.__init__

    def without_writer(self, *args, **kwargs):
        original(self, *args, **kwargs)
        del self._writer

    monkeypatch.setattr(aredis.Connection, "__init__", without_writer)
    assert [(name, attribute) for name, attribute, _use in redis_internals.missing()] == [
        ("redis.asyncio.Connection", "_writer")
    ]
    with pytest.raises(UnsupportedRedisPy, match=r"redis\.asyncio\.Connection has no '_writer' \(the asyncio engine"):
        redis_internals.check()


def test_the_engine_refuses_at_import_when_the_socket_attribute_is_gone():
    """The check runs when the engine's connection code is imported, before any lock is tried."""
    program = (
        "import redis\n"
        "original = redis.Connection.__init__\n"
        "def init(self, *a, **k):\n"
        "    original(self, *a, **k)\n"
        "    del self._sock\n"
        "redis.Connection.__init__ = init\n"
        "from django_redlock.core import LockManager\n"
        "LockManager(['redis://127.0.0.1:1'])\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("django_redlock.core.redis_internals.UnsupportedRedisPy: django-redlock cannot use redis-py ")
    assert "redis.Connection has no '_sock' (the sync engine reads and writes the connected socket itself)" in last


def test_the_tested_bounds_agree_with_the_requirement_and_the_matrix():
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (requirement,) = [d for d in dependencies if re.match(r"redis\b", d)]
    major, minor = NEWEST.split(".")
    assert requirement == f"redis>={OLDEST},<{major}.{int(minor) + 1}"
    matrix = (ROOT / "scripts" / "matrix.sh").read_text()
    assert f'REDIS_OLDEST="redis=={OLDEST}"' in matrix
    assert f'REDIS_NEWEST="redis>={NEWEST},<{major}.{int(minor) + 1}"' in matrix
