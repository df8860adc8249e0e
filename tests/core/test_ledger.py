"""A node's books of release debts (core/ledger.py ``Ledger``), driven by hand: no server, no clock."""

from __future__ import annotations

from django_redlock.core import entries, ledger
from django_redlock.core.entries import RELEASE, SET, Entry, Ledger

KEY, VALUE = "redlock:lock:a", "v1"
COMMAND = ("EVAL", "release source", 3, KEY, "q", "p", VALUE)


def release(value: str = VALUE) -> Entry:
    return Entry(RELEASE, KEY, value)


def test_a_release_answered_1_settles_its_debt() -> None:
    books = Ledger()
    books.owe(KEY, VALUE, until=30.0, now=0.0, command=COMMAND)
    assert set(books.debts) == {(KEY, VALUE)}
    books.settle(release(), 1, now=0.1)
    assert not books.debts


def test_a_release_answered_0_settles_only_when_no_set_of_the_value_can_still_land() -> None:
    books = Ledger()
    books.set_sent(KEY, VALUE)  # a vote still unanswered: it may land after the release ran
    books.owe(KEY, VALUE, until=30.0, now=0.0, command=COMMAND)
    books.settle(release(), 0, now=0.1)
    assert (KEY, VALUE) in books.debts
    books.set_answered(KEY, VALUE)
    not_proving = release()
    not_proving.proves = False  # written while a SET was unanswered on another connection
    books.settle(not_proving, 0, now=0.2)
    assert (KEY, VALUE) in books.debts
    books.settle(release(), 0, now=0.3)
    assert not books.debts


def test_a_reply_for_another_value_settles_nothing() -> None:
    books = Ledger()
    books.owe(KEY, VALUE, until=30.0, now=0.0, command=COMMAND)
    books.settle(release("v2"), 1, now=0.1)
    assert (KEY, VALUE) in books.debts


def test_ordered_knows_whether_every_unanswered_set_is_ahead_on_this_connection() -> None:
    books = Ledger()
    assert books.ordered([], KEY, VALUE)  # no SET of the value in flight
    books.set_sent(KEY, VALUE)
    ahead = [Entry(SET, KEY, VALUE, 10.0)]
    assert books.ordered(ahead, KEY, VALUE)
    assert not books.ordered([], KEY, VALUE)  # the SET is on another connection
    books.set_sent(KEY, VALUE)
    assert not books.ordered(ahead, KEY, VALUE)  # one of two is elsewhere
    assert books.ordered(ahead * 2, KEY, VALUE)


def test_a_dropped_connection_keeps_the_debt_until_its_set_surely_expired() -> None:
    books = Ledger()
    books.set_sent(KEY, VALUE)
    books.owe(KEY, VALUE, until=10.0, now=0.0, command=COMMAND)
    books.dropped([Entry(SET, KEY, VALUE, 10.0), Entry(entries.OTHER)], until=20.0)
    assert not books.unanswered  # no longer in flight on a live connection...
    assert books.debts[(KEY, VALUE)].until == 20.0  # ...but its bytes may still land
    books.settle(release(), 0, now=5.0)
    assert (KEY, VALUE) in books.debts
    books.settle(release(), 0, now=20.0)
    assert not books.debts


def test_due_pays_each_debt_again_after_retry_after_and_forgets_it_once_expired() -> None:
    books = Ledger(retry_after=1.0)
    books.owe(KEY, VALUE, until=5.0, now=0.0, command=COMMAND)
    assert books.due(0.5, retry_after=1.0) == []  # the release written at 0 is in flight
    assert [d.command for d in books.due(1.0, retry_after=1.0)] == [COMMAND]
    assert books.due(1.5, retry_after=1.0) == []  # paid at 1.0
    assert len(books.due(2.0, retry_after=1.0)) == 1
    assert books.due(5.0, retry_after=1.0) == [] and not books.debts  # its key has surely expired


def test_owing_again_keeps_the_later_expiry_and_counts_as_paid_now() -> None:
    books = Ledger(retry_after=1.0)
    books.owe(KEY, VALUE, until=5.0, now=0.0, command=COMMAND)
    books.owe(KEY, VALUE, until=3.0, now=2.0, command=COMMAND)
    debt = books.debts[(KEY, VALUE)]
    assert (debt.until, debt.paid_at) == (5.0, 2.0)
    assert books.due(2.5, retry_after=1.0) == []


