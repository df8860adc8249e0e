"""API rules users of other lock libraries expect: no silent timeouts, no "free" for "unknown"."""

from __future__ import annotations

import pytest

from django_redlock.core import AsyncLockManager, LockManager


def test_a_timeout_without_blocking_is_refused_everywhere(mgr):
    from django_redlock import redlock

    with pytest.raises(ValueError, match="timeout=2 cannot be used with blocking=False"):
        mgr.acquire("x", blocking=False, timeout=2)
    with pytest.raises(ValueError, match="cannot be used with blocking=False"):
        mgr.lock("x", blocking=False, timeout=2)
    with pytest.raises(ValueError, match="cannot be used with blocking=False"):
        redlock("x", timeout=2)  # the view decorator does not block unless asked to
    with pytest.raises(ValueError, match="cannot be used with blocking=False"):
        AsyncLockManager(["redis://127.0.0.1:1"]).lock("x", blocking=False, timeout=2)
    assert mgr.acquire("x", blocking=False, timeout=None).release() is True


def test_is_locked_never_says_free_when_too_few_nodes_answer(mgr, servers):
    from django_redlock.exceptions import QuorumUnavailable

    assert mgr.is_locked("maybe") is False
    lock = mgr.acquire("maybe")
    assert mgr.is_locked("maybe") is True
    for server in servers[:3]:
        server.pause()
    try:
        with pytest.raises(QuorumUnavailable, match="Cannot tell whether 'maybe' is locked"):
            mgr.is_locked("maybe")
        with pytest.raises(QuorumUnavailable):
            mgr.is_locked("never-taken")  # 2 of 5 say "no key": not enough to rule a holder out
    finally:
        for server in servers[:3]:
            server.resume()
    lock.release()
