"""The round-driver contract and the books, driven by a fake driver in plain Python (no Redis, no I/O).

Every driver (sockets + poll, asyncio, the simulator) keeps the same contract: ``Round.open`` per
node (a connection and the commands to send, or NEW: connect first), ``Round.written`` after the
send, ``Round.wait_time`` until it says stop, each reply handed to ``NodeBooks.book``, a broken
connection to ``NodeBooks.broken``, ``Round.finish`` at the end. The books file connections
themselves (idle, parked, dropped). These tests run that contract by hand on fake connections.
"""

from __future__ import annotations

from typing import Any

import pytest

from django_redlock.core import entries, ledger, steps
from django_redlock.core.base import ManagerConfig
from django_redlock.core.books import COOL_OFF, NEW, PARKED, ConnState, Failure, NodeBooks
from django_redlock.core.rounds import Round
from django_redlock.core import scripts
from django_redlock.core.scripts import RELEASE
from redis.exceptions import ResponseError

KEY, VALUE = "redlock:lock:r", "v1"
VOTE = ("SET", KEY, VALUE, "NX", "PX", 30000)
OK = b"OK"


class FakeConn(ConnState):
    """A connection that records what was sent on it."""

    __slots__ = ("sent",)

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[Any, ...]] = []


class NoScriptError(Exception):
    """Named as redis-py's NOSCRIPT reply is: the books recognise it by its name."""


def majority(n: int) -> Any:
    return lambda results: sum(r == OK for r in results) >= n // 2 + 1


class FakeDriver:
    """The contract as every driver keeps it: connections are fake, replies are fed by the test."""

    def __init__(self, books: list[NodeBooks[FakeConn]]) -> None:
        self.books = books
        self.conns: dict[int, FakeConn] = {}

    def connect_and_send(self, rnd: Round[FakeConn], i: int, now: float) -> FakeConn:
        conn = FakeConn()
        self.send(rnd, i, conn, None, rnd.write(i, conn, now), now)
        return conn

    def send(self, rnd: Round[FakeConn], i: int, conn: FakeConn, since: float | None, wire: Any, now: float) -> None:
        conn.sent += wire
        if rnd.written(i, conn, since, now):
            self.conns[i] = conn

    def reply(self, i: int, reply: Any, now: float, rnd: Round[FakeConn] | None = None) -> bool:
        conn = self.conns[i]
        taken, resend = self.books[i].book(conn, reply, now, rnd)
        if resend is not None:
            conn.sent.append(resend)
        return taken


def start(n: int, commands: Any = None, now: float = 0.0, connect: bool = True, **options: Any) -> tuple[
    FakeDriver, Round[FakeConn]
]:
    books: list[NodeBooks[FakeConn]] = [NodeBooks(f"n{i}", node_timeout=0.05) for i in range(n)]
    driver = FakeDriver(books)
    fan = commands if isinstance(commands, steps.Fan) else steps.Fan(commands or [VOTE] * n, **options)
    rnd: Round[FakeConn] = Round(books, fan, now=now, timeout=0.05)
    for i in range(n):
        opened = rnd.open(i, now, lambda conn, idle_for: True)
        assert opened == NEW  # fresh books: no connection yet
        if connect:
            driver.connect_and_send(rnd, i, now)
        else:
            rnd.connect_failed(i, "connection refused", now)
    return driver, rnd


def test_quorum_reached_early_then_a_grace_read_of_what_already_arrived() -> None:
    driver, rnd = start(3, done=majority(3))
    assert rnd.wait_time(0.001) == pytest.approx(0.05)  # the node timeout runs from the first wait_time
    assert driver.reply(0, OK, 0.002, rnd) and driver.reply(1, OK, 0.003, rnd)
    assert rnd.wait_time(0.003) == 0.0  # outcome known: read only what is already there
    assert driver.reply(2, OK, 0.003, rnd)  # it had arrived: taken in the grace read
    assert rnd.wait_time(0.003) is None
    assert rnd.finish(0.003) == []
    assert rnd.results == [OK, OK, OK]
    assert all(book.idle and not book.parked for book in driver.books)  # taken connections came back idle


