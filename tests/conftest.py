"""Fixtures: real redis-server masters started by the suite itself.

``redis_servers`` starts five independent masters once per session (free
loopback ports, no persistence). ``servers`` hands them to a test healed and
empty: paused ones resumed, killed ones restarted, every key flushed. Tests
fault them with ``servers[i].kill()``, ``.pause()``, ``.resume()`` and
``.restart()``.
"""

from __future__ import annotations

import pytest

from django_redlock.core import LockManager
from django_redlock.testing import RedisServers, find_redis_server


@pytest.fixture(scope="session")
def redis_servers():
    try:
        find_redis_server()
    except RuntimeError as exc:
        pytest.exit(str(exc), returncode=3)
    group = RedisServers(5).start()
    yield group
    group.stop()


@pytest.fixture
def servers(redis_servers):
    redis_servers.heal()
    yield redis_servers
    redis_servers.heal()


@pytest.fixture
def manager(servers):
    mgr = LockManager(servers.urls, ttl=10.0, retry_count=0, node_timeout=0.05, restart_window=0)
    yield mgr
    mgr.close()


@pytest.fixture
def redlock_settings(settings, servers):
    """Point REDLOCK_NODES at the five test masters."""
    settings.REDLOCK_NODES = servers.urls
    yield settings
