"""Lock metrics on real servers: one run of lock events (acquire, contend, wait in line, extend by
hand and automatically, lose one, nodes down), read back from Prometheus (``/metrics`` scraped
through Django, for the sync and asyncio managers) and from OpenTelemetry (the SDK's in-memory
reader, for both engines); then the group label, nodes sitting out, a cancelled call, the
``REDLOCK["HOOKS"]`` setting and hooks that fail."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse
from django.urls import path
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from django_redlock import signals
from django_redlock.core import AsyncLockManager, Hooks, LockManager
from django_redlock.core.config import CombinedHooks, wants
from django_redlock.exceptions import LockLost, LockNotAcquired, QuorumUnavailable
from django_redlock.manager import get_async_lock_manager, get_lock_manager
from django_redlock.metrics import OpenTelemetryHooks, PrometheusHooks
from tests.conftest import eventually
from tests.engines import Blocking, Engine

#: Never waits unless asked; a node timeout long enough that a busy test machine does not show a node down.
FAST = {"ttl": 10.0, "retry_count": 0, "node_timeout": 0.5, "restart_window": 0}
SETTINGS = {"NODE_TIMEOUT": 0.5, "RESTART_WINDOW": 0, "RETRY_COUNT": 0}

# -- a /metrics view, as docs/metrics.rst shows it (on the registry of the test) ---------------

SCRAPED: dict[str, CollectorRegistry] = {}


def metrics_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse(generate_latest(SCRAPED["registry"]), content_type=CONTENT_TYPE_LATEST)


urlpatterns = [path("metrics", metrics_view)]


@pytest.fixture
def registry():
    SCRAPED["registry"] = made = CollectorRegistry()
    yield made
    SCRAPED.clear()


# -- reading both exporters the same way ------------------------------------------------------

PROMETHEUS = {
    "acquire": "django_redlock_acquire_seconds",
    "wait": "django_redlock_wait_seconds",
    "contended": "django_redlock_contended_total",
    "refusals": "django_redlock_refusals_total",
    "extensions": "django_redlock_extensions_total",
    "lost": "django_redlock_lost_total",
    "hold": "django_redlock_hold_seconds",
    "held": "django_redlock_held_locks",
    "node_up": "django_redlock_node_up",
    "sitting_out": "django_redlock_node_sitting_out",
    "round_trip": "django_redlock_node_round_trip_seconds",
}
OTEL = {
    "acquire": "redlock.acquire.duration",
    "wait": "redlock.acquire.wait.duration",
    "contended": "redlock.acquire.contended",
    "refusals": "redlock.acquire.refusals",
    "extensions": "redlock.extensions",
    "lost": "redlock.lost",
    "hold": "redlock.hold.duration",
    "held": "redlock.locks.held",
    "node_up": "redlock.node.up",
    "sitting_out": "redlock.node.sitting_out",
    "round_trip": "redlock.node.round_trip.duration",
}
OTEL_KEYS = {"outcome": "redlock.outcome", "kind": "redlock.extension.kind", "node": "redlock.node", "group": "redlock.group"}


class Read:
    """What one scrape showed: ``rows`` of (metric, labels, {"value" | "count" | "sum": number})."""

    def __init__(self, rows: list[tuple[str, dict[str, str], dict[str, float]]], text: str = "") -> None:
        self.rows = rows
        self.text = text

    def _total(self, metric: str, field: str, labels: dict[str, str]) -> float:
        found = [
            numbers[field]
            for name, have, numbers in self.rows
            if name == metric and field in numbers and all(have.get(k) == v for k, v in labels.items())
        ]
        return sum(found) if found else 0.0

    def value(self, metric: str, **labels: str) -> float:
        """A counter's total over the rows with ``labels`` (0 when none was counted yet)."""
        return self._total(metric, "value", labels)

    def gauge(self, metric: str, **labels: str) -> float | None:
        """A gauge's value (None when it was never set)."""
        found = [n["value"] for name, have, n in self.rows if name == metric and "value" in n and have == labels]
        assert len(found) <= 1, found
        return found[0] if found else None

    def count(self, metric: str, **labels: str) -> float:
        return self._total(metric, "count", labels)

    def sum(self, metric: str, **labels: str) -> float:
        return self._total(metric, "sum", labels)

    def label_values(self, label: str) -> set[str]:
        return {have[label] for _, have, _ in self.rows if label in have}


