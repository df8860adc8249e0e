"""``check --deploy`` and nodes on one host that share a data directory (W013): a restarted node
there loads another node's data, and one declared FSYNC_ALWAYS votes with it at once."""

from __future__ import annotations

import re
import subprocess
import textwrap
from pathlib import Path

import pytest
import redis

from django_redlock.checks import Codes, check_nodes, check_votes
from django_redlock.testing import RedisServer, free_port

DURABLE = ["--appendonly", "yes", "--appendfsync", "always"]


@pytest.fixture
def started():
    """Start servers with ``started(**kwargs)``; all stopped at the end."""
    servers: list[RedisServer] = []

    def start(**kwargs):
        servers.append(RedisServer(**kwargs).start())
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def name(server):
    return f"127.0.0.1:{server.port}/0"


def shared_dir_warnings(settings, nodes):
    settings.REDLOCK_NODES = [{"URL": node.url, "FSYNC_ALWAYS": True} for node in nodes]
    return [m for m in check_nodes() if m.id == Codes.SHARED_DIR]


def test_three_local_masters_started_from_one_directory(settings, started, tmp_path):
    """The recipe without --dir: the nodes share appendonlydir; one of them restarted holds the
    other's keys. The deploy check names the two that share it, and not the one with its own."""
    a = started(workdir=str(tmp_path), extra_args=DURABLE)
    b = started(workdir=str(tmp_path), extra_args=DURABLE)
    own = started(extra_args=DURABLE)
    with redis.Redis(port=a.port, socket_timeout=5) as client:
        client.set("only-on-a", "1")
    b.kill()
    b.start()
    with redis.Redis(port=b.port, socket_timeout=5) as client:
        assert client.get("only-on-a") == b"1"  # why it matters: b came back with a's data
    [warning] = shared_dir_warnings(settings, [a, b, own])
    assert not warning.is_serious()
    assert f"{name(a)}, {name(b)} on localhost share the data directory {tmp_path}" in warning.msg
    assert name(own) not in warning.msg
    assert "--dir" in warning.hint


def test_one_directory_per_node_is_not_warned(settings, started, tmp_path):
    nodes = []
    for i in range(3):
        (tmp_path / str(i)).mkdir()
        nodes.append(started(workdir=str(tmp_path / str(i)), extra_args=DURABLE))
    assert shared_dir_warnings(settings, nodes) == []


def test_nodes_without_append_only_files_share_their_dump(settings, started, tmp_path):
    """appendonly no: a node loads dbfilename at start, so two with the same one in one directory
    share data; other file names in the same directory do not."""
    a = started(workdir=str(tmp_path))
    b = started(workdir=str(tmp_path))
    [warning] = shared_dir_warnings(settings, [a, b])
    assert name(a) in warning.msg and name(b) in warning.msg
    c = started(workdir=str(tmp_path), extra_args=["--dbfilename", "c.rdb"])
    d = started(workdir=str(tmp_path), extra_args=["--dbfilename", "d.rdb"])
    assert shared_dir_warnings(settings, [c, d]) == []


def test_where_config_is_refused_it_says_it_could_not_tell(settings, started, tmp_path):
    """A node on the host whose lock user may not run CONFIG: no W013 guessed, and the one note
    about CONFIG says the shared directory could not be checked."""
    a = started(workdir=str(tmp_path), extra_args=DURABLE)
    b = started(workdir=str(tmp_path), extra_args=[*DURABLE, "--rename-command", "CONFIG", ""])
    settings.REDLOCK_NODES = [{"URL": node.url, "FSYNC_ALWAYS": True} for node in (a, b)]
    messages = check_nodes()
    assert Codes.SHARED_DIR not in [m.id for m in messages]
    [note] = [m for m in messages if m.id == Codes.CONFIG_REFUSED]
    assert name(b) in note.msg and name(a) not in note.msg
    assert "whether a node shares its data directory with another on its host could not be checked" in note.msg


def test_config_refused_everywhere_is_one_note(settings, started):
    nodes = [started(extra_args=["--rename-command", "CONFIG", ""]) for _ in range(3)]
    settings.REDLOCK_NODES = [node.url for node in nodes]
    messages = check_nodes()
    notes = [m for m in messages if m.id == Codes.CONFIG_REFUSED]
    assert len(notes) == 1 and not notes[0].is_serious() and notes[0].level < 30  # informational
    assert all(name(node) in notes[0].msg for node in nodes)
    assert {m.id for m in messages} == {Codes.CONFIG_REFUSED, Codes.SAME_HOST}  # nothing guessed, nothing failed


ROOT = Path(__file__).resolve().parent.parent
RECIPES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.rst")), *sorted((ROOT / "example_project").rglob("*.py")),
           *sorted((ROOT / "scripts").glob("*")), *sorted((ROOT / "benchmarks").glob("*.md"))]


def test_every_recipe_starts_each_node_in_its_own_directory():
    commands = [
        (path.name, line.strip())
        for path in RECIPES
        if path.is_file() and path.name != "changelog.rst"
        for line in path.read_text().splitlines()
        if re.search(r"redis-server .*--appendonly", line)
    ]
    assert len(commands) >= 3  # README, install, checks
    assert [c for c in commands if "--dir" not in c[1]] == []


def test_the_install_recipe_starts_nodes_that_share_nothing(settings, tmp_path):
    """docs/install.rst's loop, run for real (on free ports, under tmp_path): three directories, no
    W013, and declared FSYNC_ALWAYS the fresh nodes vote at once."""
    text = (ROOT / "docs" / "install.rst").read_text()
    recipe = next(b for b in re.findall(r"\.\. code-block:: sh\n\n((?:    .*\n)+)", text) if "for port in" in b)
    ports = [free_port() for _ in range(3)]
    script = textwrap.dedent(recipe).replace("7900 7901 7902", " ".join(map(str, ports)))
    script = script.replace("/tmp/redlock", str(tmp_path))
    assert "--dir" in script and str(tmp_path) in script
    try:
        subprocess.run(["bash", "-e", "-c", script], check=True, timeout=60, cwd=tmp_path)
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(map(str, ports))
        settings.REDLOCK_NODES = [{"URL": f"redis://127.0.0.1:{port}/0", "FSYNC_ALWAYS": True} for port in ports]
        settings.REDLOCK = {"NODE_TIMEOUT": 0.5}  # the default restart window: declared nodes vote at once
        assert Codes.SHARED_DIR not in [m.id for m in check_nodes()]
        assert check_votes() == []
    finally:
        for port in ports:
            try:
                with redis.Redis(port=port, socket_timeout=5) as client:
                    client.shutdown(nosave=True)
            except redis.ConnectionError:
                pass  # stopped (shutdown closes the connection), or never started
