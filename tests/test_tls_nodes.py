"""Nodes over TLS on real ``redis-server --tls-port``: the client's TLS context, and certificate failures.

The certificates are made with ``openssl`` in a temporary directory. A CA bundle of many
certificates makes building a TLS context cost real CPU (as a host's whole CA store does):
that cost is the client's, never a node's, so it must not run inside a node timeout.
"""

from __future__ import annotations

import asyncio
import ssl
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from django_redlock.checks import Codes, check_nodes
from django_redlock.core import AsyncLockManager, LockManager
from django_redlock.exceptions import QuorumUnavailable
from django_redlock.testing import RedisServer

from tests.certs import make_ca, make_server_cert

#: Copies of the CA in the large bundle: parsing them takes well over the default 50 ms node timeout.
BUNDLE_COPIES = 1200


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1, one for another name, and a CA nobody used."""
    d = tmp_path_factory.mktemp("pki")
    ca = make_ca(d)
    make_ca(d, "other-ca")
    make_server_cert(d, "server", "IP:127.0.0.1,DNS:localhost")
    make_server_cert(d, "elsewhere", "DNS:elsewhere.invalid")
    (d / "bundle.crt").write_text(ca.read_text() * BUNDLE_COPIES)
    return d


@pytest.fixture(scope="module")
def tls_nodes(pki):
    files = (str(pki / "server.crt"), str(pki / "server.key"), str(pki / "ca.crt"))
    servers = [RedisServer(tls=files).start() for _ in range(3)]
    yield servers
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def elsewhere_node(pki):
    """A TLS node whose certificate names another host than the one the client dials."""
    server = RedisServer(tls=(str(pki / "elsewhere.crt"), str(pki / "elsewhere.key"), str(pki / "ca.crt"))).start()
    yield server
    server.stop()


def urls(servers, ca):
    return [f"rediss://127.0.0.1:{s.tls_port}/0?ssl_ca_certs={ca}" for s in servers]


@pytest.fixture
def context_builds(monkeypatch):
    """Count the TLS contexts built (each loads its CA file once)."""
    built = []
    load = ssl.SSLContext.load_verify_locations

    def counting(self, *args, **kwargs):
        built.append(self)
        return load(self, *args, **kwargs)

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counting)
    return built


# -- the client's TLS context: once per node, outside the node timeout ------------------------------


def test_sync_manager_builds_one_tls_context_per_node_not_per_connection(tls_nodes, pki, context_builds):
    mgr = LockManager(urls(tls_nodes, pki / "bundle.crt"), retry_count=0, restart_window=0)
    try:
        for round_ in range(3):
            with mgr.lock(f"tls-{round_}") as lock:
                assert lock.locked()
            mgr.close()  # the next lock connects again
    finally:
        mgr.close()
    assert len(context_builds) == 3  # three nodes, three connections each


def test_async_manager_locks_over_tls_with_the_default_node_timeout(tls_nodes, pki, context_builds):
    """Building the context (about 150 ms of CPU for this bundle) is not charged to the 50 ms node timeout."""

    async def run():
        mgr = AsyncLockManager(urls(tls_nodes, pki / "bundle.crt"), retry_count=0, restart_window=0)
        assert mgr.config.node_timeout == 0.05
        got = []
        try:
            for round_ in range(3):
                async with mgr.lock(f"atls-{round_}") as lock:
                    got.append(lock.resource)
                await mgr.aclose()  # the next lock connects again
        finally:
            await mgr.aclose()
        return got

    assert len(asyncio.run(run())) == 3
    assert len(context_builds) == 3


def test_sync_manager_locks_over_tls_with_the_default_node_timeout(tls_nodes, pki):
    mgr = LockManager(urls(tls_nodes, pki / "bundle.crt"), retry_count=0, restart_window=0)
    try:
        assert mgr.config.node_timeout == 0.05
        with mgr.lock("tls-default") as lock:
            assert lock.locked()
        assert all(s.reachable and s.votes for s in mgr.node_status())
    finally:
        mgr.close()


# -- certificate failures say so, with the client's reason -----------------------------------------


#: OpenSSL's reason when no trusted CA signed the server's certificate (the server sends its CA along).
UNTRUSTED = "self-signed certificate in certificate chain"


def failure_cases(pki, tls_nodes, elsewhere_node):
    port = tls_nodes[0].tls_port
    return {
        "wrong CA": (f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={pki / 'other-ca.crt'}",
                     UNTRUSTED),
        "no CA given": (f"rediss://127.0.0.1:{port}/0", UNTRUSTED),
        "missing CA file": (f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={pki / 'missing.crt'}",
                            f"CA file {pki / 'missing.crt'} could not be read"),
        "host name mismatch": (f"rediss://127.0.0.1:{elsewhere_node.tls_port}/0?ssl_ca_certs={pki / 'ca.crt'}",
                               "mismatch"),
    }


CASES = ["wrong CA", "no CA given", "missing CA file", "host name mismatch"]


@pytest.mark.parametrize("case", CASES)
def test_sync_certificate_failure_is_named_in_lock_errors_and_status(pki, tls_nodes, elsewhere_node, case):
    url, reason = failure_cases(pki, tls_nodes, elsewhere_node)[case]
    mgr = LockManager([url], retry_count=0, restart_window=0, node_timeout=1.0)
    try:
        with pytest.raises(QuorumUnavailable) as info:
            mgr.acquire("cert")
        [status] = mgr.node_status()
    finally:
        mgr.close()
    assert "certificate not accepted" in str(info.value) and reason in str(info.value)
    assert not status.reachable
    assert "certificate not accepted" in status.error and reason in status.error


@pytest.mark.parametrize("case", CASES)
def test_async_certificate_failure_is_named_in_lock_errors_and_status(pki, tls_nodes, elsewhere_node, case):
    url, reason = failure_cases(pki, tls_nodes, elsewhere_node)[case]

    async def run():
        mgr = AsyncLockManager([url], retry_count=0, restart_window=0, node_timeout=1.0)
        try:
            with pytest.raises(QuorumUnavailable) as info:
                await mgr.acquire("cert")
            [status] = await mgr.node_status()
        finally:
            await mgr.aclose()
        return str(info.value), status

    text, status = asyncio.run(run())
    assert "certificate not accepted" in text and reason in text
    assert not status.reachable
    assert "certificate not accepted" in status.error and reason in status.error


def test_certificate_failure_in_the_checks_and_the_command(settings, pki, tls_nodes, elsewhere_node):
    cases = failure_cases(pki, tls_nodes, elsewhere_node)
    settings.REDLOCK_NODES = [cases[case][0] for case in CASES]
    settings.REDLOCK = {"NODE_TIMEOUT": 1.0, "RESTART_WINDOW": 0}
    unreachable = [m.msg for m in check_nodes() if m.id == Codes.UNREACHABLE]
    assert len(unreachable) == 4
    for case, msg in zip(CASES, unreachable):
        assert "certificate not accepted" in msg and cases[case][1] in msg, (case, msg)
    out = StringIO()
    with pytest.raises(CommandError):
        call_command("redlock", "status", stdout=out, stderr=StringIO())
    down = [line for line in out.getvalue().splitlines() if "DOWN" in line]
    assert len(down) == 4
    for case, line in zip(CASES, down):
        assert "certificate not accepted" in line and cases[case][1] in line, (case, line)
