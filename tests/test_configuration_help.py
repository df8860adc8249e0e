"""Configuration help: every problem at once, hints for common mistakes, Django's own Redis cache,
the deploy checks by tag, and a module-level manager that follows settings."""

from __future__ import annotations

import re
from io import StringIO

import pytest
from django.core.checks import Error
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.test import override_settings

from django_redlock import get_lock_manager, lock_manager
from django_redlock.checks import Codes, check_settings


def test_every_problem_is_reported_at_once(settings, servers):
    settings.REDLOCK = {"TLL": 3, "NODE_TIMEOUT": -1, "RETRY_DELAY": "fast"}
    settings.REDLOCK_NODES = ["127.0.0.1:6379", servers.urls[0], 42, "http://x:1"]
    messages = check_settings()
    texts = [m.msg for m in messages]
    assert all(isinstance(m, Error) for m in messages)
    assert [m.id for m in messages] == [Codes.OPTIONS] * 3 + [Codes.SETTINGS] * 3
    assert "REDLOCK has an unknown key 'TLL'; did you mean 'TTL'?" in texts
    assert any("REDLOCK['NODE_TIMEOUT']" in t for t in texts) and any("REDLOCK['RETRY_DELAY']" in t for t in texts)
    assert texts[3] == "REDLOCK_NODES[0]: '127.0.0.1:6379' has no scheme; did you mean 'redis://127.0.0.1:6379/0'?"
    assert texts[4].startswith("REDLOCK_NODES[2] must be a Redis URL") and "REDLOCK_NODES[3]" in texts[5]


def test_a_misspelt_setting_name_is_named(settings, servers):
    settings.REDLOCK_NODES = servers.urls
    settings.REDLOCK_NODE = servers.urls
    assert [m.msg for m in check_settings()] == [
        "settings.REDLOCK_NODE is not a django-redlock setting; did you mean REDLOCK_NODES?"
    ]
    del settings.REDLOCK_NODES
    with pytest.raises(ImproperlyConfigured, match=r"REDLOCK_NODES is not set \(settings.REDLOCK_NODE is set"):
        get_lock_manager()


def test_a_scheme_less_node_gets_the_url_it_probably_meant(settings):
    settings.REDLOCK_NODES = ["redis-a:6379", ":s3cret@redis-b:6380/2"]
    with pytest.raises(ImproperlyConfigured, match=r"did you mean 'redis://redis-a:6379/0'\?"):
        get_lock_manager()
    messages = [m.msg for m in check_settings()]
    assert "did you mean 'redis://***@redis-b:6380/2'?" in messages[1] and "s3cret" not in " ".join(messages)


def test_djangos_own_redis_cache_can_be_a_node(settings, servers):
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        **{f"lock{i}": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": url}
           for i, url in enumerate(servers.urls[:3])},
        "pair": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": servers.urls[3:5]},
    }
    settings.REDLOCK_NODES = ["cache:lock0", "cache:lock1", "cache:lock2"]
    settings.REDLOCK = {"RESTART_WINDOW": 0}
    manager = get_lock_manager()
    assert manager.nodes[0] == servers.urls[0].split("//")[1]
    manager.acquire("via-django-cache").release()
    settings.REDLOCK_NODES = ["cache:pair"]
    with pytest.raises(ImproperlyConfigured, match="primary and replicas"):
        get_lock_manager()


def test_the_documented_deploy_tag_runs_the_node_checks(settings, servers):
    settings.REDLOCK_NODES = servers.urls[:3]
    servers[0].kill()
    out, err = StringIO(), StringIO()
    call_command("check", "--deploy", "--tag", "redlock_nodes", stdout=out, stderr=err)
    text = out.getvalue() + err.getvalue()
    assert Codes.UNREACHABLE in text and "did not answer" in text  # check_nodes ran
    assert "security.W" not in text  # and only the tagged checks


def test_the_module_level_manager_follows_settings(settings, servers):
    settings.REDLOCK_NODES = servers.urls
    settings.REDLOCK = {"RESTART_WINDOW": 0}
    kept = get_lock_manager()
    assert lock_manager.nodes == kept.nodes
    with override_settings(REDLOCK_NODES=servers.urls[:3]):
        assert len(lock_manager.nodes) == 3  # the proxy follows; the kept object does not
        assert len(kept.nodes) == 5
        lock_manager.acquire("follows").release()
    assert len(lock_manager.nodes) == 5


@pytest.mark.parametrize(
    ("url", "meant"),
    [
        ("redis//127.0.0.1:7903", "redis://127.0.0.1:7903"),
        ("rediss//cache.example.com:6380/1", "rediss://cache.example.com:6380/1"),
        ("redis:/127.0.0.1:7903", "redis://127.0.0.1:7903"),
        ("redis:///127.0.0.1:7903/2", "redis://127.0.0.1:7903/2"),
        ("redis//:s3cret-pw@127.0.0.1:7903", "redis://***@127.0.0.1:7903"),
        ("redis:6379", "redis://redis:6379/0"),
        ("127.0.0.1:7903", "redis://127.0.0.1:7903/0"),
    ],
)
def test_a_mistyped_scheme_gets_the_url_it_probably_meant(settings, url, meant):
    settings.REDLOCK_NODES = [url]
    messages = [m.msg for m in check_settings() if m.id == Codes.SETTINGS]
    assert len(messages) == 1 and messages[0].endswith(f"did you mean {meant!r}?"), messages
    assert "s3cret-pw" not in messages[0]
    with pytest.raises(ImproperlyConfigured, match=re.escape(f"did you mean {meant!r}?")):
        get_lock_manager()


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({"URL": "redis://127.0.0.1:7903/0", "OPTION": {"password": "s3cret-pw"}},
         "REDLOCK_NODES[0]: unknown key 'OPTION'; did you mean 'OPTIONS'?"),
        ({"URL": "redis://127.0.0.1:7903/0", "FSYNC_ALWAY": True},
         "REDLOCK_NODES[0]: unknown key 'FSYNC_ALWAY'; did you mean 'FSYNC_ALWAYS'?"),
        ({"url": "redis://:s3cret-pw@127.0.0.1:7903/0", "options": {}},
         "REDLOCK_NODES[0]: unknown key 'url'; did you mean 'URL'? (keys are upper-case); "
         "unknown key 'options'; did you mean 'OPTIONS'? (keys are upper-case)"),
        ({"URL": "redis://127.0.0.1:7903/0", "Fsync_Always": True},
         "REDLOCK_NODES[0]: unknown key 'Fsync_Always'; did you mean 'FSYNC_ALWAYS'? (keys are upper-case)"),
        ({"URL": "redis://127.0.0.1:7903/0", "TIMEOUT": 1},
         "REDLOCK_NODES[0]: unknown key 'TIMEOUT'; expected 'URL' and optional 'OPTIONS', 'FSYNC_ALWAYS'"),
        ({"OPTIONS": {}}, "REDLOCK_NODES[0]: 'URL' must be a Redis URL string (or a redis-py or valkey-py client); "
                          "it is missing."),
    ],
)
def test_a_node_key_is_reported_as_written_with_the_key_meant(settings, entry, expected):
    settings.REDLOCK_NODES = [entry]
    messages = [m.msg for m in check_settings() if m.id == Codes.SETTINGS]
    assert messages == [expected]
    assert "s3cret-pw" not in messages[0]
    with pytest.raises(ImproperlyConfigured, match=re.escape(expected)):
        get_lock_manager()