def test_one_write_carries_at_most_debts_per_write() -> None:
    books = Ledger()
    for i in range(entries.DEBTS_PER_WRITE + 5):
        books.owe(KEY, f"v{i}", until=60.0, now=0.0, command=COMMAND)
    assert len(books.due(1.0, retry_after=0.5)) == entries.DEBTS_PER_WRITE
    assert len(books.due(1.0, retry_after=0.5)) == 5  # the rest ride on the next write


def test_past_max_debts_the_oldest_goes_and_expired_ones_go_first() -> None:
    books = Ledger(max_debts=3)
    for i in range(4):
        books.owe(KEY, f"v{i}", until=60.0, now=float(i), command=COMMAND)
    assert [value for _, value in books.debts] == ["v1", "v2", "v3"]
    books.owe(KEY, "late", until=100.0, now=61.0, command=COMMAND)  # v1..v3 have surely expired
    assert [value for _, value in books.debts] == ["late"]
    assert entries.MAX_DEBTS == Ledger().max_debts


def test_a_debt_is_not_paid_while_the_round_that_owes_it_runs() -> None:
    books = Ledger()
    owing = entries.Owing()
    books.owe(KEY, VALUE, until=5.0, now=0.0, command=COMMAND, owing=owing)
    assert books.due(2.0, retry_after=1.0) == []  # its round is held up before this node: its own release comes
    owing.over = True
    assert [d.command for d in books.due(2.0, retry_after=1.0)] == [COMMAND]


def test_a_payment_that_deleted_the_key_while_its_round_runs_makes_the_rounds_0_a_deletion() -> None:
    books = Ledger()
    owing = entries.Owing()
    books.owe(KEY, VALUE, until=5.0, now=0.0, command=COMMAND, owing=owing)
    books.settle(release(), 1, now=0.1)  # a payment written before the round began
    own = Entry(RELEASE, KEY, VALUE, waiter=object())  # type: ignore[arg-type]
    assert books.settle(own, 0, now=0.2) == 1  # deleted by our own release: not a loss
    assert books.settle(release("v2"), 0, now=0.2) == 0
    owing.over = True
    assert books.due(0.3, retry_after=1.0) == [] and not books.debts  # nothing left to pay


# -- an extension that may set a lost key again is booked as a vote ----------------------------


def _extension(recreate: bool) -> tuple:
    from django_redlock.core.base import extend_command
    from django_redlock.core.scripts import EXTEND

    command = extend_command(("redlock:lock:r",), VALUE, 2.0, "redlock:dataset", recreate)
    return ("EVAL", EXTEND.source, *command[2:])


def test_an_extension_that_may_set_a_key_again_is_booked_as_a_vote() -> None:
    recreating = entries.entry_fields(_extension(True), entries.EXTEND)
    plain = entries.entry_fields(_extension(False), entries.EXTEND)
    assert recreating == (SET, "redlock:lock:r", VALUE, 2.0)
    assert plain[:3] == (entries.EXTEND, "redlock:lock:r", VALUE)


def test_a_late_noscript_sends_a_re_creating_extension_again_as_a_plain_one() -> None:
    from redis.exceptions import NoScriptError

    from django_redlock.core.books import ConnState, NodeBooks

    books: NodeBooks = NodeBooks("n", 0.05)
    conn = ConnState()
    command = _extension(True)
    entry = entries.Entry(*entries.entry_fields(command, entries.EXTEND), retry=command)
    books.prepare(conn, entry, 0.0, 0.0)
    assert books.ledger.unanswered == {("redlock:lock:r", VALUE): 1}
    taken, resend = books.book(conn, NoScriptError("NOSCRIPT"), 0.01)  # nobody waits any more
    assert books.ledger.unanswered == {}
    (again,) = conn.expect
    assert not taken and again.kind == entries.EXTEND and resend is not None
    assert resend[:-3] == command[:-3] and resend[-3] == "" and resend[-2:] == command[-2:]
    assert books.book(conn, 1, 0.015) == (False, None) and not conn.expect  # the plain extension's reply
    # A vote (or another script) answered NOSCRIPT late is not sent again.
    vote = Entry(SET, "k", VALUE, 1.0, retry=("EVAL", "return 1", 0))
    books.prepare(conn, vote, 0.0, 0.0)
    assert books.book(conn, NoScriptError("NOSCRIPT"), 0.02) == (False, None) and not conn.expect
