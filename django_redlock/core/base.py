"""What the sync and async engines share: quorum arithmetic, the judging of replies, the errors,
an acquire call's plan (:class:`Attempts`) and a hand-off's read (:class:`Adoption`). The
settings and their checks are in :mod:`~django_redlock.core.config`, named here too.

Nothing here does I/O. The two engines build the same commands and judge the
same replies with these functions, so they cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Sequence
from typing import Any, Literal

from django_redlock.core import config, ledger
from django_redlock.core.config import *  # noqa: F403 - the settings are named here too
from django_redlock.core.books import Failure
from django_redlock.core.rounds import Granted
from django_redlock.core.records import ForcedRelease, agreed_holder
from django_redlock.core.scripts import (
    ACQUIRE,
    EXTEND,
    HELD,
    INSPECT,
    NO_PLACE,
    NOT_FIRST,
    RECREATED,
    VOTE,
    Script,
    script_command,
)
from django_redlock.exceptions import LockError, LockLost, LockNotAcquired, QuorumUnavailable

__all__ = ["Mode"]
# Callers and the simulator's mutants use base.X for the settings (core/config.py) too.
__all__ += config.__all__

#: How an ``acquire()`` call votes: "once" (no place in line), "join" (take a place, then vote)
#: or "wait" (vote when woken).
Mode = Literal["once", "join", "wait"]


#: A node sets a key's expiry in whole milliseconds of its clock: up to this much before its TIME.
EXPIRY_STEP = 0.001
#: A lock won after waiting in line with more than this fraction of its ttl gone is extended once.
TOP_UP = 0.1


def quorum_of(total: int) -> int:
    return total // 2 + 1


def set_command(key: str, value: str, ttl: float) -> tuple[Any, ...]:
    return ("SET", key, value, "NX", "PX", ms(ttl))


#: A granted vote's reply: RESP's ``+OK`` as both drivers read it (a :class:`~.rounds.Granted` equals it too).
OK = b"OK"


def is_ok(reply: Any) -> bool:
    return bool(reply == OK)


def deleted(reply: Any) -> bool:
    """A release's reply that says it deleted the key."""
    return bool(reply == 1)


#: The success tests that are an equality, with what they compare to: a round's replies are counted
#: against those in C (``list.count``), no Python call per reply (a Failure equals neither).
_EQUAL_TO: dict[Any, Any] = {is_ok: OK, deleted: 1}


def until_outcome(quorum: int, total: int, success: Any = is_ok) -> Any:
    """A ``done`` test for fan-outs: stop once success or failure is certain."""
    value = _EQUAL_TO.get(success)

    def done(results: list[Any]) -> bool:
        if value is not None:
            good = results.count(value)
            bad = len(results) - results.count(None) - good
        else:
            good = bad = 0
            for reply in results:
                if reply is None:
                    continue
                if not isinstance(reply, Failure) and success(reply):
                    good += 1
                else:
                    bad += 1
        return good >= quorum or bad > total - quorum

    return done


@functools.lru_cache(maxsize=64)  # one test per quorum and success: built once, not per call
def granted_or_all(quorum: int, success: Any = is_ok) -> Any:
    """A ``done`` test: stop at a quorum of successes, or once every node answered. For the votes
    of a call that will wait anyway (a failed vote then needs no release on nodes not heard from),
    and for releases (a quorum that deleted the key settles the outcome; the rest stay booked)."""
    value = _EQUAL_TO.get(success)

    def done(results: list[Any]) -> bool:
        if None not in results:
            return True
        return (results.count(value) if value is not None else count(results, success)) >= quorum

    return done


def count(results: Sequence[Any], success: Any = is_ok) -> int:
    value = _EQUAL_TO.get(success)
    if value is not None:
        return results.count(value)  # what the loop below counts, in C
    good = 0
    for reply in results:  # a loop, not a generator: a generator's every step is a Python call
        if reply is not None and not isinstance(reply, Failure) and success(reply):
            good += 1
    return good


