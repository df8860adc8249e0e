"""The Redlock operations as steps: generators that yield what they need and decide everything else.

An operation never touches a socket, and reads clocks only from its config
(``config.clock()``, ``config.wall_us()``; the simulator sets its own). It yields
an effect and is resumed with its result:

- :class:`Fan` -> the list of per-node results of one :class:`~django_redlock.core.rounds.Round`;
  with ``background``, None at once: the round runs to its end even if the caller is
  cancelled (the sync driver just runs it);
- :class:`Sleep` -> None, after that many seconds.

If performing an effect raises (a signal, a cancellation), the exception is
thrown into the operation, which may yield cleanup steps before it re-raises.
Every operation that talks to the nodes is a step. A manager drives one through its
``_perform(effect)``, the one place where effects meet I/O: :class:`Run` holds the step
between effects, :func:`run_sync` is the sync driver and ``AsyncLockManager._run`` the asyncio one.
The test suite's simulator gives a manager a ``_perform`` of its own.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from django_redlock.core import base, books, held
from django_redlock.core.adoption import Adoption
from django_redlock.core.resp import pack_each
from django_redlock.core.scripts import EXTEND, FENCE_RAISE, FENCE_READ, INSPECT, RELEASE, Script, script_command
from django_redlock.exceptions import QuorumUnavailable

if TYPE_CHECKING:
    from django_redlock.core.records import ForcedRelease

__all__ = [
    "Fan",
    "Run",
    "Sleep",
    "acquire",
    "adopt",
    "ask",
    "check_owned",
    "extend",
    "fence",
    "force_release",
    "owned",
    "release",
    "release_fan",
    "run_sync",
]


class Fan:
    """Run one round: ``commands[i]`` to node ``i``; see :class:`~django_redlock.core.rounds.Round`."""

    __slots__ = (
        "commands",
        "timeout",
        "done",
        "script",
        "ordered_after_key",
        "allow_lagging",
        "restart_window",
        "vote_window",
        "owe",
        "block",
        "timings",
        "packed",
        "background",
    )

    def __init__(
        self,
        commands: Sequence[tuple[Any, ...] | None],
        *,
        timeout: float | None = None,
        done: Callable[[list[Any]], bool] | None = None,
        script: Script | None = None,
        ordered_after_key: str | None = None,
        allow_lagging: bool = True,
        restart_window: float = 0.0,
        owe: tuple[str, str, float] | None = None,
        block: tuple[tuple[str, ...], float] | None = None,
        timings: list[float | None] | None = None,
        background: bool = False,
    ) -> None:
        self.commands = commands
        self.timeout = timeout  # None: the node timeout
        self.done = done
        self.script = script
        self.ordered_after_key = ordered_after_key
        self.allow_lagging = allow_lagging
        self.restart_window = restart_window
        #: The restart window its replies are judged under as votes: an extension's are not (a key it
        #: found counts wherever; it re-creates one only where a vote would count, see
        #: :meth:`NodeBooks.recreating <django_redlock.core.books.NodeBooks.recreating>`).
        self.vote_window = 0.0 if script is EXTEND else restart_window
        self.owe = owe
        self.block = block
        self.timings = timings  # filled in with each node's round-trip time (None: no reply)
        #: Each command encoded, before any node is asked: one that cannot be raises here, the
        #: caller's error, never a node's (the drivers take the bytes from it).
        self.packed = pack_each(commands)
        self.background = background  # the driver answers None at once and runs the round to its end



class Sleep:
    __slots__ = ("seconds",)

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds


Step = Generator[Any, Any, Any]


def release_fan(
    config: base.ManagerConfig,
    total: int,
    resources: Sequence[str],
    value: str,
    ttl: float | None = None,
    place: str = "",
    only: Sequence[bool] | None = None,
    keep: tuple[int, int] | None = None,
    quorum: int | None = None,
    background: bool = False,
    timeout: float | None = None,
) -> Fan:
    """Release ``value`` on every node, or those marked in ``only``; leave the lines with ``place``,
    or with ``keep`` = (ticket, lifetime ms), keep the place (a call that goes on waiting).

    Each command goes after whatever is still pending for that value, and
    every node it goes to owes it until a reply proves it done. With
    ``quorum``, the round ends once that many nodes deleted the key (the
    outcome of a lock's release is then settled: the other replies are read
    and booked later); otherwise it hears every node out.
    """
    command = config.release_command(resources, value, place, keep)
    key = command[3]
    return Fan(
        [command] * total if only is None else [command if only[i] else None for i in range(total)],
        done=None if quorum is None else base.granted_or_all(quorum, base.deleted),
        script=RELEASE,
        ordered_after_key=key,
        allow_lagging=False,
        owe=(key, value, ttl or config.max_ttl),
        background=background,
        timeout=timeout,
    )


def acquire(
    config: base.ManagerConfig,
    quorum: int,
    names: Sequence[str],
    request: base.Request,
    note: Callable[[], str] | None = None,
) -> Step:
    """Acquire what ``request`` asks for (checked by the public call): returns the winning :class:`~django_redlock.core.base.Attempts`, or raises LockNotAcquired.

    A blocking call waits in every node's line between votes; see
    :class:`~django_redlock.core.base.Attempts`.
    """
    total = len(names)
    plan = base.Attempts(config, request, config.clock(), config.wall_us())
    # A non-blocking call stops as soon as the outcome is certain (a lost majority fails in
    # milliseconds); a call that waits in line hears every node out when it fails.
    done = base.until_outcome(quorum, total) if plan.mode == "once" else base.granted_or_all(quorum)
    started = plan.begun  # read before the first byte is written: the validity counts from here
    timed = config.reports_acquires
    while True:
        try:
            results = yield Fan(
                [plan.vote()] * total,
                done=done,
                script=plan.script,
                allow_lagging=False,
                restart_window=plan.window,
                block=(plan.wake, plan.slice) if plan.mode == "wait" else None,
            )
            now = config.clock()
            won = plan.won(results, started, quorum, now)
            if won:
                top_up = plan.top_up()
                if top_up is not None:
                    command, timeout = top_up
                    started = config.clock()
                    replies = yield Fan(
                        [command] * total,
                        timeout=timeout,
                        done=base.until_outcome(quorum, total, base.extended),
                        script=EXTEND,
                        allow_lagging=False,
                    )
                    now = config.clock()
                    plan.topped_up(replies, started, quorum, now)
                    won = plan.validity > 0  # a provisional grant can run out while it is extended
            if won:
                if timed:
                    base.call_hook(config.hooks, "acquire_finished", plan.report("acquired", now))
                return plan
            if timed and plan.attempts == 1:
                plan.first_vote_lost(now)
            pause = plan.next_vote(quorum, now)
            # Release where this attempt's value may be set (the nodes that did not refuse for sure);
            # a call that gives up also leaves the line everywhere. One that goes on waiting keeps its
            # place: a node that granted this attempt took the place out of its line.
            leaving = pause is None and plan.mode != "once"
            unsure = plan.unsure()
            if leaving:
                yield release_fan(config, total, plan.resources, plan.value, plan.ttl, _place(plan))
            elif any(unsure):
                place = _place(plan)
                keep = (plan.ticket, plan.life) if place else None
                yield release_fan(config, total, plan.resources, plan.value, plan.ttl, place, unsure, keep)
            if pause is None:
                break
            plan.renew()
            if pause > 0:
                yield Sleep(pause)
            started = config.clock()
        except GeneratorExit:
            raise  # the step was abandoned (garbage collected): nothing to drive a release with
        except BaseException:
            # Interrupted (a signal, a cancellation), during a vote, a release or the pause between
            # votes: release what may have been set, and leave the line.
            yield release_fan(config, total, plan.resources, plan.value, plan.ttl, _place(plan), background=True)
            if timed:
                base.call_hook(config.hooks, "acquire_finished", plan.report("error", config.clock()))
            raise
    command, script = plan.ttl_command()
    try:
        ttls = yield Fan([command] * total, script=script, allow_lagging=False)
    except GeneratorExit:
        raise
    except BaseException:
        if timed:
            base.call_hook(config.hooks, "acquire_finished", plan.report("error", config.clock()))
        raise
    holders = base.holders_of(plan.resources, ttls, quorum, plan.value)
    error = plan.error(names, quorum, plan.retry_after(ttls, quorum), note() if note is not None else "", holders)
    base.call_hook(config.hooks, "not_acquired", plan.resource, error)
    if timed:
        outcome: base.Outcome = "no_quorum" if isinstance(error, QuorumUnavailable) else "locked"
        base.call_hook(config.hooks, "acquire_finished", plan.report(outcome, config.clock()))
    raise error


def adopt(config: base.ManagerConfig, quorum: int, names: Sequence[str], resource: Any, token: Any) -> Step:
    """Read the lock keys of a hand-off; returns ``(adoption, started, seconds held)``. See :class:`~django_redlock.core.adoption.Adoption`."""
    adoption = Adoption(config, resource, token)
    total = len(names)
    started = config.clock()
    replies = yield Fan(
        [adoption.command()] * total,
        done=base.until_outcome(quorum, total, lambda r: adoption.kept(r) is not None),
        script=INSPECT,
        restart_window=config.restart_window,  # a node that may have forgotten keys does not vouch
    )
    return adoption, started, adoption.judge(names, replies, quorum)


def _place(plan: base.Attempts) -> str:
    return "" if plan.mode == "once" else plan.place


def extend(lock: held.LockBase, ttl: Any, automatic: bool, quorum: int, total: int) -> Step:
    """Reset the lock's ttl on a quorum, within its current validity; see :meth:`Lock.extend`.

    The caller's own extensions count against ``max_extensions``; automatic ones
    (the watchdog's) do not: ``max_hold`` bounds those.
    """
    counted = not automatic
    new_ttl = held.check_extendable(lock, ttl, counted)
    old_deadline = lock._deadline
    config = lock.manager.config
    started = config.clock()
    # A node that lost the key (a restart, an expiry while it was stopped) gets it back where a vote
    # would count: the rule's window probes each new connection, as a vote's does.
    command = base.extend_command(lock.keys, lock.value, new_ttl, config.dataset_key, recreate=True)
    results = yield Fan(
        [command] * total,
        timeout=held.extend_timeout(lock),
        done=base.extension_settled(quorum, total),
        script=EXTEND,
        allow_lagging=False,
        restart_window=config.restart_window,
    )
    hooks = config.hooks
    healed = [base.recreated(reply) for reply in results]
    try:
        held.judge_extend(lock, results, started, old_deadline, new_ttl, counted)
    except Exception:
        base.call_hook(hooks, "extension_finished", lock, automatic, False)
        # Gone from a majority: what it set again goes too, also where a reply is not in yet (or never
        # came) and the extension may still set the keys; the release goes behind it on each node.
        unsure = [again or reply is None or isinstance(reply, books.Failure) for again, reply in zip(healed, results)]
        if lock.lost and any(unsure):
            yield release_fan(config, total, lock.resources, lock.value, new_ttl, only=unsure, background=True)
        raise
    if any(healed):
        nodes = lock.manager.node_list
        names = [node if isinstance(node, str) else node.name for node, again in zip(nodes, healed) if again]
        base.call_hook(hooks, "recreated", lock, names)
    base.call_hook(hooks, "extension_finished", lock, automatic, True)


def fence(lock: held.LockBase, config: base.ManagerConfig, quorum: int, total: int) -> Step:
    """Issue ``lock``'s fencing token: read a quorum, raise on a quorum, check the lock still holds."""
    if not lock.locked():
        raise base.lost_error(lock.resource, lock.lost_reason or "it is no longer valid")
    fence_keys = [config.fence_key(resource) for resource in lock.resources]
    window = config.restart_window
    guard = (config.dataset_key, "")  # a node whose data set was replaced (its counters with it) does not count
    reads = yield Fan(
        [script_command(FENCE_READ, fence_keys, guard)] * total,
        done=base.until_outcome(quorum, total, lambda r: True),
        script=FENCE_READ,
        restart_window=window,
    )
    token = base.next_fence(reads, quorum, lock.resource, config.wall_us())
    command = script_command(FENCE_RAISE, fence_keys, (token, *guard))
    writes = yield Fan(
        [command] * total,
        done=base.until_outcome(quorum, total, lambda r: isinstance(r, int) and r >= token),
        script=FENCE_RAISE,
        restart_window=window,
    )
    held.check_fence_written(lock, writes, token, quorum)
    return token


def release(lock: held.LockBase) -> Step:
    """A lock's whole release (see :meth:`Lock.release`): leave one entry; on the last (its watch
    forgotten, see :func:`~django_redlock.core.held.start_release`), release its value on every
    node (the round ends at a quorum) and judge the replies.

    An interrupted round (a cancelled caller) is sent again in the background, to its end.
    """
    started = held.start_release(lock)
    if started is None:
        return True
    if not started:
        return False
    manager = lock.manager
    total = len(manager.node_list)
    config = manager.config
    fan = release_fan(config, total, lock.resources, lock.value, place=lock._place, quorum=manager.quorum)
    sent = config.clock()
    try:
        results = yield fan
        broken = False
        for reply in results:  # a loop: a comprehension is a Python call of its own (before 3.12)
            if type(reply) is books.Failure and reply.broken:
                broken = True
        left = config.node_timeout - (config.clock() - sent)
        if broken and left > 0 and base.count(results, base.deleted) < manager.quorum:
            broke = [type(r) is books.Failure and r.broken for r in results]
            # Written on connections that broke under it (closed by the node or a proxy while idle):
            # once more, on new ones, within the node timeout the release has. Only a deletion counts
            # from it: a "not ours" may be its own echo.
            fan = release_fan(config, total, lock.resources, lock.value, place=lock._place, only=broke, timeout=left)
            again = yield fan
            results = [1 if a == 1 else r for r, a in zip(results, again)]
    except GeneratorExit:
        raise
    except BaseException:
        # Released all the same: the round runs to its end in the background, unjudged.
        base.call_hook(config.hooks, "released", lock)
        fan.background = True
        yield fan
        raise
    return held.judge_release(lock, results)


def owned(lock: held.LockBase) -> Step:
    """Whether ``lock``'s holder still holds it (see :meth:`Lock.owned`): True, False (then it is
    marked lost), or QuorumUnavailable raised when too few nodes answer to tell."""
    if not held.can_ask(lock):
        return False
    results = yield _read_values(lock)
    verdict = held.judge_owned(lock, results)
    if verdict is None:
        raise held.owned_error(lock, results)
    return verdict


def check_owned(lock: held.LockBase) -> Step:
    """The watchdog's look at a lock: read its keys and judge; a lock that enough nodes no longer
    store is marked lost, an unclear answer waits for the next look."""
    held.judge_owned(lock, (yield _read_values(lock)))


def _read_values(lock: held.LockBase) -> Fan:
    """Read the lock's keys on every node, until a quorum shows its value or too few can."""
    manager = lock.manager
    total = len(manager.node_list)
    ours = functools.partial(held.is_ours, lock)
    return Fan([held.read_command(lock)] * total, done=base.until_outcome(manager.quorum, total, ours))


def force_release(config: base.ManagerConfig, nodes: Sequence[Any], resource: str) -> Step:
    """Delete ``resource``'s lock key on every node, whoever holds it, and wake its waiting line."""
    key = config.key(base.check_resource(resource))
    total = len(nodes)
    timeout = max(config.node_timeout, 0.5)
    results = yield Fan([("DEL", key)] * total, timeout=timeout)
    # Wake whoever waits in line (a release of no value: nothing else is touched).
    yield Fan([config.release_command((resource,), "")] * total, timeout=timeout, script=RELEASE)
    done: ForcedRelease = base.forced_release(resource, nodes, results)
    return done


def ask(total: int, commands: Sequence[tuple[Any, ...]], timeout: float) -> Step:
    """Send each of ``commands`` to every node, one round each; the replies, a list per command."""
    replies = []
    for command in commands:
        replies.append((yield Fan([command] * total, timeout=timeout)))
    return replies


class EngineCalls(threading.local):
    """How deep this thread is in engine calls. A signal handler that would unwind one half done
    (a release written to some nodes only) defers while ``depth`` is above 0; each call is bounded
    by the node timeout, and during its waits (a pause, a wait in line) the depth is 0, whatever
    encloses the call: the acquire step cleans up after an interruption there."""

    depth = 0
    #: Called once when the depth is back to 0 (a deferred stop is sent again at that moment).
    on_leave: Callable[[], None] | None = None

    def left(self) -> None:
        """An outermost engine call ended (the depth is back to 0): send a deferred stop again.

        Callers set the depth back themselves, first thing in their ``finally`` and with no call
        before it: Python runs signal handlers at calls (and loops), so an exception raised by one
        (a KeyboardInterrupt, a SIGALRM timeout) lands before or after that store, never between
        entering a function and the store. A depth left off for good would defer a command's
        stop forever.

        A call that hands a lock to its caller (``acquire()``, ``adopt()``, a ``with`` block's
        entry) counts as one engine call until it returns the lock (:func:`handing_over`), and sets the depth back
        without this: a stop sent again when its round ends would unwind it with the lock held
        on the nodes and nobody to release it. The stop's own redelivery lands a few
        milliseconds later, once the caller has the lock."""
        if self.on_leave is not None:
            on_leave, self.on_leave = self.on_leave, None
            on_leave()


engine_calls = EngineCalls()

_T = TypeVar("_T")


def handing_over(call: Callable[..., _T], *args: Any) -> _T:
    """``call(*args)`` as one engine call that hands a lock to its caller (see
    :meth:`EngineCalls.left`): the depth is set back at its end, and no deferred stop sent again."""
    calls = engine_calls
    outer = calls.depth
    try:
        calls.depth = outer + 1
        return call(*args)
    finally:
        calls.depth = outer  # first, no call before it


class Run:
    """A step being driven: ``effect`` is what it waits for while ``going``, then ``value`` is what
    it returned. A driver performs the effect and calls :meth:`resume` with the result or the error."""

    __slots__ = ("step", "effect", "going", "value")

    def __init__(self, step: Step) -> None:
        self.step = step
        self.going = True
        self.value: Any = None
        self.resume(None, None)

    def resume(self, result: Any, error: BaseException | None) -> None:
        """Hand the step the effect's result, or throw the error into it (it may clean up, then re-raise)."""
        try:
            self.effect = self.step.throw(error) if error is not None else self.step.send(result)
        except StopIteration as stop:
            self.going = False
            self.value = stop.value


def run_sync(step: Step, perform: Callable[[Any], Any]) -> Any:
    """Drive ``step`` with ``perform(effect) -> result`` on this thread, as one engine call
    (see :class:`EngineCalls`); exceptions from ``perform`` are thrown into it.

    What :class:`Run` does, inline: a step is resumed once per effect, and this loop is the hot path."""
    calls = engine_calls
    outer = calls.depth
    try:
        calls.depth = outer + 1
        error: BaseException | None
        try:
            effect = step.send(None)
            while True:
                waits = type(effect) is Sleep or (type(effect) is Fan and effect.block is not None)
                try:
                    # A wait counts for no call this thread is in, LockContext.__enter__'s neither. The
                    # depth is set to 0 inside the try: a stop raised right after it must not leave it 0.
                    depth = calls.depth
                    try:
                        if waits:
                            calls.depth = 0
                        result = perform(effect)
                    finally:
                        calls.depth = depth
                    error = None
                except BaseException as exc:  # noqa: BLE001 - handed to the step, which re-raises
                    error = exc
                effect = step.send(result) if error is None else step.throw(error)
        except StopIteration as stop:
            return stop.value
    finally:
        calls.depth = outer  # first, no call before it (see EngineCalls.left)
        if not outer and calls.on_leave is not None:
            calls.left()
