"""manage.py redlock list | release | status."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from io import StringIO

import pytest
import redis
from django.core.management import CommandError, call_command

from django_redlock import get_lock_manager
from django_redlock.core.records import Holder, LockRecord, digest_of, read_holders, seconds
from django_redlock.exit_codes import ExitCode
from django_redlock.management.commands.redlock import _seconds_text, listing_json, seconds_json
from tests.conftest import eventually

pytestmark = pytest.mark.usefixtures("redlock_settings")


def run(*args):
    out, err = StringIO(), StringIO()
    call_command("redlock", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def run_ending(code, *args):
    """``run()`` of a command that ends with ``code``: its stdout, stderr and the error's message."""
    out, err = StringIO(), StringIO()
    with pytest.raises(CommandError) as info:
        call_command("redlock", *args, stdout=out, stderr=err)
    assert info.value.returncode == code, info.value
    return out.getvalue(), err.getvalue(), str(info.value)


def test_list_and_release(servers):
    manager = get_lock_manager()
    lock = manager.acquire("orders-1", ttl=20)
    manager.acquire("orders-2", ttl=20)
    out, _ = run("list")
    assert "orders-1" in out and "orders-2" in out and "5 of 5" in out and "held" in out
    data = json.loads(run("list", "--json", "--match", "-1")[0])
    assert [r["resource"] for r in data] == ["orders-1"]
    assert data[0]["holder"]["digest"] == digest_of(lock.token) and data[0]["nodes_holding"] == 5
    assert data[0]["waiting"] == 0 and [e["waiting"] for e in data[0]["entries"]] == [0] * 5
    out, _ = run("release", "orders-1")
    assert "Released 'orders-1' on 5 of 5 nodes" in out
    assert not manager.is_locked("orders-1")
    out, _, message = run_ending(ExitCode.NOT_HELD, "release", "orders-1")
    assert out == "" and message == "Nothing to release: no node held a lock on 'orders-1'."


def test_list_with_a_node_down(servers):
    get_lock_manager().acquire("x", ttl=20)
    servers[2].kill()
    out, err, message = run_ending(ExitCode.DEGRADED, "list")
    assert "4 of 5" in out and "did not answer" in err and message.startswith("Degraded: 4 of 5 nodes answered")


def test_status_exit_codes(servers):
    out, _ = run("status")
    assert out.count(" master ") == 5 and "5 of 5 nodes can vote; quorum is 3." in out
    servers[0].kill()
    servers[1].kill()
    out, _, message = run_ending(ExitCode.DEGRADED, "status", "--json")
    data = json.loads(out)
    assert data["voting"] == 3 and data["nodes"][0]["reachable"] is False
    assert message == "Degraded: 3 of 5 nodes can vote; locks work while 3 can."
    servers[2].pause()
    message = run_ending(ExitCode.NO_QUORUM, "status", "--timeout", "0.2")[2]
    assert "No quorum: 2 of 5" in message


def test_status_never_shows_passwords(settings, servers):
    settings.REDLOCK_NODES = [u.replace("redis://", "redis://:Cmd-Secret-3@") for u in servers.urls]
    with pytest.raises(CommandError) as info:
        run("status")
    assert "Cmd-Secret-3" not in str(info.value)


def test_subcommand_required():
    with pytest.raises(CommandError):
        call_command("redlock", stdout=StringIO(), stderr=StringIO())


def test_list_counts_calls_waiting_and_drops_those_that_give_up(waiters):
    manager = get_lock_manager()
    held = manager.acquire("orders-9", ttl=20)
    manager.acquire("orders-10", ttl=20)
    waiters.start(manager, "orders-9", 2, timeout=0.8)
    waiters.start(manager, "orders-9", 1, timeout=8)

    def waiting():
        return {r["resource"]: r["waiting"] for r in json.loads(run("list", "--json")[0])}

    eventually(lambda: waiting() == {"orders-10": 0, "orders-9": 3})
    data = json.loads(run("list", "--json", "--match", "orders-9")[0])
    assert [e["waiting"] for e in data[0]["entries"]] == [3] * 5
    lines = run("list")[0].splitlines()
    assert lines[0].split() == ["RESOURCE", "STATE", "NODES", "TTL", "WAITING", "DIGEST", "HOLDER"]
    row = next(line.split() for line in lines if line.startswith("orders-9 "))
    assert row[1:8] == ["held", "by", "a", "quorum", "5", "of", "5"] and row[9] == "3"  # the admin's words
    assert row[10] == digest_of(held.token)
    eventually(lambda: len(waiters.outcomes) == 2)
    assert waiting()["orders-9"] == 1  # the two that gave up left the line with their release
    held.release()
    assert waiters.join()[2] == "acquired"


