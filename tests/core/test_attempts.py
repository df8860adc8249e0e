"""One ``acquire()`` call's plan (core/base.py ``Attempts``) judged on made-up replies: no server, no clock."""

from __future__ import annotations

import math

import pytest

from django_redlock.core import base
from django_redlock.core.records import Holder
from django_redlock.core.books import Failure
from django_redlock.core.rounds import Granted
from django_redlock.core.scripts import ACQUIRE, NO_PLACE

OK = b"OK"
QUORUM = 3  # of 5 nodes
TTL = 10.0


def config(**options: object) -> base.ManagerConfig:
    made = base.ManagerConfig(ttl=TTL, retry_delay=0.2, retry_jitter=0.0, restart_window=0, **options)  # type: ignore[arg-type]
    made.make_holder = lambda label: Holder("token", label=label)
    return made


def plan(blocking: bool = True, timeout: float | None = 5.0, **options: object) -> base.Attempts:
    made = config(**options)
    return base.Attempts(made, made.request("a", None, blocking, timeout, None), now=100.0, wall=1)


def test_the_deadline_and_first_mode_follow_blocking_and_timeout() -> None:
    once = plan(blocking=False, timeout=None)
    assert (once.deadline, once.mode, once.script) == (100.0, "once", None)  # a plain SET NX PX
    assert plan(timeout=5.0).deadline == 105.0
    assert plan(timeout=None).deadline == pytest.approx(100.0 + 3 * 0.2)  # retry_count 3 x retry_delay
    assert plan(timeout=None, retry_count=None).deadline == math.inf
    assert plan().mode == "join" and plan().script is ACQUIRE


def test_won_needs_a_quorum_and_validity_left_after_drift() -> None:
    attempt = plan()
    drift = attempt.config.drift(TTL)
    assert drift == pytest.approx(TTL * 0.01 + base.DRIFT_CONSTANT)
    assert attempt.won([OK, OK, OK, None, Failure("timeout")], started=100.0, quorum=QUORUM, now=100.5)
    assert attempt.validity == pytest.approx(TTL - 0.5 - drift)
    assert not attempt.won([OK, OK, None, 0, Failure("timeout")], 100.0, QUORUM, 100.5)  # 2 of 5
    assert attempt.won([OK] * 5, 100.0, QUORUM, 100.0 + TTL - drift - 0.001)  # a millisecond left
    assert not attempt.won([OK] * 5, 100.0, QUORUM, 100.0 + TTL - drift + 0.001)  # none left
    assert attempt.attempts == 4


def test_a_vote_that_waited_in_line_counts_its_ttl_from_what_a_quorum_waited() -> None:
    attempt = plan()
    drift_factor = attempt.config.clock_drift_factor
    waits = [Granted(OK, w) for w in (3.0, 2.0, 1.0)]
    assert attempt.won([*waits, None, None], started=100.0, quorum=QUORUM, now=104.0)
    started = 100.0 + (1.0 - base.EXPIRY_STEP) * (1 - drift_factor)  # the third longest wait
    assert attempt.started == pytest.approx(started)
    assert attempt.validity == pytest.approx(TTL - (104.0 - started) - attempt.config.drift(TTL))
    # A node that says it waited longer than we saw pass never gives more than a fresh acquire.
    attempt.won([Granted(OK, 9.0)] * 3, started=100.0, quorum=QUORUM, now=101.0)
    assert attempt.started == 101.0


def test_after_a_refusal_by_a_quorum_the_next_vote_waits_in_line() -> None:
    attempt = plan(timeout=5.0)
    attempt.won([0, 0, 0, OK, Failure("timeout")], 100.0, QUORUM, 100.01)
    assert attempt.next_vote(QUORUM, now=100.01) == 0.0
    assert attempt.mode == "wait"
    assert attempt.slice == min(base.WAIT_SLICE, TTL / 4)
    attempt.won([0, 0, 0, 0, 0], 104.9, QUORUM, 104.9)
    attempt.next_vote(QUORUM, now=104.9)
    assert attempt.slice == pytest.approx(0.1)  # never past the deadline


