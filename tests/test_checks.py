"""System checks: topology warnings, settings errors, and the node checks that connect."""

from __future__ import annotations

import pytest
from django.core.checks import Error, Warning

from django_redlock.checks import Codes, Hints, Messages, check_nodes, check_settings


def ids(messages):
    return [m.id for m in messages]


def test_w001_for_two_nodes(settings, servers):
    settings.REDLOCK_NODES = servers.urls[:2]
    messages = check_settings()
    assert Warning(Messages.FEW_MASTERS.format(count=2), hint=Hints.FEW_MASTERS, id=Codes.FEW_MASTERS) in messages


def test_w001_for_one_node_says_what_it_gives_and_what_not(settings, servers):
    settings.REDLOCK_NODES = servers.urls[:1]
    [message] = check_settings()
    assert message.id == Codes.FEW_MASTERS and not message.is_serious()
    text = message.msg
    assert "exclude each other while it runs and keeps its data" in text  # what it gives
    assert "available only while it is" in text  # availability: that node's
    assert "failover to a replica (asynchronous replication) may lose lock keys" in text  # what it does not
    assert "After a restart it sits out RESTART_WINDOW (unless declared FSYNC_ALWAYS)" in text
    assert "notices makes the node sit out RESTART_WINDOW too" in text and "not guarded" in text  # the guard, its limit
    assert "'One managed Redis as the only node'" in message.hint


def test_five_nodes_pass(settings, servers):
    settings.REDLOCK_NODES = servers.urls
    assert check_settings() == []


def test_distinct_servers_are_counted_not_entries(settings, servers):
    one = servers[0]
    settings.REDLOCK_NODES = [one.url, one.url.replace("/0", "/1"), f"redis://localhost:{one.port}/2"]
    messages = check_settings()
    assert Codes.FEW_MASTERS in ids(messages) and "1 independent" in messages[0].msg
    assert Codes.SAME_SERVER in ids(messages)


def test_even_count_warns(settings, servers):
    settings.REDLOCK_NODES = servers.urls[:4]
    assert ids(check_settings()) == [Codes.EVEN]


def test_timeout_against_ttl(settings, servers):
    settings.REDLOCK_NODES = servers.urls
    settings.REDLOCK = {"TTL": 1, "NODE_TIMEOUT": 0.5}
    assert ids(check_settings()) == [Codes.TIMEOUT]


@pytest.mark.parametrize(
    ("nodes", "text"),
    [
        ("redis://one", "must be a list"),
        ([], "is empty"),
        ([42], "REDLOCK_NODES[0] must be a Redis URL"),
        (["http://x:1"], "REDLOCK_NODES[0]: unsupported scheme 'http'"),
        (["cache:nope"], "CACHES has no alias 'nope'"),
        (["cache:locmem"], "not a Redis cache"),
        ([{"URL": "redis://x", "OPTIONS": 3}], "'OPTIONS' must be a dict"),
    ],
)
def test_bad_nodes_are_errors(settings, nodes, text):
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "locmem": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    }
    settings.REDLOCK_NODES = nodes
    messages = check_settings()
    assert len(messages) == 1 and isinstance(messages[0], Error)
    assert messages[0].id == Codes.SETTINGS and text in messages[0].msg


@pytest.mark.parametrize(
    ("redlock", "text"),
    [
        ({"TLL": 3}, "unknown key 'TLL'; did you mean 'TTL'"),
        ({"TTL": -1}, "REDLOCK['TTL'] must be > 0 seconds; got -1."),
        ({"NODE_TIMEOUT": 0}, "REDLOCK['NODE_TIMEOUT'] must be > 0 seconds; got 0."),
        ("fast", "REDLOCK must be a dict"),
    ],
)
def test_bad_redlock_dict(settings, servers, redlock, text):
    settings.REDLOCK_NODES = servers.urls
    settings.REDLOCK = redlock
    messages = check_settings()
    assert ids(messages) == [Codes.OPTIONS] and text in messages[0].msg


def test_passwords_never_in_check_messages(settings):
    settings.REDLOCK_NODES = ["redis://:Top-Secret-1@h1:6379/0", "redis://:Top-Secret-1@h1:6379/1", "bogus://:Top-Secret-1@h"]
    text = " ".join(m.msg + (m.hint or "") for m in check_settings())
    assert "Top-Secret-1" not in text and text


def test_node_checks_connect(settings, servers):
    replica = servers[4]
    import redis

    redis.Redis.from_url(replica.url).replicaof("127.0.0.1", servers[0].port)
    try:
        servers[3].kill()
        settings.REDLOCK_NODES = [*servers.urls, f"redis://localhost:{servers[0].port}/3"]
        messages = check_nodes()
        found = ids(messages)
        assert Codes.REPLICA in found
        assert Codes.UNREACHABLE in found
        assert Codes.SAME_RUN_ID in found
    finally:
        redis.Redis.from_url(replica.url).replicaof("no", "one")


def test_node_checks_eviction_policy(settings, servers):
    import redis

    redis.Redis.from_url(servers[1].url).config_set("maxmemory-policy", "volatile-lru")
    try:
        settings.REDLOCK_NODES = servers.urls
        messages = check_nodes()
        eviction = [m for m in messages if m.id == Codes.EVICTION]
        assert len(eviction) == 1 and servers.urls[1].split("//")[1] in eviction[0].msg
        assert Codes.SAME_HOST in ids(messages)  # five local masters share one machine
    finally:
        redis.Redis.from_url(servers[1].url).config_set("maxmemory-policy", "noeviction")


def test_manage_py_check_shows_w001(settings, servers):
    from io import StringIO

    from django.core.management import call_command

    settings.REDLOCK_NODES = servers.urls[:1]
    err = StringIO()
    call_command("check", stdout=StringIO(), stderr=err)
    assert "django_redlock.W001" in err.getvalue()
