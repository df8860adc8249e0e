"""Fixtures: real redis-server masters started by the suite itself.

``redis_servers`` starts five independent masters once per session (free
loopback ports, no persistence). ``servers`` hands them to a test healed and
empty: paused ones resumed, killed ones restarted, every key flushed. Tests
fault them with ``servers[i].kill()``, ``.pause()``, ``.resume()`` and
``.restart()``. ``waiters`` puts blocking acquire calls in a resource's line
from threads.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from django_redlock.core import LockManager, ledger
from django_redlock.testing import RedisServers, expected_server, find_redis_server, identify_server

pytest_plugins = ["tests.silent_nodes"]


def on_nodes(servers, command, resource):
    """``command`` ("get", "pttl") of ``resource``'s lock key, on each node."""
    out = []
    for s in servers:
        with redis.Redis.from_url(s.url, socket_timeout=2) as c:
            out.append(getattr(c, command)(f"redlock:lock:{resource}"))
    return out


def pytest_report_header(config):
    """The server the suite runs on, as it reports itself (``make test-servers`` runs several)."""
    try:
        identity = identify_server()
    except RuntimeError as exc:
        return f"server: none ({exc})"
    wanted = expected_server()
    mismatch = f"  NOT the {wanted!r} asked for" if wanted and not identity.matches(wanted) else ""
    return f"server: {identity}{mismatch}"


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
    # Each test meets the servers as a new process would: heal() restarts a killed server moments
    # after the last test used it, which this process would rightly take for a failover.
    ledger._HISTORIES.by_address.clear()
    yield redis_servers
    redis_servers.heal()


@pytest.fixture
def manager(servers):
    mgr = LockManager(servers.urls, ttl=10.0, retry_count=0, node_timeout=0.05, restart_window=0)
    yield mgr
    mgr.close()


@pytest.fixture(params=["sync", "async"])
def engine(request):
    """The sync or the asyncio engine behind one blocking face (see tests/engines.py)."""
    from tests.engines import Engine

    made = Engine(request.param)
    yield made
    made.close()


@pytest.fixture
def mgr(servers):
    """A manager with the default retries: blocking calls wait in line."""
    m = LockManager(servers.urls, ttl=10.0, node_timeout=0.05, restart_window=0)
    yield m
    m.close()


@pytest.fixture
def redlock_settings(settings, servers):
    """Point REDLOCK_NODES at the five test masters."""
    settings.REDLOCK_NODES = servers.urls
    yield settings


class Waiters:
    """Blocking ``acquire()`` calls waiting in line, each in its own thread.

    A call that gets the lock releases it at once; one that gives up keeps its
    ``LockNotAcquired``. :meth:`join` waits for every call to end.
    """

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []
        self.outcomes: list[Any] = []

    def start(self, manager: Any, resource: str, count: int, timeout: float) -> None:
        for _ in range(count):
            thread = threading.Thread(target=self._wait, args=(manager, resource, timeout), daemon=True)
            thread.start()
            self.threads.append(thread)

    def _wait(self, manager: Any, resource: str, timeout: float) -> None:
        from django_redlock.exceptions import LockNotAcquired

        try:
            lock = manager.acquire(resource, timeout=timeout)
        except LockNotAcquired as exc:
            self.outcomes.append(exc)
            return
        self.outcomes.append("acquired")
        lock.release()

    def join(self, seconds: float = 10.0) -> list[Any]:
        for thread in self.threads:
            thread.join(seconds)
        assert not any(t.is_alive() for t in self.threads), "a waiter is still waiting"
        return self.outcomes


@pytest.fixture
def waiters(servers):
    line = Waiters()
    yield line
    line.join()


Show = Callable[[], Any] | None


def _settled(check: Callable[[], Any], deadline: float, seconds: float, show: Show) -> tuple[bool, Any]:
    """``(True, value)`` once ``check()`` is true; fails once the deadline has passed."""
    value = check()
    if not value and time.monotonic() > deadline:
        seen = f"; {show()!r}" if show is not None else ""
        raise AssertionError(f"not true within {seconds} s: {check}{seen}")
    return bool(value), value


async def eventually_async(check: Callable[[], Any], seconds: float = 5.0, show: Show = None) -> Any:
    """:func:`eventually` for async tests: the event loop runs between the checks (a reply read there may
    send more, as a release answered NOSCRIPT does)."""
    deadline = time.monotonic() + seconds
    while not (found := _settled(check, deadline, seconds, show))[0]:
        await asyncio.sleep(0.05)
    return found[1]


def eventually(check: Callable[[], Any], seconds: float = 5.0, show: Show = None) -> Any:
    """Call ``check`` until it returns something true (returned) or ``seconds`` pass (AssertionError,
    with ``show()``: what the test saw last)."""
    deadline = time.monotonic() + seconds
    while not (found := _settled(check, deadline, seconds, show))[0]:
        time.sleep(0.05)
    return found[1]
