"""Known-bad changes to the engine's core: the simulator must catch every one.

Each mutant is a context manager that patches one decision of the real core
(:mod:`django_redlock.core.base`, ``ledger``, ``rounds``, ``steps``) and undoes
it on exit. The core's Lua scripts run on the nodes, so a wrong script is a
patch of the node model's method for it (:class:`.redis_model.SimNode`).
:func:`hunt` runs seeds until the checker reports a violation.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django_redlock.core import base, books, entries, extender, held, ledger, owners, rounds, steps

from .network import NetConfig
from .redis_model import SimNode
from .run import Outcome, contend, default_faults, provisional, resync_faults, simulate

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
    return _patch(ledger, "vote_refusal", lambda restart, window, now, *rest: None)


def restart_rule_open_when_unknown() -> Any:
    """A node whose restart state is unknown (probe not read yet) votes."""
    real = ledger.vote_refusal

    def open_when_unknown(restart: Any, window: float, now: float, *rest: Any) -> Any:
        return None if restart is None else real(restart, window, now, *rest)

    return _patch(ledger, "vote_refusal", open_when_unknown)


def durability_from_config() -> Any:
    """A node whose CONFIG says appendonly yes + appendfsync always now is taken as durable: it votes
    right after a restart, as a declared one does."""
    real = ledger.vote_refusal

    def from_config(restart: Any, window: float, now: float, moved_at: Any = None, declared: bool = False) -> Any:
        says = restart is not None and restart.reports_fsync is True
        return real(restart, window, now, moved_at, declared or says)

    return _patch(ledger, "vote_refusal", from_config)


def failover_unnoticed() -> Any:
    """Another server behind a node's address (a promoted replica) is not noticed: only its uptime counts."""
    return _patch(ledger, "moved", lambda before, now, heard=None: False)


def data_set_unchecked() -> Any:
    """Votes carry no data-set token: a node whose data set was replaced behind open connections (a resync,
    a flush) votes on them as before; only a new connection's probe could notice."""
    return _patch(books.NodeBooks, "guarded", lambda self, command: command)


@contextmanager
def probe_booked_at_the_fanout_start() -> Iterator[None]:
    """A probe's replies are learned with the time the client's latest fan-out started (the clock read
    once per fan-out), not with the time they were read."""
    started: dict[int, float] = {}
    real_init, real_learn = rounds.Round.__init__, books.NodeBooks._learn

    def init(self: Any, books: Any, fan: Any, **options: Any) -> None:
        real_init(self, books, fan, **options)
        for book in books:
            started[id(book)] = options["now"]

    def learn(self: Any, conn: Any, reply: Any, now: float) -> None:
        real_learn(self, conn, reply, min(now, started.get(id(self), now)))

    with _patch(rounds.Round, "__init__", init), _patch(books.NodeBooks, "_learn", learn):
        yield


def uptime_taken_as_sure() -> Any:
    """INFO's whole-second uptime taken as exact (it may run up to 1 s ahead of the restart)."""
    return _patch(ledger, "sure_uptime", lambda uptime: uptime)


def drift_ignored() -> Any:
    """Validity without the clock-drift allowance."""
    return _patch(base.ManagerConfig, "drift", lambda self, ttl: 0.0)


def validity_from_after_the_fanout() -> Any:
    """Validity measured from when the replies were in, not from before the first write."""
    real = base.Attempts.won

    def won(self: Any, results: Any, started: float, quorum: int, now: float) -> bool:
        return real(self, results, now, quorum, now)

    return _patch(base.Attempts, "won", won)


