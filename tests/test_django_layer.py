"""Settings, default managers, cache aliases, signals and logging."""

from __future__ import annotations

import logging

import pytest
from django.core.exceptions import ImproperlyConfigured

from django_redlock import get_async_lock_manager, get_lock_manager, signals
from django_redlock.exceptions import LockNotAcquired


def test_manager_built_from_settings(settings, servers):
    settings.REDLOCK_NODES = servers.urls
    settings.REDLOCK = {"TTL": 7, "NODE_TIMEOUT": 0.02, "KEY_PREFIX": "app:", "RESTART_WINDOW": 0}
    manager = get_lock_manager()
    assert manager is get_lock_manager()
    assert (manager.ttl, manager.node_timeout, manager.key_prefix, manager.quorum) == (7, 0.02, "app:", 3)
    assert manager.key("x") == "app:lock:x"
    with manager.lock("x") as lock:
        assert 6 < lock.validity <= 7


def test_manager_rebuilt_when_settings_change(settings, servers):
    settings.REDLOCK_NODES = servers.urls
    first = get_lock_manager()
    settings.REDLOCK_NODES = servers.urls[:3]
    second = get_lock_manager()
    assert first is not second and len(second.nodes) == 3


def test_missing_setting_is_a_clear_error(settings):
    del settings.REDLOCK_NODES
    with pytest.raises(ImproperlyConfigured, match="REDLOCK_NODES is not set"):
        get_lock_manager()


def test_bad_engine_option_names_the_setting(settings, servers):
    settings.REDLOCK_NODES = servers.urls
    settings.REDLOCK = {"RETRY_COUNT": -2}
    with pytest.raises(ImproperlyConfigured, match=r"REDLOCK\['RETRY_COUNT'\] must be a whole number >= 0; got -2"):
        get_lock_manager()


def test_cache_alias_reuses_django_redis_connection(settings, servers):
    settings.CACHES = {
        f"lock{i}": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": url} for i, url in enumerate(servers.urls[:3])
    }
    settings.REDLOCK_NODES = ["cache:lock0", "cache:lock1", {"URL": servers.urls[2]}]
    manager = get_lock_manager()
    assert manager.nodes[0] == servers.urls[0].split("//")[1]
    manager.acquire("via-cache").release()


def test_cache_alias_with_replicas_is_refused(settings, servers):
    settings.CACHES = {
        "many": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": [servers.urls[0], servers.urls[1]]}
    }
    settings.REDLOCK_NODES = ["cache:many"]
    with pytest.raises(ImproperlyConfigured, match="primary and replicas"):
        get_lock_manager()


def test_signals_and_logging(redlock_settings, caplog):
    events = []

    def record(signal_name):
        def receiver(sender, **kwargs):
            events.append((signal_name, kwargs.get("lock").resource if "lock" in kwargs else kwargs["resource"]))

        return receiver

    receivers = {name: record(name) for name in ("lock_acquired", "lock_released", "lock_extended", "lock_not_acquired")}
    for name, receiver in receivers.items():
        getattr(signals, name).connect(receiver)
    try:
        manager = get_lock_manager()
        with caplog.at_level(logging.INFO, logger="django_redlock"):
            lock = manager.acquire("signalled")
            lock.extend()
            with pytest.raises(LockNotAcquired):
                manager.acquire("signalled", blocking=False)
            lock.release()
    finally:
        for name, receiver in receivers.items():
            getattr(signals, name).disconnect(receiver)
    assert events == [
        ("lock_acquired", "signalled"),
        ("lock_extended", "signalled"),
        ("lock_not_acquired", "signalled"),
        ("lock_released", "signalled"),
    ]
    assert any(r.levelno == logging.INFO and "Could not lock 'signalled'" in r.getMessage() for r in caplog.records)


def test_lost_lock_is_logged_at_error_and_signalled(redlock_settings, caplog):
    lost = []
    receiver = lambda sender, lock, reason, **kw: lost.append(reason)  # noqa: E731
    signals.lock_lost.connect(receiver)
    try:
        manager = get_lock_manager()
        lock = manager.acquire("short", ttl=0.05)
        import time

        time.sleep(0.08)
        with caplog.at_level(logging.ERROR, logger="django_redlock"):
            lock.release()
    finally:
        signals.lock_lost.disconnect(receiver)
    assert lost and "expired" in lost[0]
    assert any(r.levelno == logging.ERROR and "'short' was lost" in r.getMessage() for r in caplog.records)


def test_passwords_not_logged(settings, servers, caplog):
    settings.REDLOCK_NODES = [u.replace("redis://", "redis://:Log-Secret-5@") for u in servers.urls]
    with caplog.at_level(logging.DEBUG, logger="django_redlock"):
        with pytest.raises(LockNotAcquired):
            get_lock_manager().acquire("p", blocking=False)
    assert caplog.records and "Log-Secret-5" not in caplog.text


async def test_async_manager_from_settings(redlock_settings):
    manager = get_async_lock_manager()
    async with manager.lock("async-default") as lock:
        assert lock.locked()
    await manager.aclose()
