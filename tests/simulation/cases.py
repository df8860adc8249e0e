"""Scripted simulation cases: faults placed exactly where a known bug (or a mutant) would show.

Random runs find most mistakes; some need a fault at one precise moment. Each
case here builds a small world, drives two clients through the engine's real
steps, places its faults, and returns the checker's verdict. The correct core
must pass every case; the mutant named in each case must fail it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from django_redlock.core import steps
from django_redlock.core.base import PROVISIONAL_TTL, WAIT_SLICE
from django_redlock.core.lock import LockBase
from django_redlock.core.scripts import EXTEND, FENCE_RAISE, RELEASE
from django_redlock.exceptions import LockError, LockLost

from .client import SimClient, vote_of
from .invariants import Violation
from .network import NetConfig
from .redis_model import SimNode
from .scenario import Sim, build, settled

__all__ = ["CASES", "run_case"]

QUIET = NetConfig(late_chance=0.0)
TTL = 1.0
START = settled(TTL)  # the nodes are new: after the restart window


class _Tap:
    """Wrap a step; call ``hook(effect)`` before each effect is performed."""

    def __init__(self, step: steps.Step, hook: Callable[[Any], None]) -> None:
        self.step, self.hook = step, hook

    def send(self, value: Any) -> Any:
        effect = self.step.send(value)
        self.hook(effect)
        return effect

    def throw(self, error: BaseException) -> Any:
        effect = self.step.throw(error)
        self.hook(effect)
        return effect


def _acquire(client: SimClient, resource: str | Sequence[str], then: Callable[[LockBase | None], None], *,
             blocking: bool = False, timeout: float | None = None) -> None:
    client.acquire(resource, lambda lock, error: then(lock), blocking=blocking, timeout=timeout)


def _fence(client: SimClient, lock: LockBase, then: Callable[[int | None], None],
           hook: Callable[[Any], None] | None = None) -> None:
    def done(token: Any, error: BaseException | None) -> None:
        if error is not None:
            if not isinstance(error, LockError):
                raise error
            then(None)
            return
        client.sim.checker.fenced(client.proc, lock.resource, lock.value, token)
        then(token)

    step: Any = steps.fence(lock, client.config, client.quorum, client.total)
    client.run(_Tap(step, hook) if hook else step, done)


def _release(client: SimClient, lock: LockBase, then: Callable[[], None] = lambda: None) -> None:
    client.release(lock, then)


def _hold_on_first_three(sim: Sim, client: SimClient, then: Callable[[LockBase | None], None]) -> None:
    """Acquire "r" with nodes 3 and 4 cut off from ``client``: its lock lives on nodes 0, 1, 2 only."""
    for node in sim.nodes[3:]:
        sim.network.partition(node, [client.proc])
    _acquire(client, "r", then)


def fence_written_to_a_minority(seed: int) -> Sim:
    """A's fencing write reaches one node; B, whose wall clock is behind, reads a quorum without it."""
    sim = build(seed, ttl=TTL, net=QUIET, share=0.0)
    a = SimClient(sim, "a", ttl=TTL, wall_offset=0.8)
    b = SimClient(sim, "b", ttl=TTL, wall_offset=-0.8)
    net, nodes, world = sim.network, sim.nodes, sim.world

    def cut_before_write(effect: Any) -> None:
        if type(effect) is steps.Fan and effect.script is FENCE_RAISE:
            for node in nodes[1:]:
                net.partition(node, [a.proc])  # the raise reaches node0 only

    def a_acquired(lock: LockBase | None) -> None:
        assert lock is not None, "a must get the lock in a quiet world"
        _fence(a, lock, lambda token: _release(a, lock, b_start) if token else b_start(), cut_before_write)

    def b_start() -> None:
        net.partition(nodes[0], [b.proc])  # b's quorum is nodes 1-4, which never saw a's token
        _acquire(b, "r", b_acquired, blocking=True, timeout=3.0)

    def b_acquired(lock: LockBase | None) -> None:
        if lock is not None:
            _fence(b, lock, lambda token: _release(b, lock))

    world.at(START, _acquire, a, "r", a_acquired)
    world.run_until(START + 6)
    return sim


