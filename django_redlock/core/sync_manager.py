"""LockManager: Redlock over N independent Redis masters, one round trip per step."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar, cast

from django_redlock.core import base, status, steps
from django_redlock.core.adoption import Adoption
from django_redlock.core.base import DEFAULT_MAX_TTL, Hooks, ManagerConfig, Request, Resources, check_resource
from django_redlock.core.extender import Extender
from django_redlock.core.held import HeldLocks, LockBase
from django_redlock.core.lock import Lock, LockContext
from django_redlock.core.nodes import Node, NodeSpec, close_nodes, fanout, parse_nodes
from django_redlock.core.listing import Rows, Scan, read_listing, read_locked, read_record
from django_redlock.core.records import ForcedRelease, LockListing, LockRecord, NodeStatus
from django_redlock.core.status import status_of

__all__ = ["LockManager", "status_of"]

_L = TypeVar("_L", bound=LockBase)


class ManagerBase:
    """Construction and plain attributes shared by the sync and async managers."""

    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        *,
        ttl: float = 30.0,
        retry_count: int | None = 3,
        retry_delay: float = 0.2,
        retry_jitter: float = 0.1,
        clock_drift_factor: float = 0.01,
        node_timeout: float = 0.05,
        key_prefix: str = "redlock:",
        max_extensions: int | None = 100,
        label: str | None = None,
        hooks: Hooks | None = None,
        restart_window: float | None = None,
        max_ttl: float = DEFAULT_MAX_TTL,
    ) -> None:
        self.config = ManagerConfig(
            ttl=ttl,
            retry_count=retry_count,
            retry_delay=retry_delay,
            retry_jitter=retry_jitter,
            clock_drift_factor=clock_drift_factor,
            node_timeout=node_timeout,
            key_prefix=key_prefix,
            max_extensions=max_extensions,
            label=label,
            hooks=hooks,
            restart_window=restart_window,
            max_ttl=max_ttl,
        )
        self.node_list: list[Node] = parse_nodes(nodes, self.config.node_timeout)
        self._names = tuple(node.name for node in self.node_list)
        self.quorum = base.quorum_of(len(self.node_list))  # looked up on base: a simulator mutant patches it
        self._held = HeldLocks()

    @property
    def nodes(self) -> tuple[str, ...]:
        """Node names, without credentials."""
        return self._names

    @property
    def ttl(self) -> float:
        return self.config.ttl

    @property
    def key_prefix(self) -> str:
        return self.config.key_prefix

    @property
    def node_timeout(self) -> float:
        return self.config.node_timeout

    def _acquiring(self, request: Request) -> tuple[Any, steps.Step | None]:
        """The caller's own lock re-entered, or the step that acquires the ``request``'s resources."""
        resources = request.resources
        if request.reentrant:
            entered = self._held.enter(resources)
            if entered is not None:
                return entered, None
        note = functools.partial(self._held.note, resources)
        return None, steps.acquire(self.config, self.quorum, self._names, request, note)

    def _adopting(self, resource: Any, token: Any, ttl: Any, fencing_token: Any) -> steps.Step:
        if fencing_token is not None and (isinstance(fencing_token, bool) or not isinstance(fencing_token, int)):
            raise ValueError(f"fencing_token must be an int (lock.fencing_token) or None; got {fencing_token!r}.")
        self.config.lock_ttl(ttl, self.config.ttl)
        return steps.adopt(self.config, self.quorum, self.nodes, resource, token)

    def _adopted(
        self, found: tuple[Adoption, float, float], lock_class: type[_L], ttl: Any, fencing_token: int | None
    ) -> _L:
        """The handle of a lock held elsewhere: its stored value, valid as long as a quorum keeps it."""
        adoption, started, held_for = found
        assert adoption.holder is not None and adoption.value is not None
        ttl = self.config.lock_ttl(ttl, self.config.ttl)
        lock = lock_class(
            self, adoption.resources, adoption.holder, ttl, started, value=adoption.value, deadline=started + held_for
        )
        lock._fencing_token = fencing_token
        self._held.add(lock)
        return lock

    def _granted(self, plan: base.Attempts, lock_class: type[_L]) -> _L:
        """The lock of the winning attempt (built on the time it began), announced to the hooks."""
        lock = lock_class.granted(self, plan)
        self._held.add(lock)
        hooks = self.config.hooks
        if hooks is not None:  # no call when there are none: this is every grant
            base.call_hook(hooks, "acquired", lock)
        return lock

    # -- the steps both managers drive ------------------------------------

    def _extending(self, lock: LockBase, ttl: Any, automatic: bool) -> steps.Step:
        return steps.extend(lock, ttl, automatic, self.quorum, len(self.node_list))

    def _fencing(self, lock: LockBase) -> steps.Step:
        return steps.fence(lock, self.config, self.quorum, len(self.node_list))

    def _locked(self, resource: str) -> steps.Step:
        return read_locked(self.config, self.node_list, self.quorum, resource)

    def _forcing(self, resource: str) -> steps.Step:
        return steps.force_release(self.config, self.node_list, resource)

    def _listing(self, match: str | None, rows: Rows | None, order: str, state: str | None = None) -> steps.Step:
        return read_listing(Scan(self.config, self.node_list, self.quorum, match, rows, order, state=state))

    def _record(self, resource: str) -> steps.Step:
        return read_record(self.config, self.node_list, self.quorum, resource)

    def _status(self, timeout: float) -> steps.Step:
        return status.node_status(self.config, self.node_list, timeout)

    def _ping(self, timeout: float | None) -> steps.Step:
        return status.ping(self.node_list, timeout)

    def _forget(self, lock: Any) -> None:
        """Stop watching ``lock`` (released); the async keep-alive tasks watch ``lock.released`` themselves."""

    def _watched(self, fan: steps.Fan) -> None:
        """Set ``fan`` to time each node's reply (not a vote's wait in line): a hook watches the nodes
        (``config.watches_nodes``; drivers call this and :meth:`_fanned` only then)."""
        if fan.timings is None and fan.block is None:
            fan.timings = [None] * len(self.node_list)

    def _fanned(self, fan: steps.Fan, results: list[Any]) -> None:
        """Tell a fan-out's ``results`` to the ``nodes_seen`` hook (one watches the nodes)."""
        config = self.config
        seen = status.seen_of(self.nodes, results, fan.timings, fan.vote_window, config.restart_window > 0)
        base.call_hook(config.hooks, "nodes_seen", seen)

    def key(self, resource: str) -> str:
        """The Redis key that locks ``resource``."""
        return self.config.key(check_resource(resource))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} nodes={len(self.node_list)} quorum={self.quorum}>"



