"""Tests of the simulated world itself (tests/simulation), not of the engine.

A toy single-round Redlock client (a few lines, below) shows that the world
and the checker find a violation in a deliberately broken client and none in
a correct one; the rest pins down the Redis model, the network and replay.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from redis.exceptions import NoScriptError, ResponseError

from django_redlock.core.base import ManagerConfig
from django_redlock.core.scripts import ACQUIRE, EXTEND, FENCE_RAISE, INSPECT, RELEASE
from tests.simulation import (
    Checker,
    Clock,
    ConnectionBroken,
    Exhaustive,
    FaultConfig,
    NetConfig,
    Network,
    SimNode,
    Violation,
    World,
    build,
    explore,
    parse_commands,
)

DRIFT = 0.01  # the engine's default clock_drift_factor
KEY = "redlock:lock:r"
CONFIG = ManagerConfig()


def release_args(value, place="", resource="r"):
    """KEYS and ARGV of the engine's RELEASE script (after EVAL/EVALSHA and the source or sha)."""
    return CONFIG.release_command((resource,), value, place)[2:]


def acquire_args(value, mode, place, ticket, ttl_ms=1000, life_ms=1500, resource="r"):
    return (3, *CONFIG.line_keys(resource), value, ttl_ms, mode, place, ticket, life_ms,
            CONFIG.wake_prefix(resource) + place, CONFIG.dataset_key, "")


# -- a toy Redlock client (NOT the engine) -------------------------------------------


class ToyClient:
    """Single-round Redlock: SET NX PX on every node, count, validity = ttl - elapsed - drift.

    ``quorum`` and ``honest`` let a test break it on purpose. Each attempt uses
    fresh connections; a release goes on the attempt's connection when it is
    still usable (FIFO: after the SET), else on a new one.
    """

    def __init__(self, sim, name, *, ttl=1.0, quorum=None, honest=True, timeout=0.05, resources=("r",),
                 px_factor=1.0, attempts=None):
        self.world, self.net, self.nodes, self.checker = sim.world, sim.network, sim.nodes, sim.checker
        nodes = self.nodes
        self.proc = sim.client(name)
        self.ttl, self.timeout, self.honest = ttl, timeout, honest
        self.quorum = len(nodes) // 2 + 1 if quorum is None else quorum
        self.resources = resources
        self.round = 0
        self.conns = []
        self.px = int(ttl * px_factor * 1000)  # px_factor > 1: keys outlive the ttl (a mutant)
        self.attempts = attempts

    def start(self):
        self.proc.after_local(self.world.uniform(0, 0.05, "toy start"), self.attempt)

    def attempt(self):
        w, p = self.world, self.proc
        if self.attempts is not None and self.round >= self.attempts:
            return
        self.round += 1
        rnd = self.round
        self.resource = w.choose(self.resources, "toy resource")
        self.value = w.token()
        self.started = p.now()
        self.oks = 0
        self.answers = 0
        self.conns = []
        for node in self.nodes:
            conn = self.net.connect(p, node)
            conn.on_reply = lambda reply, rnd=rnd: self.on_reply(rnd, reply)
            conn.on_broken = lambda reason, rnd=rnd: self.on_reply(rnd, None)
            conn.send([("SET", f"redlock:lock:{self.resource}", self.value, "NX", "PX", self.px)])
            self.conns.append(conn)
        self.timer = p.after_local(self.timeout, self.decide, rnd)

    def on_reply(self, rnd, reply):
        if rnd != self.round or self.answers < 0:
            return  # a late reply of an earlier round, or after the decision
        self.answers += 1
        self.oks += reply == b"OK"
        if self.answers == len(self.nodes):
            self.world.cancel(self.timer)
            self.decide(rnd)

    def decide(self, rnd):
        if rnd != self.round or self.answers < 0:
            return
        self.answers = -1
        elapsed = self.proc.now() - self.started
        drift = self.ttl * DRIFT + 0.002
        validity = self.ttl - elapsed - drift if self.honest else self.ttl
        if self.oks >= self.quorum and validity > 0:
            self.checker.acquired(self.proc, self.resource, self.value, validity)
            hold = validity * self.world.uniform(0.1, 1.5, "toy hold")
            self.proc.after_local(hold, self.release, rnd, True)
        else:
            self.release(rnd, False)

    def release(self, rnd, held):
        w = self.world
        script = ("EVAL", RELEASE.source, *release_args(self.value, resource=self.resource))
        for conn, node in zip(self.conns, self.nodes):
            if conn.state == "connecting" or (conn.state == "open" and not conn.dead):
                conn.send([script])
            else:
                conn = self.net.connect(self.proc, node)
                conn.send([script])
            conn.close()
        if held:
            self.checker.released(self.proc, self.resource, self.value, ttl=self.ttl)
        else:
            self.checker.gave_up(self.proc, self.resource, self.value, ttl=self.ttl)
        self.proc.after_local(w.uniform(0.0, 0.2, "toy retry"), self.attempt)