def _restarted_under_a_lock(seed: int, then: Callable[[SimNode], None]) -> Sim:
    """A holds on nodes 0-2; node 2 restarts empty (down 0.05 s) and ``then(node 2)`` is done at once;
    B tries the lock 0.1 s later: it must not win while A holds."""
    sim = build(seed, ttl=TTL, net=QUIET, share=0.0)
    a = SimClient(sim, "a", ttl=TTL)
    b = SimClient(sim, "b", ttl=TTL)
    nodes, world = sim.nodes, sim.world

    def a_acquired(lock: LockBase | None) -> None:
        assert lock is not None
        nodes[2].restart(0.05)
        then(nodes[2])
        world.after(0.1, _acquire, b, "r", lambda lock: None)

    world.at(START, _hold_on_first_three, sim, a, a_acquired)
    world.run_until(START + 3)
    return sim


def restarted_node_whose_probe_fails(seed: int) -> Sim:
    """B's probe of the restarted node fails for a passing reason (BUSY, a proxy hiccup) for 0.5 s."""

    def flaky(node: SimNode) -> None:
        node.flaky_info = 1.0
        node.world.after(0.5, setattr, node, "flaky_info", 0.0)

    return _restarted_under_a_lock(seed, flaky)


def restarted_node_that_turns_fsync_on(seed: int) -> Sim:
    """The restarted node gets appendonly + appendfsync always (an operator, a config agent): it says
    "durable" now, but it lost A's key."""
    return _restarted_under_a_lock(seed, SimNode.fsync_on)


def restarted_node_whose_first_reply_is_late(seed: int) -> Sim:
    """Node 2 restarts empty under A's lock and is paused when B first talks to it."""
    sim = build(seed, ttl=TTL, net=QUIET, share=0.0)
    a = SimClient(sim, "a", ttl=TTL)
    b = SimClient(sim, "b", ttl=TTL)
    nodes, world = sim.nodes, sim.world

    def a_acquired(lock: LockBase | None) -> None:
        assert lock is not None
        nodes[2].restart(0.02)
        world.after(0.05, nodes[2].pause)
        world.after(0.06, _acquire, b, "other", lambda lock: lock and _release(b, lock))  # first contact, unread
        world.after(0.35, nodes[2].resume)
        world.after(0.40, _acquire, b, "r", lambda lock: None)  # must not win while a holds

    world.at(START, _hold_on_first_three, sim, a, a_acquired)
    world.run_until(START + 3)
    return sim


def restarted_node_that_reads_one_second_at_once(seed: int) -> Sim:
    """Node 2 restarts under A's lock just before its clock's second ends: INFO says "1 s" 0.1 s later."""
    sim = build(seed, ttl=TTL, net=QUIET, share=0.0)
    a = SimClient(sim, "a", ttl=TTL)
    b = SimClient(sim, "b", ttl=TTL)
    nodes, world = sim.nodes, sim.world
    clock = nodes[2].clock
    second = clock.to_true(float(int(clock.offset + clock.rate * START) + 1))  # a whole second on node 2
    world.at(second - 0.5, _hold_on_first_three, sim, a, lambda lock: None)
    world.at(second - 0.11, nodes[2].restart, 0.01)  # up again at x.9 s: forgets A's key
    world.at(second + 0.05, _acquire, b, "other", lambda lock: lock and _release(b, lock))  # reads "1 s"
    world.at(second + 0.1, _acquire, b, "r", lambda lock: None)  # must not win while A holds
    world.run_until(second + 3)
    return sim


def restarted_node_whose_probe_is_read_late(seed: int) -> Sim:
    """Node 2 restarts under A's lock (ttl 3 s) and is paused when B's first vote probes it; it answers
    2 s later. B must age it from that reading, not from when its fan-out began."""
    ttl = 3.0
    sim = build(seed, ttl=ttl, net=QUIET, share=0.0)
    a = SimClient(sim, "a", ttl=ttl)
    b = SimClient(sim, "b", ttl=ttl)
    nodes, world = sim.nodes, sim.world

    def a_acquired(lock: LockBase | None) -> None:
        assert lock is not None
        nodes[2].restart(0.02)  # up again at +0.02, empty
        world.after(0.03, nodes[2].pause)
        world.after(0.05, _acquire, b, "other", lambda lock: None)  # B's probe of node 2 waits, unread
        world.after(2.0, nodes[2].resume)  # read now: "up 2 s"
        world.after(2.1, _acquire, b, "r", lambda lock: None)  # must not win while A holds

    world.at(settled(ttl), _hold_on_first_three, sim, a, a_acquired)
    world.run_until(settled(ttl) + 5)
    return sim


