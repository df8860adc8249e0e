"""Lock metrics for OpenTelemetry (``opentelemetry-api``): :class:`OpenTelemetryHooks`. See :doc:`metrics`."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from django_redlock.core.config import AcquireReport, NodeSeen
from django_redlock.metrics.common import (
    ACQUIRE_BUCKETS,
    HOLD_BUCKETS,
    NODE_BUCKETS,
    HeldLocks,
    MetricsHooks,
    missing_library,
)

try:
    from opentelemetry import metrics as otel
    from opentelemetry.metrics import CallbackOptions, Histogram, Meter, MeterProvider, Observation
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise missing_library("opentelemetry", "opentelemetry-api", exc) from None

__all__ = ["OpenTelemetryHooks"]

#: The instrumentation scope's name (the meter's).
SCOPE = "django_redlock"
GROUP = "redlock.group"
OUTCOME = "redlock.outcome"
KIND = "redlock.extension.kind"
NODE = "redlock.node"


def _histogram(meter: Meter, name: str, description: str, buckets: Sequence[float]) -> Histogram:
    try:
        return meter.create_histogram(
            name, unit="s", description=description, explicit_bucket_boundaries_advisory=list(buckets)
        )
    except TypeError:  # opentelemetry-api before 1.23 takes no bucket advice
        return meter.create_histogram(name, unit="s", description=description)


class _Instruments:
    """The instruments of one meter provider: made once, shared by every hooks instance that records there."""

    def __init__(self, meter: Meter) -> None:
        self.acquire = _histogram(
            meter, "redlock.acquire.duration", "Duration of acquire() calls, by how they ended.", ACQUIRE_BUCKETS
        )
        self.wait = _histogram(
            meter,
            "redlock.acquire.wait.duration",
            "Time an acquire() call waited after its first vote did not win (in line, or for the nodes).",
            ACQUIRE_BUCKETS,
        )
        self.contended = meter.create_counter(
            "redlock.acquire.contended",
            unit="{call}",
            description="acquire() calls whose first vote found the lock held, or others ahead in line.",
        )
        self.refusals = meter.create_counter(
            "redlock.acquire.refusals",
            unit="{call}",
            description="acquire() calls that gave up: the lock was held (locked) or too few nodes answered (no_quorum).",
        )
        self.extensions = meter.create_counter(
            "redlock.extensions",
            unit="{extension}",
            description="Lock extensions judged, by the keep-alive (automatic) or extend() (manual), and how they went.",
        )
        self.lost = meter.create_counter(
            "redlock.lost", unit="{lock}", description="Held locks found expired or taken over."
        )
        self.recreated = meter.create_counter(
            "redlock.keys.recreated",
            unit="{extension}",
            description="Times an extension set a lock's keys again on a node that had lost them "
            "(a restart, an expiry while stopped).",
        )
        self.hold = _histogram(meter, "redlock.hold.duration", "Time from acquiring a lock to releasing it.", HOLD_BUCKETS)
        self.node_round_trip = _histogram(
            meter,
            "redlock.node.round_trip.duration",
            "Time from sending a node a command to reading its reply (waits in line excluded).",
            NODE_BUCKETS,
        )
        self.held_locks = meter.create_up_down_counter(
            "redlock.locks.held", unit="{lock}", description="Locks this process acquired and has not released yet."
        )
        self.held = HeldLocks(lambda group, change: self.held_locks.add(change, _attributes(group)))
        self._mutex = threading.Lock()
        self._up: dict[str, int] = {}
        self._sitting_out: dict[str, int] = {}
        meter.create_observable_gauge(
            "redlock.node.up",
            callbacks=[self._observe(self._up)],
            unit="1",
            description="1 when the node answered its last round, 0 when it did not.",
        )
        meter.create_observable_gauge(
            "redlock.node.sitting_out",
            callbacks=[self._observe(self._sitting_out)],
            unit="1",
            description="1 while the node's votes do not count under the delayed-restart rule (a restart or a failover).",
        )

    def _observe(self, values: dict[str, int]) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            with self._mutex:
                return [Observation(value, {NODE: name}) for name, value in values.items()]

        return observe

    def node(self, node: NodeSeen) -> None:
        with self._mutex:
            self._up[node.name] = 1 if node.up else 0
            if node.sitting_out is not None:
                self._sitting_out[node.name] = 1 if node.sitting_out else 0
        if node.seconds is not None:
            self.node_round_trip.record(node.seconds, {NODE: node.name})


_SHARED: weakref.WeakKeyDictionary[MeterProvider, _Instruments] = weakref.WeakKeyDictionary()
#: The instruments of the global meter provider: made once, through the API's proxy when no provider
#: is set yet (they record into the one set later).
_GLOBAL: list[_Instruments] = []
_SHARED_MUTEX = threading.Lock()


def _instruments_of(provider: MeterProvider | None) -> _Instruments:
    from django_redlock import __version__

    with _SHARED_MUTEX:
        if provider is None:
            if not _GLOBAL:
                _GLOBAL.append(_Instruments(otel.get_meter(SCOPE, __version__)))
            return _GLOBAL[0]
        instruments = _SHARED.get(provider)
        if instruments is None:
            meter = otel.get_meter(SCOPE, __version__, meter_provider=provider)
            instruments = _SHARED[provider] = _Instruments(meter)
        return instruments


def _attributes(group: str | None, **more: str) -> dict[str, Any]:
    if group is not None:
        more[GROUP] = group
    return more


class OpenTelemetryHooks(MetricsHooks):
    """Record lock metrics with OpenTelemetry instruments, from the meter ``django_redlock`` of
    ``meter_provider`` (default: the global one, ``opentelemetry.metrics.get_meter_provider()``).

    The instruments are made once per meter provider and shared by every instance that records
    there (the sync and the asyncio manager, a manager rebuilt after a settings change).
    ``group``: see :class:`~django_redlock.metrics.MetricsHooks` (the attribute ``redlock.group``).
    """

    def __init__(self, meter_provider: MeterProvider | None = None, group: Callable[[str], str] | None = None) -> None:
        super().__init__(group)
        if meter_provider is not None and not isinstance(meter_provider, MeterProvider):
            raise ValueError(
                f"meter_provider must be an opentelemetry MeterProvider; got {type(meter_provider).__name__}."
            )
        self.meter_provider = meter_provider
        self.instruments = _instruments_of(meter_provider)
        self.held = self.instruments.held

    def record_acquire(self, report: AcquireReport, group: str | None) -> None:
        i = self.instruments
        attributes = _attributes(group, **{OUTCOME: report.outcome})
        i.acquire.record(report.seconds, attributes)
        if report.waited > 0:
            i.wait.record(report.waited, attributes)
        if report.contended:
            i.contended.add(1, _attributes(group))
        if report.outcome == "locked" or report.outcome == "no_quorum":
            i.refusals.add(1, attributes)

    def record_extension(self, group: str | None, kind: str, outcome: str) -> None:
        self.instruments.extensions.add(1, _attributes(group, **{KIND: kind, OUTCOME: outcome}))

    def record_lost(self, group: str | None) -> None:
        self.instruments.lost.add(1, _attributes(group))

    def record_hold(self, group: str | None, seconds: float) -> None:
        self.instruments.hold.record(seconds, _attributes(group))

    def record_node(self, node: NodeSeen) -> None:
        self.instruments.node(node)

    def record_recreated(self, node: str) -> None:
        self.instruments.recreated.add(1, {NODE: node})