def toy_run(seed, *, clients=3, nodes=5, seconds=12.0, faults=True, restart_after=1.2, share=0.9,
            fsync=False, checker_quorum=None, **client_kw):
    """One seeded run of toy clients under the nemesis; returns (world, checker, clients)."""
    sim = build(seed, nodes=nodes, ttl=1.0, drift=DRIFT, share=share, fsync_always=fsync,
                net=NetConfig(late_chance=0.01, late_max=0.3))
    if checker_quorum is not None:
        sim.checker.quorum = checker_quorum
    cs = [ToyClient(sim, f"c{i}", **client_kw) for i in range(clients)]
    for c in cs:
        c.start()
    if faults:
        sim.nemesis(seconds * 0.6, FaultConfig(mean_gap=0.4, max_duration=1.5, max_down=1.5,
                                               restart_after=restart_after, progress_within=8.0))
    sim.world.run_until(seconds)
    return sim.world, sim.checker, cs


def first_violation(seeds, **kw):
    for seed in seeds:
        try:
            toy_run(seed, **kw)
        except Violation as exc:
            return seed, str(exc)
    return None, None


# -- the checker has teeth -----------------------------------------------------------


def test_correct_toy_client_survives_faults():
    start = time.perf_counter()
    acquisitions = 0
    for seed in range(200):
        _, checker, _ = toy_run(seed, seconds=10.0)
        acquisitions += checker.acquisitions
    assert acquisitions > 200 * 10
    assert time.perf_counter() - start < 60