def test_without_enough_answers_the_next_vote_comes_after_retry_delay() -> None:
    attempt = plan(timeout=5.0)
    attempt.won([0, 0, Failure("timeout"), Failure("timeout"), None], 100.0, QUORUM, 100.01)
    assert attempt.next_vote(QUORUM, now=100.01) == pytest.approx(0.2)  # no jitter configured
    assert attempt.mode == "join"
    assert attempt.next_vote(QUORUM, now=104.9) == pytest.approx(0.1)  # the last vote at the deadline
    assert attempt.next_vote(QUORUM, now=105.0) is None


def test_a_lost_place_in_line_is_taken_again_at_once() -> None:
    attempt = plan()
    attempt.won([NO_PLACE, 0, 0, 0, 0], 100.0, QUORUM, 100.01)
    assert attempt.next_vote(QUORUM, now=100.01) == 0.0
    assert (attempt.mode, attempt.slice) == ("join", 0.0)


def test_a_call_that_does_not_wait_votes_once() -> None:
    attempt = plan(blocking=False, timeout=None)
    attempt.won([None] * 5, 100.0, QUORUM, 100.01)
    assert attempt.next_vote(QUORUM, now=100.01) is None


def test_top_up_extends_once_a_lock_that_lost_much_validity_waiting() -> None:
    attempt = plan()
    attempt.mode = "wait"
    drift = attempt.config.drift(TTL)
    attempt.won([Granted(OK, 0.0)] * 3 + [None] * 2, 100.0, QUORUM, 100.5)  # 5 % of the ttl gone
    assert attempt.top_up() is None
    attempt.won([Granted(OK, 0.0)] * 3 + [None] * 2, 100.0, QUORUM, 102.0)  # 20 % gone
    topped = attempt.top_up()
    assert topped is not None
    command, wait = topped
    assert command[0] == "EVALSHA" and wait == attempt.config.node_timeout
    attempt.topped_up([1, 1, 1, 0, None], started=102.0, quorum=QUORUM, now=102.01)
    assert attempt.validity == pytest.approx(TTL - 0.01 - drift)
    attempt.mode = "join"  # a lock won without waiting is never topped up
    attempt.won([OK] * 3 + [None] * 2, 100.0, QUORUM, 102.0)
    assert attempt.top_up() is None


def test_a_vote_in_line_is_granted_provisionally_and_extended() -> None:
    attempt = plan()
    assert attempt.vote()[4 + 3] == base.ms(TTL)  # ACQUIRE's ARGV[2]: a vote that does not wait sets the ttl
    attempt.mode = "wait"
    assert attempt.vote()[4 + 3] == base.ms(base.PROVISIONAL_TTL)
    provisional = base.PROVISIONAL_TTL - attempt.config.drift(base.PROVISIONAL_TTL)
    assert attempt.won([Granted(OK, 0.0)] * 3 + [None] * 2, 100.0, QUORUM, 100.01)
    assert attempt.validity == pytest.approx(provisional - 0.01)  # bounded by the provisional keys
    assert attempt.top_up() is not None  # always extended, however little it waited
    attempt.topped_up([1, 1, 0, 0, None], started=100.01, quorum=QUORUM, now=100.02)  # 2 of 5 extended
    assert attempt.valid_until == pytest.approx(100.0 + provisional)
    assert attempt.validity == pytest.approx(provisional - 0.02)
    attempt.topped_up([1, 1, 1, 0, None], started=100.01, quorum=QUORUM, now=100.02)  # a quorum: the ttl
    assert attempt.valid_until == pytest.approx(100.01 + TTL - attempt.config.drift(TTL))
    late = plan()
    late.mode = "wait"
    late.vote()
    assert not late.won([Granted(OK, 0.0)] * 3 + [None] * 2, 100.0, QUORUM, 100.0 + provisional)  # read too late


def test_a_ttl_below_the_provisional_one_is_granted_whole() -> None:
    made = config()
    attempt = base.Attempts(made, made.request("a", 0.5, True, 5.0, None), now=100.0, wall=1)
    attempt.mode = "wait"
    assert attempt.vote()[4 + 3] == base.ms(0.5)
    attempt.won([Granted(OK, 0.0)] * 3 + [None] * 2, 100.0, QUORUM, 100.01)
    assert attempt.top_up() is None  # lost under a tenth of the ttl: nothing to extend


def test_unsure_lists_the_nodes_where_the_value_may_be_set() -> None:
    attempt = plan()
    attempt.won([OK, None, 0, Failure("timeout"), TimeoutError()], 100.0, QUORUM, 100.01)
    assert attempt.unsure() == [True, False, False, True, True]