def replica_promoted_behind_a_node(seed: int) -> Sim:
    """B has talked to node 2; A holds on nodes 0-2; a replica that lagged is promoted behind node 2's
    address (long up, without A's key). B, which saw the server before, must sit it out.

    Failovers are not among the random faults: a process whose first contact with a node comes after a
    failover cannot tell it from a long-running master (docs/safety.rst), and random runs make such
    first contacts (respawned clients, a node cut off from a client when it started)."""
    # The failover resets connections (a silent one would keep B off node 2 until A's lock is gone).
    sim = build(seed, ttl=TTL, net=NetConfig(late_chance=0.0, silent_crash_chance=0.0), share=0.0)
    a = SimClient(sim, "a", ttl=TTL)
    b = SimClient(sim, "b", ttl=TTL)
    nodes, world = sim.nodes, sim.world

    def a_acquired(lock: LockBase | None) -> None:
        assert lock is not None
        world.after(0.05, nodes[2].fail_over)
        for after in (0.1, 0.3):  # the first may meet B's connection the failover broke
            world.after(after, _acquire, b, "r", lambda lock: None)  # must not win while A holds

    world.at(START, _acquire, b, "w", lambda lock: lock and _release(b, lock))  # B knows node 2's server
    world.at(START + 0.2, _hold_on_first_three, sim, a, a_acquired)
    world.run_until(START + 3)
    return sim


def data_set_replaced_behind_open_connections(seed: int) -> Sim:
    """B has voted on every node; A holds on nodes 0-2; node 2 becomes a replica of another server (a full
    sync replaces its data set without A's key) and a master again, and no connection breaks. B's votes
    on its open connections must see the other data set and sit node 2 out.

    Not among the random faults, for the reason failovers are not (a first contact after it cannot tell)."""
    sim = build(seed, ttl=TTL, net=QUIET, share=0.0)
    a = SimClient(sim, "a", ttl=TTL)
    b = SimClient(sim, "b", ttl=TTL)
    nodes, world = sim.nodes, sim.world
    source = nodes[4] if seed % 2 else None  # another node's copy (its own marker) or an empty server

    def a_acquired(lock: LockBase | None) -> None:
        assert lock is not None
        world.after(0.05, nodes[2].resync, source)
        world.after(0.1, _acquire, b, "r", lambda lock: None)  # must not win while A holds
        world.after(0.3, lambda: _acquire(b, "r", lambda lock: None, blocking=True, timeout=0.2))

    world.at(START, _acquire, b, "w", lambda lock: lock and _release(b, lock))  # B's connections are open
    world.at(START + 0.2, _hold_on_first_three, sim, a, a_acquired)
    world.run_until(START + 3)
    return sim


def majority_paused_past_the_stale_limit(seed: int) -> Sim:
    """B's SETs wait on three paused nodes; nothing may be left once they resume."""
    sim = build(seed, ttl=TTL, net=QUIET, share=0.0)
    b = SimClient(sim, "b", ttl=TTL)
    c = SimClient(sim, "c", ttl=TTL)
    nodes, world = sim.nodes, sim.world

    def start() -> None:
        for node in nodes[2:]:
            node.pause()
        _acquire(b, "r", lambda lock: None)
        world.after(1.5, lambda: [node.resume() for node in nodes[2:]])
        world.after(1.6, _acquire, b, "other", lambda lock: lock and _release(b, lock))  # b's next call pays debts
        world.after(1.8, lambda: _acquire(c, "r", lambda lock: lock and _release(c, lock), blocking=True, timeout=0.5))

    world.at(START, start)
    world.run_until(START + 5)
    return sim


