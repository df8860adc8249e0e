"""Known-bad changes to the engine's core: the simulator must catch every one.

Each mutant is a context manager that patches one decision of the real core
(:mod:`django_redlock.core.base`, ``ledger``, ``rounds``, ``steps``) and undoes
it on exit. :func:`hunt` runs seeds until the checker reports a violation.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django_redlock.core import base, ledger

from .network import NetConfig
from .run import Outcome, default_faults, simulate

__all__ = ["MUTANTS", "hunt"]


@contextmanager
def _patch(owner: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, old)


def quorum_half() -> Any:
    """Quorum N//2 instead of N//2 + 1."""
    return _patch(base, "quorum_of", lambda total: total // 2)


def same_value_every_attempt() -> Any:
    """One holder value reused by every attempt of one acquire()."""
    real = base.Attempts._new_holder

    def keep(self: Any) -> None:
        if not hasattr(self, "holder"):
            real(self)

    return _patch(base.Attempts, "_new_holder", keep)


def restart_rule_off() -> Any:
    """Restarted nodes vote at once."""
    return _patch(ledger, "vote_refusal", lambda restart, window, now: None)


def restart_rule_open_when_unknown() -> Any:
    """A node whose restart state is unknown (probe not read yet) votes."""
    real = ledger.vote_refusal

    def open_when_unknown(restart: Any, window: float, now: float) -> Any:
        return None if restart is None else real(restart, window, now)

    return _patch(ledger, "vote_refusal", open_when_unknown)


def drift_ignored() -> Any:
    """Validity without the clock-drift allowance."""
    return _patch(base.ManagerConfig, "drift", lambda self, ttl: 0.0)


def validity_from_after_the_fanout() -> Any:
    """Validity measured from when the replies were in, not from before the first write."""
    real = base.Attempts.won

    def won(self: Any, results: Any, started: float, quorum: int, now: float) -> bool:
        return real(self, results, now, quorum, now)

    return _patch(base.Attempts, "won", won)


def fence_below_quorum() -> Any:
    """A fencing token accepted once a single node stores it."""
    real = base.check_fence_written

    def accept(lock: Any, writes: Any, token: int, quorum: int) -> None:
        real(lock, writes, token, 1)

    return _patch(base, "check_fence_written", accept)


#: name -> (mutant, simulation options that give it a chance to show)
MUTANTS: dict[str, tuple[Callable[[], Any], dict[str, Any]]] = {
    "quorum N//2": (quorum_half, {}),
    "one value for every retry": (same_value_every_attempt, {}),
    "restart rule off": (restart_rule_off, {}),
    # INFO sometimes fails for a passing reason: the restart state stays unknown.
    "restart rule open while the probe is unknown": (restart_rule_open_when_unknown, {"flaky_info": 0.5}),
    "drift ignored": (drift_ignored, {}),
    # Replies take tens of milliseconds: a validity counted from the last reply is visibly too long.
    "validity from after the fan-out": (
        validity_from_after_the_fanout,
        {"net": NetConfig(min_delay=0.01, max_delay=0.045), "node_timeout": 0.2},
    ),
    # Late replies starve fencing writes of acknowledgements; wall clocks disagree a little.
    "fencing token on fewer than a quorum": (
        fence_below_quorum,
        {"net": NetConfig(late_chance=0.12, late_max=0.3), "resources": ("r0",), "clients": 4, "wall_skew": 0.45},
    ),
}


def hunt(name: str, *, seeds: int = 200, budget: float = 30.0, first: int = 0) -> tuple[Outcome | None, float, int]:
    """Run seeds under mutant ``name`` until a violation; returns (outcome, seconds, seeds run)."""
    mutant, options = MUTANTS[name]
    started = time.monotonic()
    ran = 0
    with mutant():
        for seed in range(first, first + seeds):
            ran += 1
            outcome = simulate(seed, faults=default_faults(), **options)
            if outcome.violation:
                return outcome, time.monotonic() - started, ran
            if time.monotonic() - started > budget:
                break
    return None, time.monotonic() - started, ran


def main() -> None:
    """Print, per mutant: which scripted case catches it, and how fast random seeds do."""
    import logging

    from .cases import CASES, run_case

    logging.getLogger("django_redlock").setLevel(logging.CRITICAL)
    print(f"{'mutant':46s} | {'scripted case (invariant)':50s} | random seeds: first failing seed, time (invariant)")
    for name, (mutant, _) in MUTANTS.items():
        caught = "-"
        for case, (_, targets) in CASES.items():
            if name in targets:
                with mutant():
                    verdict = run_case(case)
                caught = f"{case} ({verdict[:3]})" if verdict else f"{case}: NOT CAUGHT"
                break
        outcome, took, ran = hunt(name, seeds=400, budget=120.0)
        found = f"seed {outcome.seed}, {took:.1f} s ({outcome.violation[:3]})" if outcome else f"not in {ran} seeds"
        print(f"{name:46s} | {caught:50s} | {found}", flush=True)


if __name__ == "__main__":
    main()