def test_quorum_of_half_is_caught():
    seed, message = first_violation(range(300), quorum=5 // 2, faults=False)
    assert seed is not None
    assert "(c) validity" in message and f"seed={seed}" in message
    assert "ACQUIRED" in message  # the trace tail is part of the message
    # With (c) told the same wrong quorum, exclusion (a) catches it on its own.
    seed, message = first_violation(range(300), quorum=5 // 2, checker_quorum=5 // 2, faults=False)
    assert seed is not None and "(a) exclusion" in message


def test_validity_that_ignores_elapsed_time_is_caught():
    seed, message = first_violation(range(300), honest=False, faults=False)
    assert seed is not None and "(c) validity" in message


def test_restarts_without_delay_are_caught():
    seed, message = first_violation(range(300), restart_after=0.0)
    assert seed is not None
    assert "(a) exclusion" in message or "(c) validity" in message


def test_fsync_always_nodes_may_rejoin_at_once():
    seed, message = first_violation(range(100), restart_after=0.0, fsync=True, seconds=8.0)
    assert seed is None, message


def test_drift_beyond_the_bound_is_caught():
    seed, message = first_violation(range(300), share=30.0)
    assert seed is not None, "clocks far outside the drift bound must break the toy client"
    assert "(a) exclusion" in message or "(c) validity" in message


def test_keys_outliving_the_ttl_are_caught():
    seed, message = first_violation(range(300), px_factor=10.0)
    assert seed is not None and "(d) leftover" in message


def test_exhaustive_small_scope_toy_clients():
    """2 toy clients, 3 nodes, one attempt each: the first 2**10 delivery schedules, enumerated."""

    def run(quorum):
        def one(chooser):
            sim = build(0, nodes=3, share=0.0, chooser=chooser,
                        net=NetConfig(min_delay=0.001, max_delay=0.004, late_chance=0.0))
            sim.checker.quorum = quorum
            for name in ("a", "b"):
                ToyClient(sim, name, quorum=quorum, attempts=1).start()
            sim.world.run_until(3.0)

        return one

    assert explore(run(2), max_depth=10) == 2 ** 10
    with pytest.raises(Violation, match=r"\(a\) exclusion") as caught:
        explore(run(1), max_depth=10)
    assert "choices: " in str(caught.value)


def test_leftover_and_progress_checks_fire():
    w = World(1)
    net = Network(w)
    ns = [SimNode(w, f"node{i}") for i in range(3)]
    checker = Checker(w, ns, ttl=1.0)
    client = w.process("c")
    ns[0].execute(("SET", KEY, "v", "PX", 1000))
    ns[0].execute(("SET", KEY, "v"))  # no ttl: it would never go
    checker.gave_up(client, "r", "v")
    with pytest.raises(Violation, match=r"\(d\) leftover"):
        w.run()
    checker.expect_progress(2.0)
    with pytest.raises(Violation, match=r"\(e\) progress"):
        w.run()
    del net


def test_fencing_order_is_checked():
    w = World(1)
    ns = [SimNode(w, f"node{i}") for i in range(3)]
    checker = Checker(w, ns, ttl=1.0)
    a, b = w.process("a"), w.process("b")
    for n in ns:
        n.execute(("SET", KEY, "va", "PX", 1000))
    checker.acquired(a, "r", "va", 0.5, fencing_token=7)
    w.run_until(0.6)
    for n in ns:
        n.execute(("SET", KEY, "vb", "PX", 1000))
    with pytest.raises(Violation, match=r"\(b\) fencing"):
        checker.acquired(b, "r", "vb", 0.5, fencing_token=7)


def test_exact_replay_from_the_seed():
    w1, c1, _ = toy_run(42, seconds=30.0)
    w2, c2, _ = toy_run(42, seconds=30.0)
    assert w1.trace_lines() == w2.trace_lines()
    assert w1.events_run == w2.events_run and c1.acquisitions == c2.acquisitions
    w3, _, _ = toy_run(43, seconds=30.0)
    assert w3.trace_lines() != w1.trace_lines()


def test_many_clients_on_many_resources():
    """A thousand simulated lock operations (fan-out, decision, release) run clean; the rate is printed.

    The simulator's speed is measured by ``make simulate`` (runs per second), not asserted here.
    """
    resources = tuple(f"r{i}" for i in range(20))
    start = time.perf_counter()
    w, checker, clients = toy_run(5, clients=20, seconds=20.0, resources=resources)
    took = time.perf_counter() - start
    attempts = sum(c.round for c in clients)
    print(f"\n{attempts} lock operations ({checker.acquisitions} acquired), {w.events_run} events "
          f"in {took:.2f}s: {attempts / took:.0f} ops/s, {w.events_run / took:.0f} events/s")
    assert attempts > 1000 and checker.acquisitions > 100


# -- the Redis model ------------------------------------------------------------------


def make_node(**kw):
    w = World(7)
    return w, SimNode(w, "node0", **kw)


def test_set_nx_px_get_pttl_del():
    w, n = make_node()
    assert n.execute(("SET", KEY, "v1", "NX", "PX", 1000)) == b"OK"
    assert n.execute(("SET", KEY, b"v2", "NX", "PX", 1000)) is None
    assert n.execute(("GET", KEY)) == b"v1"
    assert n.execute(("PTTL", KEY)) == 1000
    assert n.execute(("PTTL", "missing")) == -2
    w.run_until(0.4)
    assert n.execute(("PTTL", KEY)) == 600
    assert n.execute(("PEXPIRE", KEY, 2000)) == 1
    assert n.execute(("DEL", KEY, "missing")) == 1
    assert n.execute(("GET", KEY)) is None
    assert n.execute(("SET", "plain", 5)) == b"OK" and n.execute(("PTTL", "plain")) == -1
    assert n.execute(("PING",)) == b"PONG"
    assert isinstance(n.execute(("HSET", "h", "f", "v")), ResponseError)


def test_expiry_follows_the_node_clock():
    w = World(1)
    fast = SimNode(w, "fast", Clock(w, rate=1.01, offset=5.0))
    slow = SimNode(w, "slow", Clock(w, rate=0.99, offset=9.0))
    for n in (fast, slow):
        n.execute(("SET", KEY, "v", "NX", "PX", 1000))
    w.run_until(0.995)  # the fast clock reads 1.005 s elapsed, the slow one 0.985 s
    assert fast.execute(("GET", KEY)) is None
    assert slow.execute(("GET", KEY)) == b"v"
    assert slow.peek(KEY)[1] == pytest.approx((1.0 - 0.99 * 0.995) / 0.99)
    w.run_until(1.011)
    assert slow.execute(("GET", KEY)) is None


def test_scripts_evalsha_noscript_until_eval_and_after_restart():
    w, n = make_node()
    n.execute(("SET", KEY, "v", "NX", "PX", 1000))
    reply = n.execute(("EVALSHA", RELEASE.sha, *release_args("other")))
    assert isinstance(reply, NoScriptError) and str(reply).startswith("NOSCRIPT")
    assert n.execute(("EVAL", RELEASE.source, *release_args("other"))) == 0
    guard = ("", CONFIG.dataset_key, "")
    assert isinstance(n.execute(("EVALSHA", EXTEND.sha, 1, KEY, "v", 5000, *guard)), NoScriptError)
    assert n.execute(("EVAL", EXTEND.source, 1, KEY, "v", 5000, *guard)) == 1
    assert n.execute(("PTTL", KEY)) == 5000
    assert n.execute(("EVAL", EXTEND.source, 1, KEY, "nope", 9000, "1", CONFIG.dataset_key, "")) == 0
    assert n.execute(("EVALSHA", RELEASE.sha, *release_args("v"))) == 1
    assert n.execute(("EVALSHA", RELEASE.sha, *release_args("v"))) == 0
    assert isinstance(n.execute(("EVALSHA", RELEASE.sha, 1, KEY, "v")), ResponseError)  # 3 keys expected
    assert n.execute(("EVAL", FENCE_RAISE.source, 1, "redlock:fence:r", 5, CONFIG.dataset_key, "")) == 5
    assert n.execute(("EVAL", FENCE_RAISE.source, 1, "redlock:fence:r", 3, CONFIG.dataset_key, "")) == 5
    assert n.execute(("GET", "redlock:fence:r")) == b"5"
    n.execute(("SET", KEY, "v", "PX", 1000))
    inspect = ("EVAL", INSPECT.source, 2, KEY, "redlock:lock:gone", "redlock:lock:", "redlock:places:")
    assert n.execute(inspect) == [b"v", 1000, None, -2, []]
    assert isinstance(n.execute(("EVAL", "return 1", 0)), ResponseError)
    n.crash()
    n.start()
    assert isinstance(n.execute(("EVALSHA", RELEASE.sha, *release_args("v"))), NoScriptError)


def test_acquire_and_release_scripts_keep_a_waiting_line():
    w, n = make_node()
    ev = lambda script, *args: n.execute(("EVAL", script.source, *args))  # noqa: E731
    queue, places = CONFIG.line_keys("r")[1:]
    assert ev(ACQUIRE, *acquire_args("a", "join", "pa", 10)) == b"OK"  # lock free, nobody waits: no place
    assert n.execute(("EXISTS", queue)) == 0
    assert ev(ACQUIRE, *acquire_args("b", "join", "pb", 20)) == 0  # held: pb takes a place
    assert ev(ACQUIRE, *acquire_args("c", "once", "pc", 5)) == 0
    assert n.execute(("ZRANGE", queue, 0, -1)) == [b"pb"]
    assert 1 <= n.execute(("PTTL", queue)) <= 1500
    assert ev(RELEASE, *release_args("a", "pa")) == 1  # wakes pb, first in line
    assert n.execute(("ZRANGE", queue, 0, -1)) == [b"pb"]
    wake = CONFIG.wake_prefix("r") + "pb"
    assert n.execute(("LLEN", wake)) == 1 and n.execute(("PTTL", wake)) == 1500
    assert ev(ACQUIRE, *acquire_args("c", "once", "pc", 5)) == -2  # free, but pb waits
    assert ev(ACQUIRE, *acquire_args("c", "join", "pc", 30)) == -2  # pc joins behind pb
    assert ev(ACQUIRE, *acquire_args("x", "wait", "px", 1)) == -1  # no place: it expired or left
    assert ev(ACQUIRE, *acquire_args("b", "wait", "pb", 20)) == b"OK" and n.execute(("LLEN", wake)) == 0
    assert n.execute(("ZRANGE", queue, 0, -1)) == [b"pc"]  # a grant takes the place out of the line
    assert ev(RELEASE, *release_args("nope", "")) == 0 and n.execute(("GET", KEY)) == b"b"
    assert isinstance(n.execute(("GET", queue)), ResponseError)  # WRONGTYPE
    # Places expire on the node's clock (TIME, ms) and are forgotten by the next script.
    w.run_until(1.2)
    assert ev(ACQUIRE, *acquire_args("d", "join", "pd", 40, life_ms=2000)) == -2  # lock expired; pc first
    w.run_until(1.6)
    assert n.in_line(queue, places, "pc") is False and n.in_line(queue, places, "pd") is True
    assert n.execute(("ZCARD", queue)) == 2  # expired places linger until a script forgets them
    assert ev(ACQUIRE, *acquire_args("d", "join", "pd", 40, life_ms=2000)) == b"OK"
    assert n.execute(("EXISTS", queue)) == 0
    n.crash()
    n.start()
    assert n.execute(("EXISTS", queue)) == 0  # lists and sorted sets are lost like keys


def test_blpop_blocks_its_connection_until_a_push_or_its_timeout():
    w, net, node, client = net_world(late_chance=0.0)
    node.tick = 0.0  # exact timeouts here (the default notices them at the next 100 ms tick)
    a, b = net.connect(client, node), net.connect(client, node)
    got = []
    a.on_reply = lambda r: got.append(("a", round(w.now, 3), r))
    b.on_reply = lambda r: got.append(("b", round(w.now, 3), r))
    w.run_until(0.01)
    a.send([("PING", "before"), ("BLPOP", "wake", "0.5"), ("PING", "after")])
    w.run_until(0.05)
    a.send([("PING", "later")])
    b.send([("BLPOP", "wake", "0.5")])  # second in line for the same list
    w.run_until(0.1)
    assert [r for who, _, r in got] == [b"before"]
    node.execute(("RPUSH", "wake", "1"))  # served first come, first served; the rest runs after
    w.run_until(0.2)
    assert [(who, r) for who, _, r in got[1:]] == [("a", [b"wake", b"1"]), ("a", b"after"), ("a", b"later")]
    w.run_until(1.0)
    assert got[-1][0] == "b" and got[-1][2] is None and 0.55 <= got[-1][1] <= 0.56  # b timed out


def test_blpop_timeouts_wait_for_the_server_tick_and_a_pause():
    w, net, node, client = net_world(late_chance=0.0)
    conn = net.connect(client, node)
    got = []
    conn.on_reply = lambda r: got.append((w.now, r))
    w.run_until(0.01)
    conn.send([("BLPOP", "wake", "0.2"), ("PING",)])
    w.run_until(0.05)
    node.pause()
    w.run_until(1.0)
    assert got == []  # SIGSTOP: the timeout waits too
    node.resume()
    w.run_until(1.1)
    assert [r for _, r in got] == [None, b"PONG"] and got[0][0] >= 1.0
    got.clear()
    conn.send([("BLPOP", "wake", "0.2")])
    w.run_until(2.0)
    start = 1.1
    assert 0.2 <= got[0][0] - start <= 0.2 + node.tick + 0.01  # noticed at the next tick at the latest


def test_closing_a_blocked_connection_drops_what_waits_behind_the_blpop():
    w, net, node, client = net_world(late_chance=0.0)
    conn = net.connect(client, node)
    w.run_until(0.01)
    conn.send([("BLPOP", "wake", "0"), ("SET", KEY, "late", "PX", 1000)])
    w.run_until(0.05)
    conn.close()
    w.run_until(0.1)
    node.execute(("RPUSH", "wake", "1"))
    w.run()
    assert node.execute(("GET", KEY)) is None and node.execute(("LLEN", "wake")) == 1


def test_info_config_and_denial():
    w, n = make_node(clock=None, fsync_always=True)
    w.run_until(12.7)
    info = n.execute(("INFO", "server"))
    assert info.startswith(b"# Server\r\n") and b"uptime_in_seconds:12\r\n" in info
    run_id = info.split(b"run_id:")[1].split(b"\r\n")[0]
    assert len(run_id) == 40
    assert n.execute(("CONFIG", "GET", "appendonly")) == [b"appendonly", b"yes"]
    assert n.execute(("CONFIG", "GET", "appendfsync")) == [b"appendfsync", b"always"]
    n.crash()
    n.start()
    info2 = n.execute(("INFO", "server"))
    assert b"uptime_in_seconds:0\r\n" in info2 and run_id not in info2
    w2, denied = make_node(deny_info=True)
    reply = denied.execute(("INFO", "server"))
    assert isinstance(reply, ResponseError) and str(reply).startswith("NOPERM")
    assert denied.execute(("CONFIG", "GET", "appendonly")) == [b"appendonly", b"no"]


def test_restart_loses_data_unless_fsync_always():
    for fsync, kept in ((False, None), (True, b"v")):
        w, n = make_node(fsync_always=fsync)
        n.execute(("SET", KEY, "v", "NX", "PX", 10_000))
        n.crash()
        w.run_until(1.0)
        n.start()
        assert n.execute(("GET", KEY)) == kept


def test_scan_matches_escaped_glob():
    w, n = make_node()
    for key in ("redlock:lock:a", "redlock:lock:b*", "redlock:fence:a", "other"):
        n.execute(("SET", key, "v"))
    assert n.execute(("SCAN", 0, "MATCH", "redlock:lock:*", "COUNT", 100)) == [
        b"0", [b"redlock:lock:a", b"redlock:lock:b*"]]
    assert n.execute(("SCAN", 0, "MATCH", r"redlock:lock:b\*", "COUNT", 10))[1] == [b"redlock:lock:b*"]
    assert n.execute(("SCAN", 0, "MATCH", "redlock:[lf]*:a", "COUNT", 10))[1] == [
        b"redlock:fence:a", b"redlock:lock:a"]


def test_parse_commands_reads_packed_requests():
    from django_redlock.core.resp import pack

    data = pack(("SET", KEY, "v", "NX", "PX", 1000)) + pack(("EVALSHA", RELEASE.sha, 1, KEY, "v"))
    assert parse_commands(data) == [
        (b"SET", KEY.encode(), b"v", b"NX", b"PX", b"1000"),
        (b"EVALSHA", RELEASE.sha.encode(), b"1", KEY.encode(), b"v"),
    ]


# -- the network ----------------------------------------------------------------------


def net_world(seed=3, **cfg):
    w = World(seed)
    net = Network(w, NetConfig(**cfg))
    node = SimNode(w, "node0")
    client = w.process("c1")
    return w, net, node, client


def test_fifo_per_connection_under_random_and_late_delays():
    for seed in range(20):
        w, net, node, client = net_world(seed, late_chance=0.3, late_max=0.5)
        conn = net.connect(client, node)
        got = []
        conn.on_reply = got.append
        for i in range(200):
            w.after(i * 0.0005, conn.send, [("SET", f"k{i}", i), ("GET", f"k{i}")])
        w.run()
        assert got[1::2] == [str(i).encode() for i in range(200)]
        # the node saw the writes in order too: each GET found its own SET
        assert all(r == b"OK" for r in got[0::2])


def test_pause_buffers_and_resume_answers_in_order():
    w, net, node, client = net_world()
    conn = net.connect(client, node)
    got = []
    conn.on_reply = lambda r: got.append((w.now, r))
    w.run_until(0.01)
    node.pause()
    conn.send([("SET", KEY, "a", "NX", "PX", 500)])
    conn.send([("GET", KEY)])
    w.run_until(1.0)
    assert got == [] and node.execute(("GET", KEY)) is None
    node.resume()
    w.run()
    # the SET ran on resume; its key then lives 500 ms on the node's clock
    assert [r for _, r in got] == [b"OK", b"a"] and got[0][0] >= 1.0


def test_client_gc_pause_defers_replies_and_timers():
    w, net, node, client = net_world()
    conn = net.connect(client, node)
    seen = []
    conn.on_reply = lambda r: seen.append(("reply", w.now))
    client.after_local(0.01, lambda: seen.append(("timer", w.now)))
    conn.send([("PING",)])
    net.pause_client(client, 2.0)
    w.run()
    assert sorted(k for k, _ in seen) == ["reply", "timer"]
    assert all(t >= 2.0 for _, t in seen)


def test_closed_connection_bytes_still_reach_the_node():
    w, net, node, client = net_world()
    conn = net.connect(client, node)
    got = []
    conn.on_reply = got.append
    conn.send([("SET", KEY, "late", "NX", "PX", 1000)])
    conn.close()
    with pytest.raises(ConnectionBroken):
        conn.send([("PING",)])
    w.run()
    assert got == [] and node.execute(("GET", KEY)) == b"late"


def test_drop_resets_both_sides_and_may_still_deliver():
    delivered = set()
    for seed in range(40):
        w, net, node, client = net_world(seed, min_delay=0.01, max_delay=0.02, late_chance=0.0)
        conn = net.connect(client, node)
        broken = []
        conn.on_broken = broken.append
        conn.on_reply = lambda r: pytest.fail("no reply after a reset")
        w.run_until(0.05)
        conn.send([("SET", KEY, "x", "NX", "PX", 1000)])
        net.drop(conn)
        w.run()
        assert broken == ["connection reset"]
        delivered.add(node.execute(("GET", KEY)))
    assert delivered == {None, b"x"}  # both outcomes happen, by seed


def test_partition_holds_bytes_then_delivers_or_resets():
    outcomes = set()
    for seed in range(40):
        w, net, node, client = net_world(seed, late_chance=0.0)
        conn = net.connect(client, node)
        got, broken = [], []
        conn.on_reply = got.append
        conn.on_broken = broken.append
        w.run_until(0.01)
        net.partition(node, [client], duration=1.0)
        conn.send([("SET", KEY, "p", "NX", "PX", 5000)])
        w.run_until(0.9)
        assert node.execute(("GET", KEY)) is None and not got
        w.run()
        outcomes.add(("reply" if got else "reset" if broken else "?", node.execute(("GET", KEY))))
    assert ("reply", b"p") in outcomes and ("reset", None) in outcomes


def test_connect_to_a_down_node_is_refused_and_crash_resets():
    w, net, node, client = net_world(late_chance=0.0, silent_crash_chance=0.0)
    node.crash()
    conn = net.connect(client, node)
    broken = []
    conn.on_broken = broken.append
    w.run()
    assert broken == ["connection refused"]
    node.start()
    conn = net.connect(client, node)
    conn.on_broken = broken.append
    w.run()
    assert conn.state == "open"
    node.crash()
    w.run()
    assert broken[-1] == "connection reset (node crashed)"


# -- replay and exhaustive enumeration ----------------------------------------------------


def test_exhaustive_enumerates_every_choice_sequence():
    seen = []

    def run(chooser):
        w = World(0, chooser=chooser)
        seen.append((w.choose("ab", "x"), w.choose("xyz", "y"), w.chance(0.5, "z")))

    assert explore(run) == 12
    assert len(set(seen)) == 12


def test_exhaustive_two_writers_every_delivery_order():
    """Two clients, one node each way: every interleaving of their SET NX is tried."""
    winners = set()

    def run(chooser):
        w = World(0, chooser=chooser)
        net = Network(w, NetConfig(min_delay=0.001, max_delay=0.003, late_chance=0.0))
        node = SimNode(w, "node0")
        for name in ("a", "b"):
            conn = net.connect(w.process(name), node)
            conn.send([("SET", KEY, name, "NX", "PX", 1000)])
        w.run()
        winners.add(node.execute(("GET", KEY)))

    runs = explore(run)
    # 2 delays (the ends) for each of 8 messages: SYN, SYNACK, request, reply per client.
    assert winners == {b"a", b"b"} and runs == 2 ** 8


def test_exhaustive_depth_bound_and_path():
    def run(chooser):
        w = World(0, chooser=chooser)
        [w.choose("ab", "x") for _ in range(10)]

    assert explore(run, max_depth=3) == 8
    chooser = Exhaustive()
    World(0, chooser=chooser).uniform(0.0, 1.0, "d")
    assert chooser.advance() and chooser.path() == [("d", 1, 2)]
    assert World(0, chooser=chooser).uniform(0.0, 1.0, "d") == 1.0 and not chooser.advance()


def test_replay_does_not_depend_on_hash_randomization():
    import subprocess
    import sys

    code = (
        "import hashlib; from tests.test_simulation_world import toy_run; "
        "w, c, _ = toy_run(11, seconds=10); "
        "print(hashlib.sha1(chr(10).join(w.trace_lines()).encode()).hexdigest(), w.events_run)"
    )
    root = str(Path(__file__).parents[1])
    outs = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env={"PYTHONHASHSEED": seed, "PATH": ""}, cwd=root).stdout
        for seed in ("1", "2")
    }
    assert len(outs) == 1