def late_release_of_an_earlier_attempt(seed: int) -> Sim:
    """Attempt 1's release, held in the network, lands after attempt 2 won.

    The ttl (2 s) outlives the winner's place in line (its slice + PLACE_MARGIN = 1.5 s): once
    the place is forgotten, only the lock key keeps B out.
    """
    ttl = 2.0
    sim = build(seed, ttl=ttl, net=QUIET, share=0.0)
    a = SimClient(sim, "a", ttl=ttl, retry_count=1, retry_delay=1.0, retry_jitter=0.0)
    b = SimClient(sim, "b", ttl=ttl)
    nodes, world = sim.nodes, sim.world
    key = "redlock:lock:r"
    first: list[str] = []

    def note_first_value(effect: Any) -> None:
        vote = vote_of(effect)
        if vote is not None and not first:
            first.append(vote[6])

    def start() -> None:
        for node in nodes[:3]:
            node.execute(("SET", key, "another holder", "PX", 2000))  # attempt 1 loses on nodes 0-2
        step = steps.acquire(a.config, a.quorum, a.names, a.config.request("r", None, True, None, None))
        a.run(_Tap(step, note_first_value), a_done)
        world.after(0.2, release_other_holder)

    def release_other_holder() -> None:  # wakes a, first in line, on nodes 0-2
        for node in nodes[:3]:
            node.execute(("EVAL", RELEASE.source, *a.config.release_command(("r",), "another holder")[2:]))

    def a_done(result: Any, error: BaseException | None) -> None:
        assert error is None, f"attempt 2 must win: {error}"
        plan = result
        lock = LockBase.granted(a.manager, plan)
        sim.checker.acquired(a.proc, "r", lock.value, lock.validity, deadline_local=lock._deadline)
        world.after(1.6, late_release)  # a's place has expired by then; its lock has not

    def late_release() -> None:
        # Attempt 1's compare-and-delete, retransmitted from a connection given up long ago:
        for node in nodes[:3]:
            node.execute(("EVAL", RELEASE.source, *a.config.release_command(("r",), first[0])[2:]))
        world.after(0.01, _acquire, b, "r", lambda lock: None)

    world.at(ttl * 2 + 0.1, start)
    world.run_until(ttl * 2 + 4)
    return sim


def replies_that_take_long(seed: int) -> Sim:
    """Every reply takes about 40 ms: the validity must count from before the first write."""
    sim = build(seed, ttl=TTL, net=NetConfig(min_delay=0.04, max_delay=0.045, late_chance=0.0), share=0.0)
    a = SimClient(sim, "a", ttl=TTL, node_timeout=0.2)
    sim.world.at(START, _acquire, a, "r", lambda lock: None)
    sim.world.run_until(START + 2)
    return sim


def _still_there(sim: Sim, key: str, value: str, what: str) -> None:
    holders = [node.name for node in sim.nodes if (found := node.peek(key)) and found[0] == value.encode()]
    if holders:
        raise Violation(f"{what}: {holders} still hold the value at t={sim.world.now:.6f}\n{sim.world.dump(40)}")


def cancelled_acquire(seed: int) -> Sim:
    """The caller is cancelled while the vote is out; what was set is released."""
    import asyncio

    sim = build(seed, ttl=TTL, net=QUIET, share=0.0)
    a = SimClient(sim, "a", ttl=TTL)
    world = sim.world
    values: list[str] = []

    def start() -> None:
        step = steps.acquire(a.config, a.quorum, a.names, a.config.request("r", None, False, None, None))
        tap = _Tap(step, lambda e: values.append(vote[6]) if (vote := vote_of(e)) is not None else None)
        a.cancelled[id(tap)] = asyncio.CancelledError()  # cancelled while it awaits the SET round
        a.run(tap, lambda result, error: world.after(0.1, check, error))

    def check(error: BaseException | None) -> None:
        assert isinstance(error, asyncio.CancelledError), error
        _still_there(sim, "redlock:lock:r", values[0], "a cancelled acquire left its keys")

    world.at(START, start)
    world.run_until(START + 1)
    return sim