def prometheus_read(text: str) -> Read:
    names = {full: short for short, full in PROMETHEUS.items()}
    rows = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for suffix, field in (("_count", "count"), ("_sum", "sum"), ("", "value")):
                base = sample.name[: len(sample.name) - len(suffix)] if suffix else sample.name
                if sample.name.endswith(suffix) and base in names:
                    rows.append((names[base], dict(sample.labels), {field: sample.value}))
                    break
    return Read(rows, text)


def otel_read(reader: InMemoryMetricReader) -> Read:
    names = {full: short for short, full in OTEL.items()}
    keys = {full: short for short, full in OTEL_KEYS.items()}
    rows = []
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            assert scope.scope.name == "django_redlock"
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    labels = {keys[k]: str(v) for k, v in (point.attributes or {}).items()}
                    if hasattr(point, "count"):
                        numbers = {"count": float(point.count), "sum": float(point.sum)}
                    else:
                        numbers = {"value": float(point.value)}
                    rows.append((names[metric.name], labels, numbers))
    return Read(rows)


# -- the events, and what they must show -------------------------------------------------------


def lock_events(m: Any, servers: Any, read: Any) -> None:
    """Lock events on manager ``m`` (sync, or the asyncio one behind a blocking face), checked in
    ``read()`` as they happen; every node running at the start."""
    a = m.acquire("metrics-a", blocking=False)
    assert read().gauge("held") == 1
    with pytest.raises(LockNotAcquired) as refused:
        m.acquire("metrics-a", blocking=False)
    assert not isinstance(refused.value, QuorumUnavailable)
    a.extend()

    # A call waits in line until the holder releases.
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(m.acquire("metrics-a", timeout=10)))
    waiter.start()
    eventually(lambda: (record := m.lock_record("metrics-a")) is not None and record.waiting >= 1)
    a.release()
    waiter.join(15)
    assert got and got[0].locked()
    got[0].release()

    with m.lock("metrics-b", ttl=0.3, auto_extend=True) as b:
        eventually(lambda: b.extensions >= 2)

    c = m.acquire("metrics-c", blocking=False)
    assert m.force_release("metrics-c") >= 3  # a node may get the SET after the DEL: the lock is lost still
    with pytest.raises(LockLost):
        c.extend()
    assert c.lost and c.release() is False

    seen = read()
    assert seen.count("acquire", outcome="acquired") == 4
    assert seen.count("acquire", outcome="locked") == 1
    assert seen.count("acquire", outcome="no_quorum") == 0
    assert seen.sum("acquire") > 0
    assert seen.value("contended") == 2  # the refused call and the waiter
    assert seen.value("refusals", outcome="locked") == 1
    assert seen.count("wait", outcome="acquired") == 1 and seen.sum("wait") > 0
    assert seen.value("extensions", kind="manual", outcome="extended") == 1
    assert seen.value("extensions", kind="automatic", outcome="extended") >= 2
    assert seen.value("extensions", kind="manual", outcome="failed") == 1
    assert seen.value("extensions", kind="automatic", outcome="failed") == 0
    assert seen.value("lost") == 1
    assert seen.count("hold") == 4  # a, the waiter's, b, c
    assert seen.gauge("held") == 0
    for name in m.nodes:
        assert seen.gauge("node_up", node=name) == 1
        assert seen.gauge("sitting_out", node=name) == 0  # the rule is off (restart_window=0)
        assert seen.count("round_trip", node=name) > 0
    assert seen.label_values("node") == set(m.nodes)
    assert "metrics-" not in seen.text  # no resource names without a group function

    # A node goes down: the lock calls' own rounds show it.
    servers[0].kill()
    first = m.nodes[0]

    def noticed() -> bool:
        m.acquire("metrics-d", blocking=False).release()
        return read().gauge("node_up", node=first) == 0

    eventually(noticed)
    assert read().gauge("node_up", node=m.nodes[1]) == 1

    servers[1].kill()
    servers[2].kill()
    with pytest.raises(QuorumUnavailable):
        m.acquire("metrics-e", blocking=False)
    seen = read()
    assert seen.count("acquire", outcome="no_quorum") == 1
    assert seen.value("refusals", outcome="no_quorum") == 1
    assert [seen.gauge("node_up", node=name) for name in m.nodes] == [0, 0, 0, 1, 1]