@contextmanager
def wait_validity_from_the_wake_up() -> Iterator[None]:
    """A vote that waited in line counts its validity from the wake-up (the last BLPOP reply read
    before the outcome was known), not from before the write plus what the nodes measured."""
    woken: dict[str, float] = {}
    real_prepare, real_book, real_won = books.NodeBooks.prepare, books.NodeBooks.book, base.Attempts.won

    def prepare(self: Any, conn: Any, mine: Any, window: float, now: float, block: Any = None) -> Any:
        extra = real_prepare(self, conn, mine, window, now, block)
        if block is not None:  # remember the wait's list on its WAKE entry
            next(e for e in reversed(conn.expect) if e.kind == entries.WAKE).key = block[0]
        return extra

    def book(self: Any, conn: Any, reply: Any, now: float, reader: Any = None) -> Any:
        if conn.expect and conn.expect[0].kind == entries.WAKE and conn.expect[0].key is not None:
            woken[conn.expect[0].key] = now
        return real_book(self, conn, reply, now, reader)

    def won(self: Any, results: Any, started: float, quorum: int, now: float) -> bool:
        wake = woken.pop(self.wake, None)
        if self.mode == "wait" and wake is not None:
            started = max(started, wake)
            results = [bytes(r) if isinstance(r, rounds.Granted) else r for r in results]
        return real_won(self, results, started, quorum, now)

    with _patch(books.NodeBooks, "prepare", prepare), _patch(books.NodeBooks, "book", book), \
            _patch(base.Attempts, "won", won):
        yield


def wait_credited_from_the_longest() -> Any:
    """A vote that waited in line is credited the longest wait of its granting nodes, not the wait a
    quorum of them reached (a node that granted at once keeps the key from then)."""
    real = base.Attempts.won

    def won(self: Any, results: Any, started: float, quorum: int, now: float) -> bool:
        waits = [r.waited for r in results if isinstance(r, rounds.Granted)]
        longest = max(waits, default=0.0)
        results = [rounds.Granted(bytes(r), longest) if base.is_ok(r) else r for r in results]
        return real(self, results, started, quorum, now)

    return _patch(base.Attempts, "won", won)


def release_without_compare() -> Any:
    """RELEASE deletes the lock key whoever holds it (no value comparison), then wakes the next."""

    def release(self: Any, keys: list[bytes], argv: list[bytes]) -> int:
        released = 0
        for r, i in enumerate(range(0, len(keys), 3)):
            released = self._del([keys[i]])
            self._leave_and_wake(keys[i : i + 3], argv[1], argv[4 + r], argv[2], argv[3])
        return released

    return _patch(SimNode, "_release", release)


def acquire_ignores_the_line() -> Any:
    """ACQUIRE grants a free lock to anyone, not only to the first in line (unfair, not unsafe)."""
    real = SimNode._acquire

    def acquire(self: Any, keys: list[bytes], argv: list[bytes]) -> Any:
        reply = real(self, keys, argv)
        if reply == -2:  # NOT_FIRST: grant it anyway
            for lock in keys[::3]:
                self._set([lock, argv[0], "PX", argv[1]])
            return b"OK"
        return reply

    return _patch(SimNode, "_acquire", acquire)


def release_wakes_nobody() -> Any:
    """RELEASE leaves the line but pushes no wake-up: waiters only notice at the end of their slice."""

    def release(self: Any, keys: list[bytes], argv: list[bytes]) -> int:
        released = 1
        for i in range(0, len(keys), 3):
            if self._get([keys[i]]) == argv[0]:
                self._del([keys[i]])
            else:
                released = 0
            if argv[1] != b"" and argv[3] == b"":
                self._zrem([keys[i + 1], argv[1]])
                self._zrem([keys[i + 2], argv[1]])
        return released

    return _patch(SimNode, "_release", release)


def acquire_takes_the_free_members() -> Any:
    """ACQUIRE on several resources sets the members that are free even when another member is held
    (it replies HELD): not all or nothing on a node."""
    real = SimNode._acquire

    def acquire(self: Any, keys: list[bytes], argv: list[bytes]) -> Any:
        reply = real(self, keys, argv)
        if reply == 0:  # HELD
            for lock in keys[::3]:
                if self._exists([lock]) == 0:
                    self._set([lock, argv[0], "PX", argv[1]])
        return reply

    return _patch(SimNode, "_acquire", acquire)