def late_noscript_for_a_release(seed: int) -> Sim:
    """A node restarted (data kept, scripts forgotten) answers the release NOSCRIPT, late."""
    # The restart resets connections (a silent power loss is another case: a stale connection).
    sim = build(seed, ttl=TTL, net=NetConfig(late_chance=0.0, silent_crash_chance=0.0), share=0.0, fsync_always=True)
    a = SimClient(sim, "a", ttl=TTL)
    net, nodes, world = sim.network, sim.nodes, sim.world

    def a_acquired(lock: LockBase | None) -> None:
        assert lock is not None
        nodes[2].restart(0.01)  # fsync-always: the key survives, the script cache does not
        world.after(0.05, release, lock)

    def release(lock: LockBase) -> None:
        net.partition(nodes[2], [a.proc], duration=0.3)  # the release's EVALSHA and its NOSCRIPT come late
        _release(a, lock, lambda: world.after(0.5, after, lock))

    def after(lock: LockBase) -> None:
        _acquire(a, "other", lambda other: other and _release(a, other))  # a's next call pays what is owed
        world.after(0.1, _still_there, sim, lock.key, lock.value, "a late NOSCRIPT swallowed a release")

    world.at(START, _acquire, a, "r", a_acquired)
    world.run_until(START + 2)
    return sim


def waiter_woken_over_a_slow_network(seed: int) -> Sim:
    """B waits in line while A holds; A releases; B's vote runs when its wake-up lands, ~40 ms before
    B reads it: B's validity may count the wait each node measured, not from the wake-up B reads."""
    sim = build(seed, ttl=TTL, net=NetConfig(min_delay=0.04, max_delay=0.045, late_chance=0.0), share=0.0)
    a = SimClient(sim, "a", ttl=TTL, node_timeout=0.2)
    b = SimClient(sim, "b", ttl=TTL, node_timeout=0.2)
    world = sim.world

    def a_acquired(lock: LockBase | None) -> None:
        assert lock is not None, "a must get the lock in a quiet world"
        _acquire(b, "r", lambda lock: lock and _release(b, lock), blocking=True, timeout=3.0)
        world.after(0.4, _release, a, lock)  # b is blocked in BLPOP on every node by then

    world.at(START, _acquire, a, "r", a_acquired)
    world.run_until(START + 3)
    return sim


def waiter_granted_early_by_some_nodes(seed: int) -> Sim:
    """A holds on nodes 0-2; B, cut off from nodes 0 and 1, waits in line: nodes 3 and 4 (free) grant
    its wait at once, node 2 only once A releases. B's quorum is nodes 2-4, and the keys on 3 and 4
    were set first: B's validity counts from them (the quorum-th longest wait), not from node 2's."""
    sim = build(seed, ttl=TTL, net=QUIET, share=0.0)
    a = SimClient(sim, "a", ttl=TTL, node_timeout=0.2)
    b = SimClient(sim, "b", ttl=TTL, node_timeout=0.2)
    world = sim.world

    def a_acquired(lock: LockBase | None) -> None:
        assert lock is not None, "a must get the lock on nodes 0-2"
        for node in sim.nodes[:2]:
            sim.network.partition(node, [b.proc])
        _acquire(b, "r", lambda lock: lock and _release(b, lock), blocking=True, timeout=3.0)
        world.after(0.35, _release, a, lock)  # b waits on node 2 by then, granted on nodes 3 and 4

    world.at(START, _hold_on_first_three, sim, a, a_acquired)
    world.run_until(START + 3)
    return sim


def newcomer_while_the_first_in_line_is_woken(seed: int) -> Sim:
    """B waits in line; A releases while B's wait is still on its way to the nodes; C, a new
    blocking call, reaches them first: the lock is free there but B is first in line on every
    node, so C must queue behind B and be granted after it (a vote that ignores the line takes
    the lock past B). The checker's own fairness test only counts a place it saw on every node
    before the later call began, which C's timing here does not give it: the case checks the
    order itself."""
    delay = 0.01  # one way, every message: the timeline below is exact
    sim = build(seed, ttl=TTL, net=NetConfig(min_delay=delay, max_delay=delay, late_chance=0.0), share=0.0)
    a, b, c = (SimClient(sim, name, ttl=TTL, node_timeout=0.2) for name in "abc")
    world = sim.world
    granted: list[str] = []

    def then(client: SimClient) -> Callable[[LockBase | None], None]:
        def got(lock: LockBase | None) -> None:
            if lock is not None:
                granted.append(client.name)
                _release(client, lock)
        return got

    def a_acquired(lock: LockBase | None) -> None:
        assert lock is not None, "a must get the lock in a quiet world"
        joined = world.now
        # B's join lands at +1 delay (refused: A holds; B's place is now in every node's line), its
        # refusal is back at +2, and its wait in line (BLPOP and vote) lands at +3.
        _acquire(b, "r", then(b), blocking=True, timeout=3.0)
        # A's release lands at +2.2: the lock is free and B, first in line, is woken.
        world.at(joined + 1.2 * delay, _release, a, lock)
        # C's join lands at +2.4, before B's wait.
        world.at(joined + 1.4 * delay, lambda: _acquire(c, "r", then(c), blocking=True, timeout=3.0))

    # First every client connects, probes and has each node load both scripts: the timeline above
    # then holds to the message.
    for client, warm_up in ((a, "w-a"), (b, "w-b"), (c, "w-c")):
        world.at(START, lambda client=client, warm_up=warm_up: _acquire(
            client, warm_up, lambda lock, client=client: lock and _release(client, lock), blocking=True, timeout=1.0))
    world.at(START + 0.5, _acquire, a, "r", a_acquired)
    world.run_until(START + 3.5)
    if granted != ["b", "c"]:
        raise Violation(f"(f) fairness: 'r' was granted in the order {granted}; b was first in line, c came later\n"
                        f"seed={seed}\n" + "\n".join(world.trace_lines(40)))
    return sim