# -- Prometheus, scraped through Django ---------------------------------------------------------


@pytest.fixture
def scrape(client):
    def read() -> Read:
        response = client.get("/metrics")
        assert response.status_code == 200
        assert response["Content-Type"] == CONTENT_TYPE_LATEST
        return prometheus_read(response.content.decode())

    return read


@pytest.mark.urls(__name__)
def test_prometheus_sync_manager_from_settings(redlock_settings, servers, registry, scrape):
    redlock_settings.REDLOCK = {**SETTINGS, "HOOKS": [PrometheusHooks(registry)]}
    sent: list[str] = []
    receiver = lambda sender, **kwargs: sent.append(kwargs["lock"].resource)  # noqa: E731
    signals.lock_acquired.connect(receiver)
    try:
        manager = get_lock_manager()
        assert manager.config.reports_acquires and manager.config.watches_nodes
        lock_events(manager, servers, scrape)
    finally:
        signals.lock_acquired.disconnect(receiver)
    assert sent[:2] == ["metrics-a", "metrics-a"]  # the signals still go out beside the metrics


@pytest.mark.urls(__name__)
def test_prometheus_async_manager_from_settings(redlock_settings, servers, registry, scrape):
    # A class path: each manager built from the settings makes its own instance, on one registry.
    redlock_settings.REDLOCK = {**SETTINGS, "HOOKS": ["tests.test_metrics.ScrapedHooks"]}
    engine = Engine("async")
    try:
        manager = Blocking(get_async_lock_manager(), engine._loop)
        try:
            lock_events(manager, servers, scrape)
        finally:
            manager.close()
    finally:
        engine.close()
    servers.heal()
    before = scrape().count("acquire", outcome="acquired")
    get_lock_manager().acquire("metrics-sync", blocking=False).release()
    assert scrape().count("acquire", outcome="acquired") == before + 1  # both managers count in one registry


class ScrapedHooks(PrometheusHooks):
    def __init__(self) -> None:
        super().__init__(SCRAPED["registry"])


# -- OpenTelemetry, with the SDK's in-memory reader ------------------------------------------------


@pytest.fixture
def otel():
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    yield provider, reader
    provider.shutdown()


def test_opentelemetry(engine, servers, otel):
    provider, reader = otel
    manager = engine.manager(servers.urls, hooks=OpenTelemetryHooks(meter_provider=provider), **FAST)
    lock_events(manager, servers, lambda: otel_read(reader))
    names = {m.name: m for r in reader.get_metrics_data().resource_metrics for s in r.scope_metrics for m in s.metrics}
    assert names["redlock.acquire.duration"].unit == "s"
    assert list(names["redlock.acquire.duration"].data.data_points[0].explicit_bounds)[:3] == [0.001, 0.0025, 0.005]
    assert set(OTEL.values()) <= set(names)


# -- the group label, cardinality ------------------------------------------------------------------


def test_group_labels_by_the_function_given(servers, registry):
    hooks = PrometheusHooks(registry, group=lambda resource: resource.split("-")[0])
    with LockManager(servers.urls, hooks=hooks, **FAST) as manager:
        for name in ("invoice-1", "invoice-2", "report-1"):
            manager.acquire(name, blocking=False).release()
        with manager.lock("invoice-3"):
            with pytest.raises(LockNotAcquired):
                manager.acquire("invoice-3", blocking=False)
            seen = prometheus_read(generate_latest(registry).decode())
            assert seen.gauge("held", group="invoice") == 1
    seen = prometheus_read(generate_latest(registry).decode())
    assert seen.count("acquire", group="invoice", outcome="acquired") == 3
    assert seen.count("acquire", group="report", outcome="acquired") == 1
    assert seen.count("acquire", group="invoice", outcome="locked") == 1
    assert seen.count("hold", group="invoice") == 3
    assert seen.label_values("group") == {"invoice", "report"}
    assert "invoice-" not in seen.text and "report-" not in seen.text
    # One registry's metrics carry a group label or none: a second hooks without one is refused.
    with pytest.raises(ValueError, match="group function"):
        PrometheusHooks(registry)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="group must be a function"):
        PrometheusHooks(CollectorRegistry(), group="resource")
    with pytest.raises(ValueError, match="registry must be a prometheus_client CollectorRegistry"):
        PrometheusHooks(registry="default")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="meter_provider must be an opentelemetry MeterProvider"):
        OpenTelemetryHooks(meter_provider=object())  # type: ignore[arg-type]