def failures_of(
    nodes: Sequence[Any],
    results: Sequence[Any],
    refused: str = "held by another holder",
    success: Any = is_ok,
    refusals: dict[int, str] | None = None,
) -> dict[str, str]:
    """Node name -> why it did not say yes; ``refusals`` names integer replies (a vote's, see :data:`REFUSALS`)."""
    out: dict[str, str] = {}
    for node, reply in zip(nodes, results):
        name = node if isinstance(node, str) else node.name
        if isinstance(reply, Failure):
            out[name] = reply.reason
        elif reply is None or not success(reply):
            out[name] = refusals.get(reply, refused) if refusals and type(reply) is int else refused
    return out


#: What an ACQUIRE refusal means, for error messages.
REFUSALS = {
    HELD: "held by another holder",
    NOT_FIRST: "free, but another waiter is first in line",
    NO_PLACE: "our place in line had expired",
}


def definite(reply: Any) -> bool:
    """A vote's reply that says for sure whether our value was set (not a failure or a timeout)."""
    return reply is not None and not isinstance(reply, Failure) and not isinstance(reply, Exception)


def not_acquired(
    resource: str,
    nodes: Sequence[Any],
    results: Sequence[Any],
    quorum: int,
    *,
    validity_left: float | None = None,
    retry_after: float | None = None,
    attempts: int = 1,
    note: str = "",
    held: Sequence[tuple[str, Any, int]] = (),
) -> LockNotAcquired:
    """Build the error for a failed attempt, telling "held" from "nodes unavailable".

    ``held``: (resource, holder, nodes) of each resource a quorum of nodes agree who holds (see
    :func:`holders_of`). ``note`` ends the message (who in this process holds it, when known).
    """
    total = len(nodes)
    granted = count(results)
    failures = failures_of(nodes, results, refusals=REFUSALS)
    unreachable = sum(1 for r in results if isinstance(r, Failure) and not r.answered)
    detail = "; ".join(f"{name}: {why}" for name, why in failures.items())
    tries = f" after {attempts} attempts" if attempts > 1 else ""
    if granted >= quorum and validity_left is not None:
        message = (
            f"Could not lock {resource!r}{tries}: {granted} of {total} nodes agreed but the validity "
            f"ran out ({validity_left * 1000:.0f} ms left after drift); the ttl is too short for these nodes."
        )
        cls: type[LockNotAcquired] = LockNotAcquired
    elif total - unreachable < quorum:
        message = (
            f"Could not lock {resource!r}{tries}: only {total - unreachable} of {total} nodes answered, "
            f"{quorum} needed ({detail})."
        )
        cls = QuorumUnavailable
    else:
        message = f"Could not lock {resource!r}{tries}: {granted} of {total} nodes agreed, {quorum} needed ({detail})."
        cls = LockNotAcquired
    if held:
        message = f"{message} {held_text(resource, held, total)}"
    if any(ledger.DELAYED_RESTART in why for why in failures.values()):
        message = f"{message} {ledger.RESTART_ADVICE}"
    if note:
        message = f"{message} {note}"
    return cls(
        message,
        resource=resource,
        granted=granted,
        quorum=quorum,
        total=total,
        failures=failures,
        retry_after=retry_after,
        holder=str(held[0][1]) if held else None,
    )


def holders_of(
    resources: Sequence[str], replies: Sequence[Any], quorum: int, own: str = ""
) -> list[tuple[str, Any, int]]:
    """From INSPECT replies of the resources' keys: (resource, holder, nodes) of each one whose value a
    quorum of the nodes store (see :func:`~django_redlock.core.records.agreed_holder`), other than
    ``own`` (the caller's last attempt, still there where its release did not land)."""
    out = []
    for j, resource in enumerate(resources):
        values = [r[2 * j] if isinstance(r, list) and len(r) > 2 * j else None for r in replies]
        agreed = agreed_holder([None if v in (own, own.encode()) else v for v in values], quorum)
        if agreed is not None:
            out.append((resource, *agreed))
    return out


#: How many holders an error names at most (a lock on many resources may meet many).
NAMED_HOLDERS = 3