class LockManager(ManagerBase):
    """Acquire Redlock locks on a set of independent Redis masters.

    ``nodes`` are Redis URLs (``redis://``, ``rediss://``, ``unix://``),
    redis-py or valkey-py clients, or mappings ``{"URL": ..., "OPTIONS": {...},
    "FSYNC_ALWAYS": bool}`` (upper-case keys; ``URL`` a URL or a client, which
    brings its own options); list each independent master once. Nothing
    connects until the first call, and a node that is down at start-up only
    counts as a failed vote. The keyword arguments (``REDLOCK`` keys in
    Django, see :doc:`configuration`):

    - ``ttl``: seconds a lock lives on the nodes unless extended (default 30).
    - ``retry_count``, ``retry_delay``: a blocking ``acquire()`` without
      ``timeout`` waits up to ``retry_count * retry_delay`` seconds
      (``retry_count=None``: forever); ``retry_delay`` (with
      ``retry_jitter``, seconds either side) is also the pause before voting
      again when too few nodes answered.
    - ``clock_drift_factor``: the share of the ttl taken off the validity for
      clock drift between the client and the nodes (plus 2 ms).
    - ``node_timeout``: how long one fan-out waits for a node's reply
      (seconds, default 0.05); a node that does not answer in time counts
      as a failed vote.
    - ``key_prefix``: the start of every key on the nodes (``"redlock:"``).
    - ``max_extensions``: how many times one lock may be extended (None: no limit).
    - ``label``: a default label stored with each holder, shown to operators.
    - ``hooks``: a :class:`~django_redlock.core.Hooks` whose methods run on
      lock events.
    - ``restart_window``: seconds a node restarted without fsync-always
      persistence sits out (default: ``max_ttl`` plus drift; 0 turns the
      delayed-restart rule off, for tests and development only).
    - ``max_ttl``: the longest ttl any client of these nodes may use (default 60).
    """

    _extender_instance: Extender | None = None

    @property
    def _extender(self) -> Extender:
        if self._extender_instance is None:
            self._extender_instance = Extender()
        return self._extender_instance

    # -- acquisition ------------------------------------------------------

    def acquire(
        self,
        resource: Resources,
        ttl: float | None = None,
        *,
        blocking: bool = True,
        timeout: float | None = None,
        label: str | None = None,
        reentrant: bool = False,
        auto_extend: bool = False,
        max_hold: float | None = None,
        on_lost: Callable[[Lock], Any] | None = None,
    ) -> Lock:
        """Acquire ``resource`` on a quorum and return the :class:`Lock`.

        :param resource: A name (up to 1024 characters, no control
            characters, text UTF-8 encodes), or a list of names to lock together, all or
            nothing (sorted, each taken once, at most 1000): on each node
            one script call sets every member's key or none, and the lock
            holds them all with one validity, one extension, one release
            and one fencing token. Overlapping sets never deadlock, and
            each member stays exclusive with locks on it alone. See
            :ref:`several-resources`.
        :param ttl: Seconds the keys live on the nodes; default: the
            manager's ``ttl``. At least 0.01, at most ``max_ttl``.
        :param blocking: ``False`` makes one attempt and never waits.
            ``True`` (the default) waits in line: the call takes a place in
            every node's line for each resource, is woken when the holder
            releases, and is granted in the order callers came (see
            :ref:`waiting-in-line`).
        :param timeout: Seconds a blocking call waits; ``None`` waits up
            to ``retry_count * retry_delay`` seconds (``retry_count=None``:
            forever). The last vote is made at the deadline. A timeout
            with ``blocking=False`` raises :class:`ValueError`.
        :param label: Text stored with the holder for operators
            (``redlock list``, the admin), with no control characters,
            that UTF-8 encodes; default: the manager's ``label``.
        :param reentrant: When this owner (thread, asyncio task, or call run by a pool) already holds
            a valid lock of this manager that covers every resource asked
            for, return that same :class:`Lock`, entered once more, without
            asking the nodes; only the outermost ``release()`` releases it.
            Holding only part of the set raises
            :class:`~django_redlock.exceptions.LockNotAcquired` at once.
            See :ref:`reentrant-locks`.
        :param auto_extend: Keep the lock alive until it is released, from
            the background thread shared by all locks (see :meth:`lock`);
            a lock dropped without a release stops being extended and
            expires. A re-entered lock keeps its outer entry's keep-alive.
        :param max_hold: As for :meth:`lock`.
        :param on_lost: As for :meth:`lock`.
        :raises ~django_redlock.exceptions.LockNotAcquired: when it gives
            up; :class:`~django_redlock.exceptions.QuorumUnavailable`, a
            subclass, when too few nodes answered.
        :raises ValueError: for invalid arguments, before anything is sent:
            :class:`~django_redlock.exceptions.InvalidResource` for a name
            no lock may have (see :ref:`names-and-labels`).

        A non-blocking call on one resource votes with ``SET NX
        PX`` and may take a lock that is free at that instant although
        others wait in line; on several resources it runs the line's
        script and is refused while anyone waits in a member's line. While
        too few nodes answer, a blocking call retries after
        ``retry_delay`` (with jitter) instead of waiting for a wake-up.

        Without ``reentrant=True``, asking again for a lock that this very
        thread (or task) holds is treated like any other request: a
        blocking call waits up to its timeout and then fails, and the
        error ends by saying that this very thread holds the lock. When
        another thread of this process holds it, the error names that
        thread.
        """
        request = self.config.request(resource, ttl, blocking, timeout, label, reentrant, auto_extend, max_hold, on_lost)
        return steps.handing_over(self._acquire, request)

    def _acquire(self, request: Request) -> Lock:
        """:meth:`acquire` with its arguments checked, called as one engine call that hands a lock to
        its caller (:func:`~django_redlock.core.steps.handing_over`): the lock won, kept alive if asked."""
        entered, step = self._acquiring(request)
        if step is None:
            return cast(Lock, entered)
        lock = self._granted(steps.run_sync(step, self._perform), Lock)  # what _run does, one call less
        keep = request.keep
        if keep is not None:
            try:
                self._watch(lock, *keep)
            except BaseException:
                lock.release()  # the watchdog could not start: the caller never owned it
                raise
        return lock

    def adopt(
        self, resource: Resources, token: str, *, ttl: float | None = None, fencing_token: int | None = None
    ) -> Lock:
        """A handle on a lock acquired elsewhere (another process, a Celery task), from its resource and token.

        Hand ``lock.resources``, ``lock.token`` and, if it was taken,
        ``lock.fencing_token`` to the other process; there ``adopt()``
        returns a :class:`Lock` that can extend, release, check and fence
        the same lock. Both handles are the same lock: whichever releases
        it releases it for both. See :ref:`handing-off`.

        :param resource: The resource, or the list of resources, exactly as
            held (``lock.resources``).
        :param token: The holder's token (``lock.token``).
        :param ttl: What :meth:`~django_redlock.core.Lock.extend` resets the keys' ttl to by
            default; default: the manager's ``ttl``, not the original
            lock's. It does not change the handle's validity.
        :param fencing_token: The fencing token already issued to this
            lock (``lock.fencing_token``), which the handle then returns;
            without it, the handle issues a new, higher one when asked.
        :raises ~django_redlock.exceptions.LockLost: when fewer than a
            quorum of nodes store that token's value on every key
            (released, expired or taken over).
        :raises ~django_redlock.exceptions.QuorumUnavailable: when too few
            nodes answer to tell.

        One read of the keys on every node; nothing is written. The
        handle is valid as long as a quorum of nodes keeps the keys: the
        quorum-th longest remaining ttl read, counted from before the
        read, minus the drift allowance. It is safe because extension and
        release only act on keys that still store the holder's value.
        """
        step = self._adopting(resource, token, ttl, fencing_token)
        return steps.handing_over(lambda: self._adopted(self._run(step), Lock, ttl, fencing_token))

    def _run(self, step: steps.Step) -> Any:
        """Drive a step on this thread (:func:`~django_redlock.core.steps.run_sync`)."""
        return steps.run_sync(step, self._perform)

    def _perform(self, effect: Any) -> Any:
        """Do what a step asks for, on real sockets and the real clock: the one place the sync engine
        meets I/O."""
        kind = type(effect)
        if kind is steps.Fan:
            watching = self.config.watches_nodes
            if watching:
                self._watched(effect)
            results = fanout(self.node_list, effect, effect.timeout or self.config.node_timeout)
            if watching:
                self._fanned(effect, results)
            return None if effect.background else results  # nothing to cancel here: a background round runs now
        if kind is steps.Sleep:
            time.sleep(effect.seconds)
            return None
        raise TypeError(f"unknown step effect {effect!r}")

    def lock(
        self,
        resource: Resources,
        ttl: float | None = None,
        *,
        blocking: bool = True,
        timeout: float | None = None,
        label: str | None = None,
        auto_extend: bool = False,
        max_hold: float | None = None,
        on_lost: Callable[[Lock], Any] | None = None,
        reentrant: bool = False,
    ) -> LockContext:
        """A context manager: acquire on entry, release on exit.

        :param resource: As for :meth:`acquire`: one name, or a list of
            names locked together, all or nothing.
        :param ttl: As for :meth:`acquire`.
        :param blocking: As for :meth:`acquire`.
        :param timeout: As for :meth:`acquire`; with ``blocking=False`` it
            raises :class:`ValueError` here, before the ``with`` block.
        :param label: As for :meth:`acquire`.
        :param auto_extend: Keep the lock alive from a background thread
            shared by all locks: it extends when about a third of the ttl
            is left, and if an extension fails on a quorum it sets
            ``lock.lost`` and calls ``on_lost(lock)``.
        :param max_hold: Seconds after which auto-extension stops; the
            lock then expires at the end of its validity (and is reported
            lost if still held). ``None``: no limit.
        :param on_lost: Called once with the lock when it is found lost
            while auto-extended (see :ref:`losing-a-lock`).
        :param reentrant: As for :meth:`acquire`. A re-entered lock keeps
            the ttl and the auto-extension of the outer entry: this call's
            ``ttl``, ``auto_extend``, ``max_hold`` and ``on_lost`` are not
            applied to it.
        """
        return LockContext(
            self, self.config.request(resource, ttl, blocking, timeout, label, reentrant, auto_extend, max_hold, on_lost)
        )

    # -- inspection and operator actions ----------------------------------

    def is_locked(self, resource: str) -> bool:
        """True when a quorum of nodes hold a live key for ``resource``, False when a quorum has none.

        ``resource`` is one name; a member of a lock on several resources
        counts as locked. Raises
        :class:`~django_redlock.exceptions.QuorumUnavailable` when too few
        nodes answer to tell (never "free" for "unknown"; a node that sits out
        after a restart counts as not answering).
        """
        return cast(bool, self._run(self._locked(resource)))

    def force_release(self, resource: str) -> int:
        """Delete ``resource``'s lock key on every node, whoever holds it.

        For operators: the holder is not told. Returns how many nodes had the
        key; :meth:`force_release_detail` also says which nodes did not answer.
        """
        return self.force_release_detail(resource).deleted

    def force_release_detail(self, resource: str) -> ForcedRelease:
        """:meth:`force_release`, reporting the nodes that did not answer (their key expires by itself)."""
        return cast(ForcedRelease, self._run(self._forcing(resource)))

    def live_locks(self, match: str | None = None) -> Iterator[LockRecord]:
        """Yield one record per resource with a lock key on any node, sorted by resource.

        Scans every node with SCAN (never KEYS), reading each page's values
        and ttls in the same round. ``match`` keeps resources containing that
        text. A node that fails is listed in each record's ``down``; use
        :meth:`lock_listing` to learn about it when there are no records.
        """
        yield from self.lock_listing(match).records

    def lock_listing(
        self, match: str | None = None, rows: Rows | None = None, order: str = "resource", state: str | None = None
    ) -> LockListing:
        """:meth:`live_locks` as a whole: the records and the nodes that could not be read.

        ``order`` sorts the records: ``"resource"``, ``"state"``,
        ``"nodes_holding"``, ``"ttl"``, ``"waiting"``, ``"holder"`` or
        ``"acquired_at"``, ascending, or descending after a ``-``; equal
        ones stay in resource order. ``rows`` (a slice of the resources in
        that order, e.g. ``slice(0, 100)``, or a function of how many there
        are that returns one) reads only those records in full: the walk
        then fetches just what the order needs (key names alone for the
        resource order), and the listing's ``count`` still tells how many
        resources there are. ``state`` (``"held"``, ``"minority"``,
        ``"split"`` or ``"unknown"``) keeps only the locks in that state, and
        ``count`` then counts those; the walk reads every key's values to
        judge it.
        """
        return cast(LockListing, self._run(self._listing(match, rows, order, state)))

    def lock_record(self, resource: str) -> LockRecord | None:
        """The record of ``resource`` (None when no node holds its key), reading that one key on every node.

        ``resource`` may be any name, even one ``acquire()`` would refuse (a
        key written by something else): it is only read.
        """
        return cast("LockRecord | None", self._run(self._record(resource)))

    def node_status(self, timeout: float = 1.0) -> list[NodeStatus]:
        """Send every node the restart probe (INFO server and replication, persistence) and judge its
        vote as the engine would; a node that does not answer is reported, not raised."""
        return cast("list[NodeStatus]", self._run(self._status(timeout)))

    def ping(self, timeout: float | None = None) -> dict[str, float | None]:
        """Round-trip time to each node in seconds, or None for a node that did not answer."""
        return cast("dict[str, float | None]", self._run(self._ping(timeout)))

    def close(self) -> None:
        """Stop watching locks and close every connection. Held locks expire by themselves.

        Replies still due (the last nodes' answers to a release that ended at a quorum) are read
        first, for at most the node timeout; the same happens at interpreter exit.
        """
        self._extender.clear(self)
        close_nodes(self.node_list)

    def __enter__(self) -> LockManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals used by Lock -----------------------------------------

    def _release(self, lock: LockBase) -> bool:
        """Release ``lock`` through this manager's connections (see :func:`~django_redlock.core.steps.release`):
        also an :class:`~django_redlock.core.AsyncLock`, from a thread its loop does not run."""
        # Not _run() nor cast(): a Python call each, per release.
        released: bool = steps.run_sync(steps.release(lock), self._perform)
        return released

    def _watch(self, lock: Lock, max_hold: float | None, on_lost: Callable[[Lock], Any] | None) -> None:
        self._extender.add(self, lock, max_hold, on_lost)

    def _forget(self, lock: Lock) -> None:
        if self._extender_instance is not None:  # none before the first auto-extended lock
            self._extender_instance.remove(lock)