def test_list_never_shows_passwords(settings, servers):
    get_lock_manager().acquire("secret-orders", ttl=20)
    # Two nodes refuse the password (they have none): named as not answering, without it.
    urls = servers.urls
    settings.REDLOCK_NODES = [u.replace("redis://", "redis://:List-Secret-7@") for u in urls[:2]] + urls[2:]
    out, err, message = run_ending(ExitCode.DEGRADED, "list")
    assert "secret-orders" in out and "3 of 5" in out and err.count("did not answer") == 2
    data = run_ending(ExitCode.DEGRADED, "list", "--json")[0]
    assert json.loads(data)[0]["down"] and "List-Secret-7" not in out + err + data + message


def test_list_names_unreachable_nodes_even_with_no_locks(servers):
    servers[4].kill()
    out, err, _ = run_ending(ExitCode.DEGRADED, "list")
    name = get_lock_manager().nodes[4]
    assert out.strip() == "No live locks." and f"Node {name} did not answer" in err
    for s in servers[:3]:
        s.kill()
    # "No live locks." from one node of five would be a guess, not an answer
    message = run_ending(ExitCode.NO_QUORUM, "list")[2]
    assert "Only 1 of 5 nodes answered, 3 needed" in message


def test_release_reports_the_nodes_it_could_not_reach(servers):
    get_lock_manager().acquire("orders-77", ttl=20)
    servers[0].kill()
    out, err, message = run_ending(ExitCode.DEGRADED, "release", "orders-77")
    assert "Released 'orders-77' on 4 of 5 nodes." in out and message == "Degraded: 1 of 5 nodes did not answer."
    name = get_lock_manager().nodes[0]
    assert f"Node {name} could not release it" in err and "expires with its ttl" in err
    out, _, message = run_ending(ExitCode.NOT_HELD, "release", "orders-77", "--json")
    data = json.loads(out)
    assert data["nodes"] == 0 and list(data["unreachable"]) == [name]
    assert message == "Nothing to release: no node that answered held a lock on 'orders-77'."
    servers[1].kill()
    servers[2].kill()
    message = run_ending(ExitCode.NO_QUORUM, "release", "orders-77")[2]
    assert "may still be held" in message


def test_status_reports_the_timeout_it_used_and_json_types(servers):
    servers[3].pause()
    out = run_ending(ExitCode.DEGRADED, "status", "--timeout", "0.3")[0]
    assert "no reply within 300 ms" in out
    data = json.loads(run_ending(ExitCode.DEGRADED, "status", "--json", "--timeout", "0.3")[0])
    up = data["nodes"][0]
    assert up["persistence"]["aof_enabled"] in (True, False)
    assert all(isinstance(v, bool) for k, v in up["persistence"].items() if k != "appendfsync")
    assert isinstance(up["votes"], bool) and isinstance(up["latency_ms"], float)
    assert data["nodes"][3]["error"] == "no reply within 300 ms"


def expected_json(records):
    """``redlock list --json`` as json.dumps writes the listing's records, one a line."""

    def holder(h):
        return h and {"digest": digest_of(h.token), "host": h.host, "pid": h.pid, "label": h.label, "acquired_at": h.acquired_at}

    return "[\n  " + ",\n  ".join(
        json.dumps(
            {
                "resource": r.resource,
                "key": r.key,
                "state": r.state,
                "nodes_holding": r.nodes_holding,
                "total": r.total,
                "ttl": r.ttl,
                "waiting": r.waiting,
                "holder": holder(r.holder),
                "entries": [{"node": e.node, "ttl": e.ttl, "waiting": e.waiting, "holder": holder(e.holder)} for e in r.entries],
                "down": list(r.down),
            }
        )
        for r in records
    ) + "\n]"


