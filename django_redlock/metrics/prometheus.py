"""Lock metrics for Prometheus (``prometheus_client``): :class:`PrometheusHooks`. See :doc:`metrics`."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

from django_redlock.core.config import AcquireReport, NodeSeen
from django_redlock.metrics.common import (
    ACQUIRE_BUCKETS,
    HOLD_BUCKETS,
    NODE_BUCKETS,
    OUTCOMES,
    HeldLocks,
    MetricsHooks,
    missing_library,
)

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise missing_library("prometheus", "prometheus_client", exc) from None

__all__ = ["PrometheusHooks"]

class _Metrics:
    """The metrics in one registry: made once, shared by every hooks instance that records there."""

    def __init__(self, registry: CollectorRegistry, grouped: bool) -> None:
        self.grouped = grouped
        g = ["group"] if grouped else []

        def seconds(name: str, documentation: str, labels: list[str], buckets: tuple[float, ...]) -> Histogram:
            return Histogram(f"django_redlock_{name}_seconds", documentation, labels, buckets=buckets, registry=registry)

        def counter(name: str, documentation: str, labels: list[str]) -> Counter:
            return Counter(f"django_redlock_{name}", documentation, labels, registry=registry)

        self.acquire = seconds(
            "acquire", "Seconds an acquire() call took, by how it ended.", [*g, "outcome"], ACQUIRE_BUCKETS
        )
        self.wait = seconds(
            "wait",
            "Seconds an acquire() call waited after its first vote did not win (in line, or for the nodes).",
            [*g, "outcome"],
            ACQUIRE_BUCKETS,
        )
        self.contended = counter(
            "contended", "acquire() calls whose first vote found the lock held, or others ahead in line.", g
        )
        self.refusals = counter(
            "refusals",
            "acquire() calls that gave up: the lock was held (locked) or too few nodes answered (no_quorum).",
            [*g, "outcome"],
        )
        self.extensions = counter(
            "extensions",
            "Lock extensions judged, by the keep-alive (automatic) or extend() (manual), and how they went.",
            [*g, "kind", "outcome"],
        )
        self.lost = counter("lost", "Held locks found expired or taken over.", g)
        self.hold = seconds("hold", "Seconds from acquiring a lock to releasing it.", g, HOLD_BUCKETS)
        self.node_up = Gauge(
            "django_redlock_node_up",
            "1 when the node answered its last round, 0 when it did not.",
            ["node"],
            registry=registry,
            multiprocess_mode="livemin",  # several processes: 0 when any one could not reach it
        )
        self.node_sitting_out = Gauge(
            "django_redlock_node_sitting_out",
            "1 while the node's votes do not count under the delayed-restart rule (a restart or a failover).",
            ["node"],
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.node_round_trip = seconds(
            "node_round_trip",
            "Seconds from sending a node a command to reading its reply (waits in line excluded).",
            ["node"],
            NODE_BUCKETS,
        )
        self.recreated = counter(
            "keys_recreated",
            "Times an extension set a lock's keys again on a node that had lost them "
            "(a restart, an expiry while stopped).",
            ["node"],
        )
        self.held_locks = Gauge(
            "django_redlock_held_locks",
            "Locks this process acquired and has not released yet.",
            g,
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.held = HeldLocks(self._held_changed)
        if not grouped:  # the fixed label values show from the start, at 0
            for outcome in OUTCOMES:
                self.acquire.labels(outcome=outcome)
            for outcome in ("locked", "no_quorum"):
                self.refusals.labels(outcome=outcome)
            for kind in ("automatic", "manual"):
                for outcome in ("extended", "failed"):
                    self.extensions.labels(kind=kind, outcome=outcome)

    def _held_changed(self, group: str | None, change: int) -> None:
        _child(self.held_locks, group).inc(change)


_SHARED: weakref.WeakKeyDictionary[CollectorRegistry, _Metrics] = weakref.WeakKeyDictionary()
_SHARED_MUTEX = threading.Lock()


def _metrics_in(registry: CollectorRegistry, grouped: bool) -> _Metrics:
    with _SHARED_MUTEX:
        metrics = _SHARED.get(registry)
        if metrics is None:
            metrics = _SHARED[registry] = _Metrics(registry, grouped)
        elif metrics.grouped != grouped:
            raise ValueError(
                "the django_redlock metrics of this registry are labelled "
                f"{'with' if metrics.grouped else 'without'} a group: give every PrometheusHooks of one "
                "registry a group function, or none of them."
            )
        return metrics


def _child(metric: Any, group: str | None, **labels: str) -> Any:
    if group is not None:
        labels["group"] = group
    return metric.labels(**labels) if labels else metric


class PrometheusHooks(MetricsHooks):
    """Record lock metrics in a ``prometheus_client`` registry (default: the global ``REGISTRY``,
    which ``/metrics`` views and ``django-prometheus`` expose).

    The metrics are registered once per registry and shared by every instance that records there
    (the sync and the asyncio manager, a manager rebuilt after a settings change). ``group``: see
    :class:`~django_redlock.metrics.MetricsHooks`.
    """

    def __init__(
        self, registry: CollectorRegistry | None = None, group: Callable[[str], str] | None = None
    ) -> None:
        super().__init__(group)
        if registry is not None and not isinstance(registry, CollectorRegistry):
            raise ValueError(f"registry must be a prometheus_client CollectorRegistry; got {type(registry).__name__}.")
        self.registry = REGISTRY if registry is None else registry
        self.metrics = _metrics_in(self.registry, self.group is not None)
        self.held = self.metrics.held

    def record_acquire(self, report: AcquireReport, group: str | None) -> None:
        m = self.metrics
        outcome = report.outcome
        _child(m.acquire, group, outcome=outcome).observe(report.seconds)
        if report.waited > 0:
            _child(m.wait, group, outcome=outcome).observe(report.waited)
        if report.contended:
            _child(m.contended, group).inc()
        if outcome == "locked" or outcome == "no_quorum":
            _child(m.refusals, group, outcome=outcome).inc()

    def record_extension(self, group: str | None, kind: str, outcome: str) -> None:
        _child(self.metrics.extensions, group, kind=kind, outcome=outcome).inc()

    def record_lost(self, group: str | None) -> None:
        _child(self.metrics.lost, group).inc()

    def record_hold(self, group: str | None, seconds: float) -> None:
        _child(self.metrics.hold, group).observe(seconds)

    def record_node(self, node: NodeSeen) -> None:
        m = self.metrics
        m.node_up.labels(node=node.name).set(1 if node.up else 0)
        if node.sitting_out is not None:
            m.node_sitting_out.labels(node=node.name).set(1 if node.sitting_out else 0)
        if node.seconds is not None:
            m.node_round_trip.labels(node=node.name).observe(node.seconds)

    def record_recreated(self, node: str) -> None:
        self.metrics.recreated.labels(node=node).inc()
