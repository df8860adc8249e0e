"""The state checker: Redlock's promises, checked against true time and node state.

A client driver reports what its client *returned* to the caller (acquired,
extended, fenced, released, gave up), at the true moment it happened. The
checker knows true time and can look inside every node, which no client can;
so it judges each report against the world's real state:

(a) exclusion: two locks on one resource are never valid at the same true
    time. A lock is valid from its acquisition until the earlier of its
    release and the true time its reported validity ends on the holder's clock;
(b) fencing: tokens order like acquisitions on each resource, strictly;
(c) honest validity: when a lock (or an extension) is returned, a quorum of
    nodes stores the holder's value for at least the reported validity, in
    true time, each node's remaining ttl measured on its own clock (a node
    that lost the key in a crash and is still down counts as keeping it: it
    votes for no one; if it rejoins too early, (a) catches the consequence);
(d) nothing left behind: once a holder released or gave up a value, and no
    fault or late delivery happened for one ttl (+ drift + slack), no node
    stores that value;
(e) progress: after :meth:`Checker.expect_progress`, some lock is acquired
    within the given bound;
(h) nothing left in line: once an acquire() call ended (gave up, was
    cancelled, its lock was released, or its process died), and no fault or
    late delivery happened for its place's lifetime (its wait slice +
    ``PLACE_MARGIN``) plus one more slice and server tick (a vote written
    behind a BLPOP runs that much after its bytes land) (+ drift and slack),
    its place is in no node's waiting line.

With ``fair=True`` (runs without faults), two more:

(f) fairness: a call is never granted while an earlier call (lower ticket)
    that was already in line on every node before it started still waits;
(g) wake-up: after a release, while someone waits in line, some call on that
    resource is granted within ``wake_within`` true seconds.

A broken promise raises :class:`Violation` with the seed and the trace tail.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from django_redlock.core.base import PLACE_MARGIN

from .redis_model import SimNode
from .world import Exhaustive, Process, World

__all__ = ["Call", "Checker", "Holding", "Violation"]

EPS = 1e-9


class Violation(AssertionError):
    """An invariant broke; the message carries the seed and the end of the trace."""


@dataclass
class Holding:
    """One lock a client returned to its caller."""

    client: str
    resource: str
    value: bytes
    seq: int  # acquisition order
    since: float  # true time of acquisition
    valid_until: float  # true time its validity ends on the holder's clock
    ended: float = math.inf  # true time it was released, given up or lost
    token: int | None = None
    extensions: int = 0

    @property
    def end(self) -> float:
        return min(self.ended, self.valid_until)


@dataclass(eq=False)
class Call:
    """One acquire() call, as its votes show it: its ticket and, for a blocking call, its place in line."""

    seq: int
    client: str
    resource: str
    started: float  # true time of the call
    ticket: int | None = None
    place: bytes = b""
    in_line: bool = False  # it took a place (voted "join" or "wait")
    life: int = 0  # the longest place lifetime its votes asked for (ms)
    joined: float = math.inf  # true time its place was first seen on every node
    granted: float = math.inf
    ended: float = math.inf

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


def _b(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode("utf-8")


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
    holdings: dict[str, list[Holding]] = field(default_factory=dict)
    by_value: dict[bytes, Holding] = field(default_factory=dict)
    acquisitions: int = 0
    last_acquired_at: float = -math.inf
    #: How many (d) checks concluded (a value was looked for on every node).
    leftover_checks: int = 0
    #: How many (h) checks concluded, and how many calls took a place in line.
    line_checks: int = 0
    calls: int = 0
    #: Per resource: calls under way (for (f) and (g)), and the grants in order (for fairness statistics).
    active: dict[str, list[Call]] = field(default_factory=dict)
    grants: dict[str, list[Call]] = field(default_factory=dict)
    #: (g): true seconds from each release (with someone in line) to the next grant on that resource.
    wake_delays: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.quorum is None:
            self.quorum = len(self.nodes) // 2 + 1
        self._gone_pending = 0
        self._last_grant: dict[str, float] = {}

    # -- reports from the client driver -------------------------------------------------

    def acquired(self, client: Process, resource: str, value: Any, validity: float,
                 fencing_token: int | None = None, deadline_local: float | None = None,
                 call: Call | None = None) -> Holding:
        """The client returned a lock with ``validity`` local seconds left (or a local deadline)."""
        world = self.world
        now = world.now
        self._last_grant[resource] = now
        if call is not None:
            self._granted(call, now)
        until = client.clock.to_true(deadline_local) if deadline_local is not None \
            else now + client.clock.true_duration(validity)
        v = _b(value)
        self.acquisitions += 1
        self.last_acquired_at = now
        h = Holding(client.name, resource, v, self.acquisitions, now, until)
        world.note(client.name, "ACQUIRED", resource, v, f"validity={validity:.6f}",
                   f"valid_until={until:.6f}")
        held = self.holdings.setdefault(resource, [])
        if len(held) > 64:  # bounded memory: old holdings ended long ago
            del held[:-64]
        self._exclusive(h, held, now)
        self._honest(h, until - now, "acquired")
        held.append(h)
        self.by_value[v] = h
        if fencing_token is not None:
            self.fenced(client, resource, v, fencing_token)
        return h

    def extended(self, client: Process, resource: str, value: Any, validity: float,
                 deadline_local: float | None = None) -> None:
        """The client extended its lock: ``validity`` local seconds from now."""
        now = self.world.now
        h = self._holding(value, "extended")
        until = client.clock.to_true(deadline_local) if deadline_local is not None \
            else now + client.clock.true_duration(validity)
        self.world.note(client.name, "EXTENDED", resource, h.value, f"validity={validity:.6f}")
        others = [o for o in self.holdings.get(resource, []) if o is not h]
        if h.end <= now + EPS:
            # The lock had lapsed: extending it is acquiring it anew.
            self._exclusive(h, others, now)
        self._honest(h, until - now, "extended")
        h.valid_until = until
        h.extensions += 1

    def fenced(self, client: Process, resource: str, value: Any, token: int) -> None:
        """The client was handed ``token`` for its lock."""
        h = self._holding(value, "fenced")
        h.token = token
        self.world.note(client.name, "FENCED", resource, h.value, f"token={token}")
        for o in self.holdings.get(resource, []):
            if o is h or o.token is None:
                continue
            if (o.seq < h.seq) != (o.token < token) or o.token == token:
                self._fail(
                    f"(b) fencing: {resource!r}: {h.client} (acquisition #{h.seq}) got token {token}, "
                    f"but {o.client} (acquisition #{o.seq}) has token {o.token}"
                )

    def released(self, client: Process, resource: str, value: Any, ttl: float | None = None) -> None:
        """The client's release returned (its lock ends now, whatever the nodes said)."""
        self._ended(client, resource, value, ttl, "RELEASED")
        if self.fair:
            self._expect_wake(resource)

    def gave_up(self, client: Process, resource: str, value: Any, ttl: float | None = None) -> None:
        """The client abandoned ``value`` (a failed attempt, or a lock it lost)."""
        self._ended(client, resource, value, ttl, "GAVE_UP")

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

    def call(self, client: Process, resource: str) -> Call:
        """An acquire() call begins."""
        self.calls += 1
        call = Call(self.calls, client.name, resource, self.world.now)
        self.active.setdefault(resource, []).append(call)
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
        queue, places = self.line_of(call.resource)
        if all(node.in_line(queue, places, call.place) for node in self.nodes):
            call.joined = self.world.now
        else:
            self.world.after(0.002, self._poll_joined, call)

    def left_line(self, call: Call) -> None:
        """The call is over (gave up, cancelled, died, or its lock was released): its place must go."""
        if call.ended < math.inf:
            return
        call.ended = self.world.now
        held = self.active.get(call.resource, [])
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
        queue, places = self.line_of(call.resource)
        left = [n.name for n in self.nodes if n.up and n.in_line(queue, places, call.place)]
        if left:
            self._fail(
                f"(h) left in line: the place {call.place[:12]!r}.. of {call.client}'s call on "
                f"{call.resource!r}, over at t<={since:.6f}, is still in line on {', '.join(left)} at t={world.now:.6f}"
            )

    def _granted(self, call: Call, now: float) -> None:
        call.granted = now
        self.grants.setdefault(call.resource, []).append(call)
        if len(self.grants[call.resource]) > 10_000:
            del self.grants[call.resource][:5_000]
        held = self.active.get(call.resource, [])
        if call in held:
            held.remove(call)
        if not self.fair:
            return
        for other in held:
            if other.waiting and other.joined < call.started and other.order < call.order:
                self._fail(
                    f"(f) fairness: {call.client}'s call (ticket {call.ticket}, started t={call.started:.6f}) "
                    f"was granted {call.resource!r} while {other.client}'s call (ticket {other.ticket}) "
                    f"waits in line on every node since t={other.joined:.6f}"
                )

    def _expect_wake(self, resource: str) -> None:
        now = self.world.now
        waiting = [c for c in self.active.get(resource, []) if c.waiting and c.joined <= now]
        if not waiting:
            return

        def check() -> None:
            first = min((c.granted for c in self.grants.get(resource, ())[-64:] if c.granted > now), default=None)
            if first is not None:
                self.wake_delays.append(first - now)
                return
            if any(c.waiting for c in waiting):
                stuck = next(c for c in waiting if c.waiting)
                self._fail(
                    f"(g) wake-up: {resource!r} was released at t={now:.6f} while {stuck.client} waited in line "
                    f"(ticket {stuck.ticket}); nobody was granted it within {self.wake_within:.3f}s"
                )

        self.world.after(self.wake_within, check)

    # -- checks ---------------------------------------------------------------------------

    def _exclusive(self, h: Holding, others: Sequence[Holding], now: float) -> None:
        for o in others:
            if o.end > now + EPS:
                self._fail(
                    f"(a) exclusion: {h.client} acquired {h.resource!r} at t={now:.6f} while {o.client} "
                    f"holds it (acquired t={o.since:.6f}, valid until t={o.valid_until:.6f}, "
                    f"{'released t=%.6f' % o.ended if o.ended < math.inf else 'not released'})"
                )

    def _honest(self, h: Holding, validity_true: float, what: str) -> None:
        if validity_true <= 0:
            return
        key = self.key_of(h.resource)
        good = []
        seen = []
        for node in self.nodes:
            found = node.peek(key)
            down = ""
            if found is None:
                # A node down since a crash that lost the key votes for no one while down,
                # nor while it sits out after its restart (up for less than the ttl): it
                # keeps the lock as well as if it still held the key (a restart that votes
                # too early is caught by (a), not here).
                found = node.peek_lost(key, self.ttl)
                down = " (lost in a crash; down or sitting out)"
            if found is None:
                seen.append(f"{node.name}: none")
                continue
            value, left = found
            if value != h.value:
                seen.append(f"{node.name}: other value")
                continue
            seen.append(f"{node.name}: {'no ttl' if left is None else f'{left:.6f}s'}{down}")
            if left is None or left >= validity_true - EPS:
                good.append(node.name)
        assert self.quorum is not None
        if len(good) < self.quorum:
            self._fail(
                f"(c) validity: {h.client} {what} {h.resource!r} with {validity_true:.6f}s of validity "
                f"(true time), but only {len(good)} node(s) keep its value that long "
                f"(quorum {self.quorum}): " + "; ".join(seen)
            )

    def _ended(self, client: Process, resource: str, value: Any, ttl: float | None, what: str) -> None:
        now = self.world.now
        v = _b(value)
        h = self.by_value.pop(v, None)
        if h is not None and h.ended == math.inf:
            h.ended = now
        self.world.note(client.name, what, resource, v)
        min_rate = min(n.clock.rate for n in self.nodes)
        bound = (ttl if ttl is not None else self.ttl) / min_rate + self.slack
        gone = _Gone(client.name, v, resource, now, bound)
        self._gone_pending += 1
        self.world.after(bound, self._check_gone, gone)

    def _check_gone(self, gone: _Gone) -> None:
        world = self.world
        gone.checks += 1
        if world.faults:
            world.after(gone.bound / 4, self._check_gone, gone)  # wait for the faults to heal
            return
        disturbed = world.disturbed_since(gone.client)
        if disturbed > gone.since:
            gone.since = disturbed
        due = gone.since + gone.bound
        if world.now < due - EPS:
            world.at(due, self._check_gone, gone)
            return
        left = [n.name for n in self.nodes if n.holds_value(gone.value)]
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
