"""The scheduler: true time, the event queue, processes, choices and the trace.

Everything that happens in a simulated run is an event in one heap, ordered by
(true time, sequence number), so ties resolve in scheduling order and a run is
a pure function of its seed and its chooser.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from typing import Any, Callable, Protocol, Sequence, TypeVar

from .clock import Clock

T = TypeVar("T")

__all__ = [
    "Chooser",
    "Exhaustive",
    "Process",
    "RandomChooser",
    "World",
    "explore",
]


# -- choices -----------------------------------------------------------------------


class Chooser(Protocol):
    """Where every nondeterministic decision of a run is made."""

    def pick(self, n: int, label: str) -> int:
        """An index in ``range(n)`` (``n >= 2``)."""

    def uniform(self, a: float, b: float, label: str) -> float:
        """A float in ``[a, b]`` (``a < b``)."""

    def chance(self, p: float, label: str) -> bool:
        """True with probability ``p`` (``0 < p < 1``)."""


class RandomChooser:
    """Sample every decision from one ``random.Random``."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def pick(self, n: int, label: str) -> int:
        return self.rng.randrange(n)

    def uniform(self, a: float, b: float, label: str) -> float:
        return self.rng.uniform(a, b)

    def chance(self, p: float, label: str) -> bool:
        return self.rng.random() < p


class Exhaustive:
    """Enumerate every sequence of choices, depth first (the exhaustigen idea).

    A run asks for choices one after another. The chooser remembers each as
    ``[value, bound]``; the first run takes 0 everywhere. :meth:`advance` then
    drops trailing choices that are at their last value and bumps the deepest
    remaining one, so the next run replays the same prefix and diverges at that
    point. When no choice can be bumped, every sequence has been seen.

    ``uniform`` becomes a choice among ``points`` evenly spaced values (2: the
    two ends, where timing bugs live). Past ``max_depth`` recorded choices every
    decision takes its first option, which bounds the search.
    """

    def __init__(self, points: int = 2, max_depth: int | None = None) -> None:
        if points < 2:
            raise ValueError("points must be at least 2")
        self.points = points
        self.max_depth = max_depth
        self._stack: list[list[int]] = []  # [value, bound] per recorded choice
        self._labels: list[str] = []
        self._pos = 0
        self.runs = 1

    def pick(self, n: int, label: str) -> int:
        pos = self._pos
        if pos < len(self._stack):
            value, bound = self._stack[pos]
            if bound != n:
                raise RuntimeError(
                    f"run is not deterministic: choice {pos} ({label}) had {bound} options, now {n}"
                )
            self._pos += 1
            return value
        if self.max_depth is not None and pos >= self.max_depth:
            return 0
        self._stack.append([0, n])
        self._labels.append(label)
        self._pos += 1
        return 0

    def uniform(self, a: float, b: float, label: str) -> float:
        i = self.pick(self.points, label)
        return a + (b - a) * i / (self.points - 1)

    def chance(self, p: float, label: str) -> bool:
        return self.pick(2, label) == 1

    def path(self) -> list[tuple[str, int, int]]:
        """The current choice sequence as ``(label, value, options)``."""
        return [(lab, v, n) for lab, (v, n) in zip(self._labels, self._stack)]

    def advance(self) -> bool:
        """Move to the next unexplored choice sequence; False once all were run."""
        stack = self._stack
        # Choices recorded but not reached in this run cannot be trusted: drop them.
        del stack[self._pos :]
        del self._labels[self._pos :]
        while stack and stack[-1][0] + 1 >= stack[-1][1]:
            stack.pop()
            self._labels.pop()
        self._pos = 0
        if not stack:
            return False
        stack[-1][0] += 1
        self.runs += 1
        return True


def explore(run: Callable[[Exhaustive], None], *, points: int = 2, max_depth: int | None = None,
            limit: int | None = None) -> int:
    """Call ``run(chooser)`` once per choice sequence; return how many runs were made.

    ``run`` builds a fresh world with ``World(seed, chooser=chooser)`` and runs it;
    a :class:`Violation` (or any exception) propagates with the path in the trace.
    ``limit`` stops early after that many runs.
    """
    chooser = Exhaustive(points=points, max_depth=max_depth)
    while True:
        run(chooser)
        if limit is not None and chooser.runs >= limit:
            return chooser.runs
        if not chooser.advance():
            return chooser.runs


# -- processes ---------------------------------------------------------------------