def test_a_reply_not_awaited_after_the_quorum_is_booked_later_and_files_the_connection() -> None:
    driver, rnd = start(3, done=majority(3))
    rnd.wait_time(0.001)
    driver.reply(0, OK, 0.002, rnd)
    driver.reply(1, OK, 0.003, rnd)
    assert rnd.wait_time(0.003) == 0.0 and rnd.wait_time(0.003) is None
    left = rnd.finish(0.003)
    assert [i for i, _ in left] == [2]
    assert rnd.results[2] == Failure("not awaited: the outcome was already known", answered=True)
    books, conn = driver.books[2], left[0][1]
    books.checkin(conn, rnd.sent_at, 0.003)
    assert books.parked == {conn: rnd.sent_at}  # its SET is still due
    assert books.ledger.unanswered == {(KEY, VALUE): 1}
    assert not driver.reply(2, OK, 0.004)  # nobody waits any more: booked all the same
    assert not books.parked and books.idle == [(conn, 0.004)] and not books.ledger.unanswered


def test_timeout_then_one_last_look_before_judging_a_node_silent() -> None:
    driver, rnd = start(3, done=majority(3))
    rnd.wait_time(0.0)
    driver.reply(0, OK, 0.001, rnd)
    assert rnd.wait_time(0.2) == 0.0  # the time ran out while we did not run: look at what arrived
    driver.reply(1, OK, 0.2, rnd)  # it came in time
    assert rnd.wait_time(0.2) == 0.0  # the quorum is known now: a grace read
    assert rnd.wait_time(0.2) is None
    rnd.finish(0.2)
    assert rnd.results[:2] == [OK, OK]
    assert rnd.results[2] == Failure("no reply within 50 ms")


def test_the_last_look_comes_once() -> None:
    driver, rnd = start(2, done=majority(2))
    rnd.wait_time(0.0)
    assert rnd.wait_time(0.1) == 0.0
    assert rnd.wait_time(0.1) is None
    assert [i for i, _ in rnd.finish(0.1)] == [0, 1]
    assert all(isinstance(r, Failure) and not r.answered for r in rnd.results)


def test_a_broken_connection_fails_its_node_and_the_books_drop_it() -> None:
    driver, rnd = start(3, done=majority(3))
    rnd.wait_time(0.0)
    books, conn = driver.books[1], driver.conns[1]
    books.broken(conn, "connection lost", 0.001)
    assert rnd.results[1] == Failure("connection lost", broken=True)
    assert not conn.expect and not books.parked and not books.idle
    # The SET may still land: a release's 0 proves nothing until its ttl has surely passed.
    assert books.ledger.lost_sets[(KEY, VALUE)] > 30.0
    driver.reply(0, OK, 0.002, rnd)
    driver.reply(2, OK, 0.002, rnd)
    assert rnd.wait_time(0.002) is None  # nothing left to wait for
    assert rnd.finish(0.002) == [] and rnd.results == [OK, Failure("connection lost", broken=True), OK]


def test_a_failed_connect_cools_the_node_off() -> None:
    driver, rnd = start(1, connect=False)
    assert rnd.results == [Failure("connection refused")]
    again: Round[FakeConn] = Round(driver.books, steps.Fan([VOTE]), now=0.1, timeout=0.05)
    assert again.open(0, 0.1, lambda conn, idle_for: True) is None  # within the cool-off: not tried
    assert again.results == [Failure("connection refused")]
    later: Round[FakeConn] = Round(driver.books, steps.Fan([VOTE]), now=COOL_OFF, timeout=0.05)
    assert later.open(0, COOL_OFF, lambda conn, idle_for: True) == NEW