def release_after_the_lock_expired(seed: int) -> Sim:
    """A's lock expires; B takes it without waiting (no place in line); C waits in line; A's late
    release must neither delete B's key nor wake C."""
    sim = build(seed, ttl=TTL, net=QUIET, share=0.0)
    a, b, c = (SimClient(sim, name, ttl=TTL) for name in "abc")
    world = sim.world
    held: list[LockBase] = []

    def b_acquired(lock: LockBase | None) -> None:
        assert lock is not None, "b must get the expired lock"
        _acquire(c, "r", lambda lock: lock and _release(c, lock), blocking=True, timeout=3.0)
        world.after(0.15, _release, a, held[0])  # late: a's validity ended a while ago
        world.after(0.6, _release, b, lock)

    world.at(START, _acquire, a, "r", held.append)
    world.at(START + TTL + 0.1, _acquire, b, "r", b_acquired)
    world.run_until(START + 4)
    return sim


def fencing_a_lock_on_several_resources(seed: int) -> Sim:
    """A, whose wall clock is ahead, fences a lock on r1; then B, whose wall clock is behind, fences
    a lock on r0 and r1: B's token must pass r1's counter, not only r0's (and B's wall clock)."""
    sim = build(seed, ttl=TTL, net=QUIET, share=0.0)
    a = SimClient(sim, "a", ttl=TTL, wall_offset=0.8)
    b = SimClient(sim, "b", ttl=TTL, wall_offset=-0.8)

    def a_acquired(lock: LockBase | None) -> None:
        assert lock is not None, "a must get the lock in a quiet world"
        _fence(a, lock, lambda token: _release(a, lock, b_start))

    def b_start() -> None:
        _acquire(b, ("r0", "r1"), b_acquired)

    def b_acquired(lock: LockBase | None) -> None:
        assert lock is not None, "b must get the free locks in a quiet world"
        _fence(b, lock, lambda token: _release(b, lock))

    sim.world.at(START, _acquire, a, "r1", a_acquired)
    sim.world.run_until(START + 2)
    return sim


def member_force_released_under_a_lock(seed: int) -> Sim:
    """A holds r0 and r1; an operator force-releases r1 (its key is deleted on every node); A's next
    extension must fail: on no node does A keep every member any more."""
    sim = build(seed, ttl=TTL, net=QUIET, share=0.0)
    a = SimClient(sim, "a", ttl=TTL)
    world = sim.world

    def a_acquired(lock: LockBase | None) -> None:
        assert lock is not None, "a must get the lock in a quiet world"
        world.after(0.1, force_release, "r1")
        world.after(0.2, extend, lock)

    def force_release(resource: str) -> None:  # as the manager's force_release does it
        for node in sim.nodes:
            node.execute(("DEL", a.config.key(resource)))
            node.execute(("EVAL", RELEASE.source, *a.config.release_command((resource,), "")[2:]))

    def extend(lock: LockBase) -> None:
        def extended(_: Any, error: BaseException | None) -> None:
            if error is None:
                sim.checker.extended(a.proc, lock.resources, lock.value, lock.validity, deadline_local=lock._deadline)
            elif not isinstance(error, LockError):
                raise error
            _release(a, lock)

        a.run(steps.extend(lock, None, False, a.quorum, a.total), extended)

    world.at(START, _acquire, a, ("r0", "r1"), a_acquired)
    world.run_until(START + 2)
    return sim


