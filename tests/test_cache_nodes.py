"""Nodes named through CACHES aliases: declared durable (``{"URL": "cache:<alias>", "FSYNC_ALWAYS": True}``),
and the messages for near misses (``cahce:x``, an unknown alias, options that belong to the cache).

The restart tests run real redis-server processes with ``appendonly yes`` and ``appendfsync always``,
behind each cache backend that can name a node: Django's own RedisCache, django-redis and django-valkey.
"""

from __future__ import annotations

import importlib.util
import time

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured

from django_redlock import get_lock_manager
from django_redlock.checks import Codes, check_settings
from django_redlock.core import LockManager, clock, ledger
from django_redlock.exceptions import LockNotAcquired
from django_redlock.pytest_plugin import FSYNC_ALWAYS
from django_redlock.testing import RedisServers
from tests.conftest import eventually


def _valkey_cache_loads() -> bool:
    if importlib.util.find_spec("django_valkey") is None:
        return False
    try:
        import django_valkey.cache  # noqa: F401  (needs a recent Django)
    except ImportError:
        return False
    return True


BACKENDS = [
    pytest.param("django.core.cache.backends.redis.RedisCache", "redis", id="django"),
    pytest.param("django_redis.cache.RedisCache", "redis", id="django-redis",
                 marks=pytest.mark.skipif(importlib.util.find_spec("django_redis") is None, reason="no django-redis")),
    pytest.param("django_valkey.cache.ValkeyCache", "valkey", id="django-valkey",
                 marks=pytest.mark.skipif(not _valkey_cache_loads(), reason="django-valkey not usable here")),
    # Django closes the caches when a test's settings are undone; this backend's close() is a coroutine.
    pytest.param("django_valkey.async_cache.cache.AsyncValkeyCache", "valkey", id="django-valkey-async",
                 marks=[pytest.mark.skipif(not _valkey_cache_loads(), reason="django-valkey not usable here"),
                        pytest.mark.filterwarnings("ignore:coroutine 'AsyncBackendCommands.close':RuntimeWarning")]),
]
PASSWORD = "cache-Pa55word-n0t-for-output"


@pytest.fixture
def durable():
    """Three fresh masters that fsync every write (uptime ~0 s: each counts as just restarted)."""
    ledger._HISTORIES.by_address.clear()
    with RedisServers(3, extra_args=FSYNC_ALWAYS) as group:
        yield group
    ledger._HISTORIES.by_address.clear()


def caches(servers, backend="django.core.cache.backends.redis.RedisCache", scheme="redis"):
    found = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    for i, server in enumerate(servers):
        found[f"lock{i}"] = {"BACKEND": backend, "LOCATION": f"{scheme}://127.0.0.1:{server.port}/0"}
    return found


@pytest.mark.parametrize(("backend", "scheme"), BACKENDS)
def test_cache_nodes_declared_fsync_always_vote_right_after_a_restart(settings, durable, backend, scheme):
    settings.CACHES = caches(durable, backend, scheme)
    settings.REDLOCK_NODES = [
        {"URL": "cache:lock0", "FSYNC_ALWAYS": True},
        {"URL": "cache:lock1", "FSYNC_ALWAYS": True},
        "cache:lock2",  # not declared
    ]
    settings.REDLOCK = {"TTL": 10}  # the restart window follows MAX_TTL: 60 s
    assert [m for m in check_settings() if m.is_serious()] == []
    manager = get_lock_manager()
    assert [node.fsync_always for node in manager.node_list] == [True, True, False]
    assert manager.nodes[0] == f"127.0.0.1:{durable[0].port}/0"
    statuses = manager.node_status()
    assert [s.votes for s in statuses] == [True, True, False], statuses
    assert statuses[2].sits_out_for > 0 and "not declared FSYNC_ALWAYS" in statuses[2].not_voting_reason
    held = manager.acquire("held", blocking=False)  # nodes 0 and 1: node 2 sits out
    last_heard = clock.now()
    # Deliberately: INFO's uptime is whole seconds, so a server that started within about 2 s of
    # this process's last reply from the one before may have been there already (a failover: it
    # sits out one window, declared or not). Restart it later than that.
    while clock.now() < last_heard + 2.5:
        time.sleep(0.05)
    durable[0].restart()
    eventually(lambda: manager.ping()[manager.nodes[0]] is not None)
    after = manager.acquire("after-restart", blocking=False)  # needs node 0's vote
    assert after.locked()
    status = manager.node_status()[0]
    assert status.votes and status.sits_out_for == 0 and status.fsync_declared and status.uptime < 10
    # fsync-always kept the held lock's key through the restart: nobody else gets it
    with pytest.raises(LockNotAcquired):
        manager.acquire("held", blocking=False)
    assert held.locked()
    after.release()
    held.release()


def test_the_same_caches_not_declared_sit_out_after_a_restart(settings, durable):
    settings.CACHES = caches(durable)
    settings.REDLOCK_NODES = ["cache:lock0", "cache:lock1", "cache:lock2"]
    settings.REDLOCK = {}  # the restart window follows MAX_TTL: 60 s
    with pytest.raises(LockNotAcquired, match="not declared FSYNC_ALWAYS"):
        get_lock_manager().acquire("fresh", blocking=False)


@pytest.fixture
def named(settings, servers):
    settings.CACHES = caches(servers[:3])
    return settings


def messages(settings, entry):
    settings.REDLOCK_NODES = [entry, "cache:lock1", "cache:lock2"]
    found = [m.msg for m in check_settings() if m.id == Codes.SETTINGS]
    with pytest.raises(ImproperlyConfigured) as info:
        get_lock_manager()
    assert found and found[0] in str(info.value)  # the same words at run time
    return found