def test_an_unusable_idle_connection_is_passed_over() -> None:
    driver, rnd = start(1)
    driver.reply(0, OK, 0.001, rnd)
    rnd.finish(0.001)
    closed: list[FakeConn] = []

    def usable(conn: FakeConn, idle_for: float) -> bool:
        closed.append(conn)
        return False

    ping: Round[FakeConn] = Round(driver.books, steps.Fan([("PING",)]), now=1.0, timeout=0.05)
    assert ping.open(0, 1.0, usable) == NEW
    assert closed == [driver.conns[0]] and not driver.books[0].idle


def test_a_release_queues_behind_its_own_vote_on_the_parked_connection() -> None:
    driver, vote = start(1)
    (i, voted), = vote.finish(0.001)  # the round ends without this reply
    books = driver.books[0]
    books.checkin(voted, vote.sent_at, 0.001)
    fan = steps.release_fan(ManagerConfig(), 1, ["r"], VALUE, quorum=1)
    release: Round[FakeConn] = Round(driver.books, fan, now=0.002, timeout=0.05)
    opened = release.open(0, 0.002, lambda conn, idle_for: True)
    assert opened != NEW and opened is not None
    conn, since, wire = opened
    assert conn is voted and since == vote.sent_at  # ordered after the SET it releases
    assert [e.kind for e in conn.expect] == [entries.SET, entries.RELEASE]
    assert conn.expect[1].proves  # every SET of the value is ahead of it on this connection
    driver.send(release, 0, conn, since, wire, 0.002)
    assert driver.reply(0, OK, 0.003, release) is False  # the vote's reply: not the release's
    assert driver.reply(0, 1, 0.004, release)
    assert release.results == [1] and not books.ledger.debts
    assert books.idle == [(conn, 0.004)]


def test_a_release_debt_rides_along_with_the_next_command() -> None:
    fan = steps.release_fan(ManagerConfig(), 1, ["r"], VALUE, quorum=1)
    driver, release = start(1, fan)
    books = driver.books[0]
    assert (KEY, VALUE) in books.ledger.debts  # owed from the moment it is written
    release.wait_time(0.0)
    books.broken(driver.conns[0], "connection lost", 0.01)  # its reply is lost
    assert (KEY, VALUE) in books.ledger.debts
    assert release.wait_time(0.01) is None
    release.finish(0.01)  # the round is over: its debt is due as any other
    ping: Round[FakeConn] = Round(driver.books, steps.Fan([("PING",)]), now=0.1, timeout=0.05)
    assert ping.open(0, 0.1, lambda conn, idle_for: True) == NEW
    conn = driver.connect_and_send(ping, 0, 0.1)
    assert [c[0] for c in conn.sent] == ["EVAL", "PING"]  # the debt is paid first, as EVAL (no NOSCRIPT)
    assert not driver.reply(0, 1, 0.101, ping)  # the debt's reply proves the key gone
    assert not books.ledger.debts
    assert driver.reply(0, b"PONG", 0.102, ping)
    assert ping.results == [b"PONG"]


def test_noscript_sends_the_source_and_the_round_waits_for_that_reply() -> None:
    fan = steps.release_fan(ManagerConfig(), 1, ["r"], VALUE, quorum=1)
    books: list[NodeBooks[FakeConn]] = [NodeBooks("n0", node_timeout=0.05)]
    driver = FakeDriver(books)
    conn = FakeConn()
    conn.scripts.add(RELEASE.sha)  # the script went out on this connection before
    books[0].checkin(conn, 0.0, 0.0)
    release: Round[FakeConn] = Round(books, fan, now=0.0, timeout=0.05)
    opened = release.open(0, 0.0, lambda conn, idle_for: True)
    assert opened != NEW and opened is not None and opened[2][0][0] == "EVALSHA"
    driver.send(release, 0, *opened, 0.0)
    release.wait_time(0.0)
    assert not driver.reply(0, NoScriptError("NOSCRIPT"), 0.01, release)  # the server forgot it (SCRIPT FLUSH)
    assert conn.sent[-1][0] == "EVAL" and not conn.scripts
    assert release.wait_time(0.04) == pytest.approx(0.02)  # a node timeout from the resend
    assert driver.reply(0, 1, 0.02, release)
    assert release.results == [1] and not books[0].ledger.debts


