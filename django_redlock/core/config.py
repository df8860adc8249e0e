"""A manager's settings, validated: the arguments' checks and :class:`ManagerConfig` (keys, commands,
drift, the injected clocks and holder maker, the hooks of :mod:`~django_redlock.core.hooks`).
Nothing here does I/O."""

from __future__ import annotations

import functools
import math
import os
import random
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, overload

from django_redlock.core import clock
from django_redlock.core.hooks import AcquireReport, CombinedHooks, Hooks, NodeSeen, Outcome, call_hook, wants
from django_redlock.core.records import MAX_RESOURCES, Holder
from django_redlock.core.scripts import INSPECT, LIST, RELEASE, script_command
from django_redlock.exceptions import InvalidResource

__all__ = [
    "ARGUMENTS",
    "DEFAULT_MAX_TTL",
    "DRIFT_CONSTANT",
    "MAX_RESOURCES",
    "MAX_RESOURCE_LENGTH",
    "PLACE_MARGIN",
    "PROVISIONAL_TTL",
    "TOKEN_BYTES",
    "WAIT_SLICE",
    "AcquireReport",
    "CombinedHooks",
    "Hooks",
    "ManagerConfig",
    "NodeSeen",
    "Outcome",
    "Request",
    "Resources",
    "call_hook",
    "check_arguments",
    "check_count",
    "check_drift_factor",
    "check_duration",
    "check_encodable",
    "check_flag",
    "check_keep_alive",
    "check_label",
    "check_name",
    "check_resource",
    "check_resources",
    "check_seconds",
    "check_text",
    "check_ttl",
    "check_wait",
    "ms",
    "name_of",
    "wants",
    "new_holder",
    "new_token",
    "lines_of",
    "wall_us",
]

#: What ``acquire()`` and ``lock()`` take: one resource, or several to lock together.
Resources = str | Iterable[str]

#: Fixed part of the drift allowance (the spec's "2 milliseconds").
DRIFT_CONSTANT = 0.002
#: The longest ttl any client may use unless configured otherwise (seconds).
DEFAULT_MAX_TTL = 60.0
MAX_RESOURCE_LENGTH = 1024
TOKEN_BYTES = 20
#: The longest single wait in line: a waiter votes again at least this often.
WAIT_SLICE = 0.5
#: A place in line outlives its waiter's current wait by this much; a waiter
#: that dies holds up the line at most ``WAIT_SLICE + PLACE_MARGIN``.
PLACE_MARGIN = 1.0
#: A vote granted in line (it may run long after it was written, its caller frozen since) sets
#: the keys for this long at most; the caller extends them to the lock's ttl once it has read the
#: grant. A winner that never reads it holds up the line this long, not a whole ttl.
PROVISIONAL_TTL = PLACE_MARGIN


def check_resource(resource: Any) -> str:
    """A resource a lock may name: a non-empty string of at most :data:`MAX_RESOURCE_LENGTH`
    characters, with no control character, that UTF-8 encodes."""
    if not isinstance(resource, str):
        raise ValueError(f"resource must be a non-empty string; got {type(resource).__name__}.")
    if type(resource) is not str:
        # A str subclass (a str-mixin Enum member) is the text its keys are named with (it formats so),
        # a plain str from here on: keys, names and caches see one text for one resource.
        resource = f"{resource}"
    if not resource:
        raise ValueError("resource must be a non-empty string.")
    if len(resource) > MAX_RESOURCE_LENGTH:
        raise InvalidResource(f"resource is {len(resource)} characters long; the limit is {MAX_RESOURCE_LENGTH}.")
    if _CONTROL.search(resource):
        raise InvalidResource("resource must not contain control characters.")
    return resource if resource.isascii() else check_encodable(resource, "resource", InvalidResource)


_CONTROL = re.compile("[\x00-\x1f\x7f]")


def check_encodable(text: str, argument: str, error: type[ValueError] = ValueError) -> str:
    """``text``, once known to be UTF-8 encodable: every string sent to the nodes is (a lone surrogate,
    as JSON's ``"\\ud800"`` makes, is not). Raises ``error`` naming ``argument`` otherwise."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise error(
                f"{argument} must be text that UTF-8 can encode; it holds {text[exc.start]!r} at position {exc.start} "
                "(a lone surrogate)."
            ) from None
    return text


def check_name(name: Any, argument: str = "resource") -> str:
    """A name that is only read (``is_locked()``, ``lock_record()``): any non-empty string UTF-8 encodes,
    even one ``acquire()`` refuses (a key written by something else)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{argument} must be a non-empty string; got {name!r}.")
    return check_encodable(name, argument)