# -- node health from what the engine learns ------------------------------------------------------


def test_nodes_sitting_out_after_a_restart(servers, registry):
    """Fresh nodes under the delayed-restart rule: every vote is refused, each node shows up and sitting out."""
    window = 86400.0  # the suite's servers are younger than that
    hooks = PrometheusHooks(registry)
    options = {**FAST, "max_ttl": window, "restart_window": window}
    with LockManager(servers.urls, hooks=hooks, **options) as m:
        with pytest.raises(QuorumUnavailable, match="delayed-restart rule"):
            m.acquire("metrics-restart", timeout=0.05)  # a call that waits hears every node out
    seen = prometheus_read(generate_latest(registry).decode())
    assert [seen.gauge("sitting_out", node=n) for n in m.nodes] == [1] * len(servers)
    assert [seen.gauge("node_up", node=n) for n in m.nodes] == [1] * len(servers)
    assert seen.value("refusals", outcome="no_quorum") == 1
    assert seen.value("contended") == 0
    # A manager without the rule on the same nodes: their replies count. (A forced release hears
    # every node out; a lock's vote and release end at a quorum.)
    with LockManager(servers.urls, hooks=PrometheusHooks(registry), **FAST) as m:
        m.acquire("metrics-restart", blocking=False).release()
        m.force_release("metrics-restart")
    seen = prometheus_read(generate_latest(registry).decode())
    assert [seen.gauge("sitting_out", node=n) for n in m.nodes] == [0] * len(servers)


def test_node_status_refreshes_the_node_gauges(servers, registry):
    with LockManager(servers.urls, hooks=PrometheusHooks(registry), **FAST) as m:
        servers[4].kill()
        statuses = m.node_status(timeout=1.0)
    assert [s.reachable for s in statuses] == [True, True, True, True, False]
    seen = prometheus_read(generate_latest(registry).decode())
    assert [seen.gauge("node_up", node=n) for n in m.nodes] == [1, 1, 1, 1, 0]


# -- the asyncio engine: a cancelled call -------------------------------------------------------------


async def test_a_cancelled_acquire_counts_as_error(servers, registry):
    manager = AsyncLockManager(servers.urls, hooks=PrometheusHooks(registry), **FAST)
    try:
        held = await manager.acquire("metrics-cancel")
        waiting = asyncio.ensure_future(manager.acquire("metrics-cancel", timeout=30))
        for _ in range(100):  # until it waits in line
            record = await manager.lock_record("metrics-cancel")
            if record is not None and record.waiting:
                break
            await asyncio.sleep(0.05)
        assert record is not None and record.waiting == 1
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await held.release()
    finally:
        await manager.aclose()
    value = registry.get_sample_value
    assert value("django_redlock_acquire_seconds_count", {"outcome": "error"}) == 1
    assert value("django_redlock_wait_seconds_count", {"outcome": "error"}) == 1
    assert value("django_redlock_acquire_seconds_count", {"outcome": "acquired"}) == 1
    assert value("django_redlock_refusals_total", {"outcome": "locked"}) == 0
    assert value("django_redlock_contended_total") == 1


