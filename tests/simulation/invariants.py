"""The state checker: Redlock's promises, checked against true time and node state.

A client driver reports what its client *returned* to the caller (acquired,
extended, fenced, released, gave up), at the true moment it happened. The
checker knows true time and can look inside every node, which no client can;
so it judges each report against the world's real state.

A lock may hold several resources at once (taken all or nothing): reports name
one resource or a collection of them, and a lock on several counts as a
holding of every member. Each promise below holds per member:

(a) exclusion: two locks sharing a resource are never valid at the same true
    time. A lock is valid from its acquisition until the earlier of its
    release and the true time its reported validity ends on the holder's clock;
(b) fencing: tokens order like acquisitions on each resource, strictly (the one
    token of a lock on several resources is checked against the holders of
    every member);
(c) honest validity: when a lock (or an extension) is returned, a quorum of
    nodes stores the holder's value on every member's key for at least the
    reported validity, in true time, each node's remaining ttl measured on its
    own clock (a node counts only if it keeps all the members: the lock is one
    lock, all or nothing on each node; a node that lost the keys in a crash and
    is still down counts as keeping them: it votes for no one; if it rejoins
    too early, (a) catches the consequence);
(d) nothing left behind: once a holder released or gave up a value, and no
    fault or late delivery happened for one ttl (+ drift + slack), no node
    stores that value under any key;
(e) progress: after :meth:`Checker.expect_progress`, some lock is acquired
    within the given bound;
(h) nothing left in line: once an acquire() call ended (gave up, was
    cancelled, its lock was released, or its process died), and no fault or
    late delivery happened for its place's lifetime (its wait slice +
    ``PLACE_MARGIN``) plus one more slice and server tick (a vote written
    behind a BLPOP runs that much after its bytes land) (+ drift and slack),
    its place is in no node's waiting line of any of its resources;
(i) automatic extension: a watchdog with no ``max_hold`` stops extending a
    lock only once the lock is lost or released, never for a limit (the
    caller's own extensions count against ``max_extensions``, the watchdog's
    do not).
(j) one caller per lock: at most one caller (a greenlet of a process running
    the real manager) is inside a lock's with block at a time; the same caller
    may nest (``reentrant=True``);
(k) loss reported: a with block whose lock's validity ran out before it ended
    reports the loss at its exit (``LockLost``);
(l) no extension after release: a process never writes an extension of a
    value after it wrote that value's release.
(m) no false loss at release: a release that reports its lock lost ("at
    release N of M nodes no longer stored this holder's value") is honest: when
    the release began, fewer than a quorum of nodes kept the value until the
    report (every member, its key not expiring before then, the node neither
    crashed nor replaced since). Only the holder's own process could have
    deleted it otherwise (a release debt racing its own round).

With ``fair=True`` (runs without faults), two more:

(f) fairness, strict FIFO per line: a call is never granted a resource while an
    earlier call (lower ticket) that was already in that resource's line on
    every node before it started still waits. This is meant to hold for locks
    on several resources too, with no exception: a node grants a vote only to
    a caller first in every line it is in, so wherever the earlier call's place
    is in that resource's line, the later call is second there, whichever of
    its other members the earlier call still waits for; the later call needs a
    quorum of such nodes, so the rule holds as long as the earlier call's
    place stays in line on more than ``N - quorum`` nodes until it is granted
    or leaves. A call that waits for two resources thus holds up the line of
    one while it waits for the other: the price of never skipping anyone.
(g) wake-up: after a release, for each released resource with someone in its
    line on every node, some call on that resource is granted within
    ``wake_within`` true seconds, unless every such waiter is *blocked
    elsewhere* (:meth:`Checker._blocked`). With one resource per call nobody is
    ever blocked elsewhere and this is the plain rule. With several, a release
    wakes the first in line, and the first may be a call that also waits for
    another resource: its vote is refused while that other member is held, or
    while an earlier call is ahead of it in that member's line, and every call
    behind it in this line waits behind it (f). Nobody can be granted this
    resource from this wake-up then; the grant comes when the other member is
    released, whose own release is checked in turn (and a lock that lapses
    without a release wakes nobody: waiters vote again at the end of their
    wait slice, by design). So a miss is excused only for a waiter that, at
    some moment between the release and the check, had another member held by
    someone, or an earlier call ahead of it in the line of another member, or
    an earlier call ahead of it in this line that was itself blocked
    elsewhere. A waiter that nothing blocks must still be granted in time.

A broken promise raises :class:`Violation` with the seed and the trace tail.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from django_redlock.core.base import PLACE_MARGIN

from .redis_model import SimNode
from .world import Exhaustive, Process, World

__all__ = ["Call", "Checker", "Holding", "Violation", "members"]

EPS = 1e-9
#: How many recent holdings, grants and calls are kept per resource (bounded memory).
RECENT = 64


class Violation(AssertionError):
    """An invariant broke; the message carries the seed and the end of the trace."""


def members(resource: str | Iterable[str]) -> tuple[str, ...]:
    """The resources a report names: one (a string) or several, sorted and each once (as the engine keeps them)."""
    if isinstance(resource, str):
        return (resource,)
    return tuple(sorted(set(resource)))


def name_of(resources: Sequence[str]) -> str:
    return ", ".join(resources)


@dataclass
class Holding:
    """One lock a client returned to its caller (on one resource or several)."""

    client: str
    resources: tuple[str, ...]
    value: bytes
    seq: int  # acquisition order
    since: float  # true time of acquisition
    valid_until: float  # true time its validity ends on the holder's clock
    ended: float = math.inf  # true time it was released, given up or lost
    token: int | None = None
    extensions: int = 0
    #: The clients that held it before ``client`` (handed off with adopt()).
    handed_from: tuple[str, ...] = ()
    #: (j): the callers inside it (a with block), by id, and how deep.
    inside: dict[int, int] = field(default_factory=dict)

    @property
    def resource(self) -> str:
        return name_of(self.resources)

    @property
    def end(self) -> float:
        return min(self.ended, self.valid_until)


@dataclass(eq=False)
class Call:
    """One acquire() call, as its votes show it: its ticket and, for a blocking call, its place in line."""

    seq: int
    client: str
    resources: tuple[str, ...]
    started: float  # true time of the call
    ticket: int | None = None
    place: bytes = b""
    in_line: bool = False  # it took a place (voted "join" or "wait")
    life: int = 0  # the longest place lifetime its votes asked for (ms)
    #: resource -> true time its place was first seen in that resource's line on every node
    joined_at: dict[str, float] = field(default_factory=dict)
    granted: float = math.inf
    ended: float = math.inf

    @property
    def resource(self) -> str:
        return name_of(self.resources)

    @property
    def joined(self) -> float:
        """True time its place was in every one of its lines on every node (inf: not yet)."""
        return max((self.joined_at.get(r, math.inf) for r in self.resources), default=math.inf)

    @property
    def order(self) -> tuple[int, bytes]:
        return (self.ticket if self.ticket is not None else 0, self.place)

    @property
    def waiting(self) -> bool:
        return self.granted == math.inf and self.ended == math.inf


@dataclass
class _Gone:
    client: str
    value: bytes
    resource: str
    since: float
    bound: float
    checks: int = 0
    #: Earlier holders of the value (a hand-off): their late bytes (a late SET) disturb it too.
    also: tuple[str, ...] = ()
    #: A copy set by an earlier holder after the release was given its ttl to expire.
    late_set: bool = False


def _b(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode("utf-8")


def _trim(items: list[Any]) -> None:
    if len(items) > RECENT:
        del items[:-RECENT]


@dataclass
class Checker:
    """Feed it the client's outcomes; it raises :class:`Violation` on a broken promise.

    ``ttl`` is the default lock ttl (seconds) used for (d); ``key_of`` maps a
    resource to its key on the nodes (the engine's default prefix by default).
    """

    world: World
    nodes: Sequence[SimNode]
    ttl: float
    quorum: int | None = None
    key_of: Callable[[str], str] = field(default=lambda resource: f"redlock:lock:{resource}")
    #: resource -> the keys of its waiting line (order, places) on the nodes.
    line_of: Callable[[str], tuple[str, str]] = field(
        default=lambda resource: (f"redlock:queue:{resource}", f"redlock:places:{resource}"))
    slack: float = 0.05
    #: Check (f) fairness and (g) wake-up: only for runs without faults.
    fair: bool = False
    wake_within: float = 0.1
    trace_tail: int = 60
    #: Per resource: the recent holdings of it (a lock on several is in the list of each).
    holdings: dict[str, list[Holding]] = field(default_factory=dict)
    by_value: dict[bytes, Holding] = field(default_factory=dict)
    acquisitions: int = 0
    #: How many of them held several resources at once.
    acquisitions_of_several: int = 0
    last_acquired_at: float = -math.inf
    #: How many (d) checks concluded (a value was looked for on every node).
    leftover_checks: int = 0
    #: How many (h) checks concluded, and how many calls took a place in line.
    line_checks: int = 0
    calls: int = 0
    #: Per resource: calls under way (for (f) and (g)), and the grants in order (for fairness statistics).
    active: dict[str, list[Call]] = field(default_factory=dict)
    grants: dict[str, list[Call]] = field(default_factory=dict)
    #: Per resource: the recent calls on it, over or not (for (g): who was ahead of whom).
    recent_calls: dict[str, list[Call]] = field(default_factory=dict)
    #: (g): true seconds from each release (with someone in line) to the next grant on that resource.
    wake_delays: list[float] = field(default_factory=list)
    #: (g): releases after which nobody was granted in time because every waiter was blocked elsewhere.
    wakes_excused: int = 0

    def __post_init__(self) -> None:
        #: value -> (true time its release began, [(node, true time its key expires, run id)]): for (m).
        self.releasing: dict[bytes, tuple[float, list[tuple[SimNode, float, str]]]] = {}
        if self.quorum is None:
            self.quorum = len(self.nodes) // 2 + 1
        self._gone_pending = 0
        self._last_grant: dict[str, float] = {}

    # -- reports from the client driver -------------------------------------------------

    def acquired(self, client: Process, resource: str | Iterable[str], value: Any, validity: float,
                 fencing_token: int | None = None, deadline_local: float | None = None,
                 call: Call | None = None) -> Holding:
        """The client returned a lock with ``validity`` local seconds left (or a local deadline)."""
        world = self.world
        now = world.now
        resources = members(resource)
        for r in resources:
            self._last_grant[r] = now
        if call is not None:
            self._granted(call, now)
        until = client.clock.to_true(deadline_local) if deadline_local is not None \
            else now + client.clock.true_duration(validity)
        v = _b(value)
        self.acquisitions += 1
        self.acquisitions_of_several += len(resources) > 1
        self.last_acquired_at = now
        h = Holding(client.name, resources, v, self.acquisitions, now, until)
        world.note(client.name, "ACQUIRED", h.resource, v, f"validity={validity:.6f}",
                   f"valid_until={until:.6f}")
        for r in resources:
            held = self.holdings.setdefault(r, [])
            _trim(held)  # old holdings ended long ago
            self._exclusive(h, r, held, now)
        self._honest(h, until - now, "acquired")
        for r in resources:
            self.holdings[r].append(h)
        self.by_value[v] = h
        if fencing_token is not None:
            self.fenced(client, resources, v, fencing_token)
        return h

    def extended(self, client: Process, resource: str | Iterable[str], value: Any, validity: float,
                 deadline_local: float | None = None) -> None:
        """The client extended its lock: ``validity`` local seconds from now."""
        now = self.world.now
        h = self._holding(value, "extended")
        until = client.clock.to_true(deadline_local) if deadline_local is not None \
            else now + client.clock.true_duration(validity)
        self.world.note(client.name, "EXTENDED", h.resource, h.value, f"validity={validity:.6f}")
        if h.end <= now + EPS:
            # The lock had lapsed: extending it is acquiring it anew.
            for r in h.resources:
                self._exclusive(h, r, [o for o in self.holdings.get(r, []) if o is not h], now)
        self._honest(h, until - now, "extended")
        h.valid_until = until
        h.extensions += 1

    def adopted(self, client: Process, value: Any, validity: float, deadline_local: float | None = None) -> None:
        """``client`` adopted the lock holding ``value`` (handed over by its holder), valid that long:
        (c) as for an acquisition; the holder is ``client`` from now on."""
        now = self.world.now
        h = self._holding(value, "adopted")
        until = client.clock.to_true(deadline_local) if deadline_local is not None \
            else now + client.clock.true_duration(validity)
        self.world.note(client.name, "ADOPTED", h.resource, h.value, f"validity={validity:.6f}")
        self._honest(h, until - now, "adopted")
        h.handed_from = (*h.handed_from, h.client)
        h.client = client.name
        h.valid_until = until

    def fenced(self, client: Process, resource: str | Iterable[str], value: Any, token: int) -> None:
        """The client was handed ``token`` for its lock (one token for all of its resources)."""
        h = self._holding(value, "fenced")
        h.token = token
        self.world.note(client.name, "FENCED", h.resource, h.value, f"token={token}")
        for r in h.resources:
            for o in self.holdings.get(r, []):
                if o is h or o.token is None:
                    continue
                if (o.seq < h.seq) != (o.token < token) or o.token == token:
                    self._fail(
                        f"(b) fencing: {r!r}: {h.client} (acquisition #{h.seq} of {h.resource!r}) got token "
                        f"{token}, but {o.client} (acquisition #{o.seq} of {o.resource!r}) has token {o.token}"
                    )

    def released(self, client: Process, resource: str | Iterable[str], value: Any, ttl: float | None = None) -> None:
        """The client's release returned (its lock ends now, whatever the nodes said)."""
        self._keepers_at_release(members(resource), _b(value))
        self._ended(client, resource, value, ttl, "RELEASED")
        if self.fair:
            self._expect_wake(members(resource))

    def loss_at_release(self, client: Process, resource: str | Iterable[str], value: Any) -> None:
        """The client's release judged its lock lost from the nodes' replies (m)."""
        began = self.releasing.pop(_b(value), None)
        if began is None:
            return
        since, keepers = began
        now = self.world.now
        kept = [node.name for node, until, run_id in keepers
                if node.up and node.run_id == run_id and until > now + self.slack]
        assert self.quorum is not None
        if len(kept) >= self.quorum:
            self._fail(f"(m) no false loss: {client.name}'s release of {name_of(members(resource))!r} (begun "
                       f"t={since:.6f}) reported the lock lost, but {', '.join(kept)} stored its value then, with a "
                       f"ttl past now, and none of them restarted since: only the holder's own process can "
                       f"have deleted it")

    def _keepers_at_release(self, resources: tuple[str, ...], value: bytes) -> None:
        """Note, as a release begins, the nodes that keep ``value`` on every member, until when (true
        time) and under which run id: for (m)."""
        now = self.world.now
        keepers = []
        for node in self.nodes:
            found = [node.peek(self.key_of(r)) for r in resources]
            if all(f is not None and f[0] == value for f in found):
                until = min(math.inf if f[1] is None else now + f[1] for f in found if f is not None)
                keepers.append((node, until, node.run_id))
        if len(self.releasing) >= 4 * RECENT:
            del self.releasing[next(iter(self.releasing))]  # the oldest: reported long ago, or never
        self.releasing[value] = (now, keepers)

    def gave_up(self, client: Process, resource: str | Iterable[str], value: Any, ttl: float | None = None) -> None:
        """The client abandoned ``value`` (a failed attempt, or a lock it lost)."""
        self._ended(client, resource, value, ttl, "GAVE_UP")

    def stopped_extending(self, client: Process, resource: str | Iterable[str], why: str) -> None:
        """The client's watchdog (no ``max_hold``) stopped extending a lock that is still held."""
        self._fail(f"(i) automatic extension: {client.name}'s watchdog stopped extending "
                   f"{name_of(members(resource))!r}, which only max_hold may end: {why}")

    def entered(self, client: Process, caller: int, value: Any) -> None:
        """A caller (one greenlet of ``client``) entered the with block of the lock holding ``value``."""
        h = self._holding(value, "entered")
        others = [c for c, depth in h.inside.items() if depth and c != caller]
        if others:
            self._fail(f"(j) one caller per lock: a caller of {client.name} entered {h.resource!r} "
                       f"(acquisition #{h.seq}) while another caller is inside it")
        h.inside[caller] = h.inside.get(caller, 0) + 1

    def leaving(self, client: Process, caller: int, value: Any, outer: bool) -> bool:
        """The caller's with block ends now; True when this is its outermost entry and the lock's
        validity ran out before this moment, so the exit must report the loss (k)."""
        h = self._holding(value, "left")
        h.inside[caller] -= 1
        return outer and h.valid_until < self.world.now - 1e-6

    def loss_unreported(self, client: Process, resource: str | Iterable[str], value: Any) -> None:
        self._fail(f"(k) loss reported: {client.name} left the with block of {name_of(members(resource))!r} "
                   f"after its validity ran out, and the exit reported no loss (LockLost)")

    def extended_after_release(self, client: Process, value: Any) -> None:
        self._fail(f"(l) no extension after release: {client.name} wrote an extension of value "
                   f"{_b(value)[:12]!r}.. after it wrote that value's release")

    def expect_progress(self, within: float) -> None:
        """Require some acquisition within ``within`` true seconds from now."""
        start = self.world.now

        def check() -> None:
            if self.last_acquired_at < start:
                self._fail(f"(e) progress: no lock acquired in {within:.3f}s since t={start:.6f}")

        self.world.after(within, check)

    def pending(self) -> int:
        """How many given-up values still await their leftover check (d)."""
        return self._gone_pending

    # -- the waiting line -------------------------------------------------------------------

    def call(self, client: Process, resource: str | Iterable[str]) -> Call:
        """An acquire() call begins (on one resource or several)."""
        self.calls += 1
        call = Call(self.calls, client.name, members(resource), self.world.now)
        for r in call.resources:
            self.active.setdefault(r, []).append(call)
            seen = self.recent_calls.setdefault(r, [])
            _trim(seen)
            seen.append(call)
        return call

    def voted(self, call: Call, mode: Any, place: Any, ticket: Any, life: Any) -> None:
        """The call writes a vote (mode "once", "join" or "wait"; ``life``: its place's lifetime, ms)."""
        call.ticket = int(ticket)
        call.place = _b(place)
        if _b(mode) != b"once":
            call.in_line = True
            call.life = max(call.life, int(life))

    def vote_answered(self, call: Call) -> None:
        """A vote of the call came back: under ``fair``, find when its place is on every node."""
        if self.fair and call.in_line and call.joined == math.inf:
            self._poll_joined(call)

    def _poll_joined(self, call: Call) -> None:
        if not call.waiting or call.joined < math.inf:
            return
        for r in call.resources:
            if r not in call.joined_at:
                queue, places = self.line_of(r)
                if all(node.in_line(queue, places, call.place) for node in self.nodes):
                    call.joined_at[r] = self.world.now
        if call.joined == math.inf:
            self.world.after(0.002, self._poll_joined, call)

    def left_line(self, call: Call) -> None:
        """The call is over (gave up, cancelled, died, or its lock was released): its place must go."""
        if call.ended < math.inf:
            return
        call.ended = self.world.now
        for r in call.resources:
            held = self.active.get(r, [])
            if call in held:
                held.remove(call)
        if call.in_line:
            # A place lives ``life`` (its wait slice + PLACE_MARGIN) after the vote that refreshed it
            # last. That vote ran before the call ended, or, written behind a BLPOP, at most one
            # slice (+ the server tick that notices a BLPOP timeout) after its bytes landed.
            min_rate = min(n.clock.rate for n in self.nodes)
            life = call.life / 1000.0
            wait = max(0.0, life - PLACE_MARGIN) + max(n.tick for n in self.nodes)
            bound = (life + wait) / min_rate + self.slack
            self._gone_pending += 1
            self.world.after(bound, self._check_left, call, call.ended, bound)

    def _check_left(self, call: Call, since: float, bound: float) -> None:
        world = self.world
        if world.faults:
            world.after(bound / 4, self._check_left, call, since, bound)
            return
        since = max(since, world.disturbed_since(call.client))
        if world.now < since + bound - EPS:
            world.at(since + bound, self._check_left, call, since, bound)
            return
        self._gone_pending -= 1
        self.line_checks += 1
        left = []
        for r in call.resources:
            queue, places = self.line_of(r)
            left += [f"{n.name} ({r!r})" if len(call.resources) > 1 else n.name
                     for n in self.nodes if n.up and n.in_line(queue, places, call.place)]
        if left:
            self._fail(
                f"(h) left in line: the place {call.place[:12]!r}.. of {call.client}'s call on "
                f"{call.resource!r}, over at t<={since:.6f}, is still in line on {', '.join(left)} at t={world.now:.6f}"
            )

    def _granted(self, call: Call, now: float) -> None:
        call.granted = now
        for r in call.resources:
            grants = self.grants.setdefault(r, [])
            grants.append(call)
            if len(grants) > 10_000:
                del grants[:5_000]
            held = self.active.get(r, [])
            if call in held:
                held.remove(call)
        if not self.fair:
            return
        # (f), per line: nobody earlier that was in this resource's line on every node before
        # the call started may still wait, whatever else either call waits for.
        for r in call.resources:
            for other in self.active.get(r, []):
                joined = other.joined_at.get(r, math.inf)
                if other.waiting and joined < call.started and other.order < call.order:
                    self._fail(
                        f"(f) fairness: {call.client}'s call on {call.resource!r} (ticket {call.ticket}, "
                        f"started t={call.started:.6f}) was granted {r!r} while {other.client}'s call on "
                        f"{other.resource!r} (ticket {other.ticket}) waits in {r!r}'s line on every node "
                        f"since t={joined:.6f}"
                    )

    def _expect_wake(self, resources: tuple[str, ...]) -> None:
        now = self.world.now
        for r in resources:
            waiting = [c for c in self.active.get(r, []) if c.waiting and c.joined_at.get(r, math.inf) <= now]
            if waiting:
                self.world.after(self.wake_within, self._check_wake, r, now, waiting)

    def _check_wake(self, resource: str, released: float, waiting: list[Call]) -> None:
        """(g) for one released resource: a grant on it since ``released``, or every waiter blocked elsewhere."""
        first = min((c.granted for c in self.grants.get(resource, ())[-RECENT:] if c.granted > released),
                    default=None)
        if first is not None:
            self.wake_delays.append(first - released)
            return
        still = [c for c in waiting if c.waiting]
        if not still:
            return
        now = self.world.now
        free = [c for c in still if self._blocked(c, resource, released, now) is None]
        if not free:
            self.wakes_excused += 1
            return
        stuck = free[0]
        self._fail(
            f"(g) wake-up: {resource!r} was released at t={released:.6f} while {stuck.client}'s call on "
            f"{stuck.resource!r} waited in line (ticket {stuck.ticket}), blocked by nothing else; "
            f"nobody was granted {resource!r} within {self.wake_within:.3f}s"
        )

    def _blocked(self, call: Call, resource: str, since: float, until: float) -> str | None:
        """Why ``call``, waiting in ``resource``'s line, may rightly not be granted ``resource`` between
        ``since`` and ``until`` (None: nothing stops it), for (g).

        * another of its members was held by someone at some moment in that time (a lock that ended
          before ``since`` no longer counts; one that lapsed without a release counts for one more
          ttl, as long as its keys may live on the nodes);
        * an earlier call (lower ticket) waiting in line at some moment in that time is ahead of it
          in another member's line: that call goes first there (f);
        * an earlier call ahead of it in ``resource``'s own line is itself blocked elsewhere.
        """
        for m in call.resources:
            if m == resource:
                continue
            for o in self.holdings.get(m, ()):
                if o.since <= until and o.ended > since and o.valid_until + self.ttl > since:
                    return f"{m!r} held by {o.client} (acquisition #{o.seq} of {o.resource!r})"
        for m in call.resources:
            for e in self.recent_calls.get(m, ()):
                if e is call or not e.in_line or e.order >= call.order:
                    continue
                if e.started > until or min(e.granted, e.ended) <= since:
                    continue  # not in line during that time
                if m != resource:
                    return f"behind {e.client}'s call on {e.resource!r} in {m!r}'s line"
                why = self._blocked(e, resource, since, until)
                if why is not None:
                    return f"behind {e.client}'s call on {e.resource!r}, itself blocked: {why}"
        return None

    # -- checks ---------------------------------------------------------------------------

    def _exclusive(self, h: Holding, resource: str, others: Sequence[Holding], now: float) -> None:
        for o in others:
            if o.end > now + EPS:
                what = repr(resource) if len(h.resources) == 1 else f"{resource!r} (with {h.resource!r})"
                theirs = "" if o.resources == (resource,) else f" (with {o.resource!r})"
                self._fail(
                    f"(a) exclusion: {h.client} acquired {what} at t={now:.6f} while {o.client} "
                    f"holds it{theirs} (acquired t={o.since:.6f}, valid until t={o.valid_until:.6f}, "
                    f"{'released t=%.6f' % o.ended if o.ended < math.inf else 'not released'})"
                )

    def _kept(self, node: SimNode, key: str, value: bytes, validity_true: float) -> tuple[bool, str]:
        """Does ``node`` keep ``value`` at ``key`` for ``validity_true`` more true seconds, and what it has."""
        found = node.peek(key)
        down = ""
        lost = node.peek_lost(key, self.ttl)
        if found is None or (lost is not None and lost[0] == value):
            # A node down since a crash that lost the key votes for no one while down,
            # nor while it sits out after its restart (up for less than the ttl), even
            # if another caller's vote set the key there meanwhile: it keeps the lock as
            # well as if it still held the key (a restart that votes too early is caught
            # by (a), not here). A key of the same value set there again meanwhile (an
            # extension) counts no longer than the lost one: the node takes part in no
            # lock that was active when it crashed until it has sat out.
            found = lost
            down = " (lost in a crash; down or sitting out)"
        if found is None:
            return False, "none"
        stored, left = found
        if stored != value:
            return False, "other value"
        return left is None or left >= validity_true - EPS, f"{'no ttl' if left is None else f'{left:.6f}s'}{down}"

    def _honest(self, h: Holding, validity_true: float, what: str) -> None:
        if validity_true <= 0:
            return
        good = []
        seen = []
        for node in self.nodes:
            # The lock is one lock: a node keeps it only if it keeps every member.
            kept = [(r, *self._kept(node, self.key_of(r), h.value, validity_true)) for r in h.resources]
            if len(kept) == 1:
                seen.append(f"{node.name}: {kept[0][2]}")
            else:
                seen.append(f"{node.name}: " + ", ".join(f"{r} {state}" for r, _, state in kept))
            if all(ok for _, ok, _ in kept):
                good.append(node.name)
        assert self.quorum is not None
        if len(good) < self.quorum:
            every = "" if len(h.resources) == 1 else " on every member"
            self._fail(
                f"(c) validity: {h.client} {what} {h.resource!r} with {validity_true:.6f}s of validity "
                f"(true time), but only {len(good)} node(s) keep its value{every} that long "
                f"(quorum {self.quorum}): " + "; ".join(seen)
            )

    def _ended(self, client: Process, resource: str | Iterable[str], value: Any, ttl: float | None,
               what: str) -> None:
        now = self.world.now
        v = _b(value)
        h = self.by_value.pop(v, None)
        if h is not None and h.ended == math.inf:
            h.ended = now
        name = name_of(members(resource))
        self.world.note(client.name, what, name, v)
        min_rate = min(n.clock.rate for n in self.nodes)
        bound = (ttl if ttl is not None else self.ttl) / min_rate + self.slack
        # Given up by another process than its holder (a hand-off): the holder's late bytes count too.
        also = tuple(c for c in (*h.handed_from, h.client) if c != client.name) if h is not None else ()
        gone = _Gone(client.name, v, name, now, bound, also=also)
        self._gone_pending += 1
        self.world.after(bound, self._check_gone, gone)

    def _check_gone(self, gone: _Gone) -> None:
        world = self.world
        gone.checks += 1
        if world.faults:
            world.after(gone.bound / 4, self._check_gone, gone)  # wait for the faults to heal
            return
        disturbed = max(world.disturbed_since(c) for c in (gone.client, *gone.also))
        if disturbed > gone.since:
            gone.since = disturbed
        due = gone.since + gone.bound
        if world.now < due - EPS:
            world.at(due, self._check_gone, gone)
            return
        held = [(n, keys) for n in self.nodes if (keys := n.keys_holding(gone.value))]
        if held and gone.also and not gone.late_set:
            # A hand-off: an earlier holder's vote queued behind its blocking pop on a node may set
            # the value after the release (its late SET); that copy expires by itself.
            lives = [peeked[1] for n, keys in held for k in keys if (peeked := n.peek(k)) is not None]
            if lives and all(life is not None and life <= gone.bound for life in lives):
                gone.late_set = True
                world.after(max(lives) + EPS, self._check_gone, gone)  # type: ignore[type-var]
                return
        left = [f"{n.name} ({', '.join(k.decode('utf-8', 'replace') for k in keys)})" for n, keys in held]
        self._gone_pending -= 1
        self.leftover_checks += 1
        if left:
            self._fail(
                f"(d) leftover: value {gone.value[:12]!r}.. of {gone.resource!r} given up at "
                f"t<={gone.since:.6f} is still on {', '.join(left)} at t={world.now:.6f}"
            )

    def _holding(self, value: Any, what: str) -> Holding:
        h = self.by_value.get(_b(value))
        if h is None:
            self._fail(f"checker misuse: {what} for a value never acquired (or already ended): {value!r}")
        return h  # type: ignore[return-value]

    def _fail(self, message: str) -> None:
        world = self.world
        path = ""
        if isinstance(world.chooser, Exhaustive):
            path = "\nchoices: " + ", ".join(f"{lab}={v}/{n}" for lab, v, n in world.chooser.path())
        raise Violation(
            f"{message}\nseed={world.seed} t={world.now:.6f}{path}\n"
            f"--- last {self.trace_tail} trace lines ---\n{world.dump(self.trace_tail)}"
        )