def _glob_escape(text: str) -> str:
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)


def check_resources(resources: Any) -> tuple[str, ...]:
    """One resource (a string) or several (an iterable of strings): sorted, each once."""
    if isinstance(resources, str):
        return (check_resource(resources),)
    if type(resources) is tuple and len(resources) == 1:
        return (check_resource(resources[0]),)
    if isinstance(resources, (bytes, bytearray)) or not hasattr(resources, "__iter__"):
        raise ValueError(
            f"resource must be a non-empty string, or a list of them to lock several at once; "
            f"got {type(resources).__name__}."
        )
    names = sorted({check_resource(r) for r in resources})
    if not names:
        raise ValueError("resources must name at least one resource; got an empty collection.")
    if len(names) > MAX_RESOURCES:
        raise InvalidResource(f"{len(names)} resources in one lock; the limit is {MAX_RESOURCES}.")
    return tuple(names)


#: How a lock on ``resources`` is named in messages, hooks and signals: ``name_of(resources)``,
#: e.g. ``"invoice-1, invoice-2"`` (a C-level join: no Python call per lock).
name_of: Callable[[Iterable[str]], str] = ", ".join


@overload
def check_seconds(value: object, argument: str, *, allow_none: Literal[False] = ..., allow_zero: bool = ...) -> float: ...
@overload
def check_seconds(value: object, argument: str, *, allow_none: bool, allow_zero: bool = ...) -> float | None: ...
def check_seconds(value: object, argument: str, *, allow_none: bool = False, allow_zero: bool = False) -> float | None:
    if value is None:
        if allow_none:
            return None
        raise ValueError(f"{argument} must be a number of seconds, not None.")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{argument} must be a number of seconds; got {value!r}.")
    seconds = float(value)
    if math.isnan(seconds) or math.isinf(seconds):
        raise ValueError(f"{argument} must be a finite number of seconds; got {value!r}.")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        expected = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{argument} must be {expected} seconds; got {value!r}.")
    return seconds