def test_list_output_is_pinned_to_the_byte(servers):
    for n, server in enumerate(servers):  # keys without expiry: every reading agrees
        with redis.Redis.from_url(server.url) as client:
            client.set("redlock:lock:plain", Holder("tok", "host", 7, "label \u00e9\"", 1.25).encode())
            if n < 1:  # with node 4 silent: 1 + 1 nodes, below a quorum for sure
                client.set("redlock:lock:left-over", "foreign\x01value")
            if n < 4:
                client.set("redlock:lock:split", Holder("abcd"[n], None, None, None, 2.0).encode())
            client.zadd("redlock:places:plain", {"p": int(client.time()[0]) * 1000 + 60_000})
    servers[4].kill()
    manager = get_lock_manager()
    out, err, _ = run_ending(ExitCode.DEGRADED, "list", "--json")
    records = manager.lock_listing().records
    assert [r.resource for r in records] == ["left-over", "plain", "split"] and err.count("did not answer") == 1
    assert out == expected_json(records) + "\n"
    assert run_ending(ExitCode.DEGRADED, "list")[0].splitlines() == [
        "RESOURCE   STATE                     NODES       TTL  WAITING  DIGEST        HOLDER",
        "left-over  minority left-over       1 of 5     -1.0s        0  0dca01e9e52a  ?:?",
        "plain      held by a quorum         4 of 5     -1.0s        1  1a7674eb4ee7  host:7 (label \u00e9\")",
        "split      split between holders    1 of 5     -1.0s        0  ca978112ca1b  ?:?",
    ]
    manager.acquire("timed", ttl=20, label="x")  # ttls that are not whole seconds
    records = manager.lock_listing().records
    assert listing_json(records, manager.nodes) == expected_json(records)


def test_json_seconds_are_written_as_json_dumps_writes_them():
    rng = random.Random(7)
    pttls = [-1, 0, 1, 9, 10, 99, 100, 999, 1000, 1001, 59_999, 60_000, 10**15 - 1]
    pttls += list(range(0, 300_000, 7)) + [rng.randrange(10**digits) for digits in range(4, 16) for _ in range(500)]
    for chunk in (pttls, [p for p in pttls if p >= 0], [10**15, 5], [2**60]):
        assert seconds_json(chunk) == [json.dumps(seconds(p)) for p in chunk]
    odd = [0.0005, 1.0000001, 1e12, 1e13 + 0.5, 2.5e-7, -1.0, 123.4567]
    for ttl in [seconds(p) for p in pttls] + odd:
        assert _seconds_text(ttl) == json.dumps(ttl)


def test_list_json_of_mixed_copies_is_json_dumps_output():
    nodes = ("a:1/0", "b:2/0", "c:3/0", "d:4/0", "e:5/0")
    one = Holder("tok", "host", 7, None, 1700000000.125).encode()
    other = Holder("other", None, None, "l\u00e9", None, 2).encode()
    records = [
        LockRecord("plain", "redlock:lock:plain", nodes, (one,) * 5, (1500, 20, 0, 999, 10**15 + 3), (0,) * 5, 5, 3),
        LockRecord("forever", "redlock:lock:forever", nodes[:4], (one,) * 4, (-1, 2001, -1, 5), (0, 2, 0, 1), 5, 3, ("e:5/0",)),
        LockRecord("split", "redlock:lock:split", nodes, (one, other, one, other, "junk"), (1, 2, 3, 4, 5), (0,) * 5, 5, 3),
        LockRecord("\u00fcber\"q", "redlock:lock:\u00fcber\"q", nodes[1:3], (other,) * 2, (7, 7), (0, 0), 5, 3),
    ]
    read_holders(records[:2])  # decoded together, and the others one by one
    assert listing_json(records, nodes) == expected_json(records)
    json.loads(listing_json(records, nodes))


# -- Django's global options, after the subcommand as before it ------------------------------


