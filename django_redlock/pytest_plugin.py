"""pytest fixtures for projects that use django-redlock: real local lock nodes that vote at once.

Installed with the package (a ``pytest11`` entry point), so a project's tests
can ask for them by name::

    def test_checkout(client, redlock_nodes):
        ...  # REDLOCK_NODES points at three local masters for this test

Fresh nodes look exactly like nodes that restarted empty, so the
delayed-restart rule would keep them out of the vote for a while. These run
with ``appendonly yes`` and ``appendfsync always`` and ``redlock_nodes``
declares them so (``"FSYNC_ALWAYS": True``): they vote at once, and nothing in
the tests' settings has to turn the rule off.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from django_redlock.testing import RedisServers, find_redis_server

__all__ = ["FSYNC_ALWAYS", "redlock_nodes", "redlock_servers"]

#: redis-server arguments under which a node keeps every lock across a restart (declare it so to
#: let it vote as soon as it is up).
FSYNC_ALWAYS = ("--appendonly", "yes", "--appendfsync", "always")


@pytest.fixture(scope="session")
def redlock_servers() -> Iterator[RedisServers]:
    """Three local ``redis-server`` masters for the whole session (skips the test if redis-server is missing)."""
    try:
        find_redis_server()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    servers = RedisServers(3, extra_args=FSYNC_ALWAYS).start()
    yield servers
    servers.stop()


@pytest.fixture
def redlock_nodes(redlock_servers: RedisServers, settings: Any) -> Iterator[list[dict[str, Any]]]:
    """``REDLOCK_NODES`` set to :func:`redlock_servers`, each declared ``FSYNC_ALWAYS``, for one test
    (needs pytest-django); emptied afterwards."""
    settings.REDLOCK_NODES = [{"URL": url, "FSYNC_ALWAYS": True} for url in redlock_servers.urls]
    yield settings.REDLOCK_NODES
    redlock_servers.heal()