def held_text(resource: str, held: Sequence[tuple[str, Any, int]], total: int) -> str:
    """Who holds ``resource`` (or the resources it names), for an error: their host, pid and label
    (escaped) and the digest of their token, never the token itself (it authorizes release,
    extension and adoption)."""
    if held[0][0] == resource:
        _resource, holder, nodes = held[0]
        return f"It is held by {holder} on {nodes} of {total} nodes (holder digest {holder.digest})."
    parts = [
        f"{resource!r} by {holder} on {nodes} of {total} nodes (holder digest {holder.digest})"
        for resource, holder, nodes in held[:NAMED_HOLDERS]
    ]
    more = f" and {len(held) - NAMED_HOLDERS} more" if len(held) > NAMED_HOLDERS else ""
    return f"Held: {'; '.join(parts)}{more}."


def locked_of(resource: str, nodes: Sequence[Any], results: Sequence[Any], quorum: int) -> bool:
    """``is_locked()`` from PTTL replies: a quorum holds a live key (True) or a quorum has none (False).

    Anything in between cannot be told from "free": QuorumUnavailable. A node
    that sits out after a restart (its reply is a Failure, see
    :func:`~django_redlock.core.listing.read_locked`) counts as not answering:
    it may have forgotten the key of a lock that is held.
    """
    live = count(results, lambda r: isinstance(r, int) and (r > 0 or r == -1))
    if live >= quorum:
        return True
    if count(results, lambda r: isinstance(r, int)) - live >= quorum:
        return False
    failures = {
        (n if isinstance(n, str) else n.name): str(r) for n, r in zip(nodes, results) if isinstance(r, Failure)
    }
    detail = "; ".join(f"{name}: {why}" for name, why in failures.items())
    raise QuorumUnavailable(
        f"Cannot tell whether {resource!r} is locked: {live} of {len(results)} nodes hold it and too few of "
        f"the rest answered, and may be trusted, to rule it out ({detail}).",
        resource=resource,
        granted=live,
        quorum=quorum,
        total=len(results),
        failures=failures,
    )


def forced_release(resource: str, nodes: Sequence[Any], results: Sequence[Any]) -> ForcedRelease:
    """Judge the DEL replies of a forced release."""
    unreachable = {node.name: r.reason for node, r in zip(nodes, results) if isinstance(r, Failure)}
    return ForcedRelease(resource, count(results, lambda r: r == 1), len(nodes), unreachable)


def retry_after_of(results: Sequence[Any], quorum: int) -> float | None:
    """Seconds until fewer than a quorum of nodes hold the key, from PTTL replies."""
    ttls = sorted(
        (int(r) / 1000.0 for r in results if isinstance(r, int) and not isinstance(r, bool) and r > 0),
        reverse=True,
    )
    if len(ttls) < quorum:
        return 0.0 if ttls else None
    return ttls[quorum - 1]


def fence_value(reply: Any) -> int | None:
    """Parse a fencing counter reply (GET, or MGET: the highest); ``None`` for failures, 0 for a missing key."""
    if isinstance(reply, Failure):
        return None
    if reply is None:
        return 0
    if isinstance(reply, list):
        values = [fence_value(r) for r in reply]
        return None if not values or None in values else max(values)  # type: ignore[type-var]
    try:
        return int(reply)
    except (TypeError, ValueError):
        return None


def next_fence(reads: Sequence[Any], quorum: int, resource: str, wall_us: int) -> int:
    """The next fencing token: one more than the highest counter any quorum reports."""
    values = [v for v in (fence_value(r) for r in reads) if v is not None]
    if len(values) < quorum:
        raise lost_error(
            resource, f"only {len(values)} nodes answered the fencing read, {quorum} needed; no token was issued"
        )
    # Never below the wall clock in microseconds: if counters were lost with
    # restarted nodes, tokens still move forward with time.
    floor = wall_us  # wall clock in microseconds: a floor for tokens, never used for validity
    return max(max(values) + 1, floor)


def extend_command(keys: Sequence[str], value: str, ttl: float, mark: str, recreate: bool = False) -> tuple[Any, ...]:
    """EXTEND: set every key's ttl to ``ttl`` while each still stores ``value``; with ``recreate``,
    a key the node lost is set again where the node may vote (``mark``: the data-set marker key)."""
    return script_command(EXTEND, keys, (value, ms(ttl), "1" if recreate else "", mark, ""))