ALIASES = "(CACHES aliases: 'default', 'lock0', 'lock1', 'lock2')"


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ("cahce:lock0", f"REDLOCK_NODES[0] is 'cahce:lock0'; did you mean 'cache:lock0'? {ALIASES}"),
        ("Cache:lock0", f"REDLOCK_NODES[0] is 'Cache:lock0'; did you mean 'cache:lock0'? {ALIASES}"),
        ("caches:lock0", f"REDLOCK_NODES[0] is 'caches:lock0'; did you mean 'cache:lock0'? {ALIASES}"),
        ("cache://lock0", f"REDLOCK_NODES[0] is 'cache://lock0'; did you mean 'cache:lock0'? {ALIASES}"),
        ("cahce:lcok0", f"REDLOCK_NODES[0] is 'cahce:lcok0'; did you mean 'cache:lock0'? {ALIASES}"),
        ({"URL": "cahce:lock0", "FSYNC_ALWAYS": True},
         f"REDLOCK_NODES[0] is 'cahce:lock0'; did you mean 'cache:lock0'? {ALIASES}"),
        ("cache:lcok0", f"REDLOCK_NODES[0] is 'cache:lcok0' but CACHES has no alias 'lcok0'; "
                        f"did you mean 'cache:lock0'? {ALIASES}."),
        ({"URL": "cache:nothing-like-it", "FSYNC_ALWAYS": True},
         f"REDLOCK_NODES[0] is 'cache:nothing-like-it' but CACHES has no alias 'nothing-like-it' {ALIASES}."),
        ("lock0", "REDLOCK_NODES[0] is 'lock0', a CACHES alias; did you mean 'cache:lock0'?"),
        ("cache:6379", f"REDLOCK_NODES[0] is 'cache:6379' but CACHES has no alias '6379' {ALIASES}; for a Redis "
                       "server at the host 'cache', write 'redis://cache:6379/0'."),
        ("cacher:6379/1", "REDLOCK_NODES[0]: 'cacher:6379/1' has no scheme; did you mean 'redis://cacher:6379/1'?"),
    ],
)
def test_a_near_miss_names_the_alias_and_the_caches_that_exist(named, entry, expected):
    found = messages(named, entry)
    assert found == [expected]
    assert "scheme" not in found[0] or not str(entry).startswith("cache:")


def test_options_that_belong_to_the_cache_are_refused(named):
    entry = {"URL": "cache:lock0", "FSYNC_ALWAYS": True, "OPTIONS": {"password": PASSWORD}}
    [text] = messages(named, entry)
    assert text == (
        "REDLOCK_NODES[0] has 'URL': 'cache:lock0' and 'OPTIONS'; a cache node connects as the cache does: "
        "set connection options in CACHES['lock0']['OPTIONS'] (or give a Redis URL with 'OPTIONS')."
    )
    named.REDLOCK_NODES = [{"URL": "cache:lock0", "OPTIONS": {}}, "cache:lock1", "cache:lock2"]
    assert [m for m in check_settings() if m.is_serious()] == []  # nothing to conflict


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({"URL": "cache:lock0", "OPTION": {}}, "REDLOCK_NODES[0]: unknown key 'OPTION'; did you mean 'OPTIONS'?"),
        ({"URL": "cache:lock0", "FSYNC_ALWAYS": "yes"}, "REDLOCK_NODES[0]: 'FSYNC_ALWAYS' must be True or False"),
        ({"url": "cache:lock0"}, "REDLOCK_NODES[0]: unknown key 'url'; did you mean 'URL'? (keys are upper-case)"),
    ],
)
def test_a_cache_node_dict_is_checked_like_any_node_dict(named, entry, expected):
    [text] = messages(named, entry)
    assert text.startswith(expected), text


def test_a_user_named_cache_is_a_url_and_its_password_stays_hidden(named):
    [text] = messages(named, f"cache:{PASSWORD}@redis-a:6379/0")
    assert PASSWORD not in text and "redis://***@redis-a:6379/0" in text


def test_the_engine_says_what_a_cache_alias_is_not_that_it_lacks_a_scheme():
    with pytest.raises(ValueError) as info:
        LockManager(["cache:lock0"])
    assert str(info.value) == (
        "nodes[0]: 'cache:lock0' names a Django cache, which only REDLOCK_NODES in Django settings resolves; "
        "give the engine a Redis URL or the cache's client."
    )
    with pytest.raises(ValueError) as info:
        LockManager(["cahce:lock0"])  # no address to guess: not 'redis://cahce:lock0/0'
    assert str(info.value) == (
        "nodes[0]: 'cahce:lock0' has no scheme; expected redis://host:port/db, rediss:// or unix://."
    )


def test_the_engine_takes_a_client_as_url_with_its_declaration(servers):
    client = redis.Redis.from_url(servers.urls[0])
    manager = LockManager([{"URL": client, "FSYNC_ALWAYS": True}, servers.urls[1]])
    assert [node.fsync_always for node in manager.node_list] == [True, False]
    assert manager.nodes[0] == servers.urls[0].split("//")[1]
    manager.close()
    with pytest.raises(ValueError, match=r"^nodes\[0\]: 'OPTIONS' cannot go with a client as 'URL'"):
        LockManager([{"URL": client, "OPTIONS": {"password": PASSWORD}}])
    client.close()


def test_check_deploy_reads_the_declaration_of_a_cache_node(named):
    from django_redlock.checks import check_nodes

    named.REDLOCK_NODES = [{"URL": "cache:lock0", "FSYNC_ALWAYS": True}, "cache:lock1", "cache:lock2"]
    found = [m for m in check_nodes() if m.id == Codes.NOT_FSYNCING]
    assert len(found) == 1 and "is declared FSYNC_ALWAYS but runs appendonly no" in found[0].msg, found
