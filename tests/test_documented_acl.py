"""The ACL line in docs/deployment.rst is enough for everything the engine does."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest

from django_redlock.core import LockManager
from django_redlock.testing import RedisServers

DOC = Path(__file__).resolve().parent.parent / "docs" / "deployment.rst"


def documented_acl() -> list[str]:
    line = re.search(r"ACL SETUSER (locker .*)", DOC.read_text()).group(1)
    return line.replace(">long-secret", ">Doc-Secret-1").split()


@pytest.fixture(scope="module")
def acl_servers():
    group = RedisServers(3, extra_args=["--user", *documented_acl()]).start()
    yield group
    group.stop()


def test_the_documented_acl_user_can_lock_wait_in_line_fence_and_list(acl_servers):
    urls = [url.replace("redis://", "redis://locker:Doc-Secret-1@") for url in acl_servers.urls]
    mgr = LockManager(urls, ttl=5, node_timeout=0.2)  # the delayed-restart probe runs too
    try:
        status = mgr.node_status()
        assert all(s.votes or s.sits_out_for > 0 for s in status), status
        mgr.config.restart_window = 0  # fresh nodes: skip the wait, everything else as in production
        lock = mgr.acquire("acl")
        assert lock.fencing_token > 0
        got = {}
        waiter = threading.Thread(target=lambda: got.setdefault("lock", mgr.acquire("acl", timeout=5)))
        waiter.start()
        records = []
        deadline = time.monotonic() + 5
        while (not records or records[0].waiting == 0) and time.monotonic() < deadline:
            records = list(mgr.live_locks())
        assert records[0].resource == "acl" and records[0].waiting == 1
        assert mgr.is_locked("acl") is True
        lock.release()
        waiter.join(5)
        assert got["lock"].locked()
        got["lock"].release()
    finally:
        mgr.close()
