"""One fan-out round and what describes it, without I/O: the contract every driver keeps.

A :class:`Round` is a command per node, written to every node before any
reply is awaited, judged reply by reply until the outcome is certain or the
node timeout passes. It says what to write, how long to wait and what each
node's result is; the node's books (:class:`~django_redlock.core.books.NodeBooks`)
choose connections, book replies and file connections. A driver (sockets +
poll, asyncio, the simulator) moves the bytes and reads the clock::

    rnd = Round(books, fan, now=now, timeout=0.05)  # fan: the round's Description (a steps.Fan)
    for i in range(len(books)):
        opened = rnd.open(i, now, usable)      # (conn, parked since, commands), NEW, or None
        ...if NEW: connect, then wire = rnd.write(i, conn, now), or rnd.connect_failed(i, reason, now)
        ...send... ; rnd.written(i, conn, since, now, error)   # True: wait for its reply
    while (wait := rnd.wait_time(now)) is not None:    # the first call starts the node timeout
        ...wait up to `wait`; each reply read: taken, resend = books[i].book(conn, reply, now, rnd)
        ...send `resend` if any; a broken connection: books[i].broken(conn, reason, now)
    left = rnd.finish(now)            # (i, conn) still owing a reply: the driver checks them in

Nothing here reads a clock, touches a socket, sleeps or starts a thread;
callers that share books between threads hold a lock around these calls.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any, Generic, Literal, Protocol, Union

from django_redlock.core import entries, ledger
from django_redlock.core.books import (
    IDLE,
    NEW,
    C,
    Command,
    Failure,
    NodeBooks,
    NodeUnavailable,
    ms_text,
    quiet_for,
)
from django_redlock.core.entries import Entry, entry_fields, pair_of
from django_redlock.core.records import printable
from django_redlock.core.scripts import ACQUIRE, EXTEND, GUARDED, RELEASE, VOTE, Script

__all__ = [
    "Description",
    "Granted",
    "Opened",
    "Round",
]

class Granted(bytes):
    """A vote's +OK that waited in line first, with how long it waited on its node's clock."""

    waited: float

    def __new__(cls, reply: bytes, waited: float) -> Granted:
        granted = super().__new__(cls, reply)
        #: Seconds between the node's TIME before the ``BLPOP`` and its TIME after it, at most
        #: the time between the write and the reply on our clock (see :meth:`Round.take`).
        granted.waited = waited
        return granted

    def __repr__(self) -> str:
        return f"{bytes(self)!r} after {self.waited * 1000:.1f} ms in line"


#: Results that tell nothing of the node: no command for it, one queued behind others, a reply not waited for.
SKIPPED = "skipped"
QUEUED = "queued behind an unanswered command"
NOT_AWAITED = "not awaited: the outcome was already known"

Done = Callable[[list[Any]], bool]
_NODE_TIMEOUT = attrgetter("node_timeout")
#: What :meth:`Round.open` hands a driver: the connection, since when it was parked (None: it was
#: idle), and the commands to send on it, booked.
Opened = Union[tuple[C, Union[float, None], list[Command]], Literal["new"]]
#: ``usable(conn, idle_for)``: whether an idle connection may be used (the driver closes one that may not).
Usable = Callable[[C, float], bool]


class Description(Protocol):
    """What a round is asked to do (a :class:`~django_redlock.core.steps.Fan`): the attributes it reads."""

    @property
    def commands(self) -> Sequence[Command | None]: ...
    @property
    def done(self) -> Done | None: ...
    @property
    def script(self) -> Script | None: ...
    @property
    def ordered_after_key(self) -> str | None: ...
    @property
    def allow_lagging(self) -> bool: ...
    @property
    def restart_window(self) -> float: ...
    @property
    def vote_window(self) -> float: ...
    @property
    def owe(self) -> tuple[str, str, float] | None: ...
    @property
    def block(self) -> tuple[tuple[str, ...], float] | None: ...
    @property
    def timings(self) -> list[float | None] | None: ...


class Round(Generic[C]):
    """One fan-out: a command per node, all written before any reply is awaited.

    ``done(results)`` says when the outcome is certain (results still pending
    are None); then the replies already there are read and the rest is left to
    the books. ``fan`` (a :class:`Description`) says the rest: with ``restart_window``, replies are
    votes and the delayed-restart rule applies (an extension's are not: the rule decides
    where it may re-create a key, see ``NodeBooks.recreating``). With ``owe=(key, value, ttl)``, every node
    owes the release of that value first (see :class:`~django_redlock.core.entries.Ledger`).
    """

    def __init__(self, books: Sequence[NodeBooks[C]], fan: Description, *, now: float, timeout: float) -> None:
        commands = fan.commands
        script = fan.script
        block = fan.block
        restart_window = fan.restart_window
        self.books = books
        self.commands = commands
        self.sent_at = now
        if block is not None:
            timeout += quiet_for(block)  # each node's vote comes after its wait in line
        self.done = fan.done
        self.script = script
        first = None
        for command in commands:
            if command is not None:
                first = command
                break
        if script is RELEASE:
            self.kind = entries.RELEASE
        elif script is EXTEND:
            self.kind = entries.EXTEND
        elif script is ACQUIRE or script is VOTE or (first is not None and first[0] == "SET"):
            self.kind = entries.SET  # a vote
        else:
            self.kind = entries.OTHER
        self.block = block
        # Worked out once for the round's first command, which usually goes to every node: its
        # entry's fields (a data-set token, see guarded(), or the script's source, EVAL, leave them
        # as they are; an EXTEND's follow recreating(), per node) and a release's (key, value).
        self._first = first
        self._fields: tuple[entries.Kind, str | None, str | None, float] | None = None
        if first is not None and type(first[0]) is not tuple and script is not EXTEND:
            self._fields = entry_fields(first, self.kind)
        self._after: tuple[str, str] | None = None
        ordered = fan.ordered_after_key is not None and self.kind == entries.RELEASE
        if ordered and first is not None and self._fields is not None:
            self._after = self._fields[1:3]  # type: ignore[assignment]  # a RELEASE's (key, value)
        self.ordered_after_key = fan.ordered_after_key
        self.allow_lagging = fan.allow_lagging
        self.window = restart_window
        self.guarded = restart_window > 0 and script in GUARDED  # once: a Script's hash is a Python call
        self.vote_window = fan.vote_window
        self.timings = fan.timings
        self.results: list[Any] = [None] * len(books)
        self.waiting: dict[Entry, tuple[int, C]] = {}  # our entry -> (node index, connection)
        self._mine: list[Entry | None] = [None] * len(books)  # node index -> the entry write() booked
        self.timeout = timeout
        self.deadline = now + timeout
        self.started = False  # the node timeout runs from the first wait_time(), once every write is out
        self.grace = False
        self.looked = False  # the last look at what arrived, once the time is up
        self.changed = False  # results moved since ``done`` was last asked (a result is set, or a reply taken)
        self._sources: dict[Command, Command] = {}  # EVALSHA -> the EVAL of its source, per command
        #: Called (by the books) whenever one of our replies was taken; drivers may set it.
        self.on_reply: Callable[[], None] | None = None
        #: While this round runs, the debts it owes are its own (see :class:`~django_redlock.core.entries.Owing`).
        self.owing: entries.Owing | None = None
        owe = fan.owe
        if owe is not None:
            self.owing = entries.Owing()
            key, value, ttl = owe
            debts: dict[int, Command] = {}  # the same command usually goes to every node
            for book, command in zip(books, commands):
                if command is not None:
                    debt = debts.get(id(command))
                    if debt is None:
                        debt = debts[id(command)] = entries.debt_command(command, RELEASE.source)
                    # Owed until proven done, or until the key has surely expired.
                    book.ledger.owe(key, value, now + ttl + book.stale_limit, now, debt, self.owing)

    def open(
        self, i: int, now: float, usable: Usable[C], look_after: float = 0.0, conn: C | None = None
    ) -> Opened[C] | None:
        """Node ``i``'s connection for this round, chosen and its commands booked: ``(conn, parked
        since, commands)``, the commands in order; :data:`NEW` when the driver must connect first
        (then :meth:`write`, or :meth:`connect_failed`); None when the node already has its result
        (skipped, unavailable).

        ``usable`` looks at an idle connection idle for ``look_after`` seconds or more. With ``conn``
        (a new connection, see :meth:`write`), nothing is chosen: the commands are booked on it."""
        original = command = self.commands[i]
        if command is None:
            self.results[i] = Failure(SKIPPED)
            self.changed = True
            return None
        book = self.books[i]
        since = None
        if conn is None:
            # A release goes behind a parked command for its key and value (its SET), to stay ordered after it.
            after = self._after
            if after is not None and command is not self._first:
                after = pair_of(command)
            while conn is None:
                try:
                    kind, conn, since = book.choose(after, self.allow_lagging, now)
                except NodeUnavailable as exc:
                    self.results[i] = Failure(str(exc))
                    self.changed = True
                    return None
                if kind == NEW or conn is None or since is None:
                    return NEW
                if kind == IDLE:
                    # A connection idle for a while may have been closed by a restart: the driver looks.
                    if not (now - since < look_after or usable(conn, now - since)):
                        conn = None
                    since = None
        # Book the commands on ``conn`` (the write, in one call with the choice: once per node and round).
        if isinstance(command[0], tuple):
            return conn, since, self._write_several(i, conn, command, now)
        script = self.script
        retry = None
        if self.guarded:
            command = book.guarded(command)
        if script is EXTEND:
            command = book.recreating(conn, command, self.window, now)
        if script is not None and command[0] == "EVALSHA":
            retry = self._sources.get(command)
            if retry is None:
                retry = self._sources[command] = ("EVAL", script.source, *command[2:])
            if script.sha not in conn.scripts:
                # A round may end at a quorum, and a NOSCRIPT read after that is answered with the
                # source only where that is worth it (see NodeBooks.book): on a connection that
                # never sent this script (a node that restarted has forgotten it), send the source.
                command, retry = retry, None
                conn.scripts.add(script.sha)
        fields = self._fields if original is self._first else None
        mine = Entry(*(fields or entry_fields(command, self.kind)), self, retry)
        extra = book.prepare(conn, mine, self.window, now, self.block)
        self.waiting[mine] = (i, conn)
        self._mine[i] = mine
        if extra:
            extra.append(command)
            return conn, since, extra
        return conn, since, [command]

    def connect_failed(self, i: int, reason: str, now: float) -> None:
        self.books[i].connect_failed(reason, now)
        self.results[i] = Failure(reason)
        self.changed = True

    def write(self, i: int, conn: C, now: float) -> list[Command]:
        """The commands to send on a new connection ``conn`` for node ``i`` (after :meth:`open` said
        :data:`NEW`), in order (all booked)."""
        opened = self.open(i, now, _looked, 0.0, conn)
        assert opened is not None and opened != NEW
        return opened[2]

    def _write_several(self, i: int, conn: C, commands: Command, now: float) -> list[Command]:
        """Several commands (e.g. ``ledger.PROBE``) for node ``i`` in one write: its result is the list
        of their replies, error replies included."""
        extra = self.books[i].prepare(conn, Entry(entries.PART), self.window, now, self.block)
        conn.expect.extend(Entry(entries.PART) for _ in commands[2:])
        mine = Entry(entries.OTHER, waiter=self)
        conn.expect.append(mine)
        self.waiting[mine] = (i, conn)
        self._mine[i] = mine
        return [*extra, *commands]

    def written(self, i: int, conn: C, parked_since: float | None, now: float, error: str | None = None) -> bool:
        """After the write; returns True when the driver should wait for this node's reply.

        Only a failed write (``error``), a write behind a parked connection's
        commands (``parked_since``) or books with background reads (the
        connection is parked while its replies come) touches the books: the
        caller holds the node's lock for those, and may skip the call otherwise
        (a write on an idle or new connection of books without background reads).
        """
        mine = self._mine[i]
        self._mine[i] = None
        assert mine is not None and mine in self.waiting
        if error is not None:
            del self.waiting[mine]
            self.books[i].drop(conn, now)
            self.results[i] = Failure(error, broken=True)
            self.changed = True
            return False
        if parked_since is not None and self._queued(i, conn, parked_since, now):
            # Ordered behind a command that is overdue, or behind a wait in line: queue it, do not wait for it.
            del self.waiting[mine]
            mine.waiter = None
            self.books[i].checkin(conn, parked_since, now)
            self.results[i] = Failure(QUEUED)
            self.changed = True
            return False
        books = self.books[i]
        if books.background_reads:  # its replies are read in the background: parked until they are
            books.parked.setdefault(conn, now if parked_since is None else parked_since)
        return True

    def _queued(self, i: int, conn: C, parked_since: float, now: float) -> bool:
        """True when a command behind ``conn``'s unanswered ones is not waited for (they are overdue,
        or a wait in line holds them back)."""
        return self.sent_at - parked_since > self.books[i].node_timeout or conn.quiet_until > now

    def replaced(self, old: Entry, new: Entry, now: float) -> None:
        """Our script went again as EVAL after NOSCRIPT: wait for that reply instead, a node timeout
        from now (each node gets the timeout from its command's write)."""
        where = self.waiting.pop(old, None)
        if where is not None:
            self.waiting[new] = where
            self.deadline = max(self.deadline, now + self.timeout)

    def take(self, entry: Entry, reply: Any, now: float) -> int | None:
        """Judge our reply for one node; returns that node's index (None if not ours any more)."""
        where = self.waiting.pop(entry, None)
        if where is None:
            return None
        i, conn = where
        book = self.books[i]
        command = self.commands[i]
        several = len(command) - 1 if command and isinstance(command[0], tuple) else 0  # see _write_several
        if isinstance(reply, Failure):
            self.results[i] = reply
        elif isinstance(reply, Exception) and not several:
            # A vote refused for another data set than the one it was sent for: the node sits out.
            replaced = self.vote_window > 0 and ledger.replaced_token(reply) is not None
            self.results[i] = (replaced and book.vote(conn, self.window, now)) or Failure(
                describe_error(reply), answered=True
            )
        else:
            if self.timings is not None:
                self.timings[i] = now - self.sent_at
            if self.block is not None and reply == b"OK" and conn.waited > 0:
                # A node cannot have waited longer than we saw pass since the write: a step of its
                # clock during the wait (NTP, a resumed VM) is not counted as waiting.
                reply = Granted(reply, min(conn.waited, now - self.sent_at))
            if several:  # the earlier replies came first (a round that ended early may have left some)
                reply, conn.parts = [*conn.parts[-several:], reply], []
            self.results[i] = (self.vote_window > 0 and book.vote(conn, self.window, now)) or reply
        self.changed = True
        if self.on_reply is not None:
            self.on_reply()
        return i

    def wait_time(self, now: float) -> float | None:
        """How long to wait for more replies: None to stop, 0.0 to read only what is already there.

        Call it once every write is out: each node gets ``timeout`` from the first call (connects can
        take time)."""
        if not self.started:
            self.started = True
            self.deadline = now + self.timeout
        if not self.waiting:
            return None
        if self.grace:
            return None
        if self.changed and self.done is not None:
            self.changed = False
            if self.done(self.results):
                self.grace = True  # outcome known: read what has already arrived, then stop
                return 0.0
        remaining = self.deadline - now
        if remaining > 0:
            return remaining
        if not self.looked:
            # The time ran out while this process did not run (a long garbage collection, a busy
            # host): replies that came meanwhile came in time. Read them before judging any missing.
            self.looked = True
            return 0.0
        return None

    def finish(self, now: float) -> list[tuple[int, C]]:
        """Stop waiting. Returns the (node index, connection) pairs whose reply is still due."""
        if self.owing is not None:
            self.owing.over = True  # its debts are due again, as any
        self._mine = []  # no cycle round -> entry -> round left behind by a skipped written()
        if not self.waiting:
            return []
        late = now - self.sent_at >= min(map(_NODE_TIMEOUT, self.books), default=0.0)
        left = []
        for entry, (i, conn) in self.waiting.items():
            entry.waiter = None  # read and booked later, when the connection is next used
            if self.grace and not late:
                self.results[i] = Failure(NOT_AWAITED, answered=True)
            else:
                self.results[i] = Failure(f"no reply within {ms_text(self.timeout)}")  # this round's own wait
            left.append((i, conn))
        self.waiting = {}
        return left


def _looked(conn: Any, idle_for: float) -> bool:
    """The ``usable`` of :meth:`Round.write`: a new connection is not looked at."""
    return True


def describe_error(exc: BaseException) -> str:
    """A node's error reply in a reason: its first line, shortened, with control characters escaped."""
    return "error reply: " + printable(str(exc).split("\n")[0][:120])
