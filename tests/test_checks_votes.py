"""The checks that ask the nodes whether locks can work: nodes that sit out after a (re)start and
fewer than a quorum answering (``check``, ``runserver``; an error under ``check --deploy``)."""

from __future__ import annotations

import ast
import os
import queue
import re
import subprocess
import sys
import threading
import time
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from django_redlock import get_lock_manager
from django_redlock.checks import Codes, check_votes
from django_redlock.core import ledger
from django_redlock.exceptions import LockNotAcquired
from django_redlock.testing import free_port

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_WINDOW = {"NODE_TIMEOUT": 0.5, "RETRY_COUNT": 0}  # RESTART_WINDOW follows MAX_TTL (60 s); a loaded CI machine connects slowly
SECONDS_LEFT = re.compile(r"sits out for (\d+) s more \(delayed-restart rule\)")


def check_output(*args):
    out, err = StringIO(), StringIO()
    call_command("check", *args, stdout=out, stderr=err)
    return out.getvalue() + err.getvalue()


def fresh(servers, count):
    """The first ``count`` servers, restarted: they sit out for the restart window."""
    for server in servers[:count]:
        server.restart()
    return servers.urls[:3]


def test_fresh_nodes_that_cannot_vote_are_reported_with_the_seconds_left(settings, servers):
    settings.REDLOCK_NODES = fresh(servers, 3)
    settings.REDLOCK = DEFAULT_WINDOW
    messages = check_votes()
    assert [m.id for m in messages] == [Codes.SITS_OUT] and not messages[0].is_serious()
    text = messages[0].msg
    assert text.startswith("Only 0 of 3 Redlock nodes can vote now, 2 needed: every lock fails for ")
    left = [int(s) for s in SECONDS_LEFT.findall(text)]
    assert len(left) == 3 and all(50 <= s <= 61 for s in left), text
    assert f"every lock fails for {sorted(left)[1]} s more" in text
    assert messages[0].hint == ledger.RESTART_ADVICE
    # The same words as the lock's own failure.
    with pytest.raises(LockNotAcquired) as info:
        get_lock_manager().acquire("fresh")
    assert ledger.RESTART_ADVICE in str(info.value)
    sits_out = r": restarted \d+ s ago and not declared FSYNC_ALWAYS; sits out for"
    told = 0
    for name in get_lock_manager().nodes:
        assert re.search(re.escape(name) + sits_out, text)
        # Once two nodes have said they sit out, the outcome is known and the third is not awaited.
        reason = re.search(re.escape(name) + r": (restarted|not awaited)", str(info.value))
        assert reason, str(info.value)
        told += reason.group(1) == "restarted"
    assert told >= 2, str(info.value)
    # manage.py check shows it, and passes: the nodes vote by themselves once the window has passed.
    shown = check_output()
    assert Codes.SITS_OUT in shown and "REDLOCK['RESTART_WINDOW'] = 0" in shown and "appendfsync always" in shown


def declared(url):
    return {"URL": url, "FSYNC_ALWAYS": True}  # votes at once, however young


def test_a_minority_sitting_out_is_said_but_locks_work(settings, servers):
    first, *others = fresh(servers, 1)
    settings.REDLOCK_NODES = [first, *map(declared, others)]
    settings.REDLOCK = DEFAULT_WINDOW
    messages = check_votes()
    assert [m.id for m in messages] == [Codes.SITS_OUT]
    text = messages[0].msg
    assert text.startswith("1 of 3 Redlock nodes sit out after a restart; locks work (2 vote, 2 needed)")
    assert len(SECONDS_LEFT.findall(text)) == 1 and servers[0].url.split("//")[1] in text
    get_lock_manager().acquire("minority").release()


@pytest.mark.parametrize("way_out", ["window", "declared"])
def test_the_ways_out_silence_it(settings, servers, way_out):
    urls = fresh(servers, 3)
    if way_out == "window":
        settings.REDLOCK_NODES, settings.REDLOCK = urls, {**DEFAULT_WINDOW, "RESTART_WINDOW": 0}
    else:
        settings.REDLOCK_NODES = [declared(url) for url in urls]
        settings.REDLOCK = DEFAULT_WINDOW
    assert check_votes() == []
    get_lock_manager().acquire("way-out").release()