# -- settings, and hooks that fail -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("hooks", "message"),
    [
        ("django_redlock.metrics.PrometheusHooks", r"REDLOCK\['HOOKS'\] must be a list"),
        (["no.such.Hooks"], r"REDLOCK\['HOOKS'\]\[0\] = 'no.such.Hooks' cannot be imported"),
        (["tests.test_metrics.FAST"], r"REDLOCK\['HOOKS'\]\[0\] must name a django_redlock.core.Hooks"),
        ([Hooks(), object()], r"REDLOCK\['HOOKS'\]\[1\] must name"),
    ],
)
def test_bad_hooks_setting_is_named(redlock_settings, hooks, message):
    redlock_settings.REDLOCK = {**redlock_settings.REDLOCK, "HOOKS": hooks}
    with pytest.raises(ImproperlyConfigured, match=message):
        get_lock_manager()


def test_without_metrics_the_engine_does_no_extra_work(redlock_settings):
    manager = get_lock_manager()
    assert not manager.config.reports_acquires and not manager.config.watches_nodes
    assert not wants(CombinedHooks(Hooks(), Hooks()), "nodes_seen")
    assert wants(CombinedHooks(Hooks(), PrometheusHooks(CollectorRegistry())), "nodes_seen")


def test_failing_metrics_never_break_locking(servers, registry, caplog):
    class Counting(Hooks):
        events = 0

        def acquired(self, lock: Any) -> None:
            Counting.events += 1

    broken = PrometheusHooks(registry, group=lambda resource: 1 / 0)  # type: ignore[arg-type,return-value]
    with caplog.at_level(logging.ERROR, logger="django_redlock"):
        with LockManager(servers.urls, hooks=CombinedHooks(broken, Counting()), **FAST) as manager:
            with manager.lock("metrics-broken", auto_extend=True, ttl=0.3) as lock:
                eventually(lambda: lock.extensions >= 1)
            assert manager.is_locked("metrics-broken") is False
    assert Counting.events == 1  # the hooks after the broken one still ran
    assert "redlock hook acquired failed" in caplog.text
    assert "ZeroDivisionError" in caplog.text


def test_a_lock_dropped_without_release_leaves_the_held_gauge(servers, registry):
    import gc

    with LockManager(servers.urls, hooks=PrometheusHooks(registry), **FAST) as manager:
        manager.acquire("metrics-dropped", ttl=1.0)  # never released: it expires on the nodes
        assert registry.get_sample_value("django_redlock_held_locks") == 1
        gc.collect()
        manager.acquire("metrics-next").release()  # the next lock event takes the dropped one off
        assert registry.get_sample_value("django_redlock_held_locks") == 0


def test_opentelemetry_global_provider_set_after_the_hooks(servers):
    """Hooks made before the application sets its meter provider record into that provider."""
    from opentelemetry import metrics as otel

    if type(otel.get_meter_provider()).__name__ != "_ProxyMeterProvider":
        pytest.skip("this process already set its global meter provider")
    hooks = OpenTelemetryHooks()
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    otel.set_meter_provider(provider)  # once per process: the API refuses a second
    try:
        with LockManager(servers.urls, hooks=hooks, **FAST) as manager:
            manager.acquire("metrics-global", blocking=False).release()
        assert OpenTelemetryHooks().instruments is hooks.instruments
        assert otel_read(reader).count("acquire", outcome="acquired") == 1
    finally:
        provider.shutdown()


def test_a_forked_child_does_not_take_its_parent_s_locks_off_the_gauge():
    """The child drops the copy of a lock it inherited: the parent's count stays, and the child's
    own (a file of its own in prometheus_client's multiprocess mode) does not go below 0."""
    import gc
    import os

    from django_redlock.metrics.common import HeldLocks
    from tests.test_lock_lifecycle import wait_child

    class Held:  # stands for a lock: only its identity matters here
        pass

    changes: list[int] = []
    held = HeldLocks(lambda group, step: changes.append(step))
    lock = Held()
    held.add(lock, None)
    pid = os.fork()
    if pid == 0:  # the child: drop the inherited lock, then report what it counted
        code = 0
        try:
            del lock
            gc.collect()
            held.add(Held(), None)  # a lock event settles what was collected
            code = 0 if changes == [1, 1] else 1
        finally:
            os._exit(code)
    assert wait_child(pid, 10.0) == 0, "the child took its parent's lock off its count"
    held.discard(lock)
    assert changes == [1, -1]