class Process:
    """A simulated OS process: a name, its own clock, and whether it is frozen.

    Events addressed to a frozen process (a client in a GC pause, a node under
    SIGSTOP) wait, in order, until it thaws; events addressed to a dead one are
    dropped.
    """

    __slots__ = ("world", "name", "clock", "frozen", "alive", "deferred")

    def __init__(self, world: World, name: str, clock: Clock) -> None:
        self.world = world
        self.name = name
        self.clock = clock
        self.frozen = False
        self.alive = True
        self.deferred: list[tuple[int, Callable[..., Any], tuple[Any, ...]]] = []

    def now(self) -> float:
        """This process's monotonic clock reading (local seconds)."""
        return self.clock.now()

    def after_local(self, local_dt: float, fn: Callable[..., Any], *args: Any) -> int:
        """Run ``fn(*args)`` once ``local_dt`` seconds pass on this process's clock."""
        return self.world.after(self.clock.true_duration(local_dt), fn, *args, proc=self)

    def at_local(self, local_t: float, fn: Callable[..., Any], *args: Any) -> int:
        """Run ``fn(*args)`` when this process's clock reads ``local_t``."""
        return self.world.at(max(self.world.now, self.clock.to_true(local_t)), fn, *args, proc=self)

    def __repr__(self) -> str:
        return f"<Process {self.name}>"


# -- the world ---------------------------------------------------------------------


class World:
    """One simulated run: true time, the event heap, the chooser, the trace.

    ``seed`` seeds ``self.rng`` (identifiers such as run ids and tokens) and, unless
    another ``chooser`` is given, every decision too.
    """

    def __init__(self, seed: int, chooser: Chooser | None = None, trace_limit: int = 2000) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.chooser: Chooser = chooser if chooser is not None else RandomChooser(self.rng)
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., Any], tuple[Any, ...], Process | None]] = []
        self._seq = 0
        self._cancelled: set[int] = set()
        self.events_run = 0
        #: The last ``trace_limit`` notes as ``(true time, who, parts)``; see :meth:`trace_lines`.
        self.trace: deque[tuple[float, str, tuple[Any, ...]]] = deque(maxlen=trace_limit)
        self.processes: dict[str, Process] = {}
        #: Names of faults now in force (a partition, a paused node, a frozen client...).
        self.faults: set[str] = set()
        #: Last true time a fault ended (any fault disturbs every client's keys).
        self.disturbed_at = 0.0
        #: Per client: last true time bytes of that client landed unusually (late, after a reset).
        self.disturbed_by: dict[str, float] = {}

    # time and events

    def at(self, t: float, fn: Callable[..., Any], *args: Any, proc: Process | None = None) -> int:
        """Run ``fn(*args)`` at true time ``t`` (on behalf of ``proc``); return a handle."""
        if t < self.now:
            t = self.now
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, fn, args, proc))
        return self._seq

    def after(self, dt: float, fn: Callable[..., Any], *args: Any, proc: Process | None = None) -> int:
        """Run ``fn(*args)`` ``dt`` true seconds from now."""
        return self.at(self.now + dt, fn, *args, proc=proc)

    def cancel(self, handle: int) -> None:
        """Forget a scheduled event (a timer the client no longer needs)."""
        self._cancelled.add(handle)

    def step(self) -> bool:
        """Run the next event; False when the queue is empty."""
        heap = self._heap
        while heap:
            t, seq, fn, args, proc = heapq.heappop(heap)
            if self._cancelled and seq in self._cancelled:
                self._cancelled.discard(seq)
                continue
            self.now = t
            if proc is not None:
                if not proc.alive:
                    continue
                if proc.frozen:
                    proc.deferred.append((seq, fn, args))
                    continue
            self.events_run += 1
            fn(*args)
            return True
        return False

    def run_until(self, t: float) -> None:
        """Run every event due at or before true time ``t``; then time is ``t``."""
        heap = self._heap
        while heap and heap[0][0] <= t:
            self.step()
        if t > self.now:
            self.now = t

    def run(self, max_events: int | None = None) -> int:
        """Run until the queue is empty or ``max_events`` ran; return how many ran."""
        start = self.events_run
        while (max_events is None or self.events_run - start < max_events) and self.step():
            pass
        return self.events_run - start

    def pending(self) -> int:
        return len(self._heap)

    # processes

    def process(self, name: str, clock: Clock | None = None) -> Process:
        """Register a process (client or node) with its own clock."""
        if name in self.processes:
            raise ValueError(f"process {name!r} exists")
        proc = Process(self, name, clock if clock is not None else Clock(self))
        self.processes[name] = proc
        return proc

    def freeze(self, proc: Process) -> None:
        """Stop delivering events to ``proc`` (GC pause, SIGSTOP) until :meth:`thaw`."""
        if not proc.frozen:
            proc.frozen = True
            self.fault_begin(f"frozen:{proc.name}")
            self.note(proc.name, "frozen")

    def thaw(self, proc: Process) -> None:
        """Deliver, in their original order, the events ``proc`` missed while frozen."""
        if not proc.frozen:
            return
        proc.frozen = False
        deferred, proc.deferred = proc.deferred, []
        self.note(proc.name, f"thawed ({len(deferred)} deferred events)")
        for _seq, fn, args in deferred:
            self.at(self.now, fn, *args, proc=proc)
        self.fault_end(f"frozen:{proc.name}")

    def kill(self, proc: Process) -> None:
        """The process dies: its pending and future events are dropped."""
        proc.alive = False
        proc.deferred.clear()
        self.note(proc.name, "killed")

    # faults bookkeeping (read by the invariant checker)

    def fault_begin(self, name: str) -> None:
        self.faults.add(name)

    def fault_end(self, name: str) -> None:
        self.faults.discard(name)
        self.disturbed_at = self.now

    def disturbed(self, client: str | None = None) -> None:
        """Mark now as the last unusual event: for one client's bytes, or for everyone."""
        if client is None:
            self.disturbed_at = self.now
        else:
            self.disturbed_by[client] = self.now

    def disturbed_since(self, client: str) -> float:
        """When ``client``'s keys were last disturbed (a fault, or its own late bytes)."""
        return max(self.disturbed_at, self.disturbed_by.get(client, 0.0))

    # choices

    def choose(self, options: Sequence[T], label: str) -> T:
        """One of ``options``, decided by the chooser."""
        if len(options) == 1:
            return options[0]
        return options[self.chooser.pick(len(options), label)]

    def uniform(self, a: float, b: float, label: str) -> float:
        """A float in ``[a, b]``, decided by the chooser."""
        if b <= a:
            return a
        return self.chooser.uniform(a, b, label)

    def chance(self, p: float, label: str) -> bool:
        """True with probability ``p``; an exhaustive chooser tries both."""
        if p <= 0.0:
            return False
        if p >= 1.0:
            return True
        return self.chooser.chance(p, label)

    def token(self, nbytes: int = 20) -> str:
        """A random hex identifier from the seeded rng (not a decision: never enumerated)."""
        return "%0*x" % (nbytes * 2, self.rng.getrandbits(nbytes * 8))

    # the trace

    def note(self, who: str, *parts: Any) -> None:
        """Add a trace line; ``parts`` are formatted only when the trace is printed."""
        self.trace.append((self.now, who, parts))

    def trace_lines(self, last: int | None = None) -> list[str]:
        items = list(self.trace)
        if last is not None:
            items = items[-last:]
        return [f"t={t:.6f} {who} " + " ".join(_fmt(p) for p in parts) for t, who, parts in items]

    def dump(self, last: int | None = None) -> str:
        return "\n".join(self.trace_lines(last))