def check_count(value: object, argument: str, *, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{argument} must be a whole number >= 0; got {value!r}.")
    return value


def check_flag(value: Any, argument: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{argument} must be True or False; got {value!r}.")
    return value


def check_wait(blocking: Any, timeout: Any) -> float | None:
    """``timeout`` for an acquire: seconds to wait in line, which only a blocking call does."""
    check_flag(blocking, "blocking")
    seconds = check_seconds(timeout, "timeout", allow_none=True, allow_zero=True)
    if not blocking and seconds is not None:
        raise ValueError(
            f"timeout={timeout!r} cannot be used with blocking=False: a non-blocking acquire makes one "
            "attempt and never waits. Pass blocking=True to wait up to the timeout, or drop the timeout."
        )
    return seconds


class Request:
    """One acquire call's arguments, checked once by the public call (:meth:`ManagerConfig.request`):
    what lies below (the call's plan, the acquire step) trusts them as they are."""

    __slots__ = ("resources", "ttl", "blocking", "timeout", "label", "reentrant", "keep")

    def __init__(
        self,
        resources: tuple[str, ...],
        ttl: float,
        blocking: bool,
        timeout: float | None,
        label: str | None,
        reentrant: bool = False,
        keep: tuple[float | None, Any] | None = None,
    ) -> None:
        self.resources = resources  # sorted, each once
        self.ttl = ttl  # the manager's ttl when none was given
        self.blocking = blocking
        self.timeout = timeout
        self.label = label  # the manager's label when none was given
        self.reentrant = reentrant
        #: ``(max_hold, on_lost)`` when the lock is to be kept alive once acquired (``auto_extend``), else None.
        self.keep = keep


def check_keep_alive(auto_extend: Any, max_hold: Any, on_lost: Any) -> tuple[float | None, Any] | None:
    """``(max_hold, on_lost)`` when a lock is to be kept alive once acquired (``auto_extend``), else
    None; all three checked."""
    check_flag(auto_extend, "auto_extend")
    if on_lost is not None and not callable(on_lost):
        raise ValueError(f"on_lost must be a callable taking the lock, or None; got {type(on_lost).__name__}.")
    max_hold = check_seconds(max_hold, "max_hold", allow_none=True)
    return (max_hold, on_lost) if auto_extend else None


def check_label(label: Any, argument: str = "label") -> str | None:
    """A holder's label, shown to operators: a string with no control character, that UTF-8 encodes."""
    if label is None:
        return None
    if not isinstance(label, str):
        raise ValueError(f"{argument} must be a string or None; got {label!r}.")
    if _CONTROL.search(label):
        raise ValueError(f"{argument} must not contain control characters; got {label!r}.")
    return check_encodable(label, argument)


def check_text(value: Any, argument: str) -> str:
    """A string sent to the nodes as it is (``key_prefix``, a listing's ``match``)."""
    if not isinstance(value, str):
        raise ValueError(f"{argument} must be a string; got {value!r}.")
    return check_encodable(value, argument)


def check_duration(value: Any, argument: str = "ttl") -> float:
    """A ttl: a number of seconds, at least 10 ms."""
    seconds = check_seconds(value, argument)
    if seconds < 0.01:
        raise ValueError(f"{argument} must be at least 0.01 seconds (10 ms); got {value!r}.")
    return seconds


def check_ttl(ttl: Any, default: float, argument: str = "ttl") -> float:
    """A lock's ttl, ``default`` when None."""
    return default if ttl is None else check_duration(ttl, argument)


def check_drift_factor(value: Any, argument: str = "clock_drift_factor") -> float:
    """The clock drift allowance, a fraction of the ttl."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{argument} must be a finite number >= 0 (a fraction of the ttl); got {value!r}.")
    if value >= 0.5:
        raise ValueError(f"{argument} must be below 0.5 (a fraction of the ttl); got {value!r}.")
    return float(value)


def _seconds(allow_none: bool = False, allow_zero: bool = False) -> Callable[[Any, str], float | None]:
    return lambda value, argument: check_seconds(value, argument, allow_none=allow_none, allow_zero=allow_zero)


def _count(value: Any, argument: str) -> int | None:
    return check_count(value, argument, allow_none=True)


#: The rule for each of a manager's settings, by keyword: ``check(value, name)`` returns the value to
#: use, or raises ValueError saying what ``name`` (the keyword, or the setting it came from) expects.
#: Settings read elsewhere (Django's ``REDLOCK``) are checked by these, so both refuse the same values.
ARGUMENTS: dict[str, Callable[[Any, str], Any]] = {
    "ttl": check_duration,
    "retry_count": _count,
    "retry_delay": _seconds(allow_zero=True),
    "retry_jitter": _seconds(allow_zero=True),
    "clock_drift_factor": check_drift_factor,
    "node_timeout": _seconds(),
    "key_prefix": check_text,
    "max_extensions": _count,
    "label": check_label,
    "restart_window": _seconds(allow_none=True, allow_zero=True),
    "max_ttl": check_duration,
}


def check_arguments(values: Mapping[str, Any], names: Mapping[str, str] | None = None) -> tuple[dict[str, Any], list[str]]:
    """Check each of ``values`` (keyword -> value) by its rule in :data:`ARGUMENTS`, naming it as ``names``
    says (default: the keyword). Returns the checked values and one message per refused value."""
    checked: dict[str, Any] = {}
    problems: list[str] = []
    for keyword, value in values.items():
        try:
            checked[keyword] = ARGUMENTS[keyword](value, (names or {}).get(keyword, keyword))
        except ValueError as exc:
            problems.append(str(exc))
    return checked, problems


#: The keys of a resource (after the key prefix): its lock, its waiting line's order and places,
#: and the head of the wake list of each place in that line (C-level formatters: no Python call).
_LOCK_KEY = "{}lock:{}".format
_QUEUE_KEY = "{}queue:{}".format
_PLACES_KEY = "{}places:{}".format
_WAKE_PREFIX = "{}wake:{}:".format


@functools.lru_cache(maxsize=1024)  # a lock's acquire and its release both need them: made once
def lines_of(prefix: str, resources: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """ACQUIRE's and RELEASE's KEYS (the lock key, the waiting line's order and its places, in threes
    per resource) and the head of each resource's wake lists (a place's list: the head + the place)."""
    keys: list[str] = []
    wakes: list[str] = []
    for resource in resources:  # a loop of format calls: no Python call per resource
        keys += (_LOCK_KEY(prefix, resource), _QUEUE_KEY(prefix, resource), _PLACES_KEY(prefix, resource))
        wakes.append(_WAKE_PREFIX(prefix, resource))
    return tuple(keys), tuple(wakes)


class ManagerConfig:
    """Validated settings shared by :class:`LockManager` and :class:`AsyncLockManager`."""

    def __init__(
        self,
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
        given = {
            "ttl": ttl,
            "retry_count": retry_count,
            "retry_delay": retry_delay,
            "retry_jitter": retry_jitter,
            "clock_drift_factor": clock_drift_factor,
            "node_timeout": node_timeout,
            "key_prefix": key_prefix,
            "max_extensions": max_extensions,
            "label": label,
            "restart_window": restart_window,
            "max_ttl": max_ttl,
        }
        checked, problems = check_arguments(given)
        if problems:
            raise ValueError(" ".join(problems))
        self.max_ttl: float = checked["max_ttl"]
        self.ttl = self.lock_ttl(checked["ttl"], 30.0)
        self.retry_count: int | None = checked["retry_count"]
        self.retry_delay: float = checked["retry_delay"]
        self.retry_jitter: float = checked["retry_jitter"]
        self.clock_drift_factor: float = checked["clock_drift_factor"]
        window = checked["restart_window"]
        if window is None:
            window = self.max_ttl + self.drift(self.max_ttl)
        elif 0 < window < self.max_ttl:
            raise ValueError(
                f"restart_window ({window} s) is shorter than max_ttl ({self.max_ttl} s): a node restarted "
                "empty would vote again while locks it forgot are still valid. Use a window >= max_ttl, "
                "or 0 to turn the delayed-restart rule off (only for nodes that fsync every write, or tests)."
            )
        #: How long a node restarted without fsync-always persistence sits out (0: rule off).
        self.restart_window = window
        #: The clock validity is measured on (:mod:`.clock`; the simulator gives each client its own).
        self.clock: Callable[[], float] = clock.now
        #: The wall clock in microseconds (waiting-line tickets, the floor of fencing tokens).
        self.wall_us: Callable[[], int] = wall_us
        #: Makes the holder of each attempt (the simulator makes them from its seed).
        self.make_holder: Callable[[str | None], Holder] = new_holder
        self.node_timeout: float = checked["node_timeout"]
        self.key_prefix: str = checked["key_prefix"]
        #: The marker key whose token names each node's data set (see ``scripts.DATASET``).
        self.dataset_key = f"{self.key_prefix}dataset"
        self.max_extensions: int | None = checked["max_extensions"]
        self.label: str | None = checked["label"]
        if hooks is not None and not isinstance(hooks, Hooks):
            raise ValueError("hooks must be an instance of django_redlock.core.Hooks.")
        self.hooks = hooks
        #: The measuring hooks are run (and their extra work done) only when ``hooks`` does something on them.
        self.reports_acquires = wants(hooks, "acquire_finished")
        self.watches_nodes = wants(hooks, "nodes_seen")

    def key(self, resource: str) -> str:
        return _LOCK_KEY(self.key_prefix, resource)

    def line_keys(self, resource: str) -> tuple[str, str, str]:
        """The lock key, the waiting line's order and its places."""
        prefix = self.key_prefix
        return _LOCK_KEY(prefix, resource), _QUEUE_KEY(prefix, resource), _PLACES_KEY(prefix, resource)

    def wake_prefix(self, resource: str) -> str:
        return _WAKE_PREFIX(self.key_prefix, resource)

    def inspect_command(self, keys: Sequence[str]) -> tuple[Any, ...]:
        """INSPECT of lock keys: each one's value and ttl, and the live places in its resource's line."""
        lock_head, _, places_head = self.line_keys("")  # the script names each line from these heads
        return script_command(INSPECT, keys, (lock_head, places_head))

    def list_command(self, cursor: str, pattern: str, count: int, fields: str, safe: bool = False) -> tuple[Any, ...]:
        """LIST from ``cursor``: the next keys matching ``pattern``, with ``fields`` read of each
        (see the script); ``safe`` for a reply whose columns are arrays."""
        lock_head, _, places_head = self.line_keys("")
        return script_command(LIST, (), (cursor, pattern, count, fields, lock_head, places_head, "1" if safe else ""))

    def pattern(self, head: str, match: str | None = None) -> str:
        """A SCAN pattern for the keys starting with ``head`` (and containing ``match`` after it)."""
        pattern = _glob_escape(head) + "*"
        return pattern + _glob_escape(match) + "*" if match else pattern

    def release_command(
        self, resources: Sequence[str], value: str, place: str = "", keep: tuple[int, int] | None = None
    ) -> tuple[Any, ...]:
        """Compare-and-delete ``value``; leave the lines with ``place`` (or, with ``keep`` = (ticket,
        place lifetime ms), stay in them); wake the first waiter of each."""
        life = _PLACE_LIFE if keep is None else keep[1]
        keys, prefixes = lines_of(self.key_prefix, tuple(resources))
        ticket = "" if keep is None else keep[0]
        return script_command(RELEASE, keys, (value, place, life, ticket, *prefixes))

    def request(
        self,
        resource: Any,
        ttl: Any,
        blocking: Any,
        timeout: Any,
        label: Any,
        reentrant: Any = False,
        auto_extend: Any = False,
        max_hold: Any = None,
        on_lost: Any = None,
    ) -> Request:
        """An acquire call's arguments, checked (a ValueError names the first bad one)."""
        # The usual call's arguments (one resource, defaults) each skip the checks they need not.
        resources = (check_resource(resource),) if type(resource) is str else check_resources(resource)
        if reentrant is not False:
            reentrant = check_flag(reentrant, "reentrant")
        checked_ttl = self.ttl if ttl is None else self.lock_ttl(ttl, self.ttl)
        seconds = None if timeout is None and type(blocking) is bool else check_wait(blocking, timeout)
        checked_label = check_label(label) if label is not None else self.label
        keep = None
        if not (auto_extend is False and max_hold is None and on_lost is None):
            keep = check_keep_alive(auto_extend, max_hold, on_lost)
        return Request(resources, checked_ttl, blocking, seconds, checked_label, reentrant, keep)

    def lock_ttl(self, ttl: Any, default: float, argument: str = "ttl") -> float:
        """Check a lock's ttl: a number of seconds, at most ``max_ttl``."""
        value = check_ttl(ttl, default, argument)
        if value > self.max_ttl:
            raise ValueError(
                f"{argument} ({value} s) is above max_ttl ({self.max_ttl} s), the longest ttl any client of "
                "these nodes may use (the delayed-restart window is built on it). Keep long work alive with "
                "auto_extend=True or extend(), or raise max_ttl (REDLOCK['MAX_TTL']) in every client."
            )
        return value

    def fence_key(self, resource: str) -> str:
        return f"{self.key_prefix}fence:{resource}"

    def drift(self, ttl: float) -> float:
        return ttl * self.clock_drift_factor + DRIFT_CONSTANT

    def retry_pause(self) -> float:
        low = max(0.0, self.retry_delay - self.retry_jitter)
        high = self.retry_delay + self.retry_jitter
        return random.uniform(low, high)  # noqa: S311 - spreading retries, not secrets


def wall_us() -> int:
    """The wall clock, in whole microseconds."""
    return time.time_ns() // 1000


def new_token() -> str:
    # What secrets.token_hex does, without its two layers of calls: this runs for every attempt.
    return os.urandom(TOKEN_BYTES).hex()


def new_holder(label: str | None) -> Holder:
    return Holder.new(os.urandom(TOKEN_BYTES).hex(), label)  # new_token(), without the call: one per attempt


@functools.lru_cache(maxsize=256)  # the same few durations (ttls, the place lifetime) recur: looked up in C
def ms(seconds: float) -> int:
    return max(1, int(round(seconds * 1000)))


#: How long a release that leaves its lines keeps a place it did not keep: long enough to wake its next.
_PLACE_LIFE = ms(WAIT_SLICE + PLACE_MARGIN)