@pytest.mark.parametrize(("uptime", "votes"), [(3600, True), (3, False)])
def test_the_restart_probe_goes_first_on_a_new_connection(uptime: int, votes: bool) -> None:
    driver, rnd = start(1, restart_window=30.0)
    conn = driver.conns[0]
    assert [c[0] for c in conn.sent] == [*(c[0] for c in ledger.PROBE), "SET"]
    info = f"# Server\r\nrun_id:abc\r\nuptime_in_seconds:{uptime}\r\n".encode()
    replication = b"# Replication\r\nrole:master\r\nmaster_replid:r1\r\n"
    for reply in (info, replication, [b"appendonly", b"no"], [b"appendfsync", b"everysec"]):
        assert not driver.reply(0, reply, 0.001, rnd)
    assert conn.restart is not None and conn.restart.run_id == "abc"
    assert driver.reply(0, OK, 0.002, rnd)
    if votes:
        assert rnd.results == [OK]
    else:
        assert isinstance(rnd.results[0], Failure) and ledger.DELAYED_RESTART in str(rnd.results[0])
    # The probe went once: the connection's next vote goes alone.
    again: Round[FakeConn] = Round(driver.books, steps.Fan([VOTE], restart_window=30.0), now=0.01, timeout=0.05)
    opened = again.open(0, 0.01, lambda conn, idle_for: True)
    assert opened != NEW and opened is not None and [c[0] for c in opened[2]] == ["SET"]


def test_background_reads_keep_a_written_connection_parked_until_nothing_is_due() -> None:
    books: list[NodeBooks[FakeConn]] = [NodeBooks("n0", node_timeout=0.05, background_reads=True)]
    driver = FakeDriver(books)
    rnd: Round[FakeConn] = Round(books, steps.Fan([VOTE]), now=0.0, timeout=0.05)
    assert rnd.open(0, 0.0, lambda conn, idle_for: True) == NEW
    conn = driver.connect_and_send(rnd, 0, 0.0)
    assert books[0].parked == {conn: 0.0}  # its replies are read in the background, whoever waits
    assert books[0].choose(None, True, 0.001)[:2] == (PARKED, conn)  # another round may queue behind it
    books[0].parked[conn] = 0.001  # written on by that round: parked until its replies are read
    assert not driver.reply(0, OK, 0.002)  # read in the background: taken by the waiting round
    assert rnd.results == [OK]
    assert not books[0].parked and books[0].idle == [(conn, 0.002)]


def test_stale_and_lagging_parked_connections() -> None:
    driver, rnd = start(1, done=lambda results: True)
    rnd.wait_time(0.0)
    rnd.wait_time(0.0)
    (_, conn), = rnd.finish(0.0)
    books = driver.books[0]
    books.checkin(conn, 0.0, 0.0)
    strict: Round[FakeConn] = Round(driver.books, steps.Fan([("PING",)], allow_lagging=False), now=0.1, timeout=0.05)
    assert strict.open(0, 0.1, lambda conn, idle_for: True) is None
    assert "no reply to an earlier command" in str(strict.results[0])
    assert books.give_up_stale(0.5) == []  # overdue, but not beyond the stale limit
    assert books.give_up_stale(books.stale_limit + 0.1) == [conn]
    assert not books.parked and not conn.expect


# -- the data set a vote counts on ----------------------------------------------------------

GUARDED_VOTE = steps.script_command(scripts.VOTE, (KEY,), (VALUE, 30000, "redlock:dataset", ""))


def _probe_replies(run_id: str, uptime: int = 3600) -> list[Any]:
    info = f"# Server\r\nrun_id:{run_id}\r\nuptime_in_seconds:{uptime}\r\n".encode()
    return [info, b"# Replication\r\nrole:master\r\nmaster_replid:r1\r\n", [b"appendonly", b"no"],
            [b"appendfsync", b"everysec"]]


