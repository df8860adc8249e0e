"""One managed Redis as the only node: a master and its replica behind one address, CONFIG denied
to the lock user (renamed away, or an ACL user without it), as on most managed services.

Every path works without CONFIG and says so once; across a failover that loses the lock's key,
redis-py's ``Lock`` grants the lock again at once, where this engine keeps the node out of votes
for the restart window (it noticed the failover).
"""

from __future__ import annotations

import logging
from io import StringIO

import pytest
import redis
from django.core.management import call_command

from django_redlock import get_lock_manager
from django_redlock.checks import Codes, check_nodes, check_settings, check_votes
from django_redlock.core import LockManager, ledger
from django_redlock.exceptions import LockNotAcquired
from django_redlock.testing import RedisServer
from tests.conftest import eventually
from tests.proxy import Proxy
from tests.test_restart_and_failover import Failover, _try
from tests.test_restart_guard import wait_until_old

WINDOW = 2.0
PASSWORD = "Managed-Secret-42x"
DENIED = {
    "renamed": (["--rename-command", "CONFIG", ""], ""),
    "acl": (["--user", "locker", "on", f">{PASSWORD}", "~*", "&*", "+@all", "-config"], f"locker:{PASSWORD}"),
}


class Managed(Failover):
    """A master and its replica behind one address, as :class:`Failover`, with CONFIG denied on both."""

    def __init__(self, args: list[str], userinfo: str) -> None:
        self.master = RedisServer(extra_args=args).start()
        self.replica = RedisServer(extra_args=args).start()
        self.stream = Proxy(self.master.port).start()
        self.address = Proxy(self.master.port).start()
        self.userinfo = userinfo
        with redis.Redis(port=self.replica.port, socket_timeout=5) as replica:
            replica.replicaof("127.0.0.1", self.stream.port)
            eventually(lambda: replica.info("replication").get("master_link_status") == "up", 10)

    @property
    def url(self) -> str:
        return self.address.url_with(self.userinfo) if self.userinfo else self.address.url


@pytest.fixture(params=sorted(DENIED))
def managed(request):
    node = Managed(*DENIED[request.param])
    with redis.Redis.from_url(node.url, socket_timeout=5) as client, pytest.raises(redis.ResponseError):
        client.config_get("dir")  # CONFIG really is denied to the lock user
    yield node
    node.close()


def engine(url: str) -> LockManager:
    return LockManager([url], ttl=WINDOW, max_ttl=WINDOW, restart_window=WINDOW, retry_count=0, node_timeout=0.5)


def test_a_failover_that_loses_the_key_fails_closed_where_redis_py_grants_twice(managed):
    first, second = engine(managed.url), engine(managed.url)
    plain = redis.Redis.from_url(managed.url, socket_timeout=5)
    try:
        wait_until_old(second, WINDOW + 0.2)
        second.acquire("warm-up", blocking=False).release()  # this process knows the master behind the address
        managed.fall_behind()
        held = first.acquire("r", blocking=False)
        assert plain.lock("plain", timeout=30).acquire(blocking=False)
        managed.promote()  # neither key reached the replica
        with redis.Redis.from_url(managed.url, socket_timeout=5) as other:
            assert other.lock("plain", timeout=30).acquire(blocking=False), "redis-py grants it a second time"
        for _ in range(2):  # the first vote may go on the connection the old master's death broke
            with pytest.raises(LockNotAcquired) as info:
                second.acquire("r", blocking=False)
            assert held.locked(), "the first lock is still valid: nobody else may hold it"
            if ledger.DELAYED_RESTART in info.value.failures[second.nodes[0]]:
                break
        reason = info.value.failures[second.nodes[0]]
        assert "another server answers" in reason and ledger.DELAYED_RESTART in reason
        # Once the window has passed (and the first lock has expired), locks work again.
        eventually(lambda: not held.locked(), WINDOW + 1)
        eventually(lambda: _try(second, "r"), WINDOW + 2).release()
    finally:
        plain.close()
        first.close()
        second.close()


def status_output(*args):
    out = StringIO()
    call_command("redlock", "status", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def test_every_path_works_without_config_and_says_so_once(settings, managed, caplog):
    settings.REDLOCK_NODES = [managed.url]
    settings.REDLOCK = {"NODE_TIMEOUT": 0.2, "RETRY_COUNT": 0, "TTL": WINDOW, "COMMAND_TTL": WINDOW,
                        "MAX_TTL": WINDOW, "RESTART_WINDOW": WINDOW}
    caplog.set_level(logging.INFO, logger="django_redlock")
    # The default checks: W001 says what one node gives; nothing about CONFIG.
    assert [m.id for m in check_settings()] == [Codes.FEW_MASTERS]
    with engine(managed.url) as manager:
        wait_until_old(manager, WINDOW + 0.2)
    assert check_votes() == []
    # The deploy checks: one note, for what could not be checked, and nothing guessed.
    messages = check_nodes()
    assert [m.id for m in messages] == [Codes.CONFIG_REFUSED]
    assert "locks work without it" in messages[0].msg and "noeviction" in messages[0].hint
    # redlock status: the node votes; its persistence is unknown, said once below the nodes.
    out = status_output()
    name = get_lock_manager().nodes[0]
    line = next(row for row in out.splitlines() if row.startswith(name))
    assert "persistence ?" in line and "does not vote" not in line
    assert out.count(ledger.CONFIG_REFUSED) == 1
    assert "1 of 1 nodes can vote" in out
    # Locks, through several managers and calls: the log says it once.
    for _ in range(3):
        get_lock_manager().acquire("job").release()
    with engine(managed.url) as other:
        other.acquire("job").release()
    # The other redlock commands do not need CONFIG either.
    with get_lock_manager().lock("held"):
        listed = StringIO()
        call_command("redlock", "list", stdout=listed)
        assert "held" in listed.getvalue()
    said = [r for r in caplog.records if ledger.CONFIG_REFUSED in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO and PASSWORD not in said[0].getMessage()
    # Declared FSYNC_ALWAYS: CONFIG cannot confirm it, and status does not claim otherwise.
    settings.REDLOCK_NODES = [{"URL": managed.url, "FSYNC_ALWAYS": True}]
    line = next(row for row in status_output().splitlines() if row.startswith(name))
    assert "fsync always (declared)" in line and "runs without" not in line
