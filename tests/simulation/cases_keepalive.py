"""Scripted cases of an extension that sets a lost key again (see ``scripts.EXTEND``): registered in
:data:`.cases.CASES` with the mutants each one must catch."""

from __future__ import annotations

from typing import Any

from django_redlock.core import steps
from django_redlock.core.base import extend_command
from django_redlock.core.lock import LockBase
from django_redlock.core.scripts import EXTEND, RELEASE
from django_redlock.exceptions import LockError

from .cases import CASES, QUIET, START, TTL, _acquire
from .client import SimClient
from .scenario import Sim, build

__all__ = ["KEEPALIVE_CASES"]


def extension_with_a_restarted_node_still_sitting_out(seed: int) -> Sim:
    """A holds on all five nodes; node 4 restarts empty, then nodes 2 and 3 go down. A's next extension
    reaches nodes 0 and 1, which still hold the key, and node 4, which sits out: its key must not be
    set again there, nor counted (A is told the extension failed)."""
    sim = build(seed, ttl=TTL, net=QUIET, share=0.0)
    a = SimClient(sim, "a", ttl=TTL)
    world, nodes = sim.world, sim.nodes

    def a_acquired(lock: LockBase | None) -> None:
        assert lock is not None, "a must get the lock in a quiet world"
        nodes[4].restart(0.05)
        world.after(0.15, nodes[2].crash)
        world.after(0.15, nodes[3].crash)
        world.after(0.4, extend, lock)

    def extend(lock: LockBase) -> None:
        def extended(_: Any, error: BaseException | None) -> None:
            if error is None:
                sim.checker.extended(a.proc, lock.resources, lock.value, lock.validity, deadline_local=lock._deadline)
            elif not isinstance(error, LockError):
                raise error
            assert nodes[4].peek(a.config.key("r")) is None, "the key was set again on a node sitting out"

        a.run(steps.extend(lock, None, True, a.quorum, a.total), extended)

    world.at(START, _acquire, a, "r", a_acquired)
    world.run_until(START + 2)
    return sim


def late_extension_meets_another_holder(seed: int) -> Sim:
    """A's lock lapses and B takes it on every node; then A's extension, held up on the way since (a
    connection given up long ago), lands on nodes 1-3, and A's release follows. B's keys must stay:
    C must not get the lock while B holds it."""
    sim = build(seed, ttl=TTL, net=QUIET, share=0.0)
    a, b, c = (SimClient(sim, name, ttl=TTL) for name in "abc")
    world, nodes = sim.world, sim.nodes
    held: list[str] = []

    def a_acquired(lock: LockBase | None) -> None:
        assert lock is not None, "a must get the lock in a quiet world"
        held.append(lock.value)
        world.after(TTL + 0.1, _acquire, b, "r", b_acquired)

    def b_acquired(lock: LockBase | None) -> None:
        assert lock is not None, "b must get the lock once a's has lapsed"
        world.after(0.05, late_extension)

    def late_extension() -> None:
        config = a.config
        command = extend_command((config.key("r"),), held[0], TTL, config.dataset_key, recreate=True)
        for node in nodes[1:4]:
            node.execute(("EVAL", EXTEND.source, *command[2:]))
            node.execute(("EVAL", RELEASE.source, *config.release_command(("r",), held[0])[2:]))
        world.after(0.01, _acquire, c, "r", lambda lock: None)

    world.at(START, _acquire, a, "r", a_acquired)
    world.run_until(START + TTL + 1)
    return sim


KEEPALIVE_CASES = {
    "extension with a restarted node still sitting out": (
        extension_with_a_restarted_node_still_sitting_out, ("extension re-creates on a node sitting out",),
    ),
    "late extension meets another holder": (
        late_extension_meets_another_holder, ("extension re-creates over another holder's key",),
    ),
}
CASES.update(KEEPALIVE_CASES)