def release_held_up_between_its_writes(seed: int) -> Sim:
    """Two callers of one process running the real LockManager (threads of a web worker): the holder's
    release writes to nodes 0 and 1 and is held up before node 2 (the GIL, a busy CPU) for three node
    timeouts; meanwhile the other caller writes to every node. Its writes must not carry the holder's
    release debt ahead of the holder's own release: the lock, held alone, must not be reported lost."""
    from greenlet import getcurrent

    from django_redlock.core import entries

    from .sim_manager import SimProcess

    sim = build(seed, ttl=TTL, net=QUIET, share=0.0)
    p = SimProcess(sim, "p", ttl=TTL)
    world = sim.world
    holder: list[Any] = []

    def stall(proc: Any, rnd: Any, i: int) -> float:
        if proc is p.proc and i == 2 and rnd.kind == entries.RELEASE and holder == [getcurrent()]:
            holder.append("held up")
            proc.after_local(2 * p.node_timeout, p.spawn, p.manager.is_locked, "x")  # the other caller
            return 3 * p.node_timeout
        return 0.0

    def hold() -> None:
        holder.append(getcurrent())
        caller, due = p._begin("r", None), False  # the checker hears of it as of any caller's hold
        try:
            with p.manager.lock("r") as lock:
                p._entered_hold(caller, lock, False)
                p.sleep(0.1)
                due = p._leaving(lock)
        except LockLost as exc:  # the checker heard of it through the manager's "lost" hook (m)
            p._exited(caller, lock, due, exc)

    sim.stall = stall
    world.at(START, p.spawn, hold)
    world.run_until(START + 1)
    assert "held up" in holder, "the holder's release never reached node 2"
    return sim


#: case name -> (function, the mutants it is built to catch)
#: A ttl well above the provisional ttl of a grant in line, so the two can be told apart.
LONG_TTL = 4.0


def waiter_frozen_in_line(seed: int) -> Sim:
    """W waits in line behind A and freezes (SIGSTOP, a frozen VM: its connections stay open) while
    its BLPOP is pending; B waits behind W. A's release wakes W, whose vote runs on every node: the
    lock is granted to a caller that cannot read it. B must get in once that grant lapses (its
    provisional ttl) and B's wait slice ends, not after W's whole ttl."""
    sim = build(seed, ttl=LONG_TTL, net=QUIET, share=0.0)
    a, w, b = (SimClient(sim, name, ttl=LONG_TTL, node_timeout=0.2) for name in "awb")
    world = sim.world
    released: list[float] = []
    granted: list[float] = []

    def b_acquired(lock: LockBase | None) -> None:
        if lock is not None:
            granted.append(world.now)
            _release(b, lock)

    def a_acquired(lock: LockBase | None) -> None:
        assert lock is not None, "a must get the lock in a quiet world"
        _acquire(w, "r", lambda lock: lock and _release(w, lock), blocking=True, timeout=30.0)
        world.after(0.2, sim.network.pause_client, w.proc, 10.0)  # w's BLPOP (a 0.5 s slice) is pending
        world.after(0.2, lambda: _acquire(b, "r", b_acquired, blocking=True, timeout=30.0))
        world.after(0.3, lambda: (released.append(world.now), _release(a, lock)))

    world.at(settled(LONG_TTL), _acquire, a, "r", a_acquired)
    world.run_until(settled(LONG_TTL) + 12)
    bound = PROVISIONAL_TTL + WAIT_SLICE + 0.1 + 0.1  # + a server tick, + slack
    if not granted or granted[0] - released[0] > bound:
        waited = f"after {granted[0] - released[0]:.3f} s" if granted else "never"
        raise Violation(f"(e) progress: b, next in line behind a frozen waiter, got 'r' {waited}; "
                        f"at most {bound:.1f} s expected\nseed={seed}\n" + "\n".join(world.trace_lines(40)))
    return sim


