"""The engine's real core in the deterministic simulator: random faults, scripted cases, every small schedule.

The long run is ``make simulate SEEDS=N``; this is its short version.
"""

from __future__ import annotations

import logging
from collections import Counter

import pytest

from tests.simulation.cases import CASES, run_case
from tests.simulation.exhaustive import check_small_scope
from tests.simulation.mutants import MUTANTS, hunt
from tests.simulation.run import contend, default_faults, provisional, resync_faults, simulate

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@pytest.fixture(autouse=True)
def quiet():
    logger = logging.getLogger("django_redlock")
    level = logger.level
    logger.setLevel(logging.CRITICAL)  # restarts are logged once per node and run
    yield
    logger.setLevel(level)


def test_random_faults_break_no_invariant():
    acquired = 0
    for seed in range(24):
        outcome = simulate(seed, faults=default_faults())
        assert outcome.violation is None, outcome.violation
        acquired += outcome.acquired
    assert acquired > 240, "the clients must get locks, or the run proves nothing"


def test_resyncs_under_open_connections_break_no_invariant():
    """A node's data set replaced (from an empty server) while clients stay connected: the votes'
    data-set check sits it out (no respawned clients: a first contact after a resync cannot tell)."""
    for seed in range(8):
        outcome = simulate(seed, faults=resync_faults())
        assert outcome.violation is None, outcome.violation


def test_locks_won_in_line_provisionally_break_no_invariant(monkeypatch):
    """A ttl above the provisional one (1 s): every lock won in line is granted provisionally and
    extended, under the random faults (client pauses among them: winners that read their grant late,
    extensions cut off); three runs add a process of the real AsyncLockManager."""
    from django_redlock.core import base

    extended = []
    real = base.Attempts.topped_up

    def topped_up(self, results, started, quorum, now):
        real(self, results, started, quorum, now)
        if self.granted_ttl < self.ttl:
            extended.append(self.valid_until - started >= self.ttl / 2)  # the ttl's validity, or the provisional

    monkeypatch.setattr(base.Attempts, "topped_up", topped_up)
    for seed, options in [(seed, {}) for seed in range(6)] + [(seed, {"async_managers": 1}) for seed in range(3)]:
        outcome = provisional(seed, **options)
        assert outcome.violation is None, outcome.violation
    assert sum(extended) > 20, "locks must be won in line and extended, or the run proves nothing"


def test_processes_running_the_real_manager_break_no_invariant():
    """Only processes running the real LockManager, two callers each: holds (kept alive, re-entered,
    nested), acquire and release, extensions, fencing tokens, owned(), hand-offs by adopt()."""
    seen: Counter[str] = Counter()
    for seed in range(6):
        outcome = simulate(seed, faults=default_faults(), clients=0, managers=2)
        assert outcome.violation is None, outcome.violation
        seen.update(outcome.extra["real"])
    assert seen["acquired"] > 150, seen
    for what in ("nested", "automatic extensions", "losses reported", "adopted", "fenced", "cancelled"):
        assert seen[what] > 0, (what, seen)


def test_processes_running_the_real_async_manager_break_no_invariant():
    """Only processes running the real AsyncLockManager, two asyncio tasks each on a loop driven on
    simulated time: holds (kept alive by the keep-alive task, re-entered by their task, nested,
    released early), acquire and release, extensions, fencing tokens, owned(), hand-offs by adopt(),
    tasks cancelled at an await; a seed replays exactly."""
    seen: Counter[str] = Counter()
    for seed in range(6):
        outcome = simulate(seed, faults=default_faults(), clients=0, managers=0, async_managers=2)
        assert outcome.violation is None, outcome.violation
        seen.update(outcome.extra["real"])
    assert seen["acquired"] > 150, seen
    for what in ("nested", "automatic extensions", "losses reported", "cancelled", "cancelled in the block",
                 "released early", "adopted", "fenced"):
        assert seen[what] > 0, (what, seen)
    again = simulate(seed, faults=default_faults(), clients=0, managers=0, async_managers=2)
    assert (again.events, again.acquired, again.extra["real"]) == (outcome.events, outcome.acquired,
                                                                   outcome.extra["real"])


