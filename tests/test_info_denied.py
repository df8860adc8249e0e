"""A node whose lock user may not run INFO: a deploy check error, and `redlock status` says it does not vote."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from django_redlock.checks import Codes, check_nodes, check_settings
from django_redlock.core import LockManager
from django_redlock.exit_codes import ExitCode
from django_redlock.testing import RedisServer

PASSWORD = "Acl-Secret-42x"


@pytest.fixture(scope="module")
def denied_server():
    server = RedisServer(extra_args=["--user", "locker", "on", f">{PASSWORD}", "~*", "&*", "+@all", "-info"]).start()
    yield server
    server.stop()


@pytest.fixture
def denied_url(denied_server):
    denied_server.flushall()
    return f"redis://locker:{PASSWORD}@127.0.0.1:{denied_server.port}/0"


def shown(messages):
    return " ".join(m.msg + " " + (m.hint or "") for m in messages)


def test_deploy_check_reports_info_denied(settings, servers, denied_url):
    settings.REDLOCK_NODES = [*servers.urls[:4], denied_url]
    messages = check_nodes()
    denied = [m for m in messages if m.id == Codes.INFO_DENIED]
    assert Codes.INFO_DENIED == "django_redlock.E004"
    assert len(denied) == 1 and denied[0].is_serious()
    assert f"127.0.0.1:{denied_url.rsplit(':', 1)[1]}" in denied[0].msg and "INFO" in denied[0].msg
    assert "+info" in denied[0].hint and "+config|get" in denied[0].hint and "FSYNC_ALWAYS" in denied[0].hint
    assert Codes.UNREACHABLE not in [m.id for m in messages]  # it answered: it is not down
    assert PASSWORD not in shown(messages)


def test_node_declared_fsync_always_is_exempt(settings, servers, denied_url):
    settings.REDLOCK_NODES = [*servers.urls[:4], {"URL": denied_url, "FSYNC_ALWAYS": True}]
    assert check_settings() == []
    assert Codes.INFO_DENIED not in [m.id for m in check_nodes()]


def test_fsync_always_must_be_a_bool(settings, servers):
    settings.REDLOCK_NODES = [*servers.urls[:4], {"URL": servers.urls[4], "FSYNC_ALWAYS": "yes"}]
    messages = check_settings()
    assert [m.id for m in messages] == [Codes.SETTINGS] and "FSYNC_ALWAYS" in messages[0].msg


def run(*args, ending=0):
    """``redlock *args``: stdout and stderr, once it has ended with the exit code ``ending``."""
    out, err = StringIO(), StringIO()
    try:
        call_command("redlock", *args, stdout=out, stderr=err)
    except CommandError as exc:
        assert exc.returncode == ending, exc
    else:
        assert ending == 0
    return out.getvalue(), err.getvalue()


def test_status_says_it_does_not_vote_and_why(settings, servers, denied_url):
    settings.REDLOCK_NODES = [*servers.urls[:4], denied_url]
    out, err = run("status", ending=ExitCode.DEGRADED)  # 4 of 5 vote
    line = next(line for line in out.splitlines() if f":{denied_url.rsplit(':', 1)[1]}" in line)
    assert "does not vote" in line and "INFO" in line
    assert "4 of 5 nodes can vote; quorum is 3." in out
    data = json.loads(run("status", "--json", ending=ExitCode.DEGRADED)[0])
    node = data["nodes"][4]
    assert data["voting"] == 4
    assert node["reachable"] is True and node["votes"] is False and "INFO" in node["not_voting_reason"]
    assert PASSWORD not in out + err + json.dumps(data)


def test_status_no_quorum_when_denied_nodes_are_the_majority(settings, servers, denied_url):
    settings.REDLOCK_NODES = [servers.urls[0], denied_url, denied_url.replace("/0", "/1")]
    with pytest.raises(CommandError) as info:
        call_command("redlock", "status", stdout=StringIO(), stderr=StringIO())
    assert info.value.returncode == ExitCode.NO_QUORUM and PASSWORD not in str(info.value)


def test_status_counts_a_declared_node_as_voting(settings, servers, denied_url):
    spec = {"URL": denied_url, "FSYNC_ALWAYS": True}
    settings.REDLOCK_NODES = [*servers.urls[:4], spec]
    data = json.loads(run("status", "--json")[0])
    assert data["voting"] == 5 and data["nodes"][4]["votes"] is True


def test_status_of_a_declared_node_reads_the_declaration(servers, denied_url):
    # The engine marks a node declared "FSYNC_ALWAYS": True with node.fsync_always.
    manager = LockManager([*servers.urls[:2], denied_url], restart_window=3600)  # the servers are younger
    try:
        manager.node_list[2].fsync_always = True
        manager.node_list[1].fsync_always = True
        statuses = manager.node_status()
    finally:
        manager.close()
    assert statuses[2].votes and statuses[2].fsync_declared and statuses[2].not_voting_reason is None
    assert statuses[1].votes and statuses[1].sits_out_for == 0  # declared durable: no restart window
    assert not statuses[0].votes and "sits out" in statuses[0].not_voting_reason  # young, not durable
