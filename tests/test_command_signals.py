"""A signal at any moment of a locked command's life never leaves its lock on the nodes, and the
process exits 128 + N (real signals, a real process, real nodes).

Every node is reached through a proxy that holds its bytes at the exact moment under test: the
vote on its way to every node, the vote set on every node with its replies held back (the
process is about to be granted the lock), the release on its way. The signal is sent while they
are held, then the bytes go on: the process cannot have moved past that moment meanwhile.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from django_redlock.core.scripts import RELEASE
from tests.conftest import on_nodes
from tests.proxy import Proxy
from tests.test_command_decorator import ROOT

RESOURCE = "command:nightly"
KEY = f"redlock:lock:{RESOURCE}".encode()
#: The release as a new connection sends it (the script's source) or a later one (its SHA1).
RELEASE_SENT = (RELEASE.source.encode()[-120:], RELEASE.sha.encode())


def start_nightly(urls, marker, *extra):
    env = dict(os.environ, REDLOCK_TEST_NODES=",".join(urls), DJANGO_SETTINGS_MODULE="tests.settings_held_replies")
    return subprocess.Popen(
        [sys.executable, "-m", "django", "nightly", "--lock-ttl", "30", "--marker", str(marker), *extra],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def signal_at(proc, signum, moment, then):
    """Send ``signum`` to ``proc`` once ``moment()`` returned, call ``then()``, and return its stderr
    once it exited (killed if the test fails first)."""
    try:
        moment()
        proc.send_signal(signum)
        then()
        return proc.communicate(timeout=30)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def hold_the_vote_on_its_way(proxies):
    for proxy in proxies:
        proxy.hold_requests_from(KEY)
    yield
    for proxy in proxies:
        proxy.wait_held(lambda held: KEY in held, timeout=20)
    yield
    for proxy in proxies:
        proxy.pass_requests()
        proxy.flush_requests()


def hold_replies_after(*patterns):
    def moment(proxies):
        for proxy in proxies:
            proxy.hold_replies_after(*patterns)
        yield
        for proxy in proxies:
            proxy.wait_held(bool, timeout=20, replies=True)
        yield
        for proxy in proxies:
            proxy.pass_replies()
            proxy.flush_replies()

    return moment


MOMENTS = {
    # Before the grant: the vote is on its way (a late packet delivers it even after a death).
    "vote on its way": (hold_the_vote_on_its_way, ("--seconds", "30")),
    # The vote reached the last node: the key is on every node and the grant is one read away.
    "vote on every node": (hold_replies_after(KEY), ("--seconds", "30")),
    # The same while waiting in line (--lock-wait): the signal may unwind the vote itself.
    "vote on every node, waiting in line": (hold_replies_after(KEY), ("--seconds", "30", "--lock-wait", "10")),
    # The work is done and the release is on the wire.
    "release on its way": (hold_replies_after(*RELEASE_SENT), ("--seconds", "0")),
}


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("moment", list(MOMENTS))
def test_a_signal_at_any_moment_releases_and_exits_128_plus_n(servers, tmp_path, moment, signum):
    hold, extra = MOMENTS[moment]
    proxies = [Proxy(server.port).start() for server in servers]
    marker = tmp_path / "work"
    try:
        steps = hold(proxies)
        next(steps)  # armed; then the moment is reached and held, the signal sent, the bytes go on
        proc = start_nightly([proxy.url for proxy in proxies], marker, *extra)
        err = signal_at(proc, signum, lambda: next(steps), lambda: next(steps, None))
    finally:
        for proxy in proxies:
            proxy.close()
    left = on_nodes(servers, "get", RESOURCE)
    held = len(left) - left.count(None)
    assert not held, f"the lock was left on {held} nodes, exit {proc.returncode}; {err[-300:]}"
    assert proc.returncode == 128 + signum, err
    assert f"Stopped by {signal.Signals(signum).name}" in err, err
    if moment.startswith("vote"):
        assert not marker.exists(), "the command's work began after the signal"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_while_waiting_in_line_withdraws_the_place_and_exits_128_plus_n(servers, tmp_path, signum):
    """Before the grant, in line behind another host: the wait ends at once, the place is taken out
    of every node's line (not left for its life), the holder keeps its lock, and handle never runs."""
    from django_redlock.core import LockManager
    from tests.conftest import eventually

    holder_manager = LockManager(servers.urls, restart_window=0)
    holder = holder_manager.acquire(RESOURCE, ttl=30)
    marker = tmp_path / "work"
    line = f"redlock:queue:{RESOURCE}"
    proc = start_nightly(servers.urls, marker, "--seconds", "30", "--lock-wait", "30")
    in_line = lambda: eventually(lambda: all(on_nodes_zcard(servers, line)), 20.0)  # noqa: E731
    err = signal_at(proc, signum, in_line, lambda: None)
    try:
        assert proc.returncode == 128 + signum, err
        assert f"Stopped by {signal.Signals(signum).name}; the lock was not held." in err, err
        assert on_nodes_zcard(servers, line) == [0] * len(servers), "the place was left in line"
        assert holder.owned() and not marker.exists()
    finally:
        holder.release()
        holder_manager.close()


def on_nodes_zcard(servers, key):
    import redis

    out = []
    for server in servers:
        with redis.Redis.from_url(server.url, socket_timeout=2) as client:
            out.append(client.zcard(key))
    return out