def _first_vote(token: bytes, run_id: str = "abc") -> tuple[FakeDriver, Round[FakeConn]]:
    """A vote on a new connection: the probe and the marker read go first; the marker says ``token``."""
    driver, rnd = start(1, [GUARDED_VOTE], restart_window=30.0, script=scripts.VOTE)
    for reply in (*_probe_replies(run_id), token):
        assert not driver.reply(0, reply, 0.001, rnd)
    assert driver.reply(0, OK, 0.002, rnd) and rnd.results == [OK]
    return driver, rnd


def _vote_again(driver: FakeDriver, now: float) -> tuple[Round[FakeConn], tuple[Any, ...]]:
    rnd: Round[FakeConn] = Round(driver.books, steps.Fan([GUARDED_VOTE], restart_window=30.0,
                                 script=scripts.VOTE), now=now, timeout=0.05)
    opened = rnd.open(0, now, lambda conn, idle_for: True)
    assert opened != NEW and opened is not None
    driver.send(rnd, 0, opened[0], opened[1], opened[2], now)
    return rnd, opened[2][-1]


def test_a_vote_carries_the_token_of_the_data_set_the_probe_read() -> None:
    driver, _ = _first_vote(b"t1")
    sent = [c[0] for c in driver.conns[0].sent]
    assert sent == [*(c[0] for c in ledger.PROBE), "EVAL", "EVAL"]  # the marker read, then the vote
    assert driver.conns[0].sent[-1][-1] == ""  # nothing known yet: the first vote is unchecked
    _, command = _vote_again(driver, 0.01)
    assert command[-2:] == ("redlock:dataset", "t1")


def test_a_vote_refused_for_another_data_set_makes_the_node_sit_out() -> None:
    driver, _ = _first_vote(b"t1")
    rnd, _ = _vote_again(driver, 0.01)
    driver.reply(0, ResponseError("DATASET t2"), 0.011, rnd)
    assert isinstance(rnd.results[0], Failure) and ledger.DELAYED_RESTART in str(rnd.results[0])
    assert driver.books[0].dataset == "t2" and driver.books[0].history.moved_at == 0.011
    _, command = _vote_again(driver, 0.02)
    assert command[-1] == "t2"  # the next vote counts on the new data set, once the window is over


def test_a_new_marker_after_a_restart_is_left_to_the_restart_rule() -> None:
    driver, _ = _first_vote(b"t1", run_id="abc")
    books = driver.books[0]
    books.close_all(5.0)  # the restart closed the connection
    rnd: Round[FakeConn] = Round(driver.books, steps.Fan([GUARDED_VOTE], restart_window=30.0,
                                 script=scripts.VOTE), now=10.0, timeout=0.05)
    assert rnd.open(0, 10.0, lambda conn, idle_for: True) == NEW
    driver.connect_and_send(rnd, 0, 10.0)
    for reply in (*_probe_replies("def", uptime=0), b"t9"):  # started long after its last answer: a restart
        driver.reply(0, reply, 10.001, rnd)
    assert books.dataset == "t9" and books.history.moved_at is None  # not a replaced data set
    driver.reply(0, OK, 10.002, rnd)
    assert isinstance(rnd.results[0], Failure) and "restarted" in str(rnd.results[0])  # the uptime rule


def test_a_readonly_reply_to_a_vote_makes_the_connection_probe_again() -> None:
    driver, _ = _first_vote(b"t1")
    rnd, _ = _vote_again(driver, 0.01)
    driver.reply(0, ResponseError("READONLY You can't write against a read only replica."), 0.011, rnd)
    assert driver.conns[0].restart is None
    again, _ = _vote_again(driver, 0.02)
    assert [c[0] for c in driver.conns[0].sent[-6:]] == [*(c[0] for c in ledger.PROBE), "EVAL", "EVALSHA"]