def extended(reply: Any) -> bool:
    """An EXTEND reply that says the node now keeps the key for the new ttl (extended or re-created)."""
    return type(reply) is int and (reply == 1 or reply == RECREATED)


def recreated(reply: Any) -> bool:
    """An EXTEND reply that says the node had lost a key and now holds it again."""
    return type(reply) is int and reply == RECREATED


def key_gone(reply: Any) -> bool:
    """An EXTEND reply from a node that no longer stored the holder's value (it refused, or re-created the key)."""
    return not isinstance(reply, Failure) and (reply == 0 or recreated(reply))


def extension_held(results: Sequence[Any], quorum: int, finished: float, old_deadline: float) -> bool:
    """An EXTEND fan-out holds when a quorum extended (or re-created) the keys, the nodes that had lost
    them leave a quorum that had not (a lock gone from a majority was released or taken: it is never
    brought back), and the lock was still valid once the last reply needed was read (``finished``);
    the new validity then counts from before its write."""
    gone = count(results, key_gone)
    return count(results, extended) >= quorum and gone <= len(results) - quorum and finished < old_deadline


def extension_settled(quorum: int, total: int) -> Any:
    """A ``done`` test for an EXTEND fan-out: stop once :func:`extension_held` is sure either way."""

    def done(results: list[Any]) -> bool:
        waiting = results.count(None)
        good = count(results, extended)
        gone = count(results, key_gone)
        return (good >= quorum and gone + waiting <= total - quorum) or good + waiting < quorum or gone > total - quorum

    return done


def lost_error(resource: str, why: str) -> LockLost:
    return LockLost(f"Lock {resource!r} was lost: {why}", resource=resource)