def release_deletes_the_first_member() -> Any:
    """RELEASE of a lock on several resources deletes the first member's key only (the others stay
    until they expire); it still leaves the lines and wakes where a lock is free."""

    def release(self: Any, keys: list[bytes], argv: list[bytes]) -> int:
        released = 1
        for r, i in enumerate(range(0, len(keys), 3)):
            if self._get([keys[i]]) == argv[0]:
                if i == 0:
                    self._del([keys[i]])
            else:
                released = 0
            self._leave_and_wake(keys[i : i + 3], argv[1], argv[4 + r], argv[2], argv[3])
        return released

    return _patch(SimNode, "_release", release)


def extend_checks_the_first_member() -> Any:
    """EXTEND of a lock on several resources checks the first member's key only, then extends them all."""

    def extend(self: Any, keys: list[bytes], argv: list[bytes]) -> int:
        entry = self._live(keys[0])
        if entry is None or entry[0] != argv[0]:
            return 0
        for key in keys:
            self._pexpire([key, argv[1]])
        return 1

    return _patch(SimNode, "_extend", extend)


def extension_recreates_over_another_holder() -> Any:
    """EXTEND sets a key that does not hold its value with a plain SET (no NX): another holder's too."""
    real = SimNode._extend

    def extend(self: Any, keys: list[bytes], argv: list[bytes]) -> int:
        if argv[2] == b"1":
            for key in keys:
                entry = self._live(key)
                if entry is not None and entry[0] != argv[0]:
                    self._set([key, argv[0], "PX", argv[1]])
        return int(real(self, keys, argv))

    return _patch(SimNode, "_extend", extend)


def extension_recreates_while_sitting_out() -> Any:
    """An extension may set a lost key again on any node, one still sitting out under the delayed-restart rule too."""
    return _patch(books.NodeBooks, "recreating", lambda self, conn, command, window, now: command)


def fence_from_the_first_member() -> Any:
    """The fencing read of a lock on several resources (MGET) counts the first member's counter only."""
    real = base.fence_value

    def first(reply: Any) -> int | None:
        return real(reply[0] if isinstance(reply, list) and reply else reply)

    return _patch(base, "fence_value", first)


def fence_below_quorum() -> Any:
    """A fencing token accepted once a single node stores it."""
    real = held.check_fence_written

    def accept(lock: Any, writes: Any, token: int, quorum: int) -> None:
        real(lock, writes, token, 1)

    return _patch(held, "check_fence_written", accept)


def automatic_extensions_counted() -> Any:
    """The watchdog's extensions count against max_extensions, as the caller's own do."""
    real = steps.extend

    def counted(lock: Any, ttl: Any, automatic: bool, quorum: int, total: int) -> Any:
        return real(lock, ttl, False, quorum, total)

    return _patch(steps, "extend", counted)


def release_without_its_debt() -> Any:
    """A release round owes nothing: a node that did not confirm the release is not sent it again."""
    real = steps.release_fan

    def no_debt(*args: Any, **kwargs: Any) -> steps.Fan:
        fan = real(*args, **kwargs)
        fan.owe = None
        return fan

    return _patch(steps, "release_fan", no_debt)


def reentrancy_keyed_on_the_thread() -> Any:
    """``reentrant=True`` takes the thread for the owner: every greenlet of a process enters every
    other's lock."""

    def thread_only(first: bool = False) -> list[tuple[Any, str]]:
        return [(threading.current_thread(), "thread")]

    return _patch(owners, "callers", thread_only)  # what caller() and HeldLocks look up


def loss_swallowed() -> Any:
    """The hold's loss report says nothing: a with block that ran without its lock exits quietly."""
    return _patch(held, "loss_to_report", lambda lock, *args: None)