def test_killed_client_sockets_close_but_sent_bytes_land():
    w, net, node, client = net_world()
    conn = net.connect(client, node)
    conn.send([("SET", KEY, "dead", "NX", "PX", 1000)])
    fired = []
    client.after_local(0.5, lambda: fired.append(1))
    net.kill_client(client)
    w.run()
    assert conn.state == "closed" and not fired and node.execute(("GET", KEY)) == b"dead"


def test_the_real_scripts_answer_as_the_model_does(servers):
    """The same story of joins, waits, releases and refusals, on a real redis-server and on the model."""
    import redis as redis_py

    real = redis_py.Redis.from_url(servers[0].url)
    real.flushall()
    w, model = make_node()
    queue = CONFIG.line_keys("r")[1]
    wake = CONFIG.wake_prefix("r") + "pb"
    story = [
        (ACQUIRE, acquire_args("a", "join", "pa", 10)),
        (ACQUIRE, acquire_args("b", "join", "pb", 20)),
        (ACQUIRE, acquire_args("c", "once", "pc", 5)),
        ("ZRANGE", (queue, 0, -1)),
        (RELEASE, release_args("a", "pa")),
        ("LLEN", (wake,)),
        (ACQUIRE, acquire_args("c", "once", "pc", 5)),
        (ACQUIRE, acquire_args("c", "join", "pc", 30)),
        (ACQUIRE, acquire_args("x", "wait", "px", 1)),
        (ACQUIRE, acquire_args("b", "wait", "pb", 20)),
        ("LLEN", (wake,)),
        ("ZRANGE", (queue, 0, -1)),
        (RELEASE, release_args("nope", "")),
        ("GET", (KEY,)),
        (RELEASE, release_args("b", "pb")),
        ("LLEN", (CONFIG.wake_prefix("r") + "pc",)),
        (ACQUIRE, acquire_args("c", "wait", "pc", 30)),
        ("EXISTS", (queue,)),
        (RELEASE, release_args("c", "")),
        (ACQUIRE, acquire_args("d", "once", "pd", 40)),
    ]
    for step, args in story:
        command = ("EVAL", step.source, *args) if not isinstance(step, str) else (step, *args)
        expected = model.execute(command)
        got = real.execute_command(*command)
        assert got == expected, (command[:1] + command[3:], got, expected)