class Attempts:
    """One ``acquire()`` call's plan: its checked :class:`Request`, the holder, its place in line, when to give up.

    A blocking call takes a place in every node's waiting line, ordered by a
    ticket it picks once (its wall-clock start), and waits for a wake-up
    between votes; a vote is granted only to the first in line. A
    non-blocking call never takes a place; it votes with ``SET NX PX`` (see :meth:`vote`).
    Used by :func:`django_redlock.core.steps.acquire`; every time is passed in.
    """

    def __init__(self, config: ManagerConfig, request: Request, now: float, wall: int) -> None:
        self.config = config
        #: The resources, sorted (several are taken all or nothing), and the name messages use.
        self.resources = resources = request.resources
        self.resource = name_of(resources)
        self.ttl = request.ttl
        self.timeout = request.timeout
        self.blocking = blocking = request.blocking
        self.label = request.label
        line, heads = lines_of(config.key_prefix, resources)
        self.keys = line[::3]  # the lock key of each resource (config.key), from the line keys in threes
        self.key = self.keys[0]
        self.window = config.restart_window
        self._new_holder()
        self.begun = now
        if not blocking:
            self.deadline = now
        elif self.timeout is not None:
            self.deadline = now + self.timeout
        elif config.retry_count is None:
            self.deadline = math.inf
        else:
            self.deadline = now + config.retry_count * config.retry_delay
        self.mode: Mode = "join" if self.deadline > now else "once"
        #: This call's place in every node's line, and its ticket (the order; ties go by place).
        self.place = self.holder.token
        self.ticket = wall
        #: The script the votes run (None: a plain ``SET``). A call on one resource that does not
        #: wait votes with VOTE, or a plain SET with the restart rule off; the others run ACQUIRE.
        self.script: Script | None = ACQUIRE
        if self.mode == "once" and len(self.keys) == 1:
            self.script = VOTE if self.window > 0 else None
        #: ACQUIRE's KEYS (the line keys of each resource) and the wake list of this call's place in
        #: each line: only calls that run the script have them.
        self.line: tuple[str, ...] = ()
        self.wake: tuple[str, ...] = ()
        if self.script is ACQUIRE:
            self.line = line
            self.wake = tuple(map(str.__add__, heads, itertools.repeat(self.place)))  # no Python call
        #: How long the next vote may wait in line for a wake-up first (0: vote at once).
        self.slice = 0.0
        #: How long the last vote kept the place in line (node ms); its failed attempt's release keeps it as long.
        self.life = 0
        self.attempts = 0
        self.results: Sequence[Any] = ()
        #: The ttl the last vote set the keys with: a provisional one for a vote in line.
        self.granted_ttl = self.ttl
        self.validity = 0.0
        #: When the winning attempt's validity ends (the lock's deadline).
        self.valid_until = 0.0
        # For the acquire_finished hook: when the first vote was judged lost, and whether it found the lock held.
        self.first_lost: float | None = None
        self.contended = False


    def _new_holder(self) -> None:
        # Every attempt sets its own value: a late release of an earlier attempt
        # (bytes delivered after a connection was given up) can never match it.
        holder = self.config.make_holder(self.label)
        if len(self.resources) > 1:  # a hand-off can tell it was given the whole set
            holder = dataclasses.replace(holder, members=len(self.resources))
        self.holder = holder
        self.value = holder.encode()

    def vote(self) -> tuple[Any, ...]:
        """This attempt's vote (the same for every node; each node's books fill in the token of the
        data set it may count on, see :meth:`~django_redlock.core.books.NodeBooks.guarded`).

        A call on one resource that does not wait votes with VOTE (``SET NX PX``
        behind the data-set check; a plain ``SET`` with the restart rule off): it
        takes a free lock and never touches the line. The others run ACQUIRE
        (several resources are set all or nothing on each node).
        """
        # A vote in line runs when the node wakes it, maybe long after its caller froze: it sets
        # the keys provisionally, and the winner extends them (see top_up).
        self.granted_ttl = min(self.ttl, PROVISIONAL_TTL) if self.mode == "wait" else self.ttl
        script = self.script
        if script is None:
            return set_command(self.key, self.value, self.ttl)
        guard = (self.config.dataset_key, "")
        if script is VOTE:
            return script_command(VOTE, (self.key,), (self.value, ms(self.ttl), *guard))
        self.life = life = ms(self.slice + PLACE_MARGIN)
        args = (self.value, ms(self.granted_ttl), self.mode, self.place, self.ticket, life, *self.wake, *guard)
        return script_command(ACQUIRE, self.line, args)

    def ttl_command(self) -> tuple[tuple[Any, ...], Script | None]:
        """What to ask each node after giving up (and the script it runs): each key's value and ttl,
        for :meth:`retry_after` and the holder the error names, in the same round trip."""
        return self.config.inspect_command(self.keys), INSPECT

    def retry_after(self, replies: Sequence[Any], quorum: int) -> float | None:
        """Seconds until every resource may be free, from the replies to :meth:`ttl_command`."""
        waits = [
            retry_after_of([r[2 * j + 1] if isinstance(r, list) else r for r in replies], quorum)
            for j in range(len(self.keys))
        ]
        known = [w for w in waits if w is not None]
        return max(known) if known else None

    def won(self, results: Sequence[Any], started: float, quorum: int, now: float) -> bool:
        """Judge an attempt: a quorum said yes and validity is left after drift.

        ``started`` is read before the first command was written, ``now`` after
        the last reply: the validity is what is left of the ttl in between. A
        vote that waited in line first ran later: each node measured on its
        own clock how long it waited at least (:class:`~.rounds.Granted`, never
        more than we saw pass), and the ttl counts from ``started`` plus what a
        quorum of the granting nodes waited, less the drift on it, and never
        from later than ``now`` (see docs/safety.rst, "Validity after waiting
        in line"). A vote in line set the keys for :attr:`granted_ttl` only:
        that bounds the validity until :meth:`topped_up` extends it.
        """
        self.attempts += 1
        self.results = results
        waits = []
        for reply in results:  # a loop, not a generator: no Python call per reply
            if isinstance(reply, Granted):
                waits.append(reply.waited)
        waits.sort(reverse=True)
        if len(waits) >= quorum:
            started += max(0.0, waits[quorum - 1] - EXPIRY_STEP) * (1 - self.config.clock_drift_factor)
            started = min(started, now)  # never more than a fresh acquire's validity
        self._valid_for(self.granted_ttl, started, now)
        return count(results) >= quorum and self.validity > 0

    def _valid_for(self, ttl: float, started: float, now: float) -> None:
        """Keys set for ``ttl`` no earlier than ``started``: the validity left at ``now``, after drift."""
        #: When the winning attempt's ttl counts from: the lock's validity counts from here.
        self.started = started
        self.valid_until = started + ttl - self.config.drift(ttl)
        self.validity = self.valid_until - now

    def top_up(self) -> tuple[tuple[Any, ...], float] | None:
        """After a win: an extension to send at once, and how long to wait for it, or None.

        A vote that waited in line can be granted by some nodes long before
        the others (a node where the lock was free grants at once, another
        only once its holder releases), and the validity counts from the
        earliest of them. When that cost more than :data:`TOP_UP` of the ttl,
        one extension gives the lock the validity of a fresh acquire. A vote
        granted provisionally (:data:`PROVISIONAL_TTL`) is always extended.
        """
        if self.mode != "wait":
            return None
        fresh = self.ttl - self.config.drift(self.ttl)
        if self.granted_ttl >= self.ttl and fresh - self.validity <= TOP_UP * self.ttl:
            return None
        command = extend_command(self.keys, self.value, self.ttl, self.config.dataset_key)
        return command, max(0.001, min(self.config.node_timeout, self.validity))

    def topped_up(self, results: Sequence[Any], started: float, quorum: int, now: float) -> None:
        """Judge the extension of :meth:`top_up`: a quorum that extended within the validity restarts the ttl
        from ``started`` (read before its write); otherwise the lock keeps the validity it won with (a
        provisional grant's: its keys expire that soon on the nodes that were not extended)."""
        if extension_held(results, quorum, now, self.valid_until):
            self._valid_for(self.ttl, started, now)
        else:
            self.validity = self.valid_until - now

    def unsure(self) -> list[bool]:
        """Per node: may this attempt's value be set there (granted, or no definite answer)?

        A refusal is definite: nil from ``SET NX`` (or VOTE), an integer from ACQUIRE.
        """
        return [not (r is None or type(r) is int) for r in self.results]

    def next_vote(self, quorum: int, now: float) -> float | None:
        """After a failed attempt: None to give up, else seconds to sleep before the next vote.

        Refused by enough nodes to decide: wait in line (woken by a release,
        or after a slice). Too few nodes answered: sleep ``retry_delay`` (with
        jitter), then take a place again.
        """
        remaining = self.deadline - now
        if self.mode == "once" or remaining <= 0:
            return None
        if NO_PLACE in self.results:
            self.mode, self.slice = "join", 0.0
            return 0.0
        if sum(1 for r in self.results if definite(r)) >= quorum:
            self.mode = "wait"
            self.slice = max(0.001, min(WAIT_SLICE, remaining, self.ttl / 4))
            return 0.0
        self.mode, self.slice = "join", 0.0
        return min(self.config.retry_pause(), remaining)  # the last attempt is made at the deadline

    def renew(self) -> None:
        """A new value for the next attempt (the place and ticket stay)."""
        self._new_holder()

    def first_vote_lost(self, now: float) -> None:
        """The first vote did not win (judged at ``now``): note it for :meth:`report`. A call that waits
        waits from here; the lock was contended when so many nodes refused the vote (held, or others
        ahead in line) that no quorum was left."""
        if self.mode != "once":
            self.first_lost = now
        refused = sum(1 for r in self.results if r is None or type(r) is int)
        self.contended = refused > len(self.results) - quorum_of(len(self.results))

    def report(self, outcome: Outcome, now: float) -> AcquireReport:
        """The call's :class:`AcquireReport`, ended at ``now``."""
        waited = 0.0 if self.first_lost is None else max(0.0, now - self.first_lost)
        return AcquireReport(
            self.resource, self.resources, outcome, max(0.0, now - self.begun), waited, self.contended, self.attempts
        )

    def error(
        self, nodes: Sequence[Any], quorum: int, retry_after: float | None, note: str = "", held: Sequence[Any] = ()
    ) -> LockNotAcquired:
        granted = count(self.results) >= quorum
        return not_acquired(
            self.resource,
            nodes,
            self.results,
            quorum,
            validity_left=self.validity if granted else None,
            retry_after=retry_after,
            attempts=self.attempts,
            note=note,
            held=held,
        )