@contextmanager
def watchdog_ignores_the_release() -> Iterator[None]:
    """The watchdog is not told of a release and extends once more: the release does not unschedule
    the lock, the watchdog's next wake-up extends it, and the extension step does not look at
    ``released``. An asyncio keep-alive task still running after its lock's release (released
    inside the block) extends it at its next wake-up."""
    real_action, real_check = extender.next_action, held.check_extendable

    def action(watch: Any, lock: Any) -> str:
        if lock is not None and lock.released and lock.validity > 0:
            return "extend"
        return real_action(watch, lock)

    def check(lock: Any, ttl: Any, counted: bool) -> float:
        if not lock.released:
            return real_check(lock, ttl, counted)
        lock.released = False
        try:
            return real_check(lock, ttl, counted)
        finally:
            lock.released = True

    with _patch(extender.Extender, "remove", lambda self, lock: None), _patch(extender, "next_action", action), \
            _patch(held, "check_extendable", check):
        yield


def debt_paid_while_its_round_runs() -> Any:
    """A release round's debts are due to any write a node timeout after the round began, even while
    the round has not written its own release there yet (and a payment's deletion is not its own)."""
    return _patch(entries.Debt, "held", lambda self: False)


def grant_in_line_with_the_full_ttl() -> Any:
    """A vote in line sets the keys for the whole ttl: a waiter frozen in line holds it that long."""
    return _patch(base, "PROVISIONAL_TTL", float("inf"))


@contextmanager
def provisional_validity_ignored() -> Iterator[None]:
    """A lock won in line is judged as if its keys were set for the whole ttl, not the provisional
    one: an extension that did not reach a quorum leaves the validity overstated."""
    real = base.Attempts.won

    def won(self: Any, results: Any, started: float, quorum: int, now: float) -> bool:
        granted, self.granted_ttl = self.granted_ttl, self.ttl
        try:
            return bool(real(self, results, started, quorum, now))
        finally:
            self.granted_ttl = granted

    with _patch(base.Attempts, "won", won):
        yield


#: Only a process of the real AsyncLockManager (and the clients driving the core's steps).
ASYNC_CALLERS: dict[str, Any] = {"managers": 0, "async_managers": 1}

