"""The simulator's Redis model (tests/simulation/redis_model.py ``SimNode``) answers as a real redis-server.

A seeded generator writes sequences of the commands the engine sends (SET NX PX, the VOTE, ACQUIRE,
RELEASE, EXTEND, FENCE_READ, FENCE_RAISE, INSPECT, LIST and DATASET scripts, DEL, PTTL, GET) over a
few resources, values, places
in line and ttls, with pauses that let short keys and places expire. Each command runs on a real
server (read with the engine's own RESP reader) and on the model, whose clock follows the real
time, and every reply is compared. The suite runs a few sequences; set ``REDLOCK_LUA_MODEL_SEEDS``
(e.g. 200) for a longer run.
"""

from __future__ import annotations

import os
import random
import socket
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from django_redlock.core.base import ManagerConfig, extend_command, lines_of
from django_redlock.core.resp import INCOMPLETE, ReplyBuffer, pack
from django_redlock.core import scripts
from django_redlock.core.scripts import ACQUIRE, DATASET, FENCE_RAISE, FENCE_READ, LIST, VOTE, script_command
from tests.simulation import SimNode, World, redis_model

CONFIG = ManagerConfig()
RESOURCES = ("a", "b", "c")
VALUES = ("v1", "v2", "v3")
PLACES = ("p1", "p2", "p3")
SHORT, LONG = 150, 60_000  # ms: a short key or place is gone after a PAUSE, a long one never in a run
PAUSE = 0.3  # seconds
MAX_BURST = 15  # commands between pauses: a burst ends long before a short ttl does
COMMANDS = 60  # per sequence
#: Scripts by sha and by source, for EVAL and for messages.
SCRIPTS = {s.sha: s for s in vars(scripts).values() if isinstance(s, scripts.Script)}
#: LIST is compared once the model implements it.
MODELLED_LIST = LIST.sha in redis_model._SCRIPTS
SEEDS = int(os.environ.get("REDLOCK_LUA_MODEL_SEEDS", "3"))
#: The tokens a data-set marker is created with from each value.
TOKENS = tuple(redis_model.dataset_token(v.encode()).decode() for v in VALUES)


class Real:
    """One connection to a redis-server, read with the engine's RESP reader (no redis-py reply callbacks)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.buffer = ReplyBuffer()

    def execute(self, command: Sequence[Any]) -> Any:
        self.sock.sendall(pack(command))
        while (reply := self.buffer.next()) is INCOMPLETE:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("redis-server closed the connection")
            self.buffer.feed(data)
        return reply

    def close(self) -> None:
        self.sock.close()


def generate(rng: random.Random) -> Iterator[tuple[Any, ...] | None]:
    """Commands as the engine writes them, and None for a pause."""
    burst = 0
    recent: dict[str, str] = {}  # resource -> the value last voted for (a release or extension mostly names it)
    for _ in range(COMMANDS):
        burst += 1
        if burst > MAX_BURST or rng.random() < 0.05:
            burst = 0
            yield None
            continue
        resources = sorted(rng.sample(RESOURCES, rng.choice((1, 1, 1, 2))))
        locks = [CONFIG.key(r) for r in resources]
        value, place = rng.choice(VALUES), rng.choice(PLACES)
        if resources[0] in recent and rng.random() < 0.6:
            value = recent[resources[0]]
        ttl, life = rng.choice((SHORT, LONG)), rng.choice((SHORT, LONG))
        kind = rng.choice(("set", "acquire", "acquire", "acquire", "release", "release", "extend", "fence",
                           "inspect", "list", "del", "pttl", "get", "line", "vote", "dataset"))
        # The data-set check: no token, one a marker may hold (see redis_model.dataset_token), or a stale one.
        guard = (CONFIG.dataset_key, rng.choice(("", "stale", *TOKENS)))
        if kind in ("set", "acquire", "vote"):
            recent.update(dict.fromkeys(resources, value))
        if kind == "set":
            yield ("SET", locks[0], value, "NX", "PX", ttl)
        elif kind == "vote":
            yield script_command(VOTE, locks[:1], (value, ttl, *guard))
        elif kind == "dataset":
            yield rng.choice((script_command(DATASET, (CONFIG.dataset_key,), (value,)), ("DEL", CONFIG.dataset_key)))
        elif kind == "acquire":
            mode = rng.choice(("once", "join", "wait"))
            wake = [CONFIG.wake_prefix(r) + place for r in resources]
            args = (value, ttl, mode, place, rng.randint(1, 4), life, *wake, *guard)
            yield script_command(ACQUIRE, lines_of(CONFIG.key_prefix, tuple(resources))[0], args)
        elif kind == "release":
            keep = rng.choice((None, None, (rng.randint(1, 4), life)))
            yield CONFIG.release_command(resources, value, rng.choice((place, "")), keep)
        elif kind == "extend":  # re-creating a lost key, or not; behind a data-set check
            command = extend_command(locks, value, ttl / 1000, CONFIG.dataset_key, rng.random() < 0.6)
            yield (*command[:-1], guard[1])
        elif kind == "fence":
            fences = [CONFIG.fence_key(r) for r in resources]
            if rng.random() < 0.5:
                yield script_command(FENCE_RAISE, fences, (rng.randint(1, 9), *guard))
            else:
                yield script_command(FENCE_READ, fences, guard)
        elif kind == "inspect":
            yield CONFIG.inspect_command(locks)
        elif kind == "list" and MODELLED_LIST:
            fields = rng.choice(("n", "v", "t", "vt", "w"))
            head = CONFIG.line_keys("")[2] if fields == "w" else rng.choice((CONFIG.key(""), CONFIG.key_prefix))
            yield CONFIG.list_command("0", CONFIG.pattern(head), 1000, fields, rng.random() < 0.5)
        elif kind == "del":
            yield ("DEL", *rng.sample([*locks, *CONFIG.line_keys(resources[0])[1:]], 2))
        elif kind in ("pttl", "get"):
            yield (kind.upper(), rng.choice([*locks, CONFIG.fence_key(resources[0])]))
        elif kind == "list":
            yield ("GET", locks[0])
        else:
            _, queue, places = CONFIG.line_keys(resources[0])
            yield rng.choice((("ZRANGE", queue, 0, -1), ("ZCARD", places), ("LLEN", CONFIG.wake_prefix(resources[0]) + place)))


def _ms_close(got: Any, expected: Any) -> bool:
    """Equal, or both milliseconds of a ttl (the real clock ran a little between the two reads)."""
    if isinstance(got, int) and isinstance(expected, int) and got > 100 and expected > 100:
        return abs(got - expected) <= 50
    return bool(got == expected)


def _rows(reply: list[Any]) -> list[tuple[Any, ...]]:
    """A LIST reply's columns as sorted rows (SCAN's order is the server's own)."""
    cursor, count, *columns = reply
    if all(isinstance(c, bytes) for c in columns):  # NUL-joined columns
        columns = [c.split(b"\0") if c else [] for c in columns]
    columns = [[int(x) if isinstance(x, bytes) and x.lstrip(b"-").isdigit() else x for x in c] for c in columns]
    names = columns[0]
    padded = [c + [None] * (len(names) - len(c)) for c in columns]
    return sorted(zip(*padded), key=repr) + [("cursor", cursor, "count", count)]