# -- formatting for the trace ------------------------------------------------------

_SCRIPT_NAMES: dict[str, str] = {}


def _script_name(text: str) -> str | None:
    if not _SCRIPT_NAMES:
        from django_redlock.core import scripts

        for script in (scripts.ACQUIRE, scripts.RELEASE, scripts.EXTEND, scripts.FENCE_RAISE, scripts.INSPECT,
                       scripts.VOTE, scripts.DATASET, scripts.FENCE_READ):
            _SCRIPT_NAMES[script.source] = f"<{script.name}>"
            _SCRIPT_NAMES[script.sha] = f"<{script.name}>"
    return _SCRIPT_NAMES.get(text)


def _short(value: Any) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        name = _script_name(value)
        if name is not None:
            return name
        if len(value) > 24 and "\n" not in value:
            return value[:10] + ".." + value[-4:]
        if "\n" in value:
            return repr(value[:20] + "..")
        return value
    if isinstance(value, list):
        return "[" + ", ".join(_short(v) for v in value) + "]"
    if value is None:
        return "nil"
    if isinstance(value, BaseException):
        return f"{type(value).__name__}({str(value)[:40]})"
    return str(value)


def _fmt(part: Any) -> str:
    if isinstance(part, tuple):
        return " ".join(_short(v) for v in part)
    return _short(part)
