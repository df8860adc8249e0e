"""Which server the suite runs on, and what differs between the servers it supports.

``make test-servers`` runs the engine and safety tests on Redis 6.2, Redis 7.x and Valkey 8.x
(``REDIS_SERVER`` names the binary, ``REDLOCK_TEST_SERVER`` the server it must be); these tests
fail when the binary is not the one asked for, and check what the library reports of each server.
"""

from __future__ import annotations

import io
import json
import stat

import pytest
import redis
from django.core.management import call_command

from django_redlock.core import LockManager
from django_redlock.testing import (
    EXPECT_ENV,
    ServerIdentity,
    expected_server,
    find_redis_server,
    identify_server,
    identity_from_info,
)


@pytest.fixture(scope="module")
def identity() -> ServerIdentity:
    return identify_server()


def test_the_suite_runs_on_the_server_asked_for(identity):
    wanted = expected_server()
    assert identity.product in ("redis", "valkey"), identity
    assert identity.version[:1].isdigit(), identity
    if wanted is not None:
        assert identity.matches(wanted), f"{EXPECT_ENV}={wanted!r} but REDIS_SERVER runs {identity}"


def test_what_info_server_says_names_the_product_and_its_own_version():
    redis7 = identity_from_info({"redis_version": "7.0.15", "redis_mode": "standalone"}, "/usr/bin/redis-server")
    valkey = identity_from_info({"redis_version": "7.2.4", "server_name": "valkey", "valkey_version": "8.1.8"})
    assert (redis7.product, redis7.version) == ("redis", "7.0.15")
    assert (valkey.product, valkey.version) == ("valkey", "8.1.8")
    assert str(redis7) == "redis 7.0.15 (/usr/bin/redis-server)"
    assert redis7.matches("redis 7") and redis7.matches("redis 7.0") and redis7.matches("REDIS")
    assert not redis7.matches("redis 7.2") and not redis7.matches("redis 7.01") and not redis7.matches("valkey 8")
    assert valkey.matches("valkey 8.1") and not valkey.matches("redis 7.2")


def test_redis_server_names_the_binary(monkeypatch, tmp_path):
    real = find_redis_server()
    monkeypatch.setenv("REDIS_SERVER", real)
    assert find_redis_server() == real
    not_executable = tmp_path / "redis-server"
    not_executable.write_text("")
    not_executable.chmod(stat.S_IRUSR)
    monkeypatch.setenv("REDIS_SERVER", str(not_executable))
    with pytest.raises(RuntimeError, match="not an executable"):
        find_redis_server()


def test_a_started_server_is_the_binary_it_was_given(identity):
    assert identify_server(identity.binary) == identity


def test_status_names_the_server_and_its_own_version(servers, identity):
    """Valkey also reports ``redis_version`` (7.2.4 for Valkey 8): status shows Valkey's own."""
    manager = LockManager(servers.urls[:3], restart_window=0)
    try:
        statuses = manager.node_status()
    finally:
        manager.close()
    assert [(s.server, s.version) for s in statuses] == [(identity.product, identity.version)] * 3


def test_redlock_status_prints_the_server_and_its_version(redlock_settings, identity):
    out = io.StringIO()
    call_command("redlock", "status", stdout=out)
    assert f"{identity.product} {identity.version}" in out.getvalue()
    out = io.StringIO()
    call_command("redlock", "status", "--json", stdout=out)
    nodes = json.loads(out.getvalue())
    nodes = nodes["nodes"] if isinstance(nodes, dict) else nodes
    assert {(n["server"], n["version"]) for n in nodes} == {(identity.product, identity.version)}


def test_the_restart_probe_reads_the_same_fields_on_this_server(servers):
    """The restart rule reads INFO server and replication and CONFIG GET: the same fields on every server."""
    with redis.Redis.from_url(servers[0].url, socket_timeout=2) as client:
        info = client.info("server")
        replication = client.info("replication")
        config = client.config_get("appendfsync")
    assert isinstance(info["uptime_in_seconds"], int) and len(info["run_id"]) == 40
    assert replication["role"] == "master" and len(replication["master_replid"]) == 40
    assert "master_replid2" in replication
    assert config == {"appendfsync": "everysec"}


def test_the_session_header_names_the_server(pytestconfig, identity):
    lines = pytestconfig.hook.pytest_report_header(config=pytestconfig, start_path=pytestconfig.rootpath)
    text = "\n".join(line for group in lines for line in ([group] if isinstance(group, str) else group))
    assert f"server: {identity}" in text