def test_callers_held_up_between_their_writes_break_no_invariant():
    """Rounds held up before a node's write (a thread descheduled between two writes) while the process's
    other callers go on: no lock held alone is reported lost at its release (m), nothing else breaks."""
    seen: Counter[str] = Counter()
    for seed in range(6):
        outcome = simulate(seed, faults=default_faults(), clients=1, managers=1, async_managers=1, stalls=0.03)
        assert outcome.violation is None, outcome.violation
        seen.update(outcome.extra["real"])
    assert seen["acquired"] > 100, seen


def test_a_seed_replays_exactly():
    first = simulate(7, faults=default_faults())
    second = simulate(7, faults=default_faults())
    assert (first.acquired, first.failed, first.faults, first.events) == (
        second.acquired, second.failed, second.faults, second.events
    )
    assert simulate(8, faults=default_faults()).events != first.events


@pytest.mark.parametrize("name", list(CASES))
def test_scripted_case_passes_on_the_real_core(name):
    assert run_case(name) is None


# Mutants without a scripted case are hunted with random seeds from 0 (found at once).
SEEDS_FOR = {"quorum N//2": 5, "drift ignored": 5, "acquire ignores the line": 5, "release wakes nobody": 3,
             "acquire takes the free members of a held set": 3, "release deletes the first member only": 3,
             "automatic extensions counted": 3, "reentrancy keyed on the thread": 5,
             "loss at the hold's exit swallowed": 5, "watchdog extends after the release": 5,
             "reentrancy keyed on the thread (asyncio)": 5, "loss at the hold's exit swallowed (asyncio)": 5,
             "keep-alive task extends after the release": 10}


@pytest.mark.parametrize("name", list(MUTANTS))
def test_every_known_bad_core_is_caught(name):
    mutant = MUTANTS[name][0]
    for case, (_, targets) in CASES.items():
        if name in targets:
            with mutant():
                assert run_case(case) is not None, f"case {case!r} missed mutant {name!r}"
            return
    outcome, _, ran = hunt(name, seeds=SEEDS_FOR[name], budget=60.0)
    assert outcome is not None, f"{ran} seeds did not catch mutant {name!r}"


def test_waiters_are_granted_in_line_order_and_woken_at_once():
    """No faults, four callers queueing for one lock: (f) fairness and (g) wake-up hold, and
    the grants are spread evenly."""
    for seed in range(3):
        outcome = contend(seed)
        assert outcome.violation is None, outcome.violation
        grants = outcome.extra["grants"].values()
        assert min(grants) >= 20 and max(grants) - min(grants) <= 6, outcome.extra["grants"]
        delays = outcome.extra["wake_delays"]
        assert len(delays) > 80 and max(delays) < 0.02, delays


def test_overlapping_locks_on_several_resources_queue_in_order():
    """No faults, four callers queueing for r0..r2, half the calls on two or three of them at once:
    every invariant holds, (f) strict FIFO per line and (g) wake-up included."""
    for seed in range(4):
        outcome = contend(seed, resources=("r0", "r1", "r2"), multi=0.5)
        assert outcome.violation is None, outcome.violation
        assert outcome.acquired > 100 and outcome.several > 40, (outcome.acquired, outcome.several)
        assert min(outcome.extra["grants"].values()) >= 20, outcome.extra["grants"]
        assert len(outcome.extra["wake_delays"]) > 100, "releases with someone in line must be common"


@pytest.mark.parametrize("fault", ["restart", "pause"])
def test_every_small_schedule(fault):
    schedules, _ = check_small_scope(fault, max_depth=7)
    assert schedules == 480


def test_nodes_that_deny_info_never_vote():
    """Fail closed: with INFO denied everywhere the restart state is never known, so nothing is locked."""
    outcome = simulate(3, deny_info=True, seconds=2.0)  # no nemesis: no progress is owed here
    assert outcome.violation is None, outcome.violation
    assert outcome.acquired == 0 and outcome.failed > 0