def same(got: Any, expected: Any, command: Sequence[Any]) -> bool:
    if isinstance(expected, Exception) or isinstance(got, Exception):
        return type(got) is type(expected) and str(got).split()[:1] == str(expected).split()[:1]
    if command[0] in ("EVAL", "EVALSHA") and command[1] in (LIST.sha, LIST.source):
        got, expected = _rows(got), _rows(expected)
    if isinstance(got, list) and isinstance(expected, list):
        return len(got) == len(expected) and all(same(g, e, ("",)) for g, e in zip(got, expected))
    return _ms_close(got, expected)


def shown(command: Sequence[Any]) -> str:
    """A command for a failure message: a script by its name."""
    if command[0] in ("EVAL", "EVALSHA"):
        script = SCRIPTS.get(command[1]) or next(s for s in SCRIPTS.values() if s.source == command[1])
        return f"{command[0]} {script.name} {list(command[2:])}"
    return " ".join(map(str, command))


def run_sequence(seed: int, port: int) -> int:
    """Run one generated sequence on both; return how many commands were compared."""
    rng = random.Random(seed)
    real = Real(port)
    real.execute(("FLUSHALL",))
    real.execute(("SCRIPT", "FLUSH"))  # both start without scripts: EVALSHA answers NOSCRIPT until an EVAL
    world = World(seed)
    model = SimNode(world, "model", fsync_always=True)
    start = time.monotonic()
    compared, history, loaded = 0, [], set()
    try:
        for command in generate(rng):
            if command is None:
                time.sleep(PAUSE)
                history.append("pause")
                continue
            if command[0] == "EVALSHA" and rng.random() < (0.1 if command[1] in loaded else 0.8):
                loaded.add(command[1])  # mostly as the engine does: EVAL once, then EVALSHA
                command = ("EVAL", SCRIPTS[command[1]].source, *command[2:])
            before = time.monotonic()
            got = real.execute(command)
            world.run_until((before + time.monotonic()) / 2 - start)  # the model's clock is the real one
            expected = model.execute(command)
            history.append(shown(command))
            assert same(got, expected, command), (
                f"seed {seed}: the model answered {expected!r}, redis-server {got!r} to\n  {shown(command)}\n"
                "after:\n  " + "\n  ".join(history[-12:])
            )
            compared += 1
    finally:
        real.close()
    return compared


@pytest.mark.parametrize("seed", range(SEEDS))
def test_the_model_answers_generated_commands_as_redis_server_does(servers, seed):
    assert run_sequence(seed, servers[0].port) > COMMANDS // 2


def test_a_wrong_model_reply_is_caught(servers, monkeypatch):
    """The comparison is not vacuous: a model whose EXTEND never extends is caught."""
    monkeypatch.setattr(SimNode, "_extend", lambda self, keys, argv: 0, raising=True)
    with pytest.raises(AssertionError, match="the model answered 0"):
        for seed in range(20):
            run_sequence(1000 + seed, servers[0].port)