def winner_whose_extension_is_lost(seed: int) -> Sim:
    """B waits in line; A releases; B's vote is granted provisionally on every node, and B's extension
    to its ttl is cut off from three nodes: B's lock is valid only as long as the provisional keys
    live, and (c) checks that what B reports is kept by a quorum."""
    sim = build(seed, ttl=LONG_TTL, net=QUIET, share=0.0)
    a, b = (SimClient(sim, name, ttl=LONG_TTL, node_timeout=0.2) for name in "ab")
    world, net = sim.world, sim.network

    def cut_the_extension(effect: Any) -> None:
        if type(effect) is steps.Fan and effect.script is EXTEND:
            for node in sim.nodes[:3]:
                net.partition(node, [b.proc], duration=1.0)

    def b_done(plan: Any, error: BaseException | None) -> None:
        assert error is None, f"b must win its wait: {error}"
        lock = LockBase.granted(b.manager, plan)
        sim.checker.acquired(b.proc, "r", lock.value, lock.validity, deadline_local=lock._deadline)

    def a_acquired(lock: LockBase | None) -> None:
        assert lock is not None, "a must get the lock in a quiet world"
        step = steps.acquire(b.config, b.quorum, b.names, b.config.request("r", None, True, 3.0, None))
        b.run(_Tap(step, cut_the_extension), b_done)
        world.after(0.2, _release, a, lock)  # b waits in BLPOP on every node by then

    world.at(settled(LONG_TTL), _acquire, a, "r", a_acquired)
    world.run_until(settled(LONG_TTL) + 5)
    return sim


CASES: dict[str, tuple[Callable[[int], Sim], tuple[str, ...]]] = {
    "fencing written to a minority": (fence_written_to_a_minority, ("fencing token on fewer than a quorum",)),
    "restarted node whose probe fails": (
        restarted_node_whose_probe_fails,
        ("restart rule open while the probe is unknown", "restart rule off"),
    ),
    "restarted node whose first reply is late": (restarted_node_whose_first_reply_is_late, ("restart rule off",)),
    "restarted node that reads one second at once": (
        restarted_node_that_reads_one_second_at_once, ("uptime in whole seconds taken as sure",),
    ),
    "restarted node whose probe is read late": (
        restarted_node_whose_probe_is_read_late, ("probe reply booked with the fan-out's start",),
    ),
    "restarted node that turns fsync on": (restarted_node_that_turns_fsync_on, ("durability from the node's CONFIG",)),
    "replica promoted behind a node": (replica_promoted_behind_a_node, ("failover unnoticed",)),
    "majority paused past the stale limit": (majority_paused_past_the_stale_limit, ()),
    "late release of an earlier attempt": (
        late_release_of_an_earlier_attempt,
        ("one value for every retry", "release without comparing the value"),
    ),
    "replies that take long": (replies_that_take_long, ("validity from after the fan-out",)),
    "cancelled acquire": (cancelled_acquire, ()),
    "late NOSCRIPT for a release": (late_noscript_for_a_release, ("release without its debt",)),
    "waiter woken over a slow network": (waiter_woken_over_a_slow_network, ("wait vote's validity from the wake-up",)),
    "waiter granted early by some nodes": (waiter_granted_early_by_some_nodes, ("wait credited from the longest wait",)),
    "release after the lock expired": (release_after_the_lock_expired, ("release without comparing the value",)),
    "newcomer while the first in line is woken": (
        newcomer_while_the_first_in_line_is_woken, ("acquire ignores the line",),
    ),
    "fencing a lock on several resources": (
        fencing_a_lock_on_several_resources, ("fencing token from the first member's counter",),
    ),
    "member force-released under a lock": (member_force_released_under_a_lock, ("extend checks the first member",)),
    "release held up between its writes": (
        release_held_up_between_its_writes, ("release debt paid while its round runs",),
    ),
    "data set replaced behind open connections": (data_set_replaced_behind_open_connections, ("data set unchecked",)),
    "waiter frozen in line": (waiter_frozen_in_line, ("grant in line with the full ttl",)),
    "winner whose extension is lost": (winner_whose_extension_is_lost, ("validity of a grant in line from the full ttl",)),
}


def run_case(name: str, seed: int = 0) -> str | None:
    """Run one case; the violation's text, or None."""
    logging.getLogger("django_redlock").setLevel(logging.CRITICAL)
    try:
        CASES[name][0](seed)
    except Violation as exc:
        return str(exc)
    return None


from . import cases_keepalive  # noqa: E402,F401 - registers its cases in CASES