def returned(check, seconds=30.0):
    """Run ``check`` in a thread; its result, once it has returned (fails if it hangs)."""
    result = []
    worker = threading.Thread(target=lambda: result.append(check()), daemon=True)
    worker.start()
    worker.join(seconds)  # a guard against a hang, not a measure of speed
    assert not worker.is_alive(), "the check did not return"
    return result[0]


def test_fewer_than_a_quorum_answering_is_said_by_the_default_check(settings, servers):
    """Nothing listens on one port, one server is SIGSTOPped: the check returns after one wait and
    names both nodes with why."""
    nobody = f"redis://:Hidden-Pw-9@127.0.0.1:{free_port()}/0"
    settings.REDLOCK_NODES = [nobody, servers.urls[1], declared(servers.urls[2])]
    settings.REDLOCK = DEFAULT_WINDOW
    servers[1].pause()
    messages = returned(check_votes)
    assert [m.id for m in messages] == [Codes.NO_ANSWER] and not messages[0].is_serious()
    text = messages[0].msg
    assert text.startswith("Only 1 of 3 Redlock nodes answered within 1 s, 2 needed: every lock fails (")
    assert f"{nobody.split('@')[1]}: connection refused" in text and "Hidden-Pw-9" not in text + messages[0].hint
    assert f"{servers.urls[1].split('//')[1]}: no reply within 1000 ms" in text
    assert servers.urls[2].split("//")[1] not in text  # it answered
    assert "redlock status" in messages[0].hint


def test_a_minority_not_answering_is_left_to_the_deploy_checks(settings, servers):
    settings.REDLOCK_NODES = [declared(url) for url in servers.urls[:3]]
    settings.REDLOCK = DEFAULT_WINDOW
    servers[0].kill()
    assert returned(check_votes) == []  # locks work: which node is down is check --deploy's (W008)


def test_manage_py_check_with_wrong_ports_is_not_silent(servers):
    """The first ``check`` (and ``runserver``) of a project whose ports are wrong: a warning naming
    the nodes, not "no issues"; it still passes (the nodes may come up later)."""
    wrong = [f"redis://127.0.0.1:{free_port()}/0" for _ in range(3)]
    result = django_admin(["check"], {"DJANGO_SETTINGS_MODULE": "tests.settings", "REDLOCK_TEST_NODES": ",".join(wrong)})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" not in result.stdout and Codes.NO_ANSWER in result.stderr
    assert "Only 0 of 3 Redlock nodes answered" in result.stderr
    assert all(f"{url.split('//')[1]}: connection refused" in result.stderr for url in wrong), result.stderr


@pytest.mark.parametrize("fault", ["kill", "pause"])
def test_deploy_fails_when_fewer_than_a_quorum_answer(settings, servers, fault):
    settings.REDLOCK_NODES = servers.urls[:3]
    for server in servers[:2]:
        getattr(server, fault)()
    with pytest.raises(SystemCheckError) as info:
        check_output("--deploy", "--tag", "redlock_nodes")
    text = str(info.value)
    assert Codes.NO_QUORUM in text and "Only 1 of 3 Redlock nodes answered, 2 needed: every lock fails." in text
    assert text.count(Codes.UNREACHABLE) == 2


def test_deploy_warns_when_a_minority_does_not_answer(settings, servers):
    settings.REDLOCK_NODES = servers.urls[:3]
    servers[0].kill()
    text = check_output("--deploy", "--tag", "redlock_nodes")
    assert Codes.UNREACHABLE in text and Codes.NO_QUORUM not in text