def manage_py(servers, *argv):
    """``manage.py *argv`` from the shell (DJANGO_SETTINGS_MODULE names the suite's settings)."""
    from tests.test_command_decorator import ROOT

    environ = dict(os.environ, REDLOCK_TEST_NODES=",".join(servers.urls), DJANGO_SETTINGS_MODULE="tests.settings")
    return subprocess.run(
        [sys.executable, "-m", "django", *argv], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("before", [False, True])
def test_settings_and_pythonpath_switch_settings_after_the_subcommand(servers, tmp_path, before):
    """``--settings`` really loads the other module: its three nodes, not the five of tests.settings."""
    (tmp_path / "other_settings.py").write_text(
        "from tests.settings import *  # noqa\n"
        f"REDLOCK_NODES = {servers.urls[:3]!r}\n"
    )
    options = ["--settings=other_settings", "--pythonpath", str(tmp_path)]
    argv = ["redlock", *options, "status", "--json"] if before else ["redlock", "status", "--json", *options]
    done = manage_py(servers, *argv)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["voting"] == 3 and "unrecognized arguments" not in done.stderr
    done = manage_py(servers, "redlock", "status", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["voting"] == 5, done.stderr


@pytest.mark.parametrize("subcommand", [["list"], ["release", "x"], ["status"]])
def test_every_global_option_after_each_subcommand(subcommand):
    from django_redlock.management.commands.redlock import Command

    parser = Command().create_parser("manage.py", "redlock")
    flags = ["--traceback", "--no-color", "--force-color", "--skip-checks"]
    options = vars(parser.parse_args([*subcommand, "-v", "2", "--settings", "a.b", "--pythonpath", "/p", *flags]))
    assert options["verbosity"] == 2 and options["settings"] == "a.b" and options["pythonpath"] == "/p"
    assert all(options[flag[2:].replace("-", "_")] is True for flag in flags)
    # Given before the subcommand, not repeated after it: the value stays; the defaults are Django's.
    options = vars(parser.parse_args(["--verbosity", "3", "--traceback", *subcommand]))
    assert options["verbosity"] == 3 and options["traceback"] is True and options["no_color"] is False
    options = vars(parser.parse_args(["-v", "0", *subcommand, "-v", "2"]))
    assert options["verbosity"] == 2  # the later one, as argparse does for any option
    options = vars(parser.parse_args(subcommand))
    assert options["verbosity"] == 1 and options["settings"] is None and options["skip_checks"] is False



def test_color_options_after_the_subcommand(servers):
    forced = manage_py(servers, "redlock", "status", "--force-color")
    assert forced.returncode == 0 and "\x1b[" in forced.stdout, forced.stderr
    plain = manage_py(servers, "redlock", "status", "--no-color", "--traceback", "-v", "2")
    assert plain.returncode == 0 and "\x1b[" not in plain.stdout + plain.stderr and "5 of 5" in plain.stdout
    both = manage_py(servers, "redlock", "status", "--no-color", "--force-color")
    assert both.returncode == ExitCode.ERROR and "can't be used together" in both.stderr


# -- damaged and hostile values on the nodes ----------------------------------------------


def strict_json(text):
    """json.loads that refuses NaN and Infinity, which are not JSON."""

    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_list_shows_damaged_and_hostile_values_escaped_in_text_and_json(servers):
    """A newline in a label forged a row ("refund-77 held by a quorum 3/3") and ESC/OSC sequences reached
    the terminal; acquired_at NaN printed NaN, which is not JSON."""
    from tests.hostile_values import HOSTILE, write_hostile

    write_hostile(servers)
    out, err = run("list")
    lines = out.rstrip("\n").split("\n")
    assert len(lines) == 1 + len(HOSTILE), out  # the header and one row a lock: no forged row
    assert not any(line.startswith("refund-7") for line in lines)
    assert all(line.isprintable() for line in lines), out
    assert "\\x1b]0;pwned\\x07" in out and "\\n" in out  # shown, escaped
    assert err == ""
    data = strict_json(run("list", "--json")[0])
    assert sorted(r["resource"] for r in data) == sorted(HOSTILE)
    by_name = {r["resource"]: r for r in data}
    assert by_name["date-nan"]["holder"]["acquired_at"] is None
    assert by_name["date-1e20"]["holder"] == {
        "digest": digest_of("a1"), "host": "web-1", "pid": 11, "label": None, "acquired_at": None,
    }
    for record in data:
        assert record["state"] == "held" and record["nodes_holding"] == 5


def test_status_and_node_reasons_are_escaped():
    from django.core.management.color import no_style

    from django_redlock.core.records import NodeStatus
    from django_redlock.management.commands.redlock import Command

    command = Command()
    command.style = no_style()
    down = NodeStatus("node-1", reachable=False, error="error reply: ERR \x1b]0;pwned\x07\nforged")
    up = NodeStatus(
        "node-2", reachable=True, latency=0.001, role="master\x1b[2J", version="7.2\n8", run_id="ab\x07cd",
        votes=False, not_voting_reason="restarted\x1b[31m", warning="INFO\nrefused",
    )
    for status in (down, up):
        line = command.status_line(status)
        assert line.isprintable(), line