#: name -> (mutant, simulation options that give it a chance to show)
MUTANTS: dict[str, tuple[Callable[[], Any], dict[str, Any]]] = {
    "quorum N//2": (quorum_half, {}),
    "one value for every retry": (same_value_every_attempt, {}),
    "restart rule off": (restart_rule_off, {}),
    # INFO sometimes fails for a passing reason: the restart state stays unknown.
    "restart rule open while the probe is unknown": (restart_rule_open_when_unknown, {"flaky_info": 0.5}),
    "uptime in whole seconds taken as sure": (uptime_taken_as_sure, {}),
    # Need a probe read long after its fan-out began, fsync switched on after a restart, a failover:
    # each has a scripted case (failovers are not among the random faults, see cases.py).
    "probe reply booked with the fan-out's start": (probe_booked_at_the_fanout_start, {}),
    "durability from the node's CONFIG": (durability_from_config, {}),
    "failover unnoticed": (failover_unnoticed, {}),
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
    # Replies take tens of milliseconds: the wake-up is read one trip after the vote ran.
    "wait vote's validity from the wake-up": (
        wait_validity_from_the_wake_up,
        {"net": NetConfig(min_delay=0.01, max_delay=0.045), "node_timeout": 0.2},
    ),
    # Needs a quorum whose nodes granted at different times (a scripted case).
    "wait credited from the longest wait": (wait_credited_from_the_longest, {}),
    "release without comparing the value": (release_without_compare, {}),
    # Not safety: the contention run (no faults) checks fairness (f) and wake-ups (g).
    # Mostly non-blocking callers: a free lock with someone first in line is common.
    "acquire ignores the line": (acquire_ignores_the_line, {"scenario": contend, "once": 0.8}),
    "release wakes nobody": (release_wakes_nobody, {"scenario": contend}),
    # Only a lock on several resources can tell these from the correct core.
    # Liveness: the contention run with overlapping sets of resources checks (g).
    "acquire takes the free members of a held set": (
        acquire_takes_the_free_members, {"scenario": contend, "resources": ("r0", "r1", "r2"), "multi": 0.5},
    ),
    "release deletes the first member only": (
        release_deletes_the_first_member, {"scenario": contend, "resources": ("r0", "r1", "r2"), "multi": 0.5},
    ),
    # Needs a member's key gone under a live lock: an operator's force release (a scripted case).
    "extend checks the first member": (extend_checks_the_first_member, {}),
    # Need a node that restarted under a kept-alive lock, or an extension that lands late: scripted cases.
    "extension re-creates on a node sitting out": (extension_recreates_while_sitting_out, {}),
    "extension re-creates over another holder's key": (extension_recreates_over_another_holder, {}),
    # Wall clocks disagree by more than a fencing round: a token floored at a slow wall clock is low.
    "fencing token from the first member's counter": (fence_from_the_first_member, {"wall_skew": 0.45}),
    # The simulated clients allow two extensions; a watchdog's long hold needs three.
    "automatic extensions counted": (automatic_extensions_counted, {}),
    # A release held up by a restart (NOSCRIPT, late) must be paid later (a scripted case).
    "release without its debt": (release_without_its_debt, {}),
    # These need the real manager's processes (sim_manager.py): several callers, holds, the watchdog.
    "reentrancy keyed on the thread": (reentrancy_keyed_on_the_thread, {"managers": 1}),
    "loss at the hold's exit swallowed": (loss_swallowed, {"managers": 1}),
    "watchdog extends after the release": (watchdog_ignores_the_release, {"managers": 1}),
    # The same, with asyncio callers only (sim_async.py): tasks of one thread, the keep-alive task.
    "reentrancy keyed on the thread (asyncio)": (reentrancy_keyed_on_the_thread, ASYNC_CALLERS),
    "loss at the hold's exit swallowed (asyncio)": (loss_swallowed, ASYNC_CALLERS),
    "keep-alive task extends after the release": (watchdog_ignores_the_release, ASYNC_CALLERS),
    # Needs a release held up between two writes while another caller of the process writes (a scripted
    # case; random runs with stalls find it too).
    "release debt paid while its round runs": (debt_paid_while_its_round_runs, {"managers": 1, "stalls": 0.03}),
    # Needs a node's data set replaced under open connections while a lock is held: resyncs among the
    # faults, no respawned clients (their first contact with a resynced node could not tell).
    "data set unchecked": (data_set_unchecked, {"faults": resync_faults}),
    # A waiter frozen in line, granted and never reading it; an extension cut off: scripted cases.
    "grant in line with the full ttl": (grant_in_line_with_the_full_ttl, {}),
    # Random seeds need a ttl above the provisional one (the usual runs' 1 s is not).
    "validity of a grant in line from the full ttl": (provisional_validity_ignored, {"scenario": provisional}),
}


def hunt(name: str, *, seeds: int = 200, budget: float = 30.0, first: int = 0) -> tuple[Outcome | None, float, int]:
    """Run seeds under mutant ``name`` until a violation; returns (outcome, seconds, seeds run)."""
    mutant, options = MUTANTS[name]
    options = dict(options)
    scenario = options.pop("scenario", None)
    started = time.monotonic()
    ran = 0
    with mutant():
        for seed in range(first, first + seeds):
            ran += 1
            if scenario is not None:
                outcome = scenario(seed, **options)
            else:
                # Only the mutants of the manager, its locks, holds and watchdog need its processes.
                faults = options.get("faults", default_faults)()
                outcome = simulate(seed, **{"managers": 0, **options, "faults": faults})
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