def django_admin(args, env, timeout=60):
    environment = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    environment.update(env, PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    return subprocess.run(
        [sys.executable, "-m", "django", *args], capture_output=True, text=True, env=environment, timeout=timeout,
        cwd=ROOT,
    )


@pytest.mark.parametrize(("down", "code"), [(2, 1), (1, 0)])
def test_manage_py_check_deploy_exit_code(servers, down, code):
    for server in servers[:down]:
        server.kill()
    env = {"DJANGO_SETTINGS_MODULE": "tests.settings", "REDLOCK_TEST_NODES": ",".join(servers.urls[:3])}
    result = django_admin(["check", "--deploy"], env)
    assert result.returncode == code, result.stdout + result.stderr
    assert (Codes.NO_QUORUM in result.stderr) is (code == 1)


def test_runserver_says_the_nodes_sit_out(servers, tmp_path):
    urls = fresh(servers, 3)
    (tmp_path / "window_settings.py").write_text(
        "from tests.settings import *  # noqa: F403\n"
        f"REDLOCK_NODES = {urls!r}\n"
        "REDLOCK = {'NODE_TIMEOUT': 0.05}\n"
    )
    environment = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    environment.update(
        DJANGO_SETTINGS_MODULE="window_settings", PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]),
        PYTHONUNBUFFERED="1",
    )
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "django", "runserver", "--noreload", f"127.0.0.1:{port}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment, cwd=ROOT,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True).start()
    seen = []
    try:
        deadline = time.monotonic() + 60
        while not any("Quit the server" in line for line in seen):
            seen.append(lines.get(timeout=max(0.1, deadline - time.monotonic())))
    finally:
        process.terminate()
        process.wait(10)
    text = "".join(seen)
    assert Codes.SITS_OUT in text and "Only 0 of 3 Redlock nodes can vote now, 2 needed" in text, text
    assert len(SECONDS_LEFT.findall(text)) == 3 and ledger.RESTART_ADVICE in text.replace("\n\t", " ")


def readme_quickstart():
    text = (ROOT / "README.md").read_text()
    return text.split("## Quickstart", 1)[1].split("```", 2)[1]


def test_readme_two_setup_commands_are_kept():
    text = (ROOT / "README.md").read_text()
    assert "make demo    # example project on 5 local Redis masters: http://127.0.0.1:8000/\n" in text
    assert "make test    # the whole test suite, against real redis-server processes\n" in text


def test_readme_quickstart_way_out_works(settings, servers):
    """The quickstart's note next to REDLOCK_NODES: fresh nodes sit out; its development command and
    declaration let them vote at once; its test setting turns the rule off."""
    from django_redlock.testing import RedisServers

    quickstart = readme_quickstart()
    after_nodes = quickstart.split("REDLOCK_NODES = ", 1)[1]
    assert "sits out" in after_nodes.split("\n\n")[0] and "MAX_TTL (60 s" in quickstart
    command = re.search(r"#\s+mkdir -p (\S+) && (redis-server [^\n]*)", after_nodes)
    folder, command = command.group(1), command.group(2).split()
    assert command[command.index("--dir") + 1] == folder  # each node its own directory
    options = command[command.index("--appendonly"):]
    assert options == ["--appendonly", "yes", "--appendfsync", "always"]
    declaration = re.search(r'(\{"URL": [^}]*\})', after_nodes).group(1)
    for_tests = ast.literal_eval(re.search(r"REDLOCK = (\{[^}]*\})", after_nodes).group(1))
    with RedisServers(3, extra_args=options) as fresh_nodes:
        settings.REDLOCK = DEFAULT_WINDOW
        settings.REDLOCK_NODES = fresh_nodes.urls
        assert [m.id for m in check_votes()] == [Codes.SITS_OUT]  # started fresh: they sit out
        settings.REDLOCK_NODES = [{**ast.literal_eval(declaration), "URL": url} for url in fresh_nodes.urls]
        assert check_votes() == []
        get_lock_manager().acquire("quickstart").release()
    settings.REDLOCK_NODES = fresh(servers, 3)
    settings.REDLOCK = {**DEFAULT_WINDOW, **for_tests}
    assert check_votes() == []
    get_lock_manager().acquire("quickstart-tests").release()
