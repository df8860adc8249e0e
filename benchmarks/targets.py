"""The speed targets, and the one place that judges them.

A target compares a number measured in a run with a *basis* measured in the same run on the
same machine (a floor: a bare client on raw sockets, a competitor) or, where no floor exists,
with a reference value recorded below with its date and commit. The limit follows from the
basis by the target's rule. ``bench.py`` and ``scaling.py`` build their targets with the
functions here, print them with :func:`block`, keep them in their ``--json`` results (a list
of dicts, under ``"targets"``) and write them into their ``--rst`` tables with :func:`rst`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

MET, NOT_MET, UNMEASURED = "met", "NOT met", "not measured"

#: The reference values: ``scaling.py --iterations 2000 --rtt-ms 0`` at this commit, run on the
#: project's 2-core machine with nothing else running (load average below 1), and the mean of two
#: runs of ``bench.py --only contention --workers 8`` for the validity.
REFERENCE = {"commit": "d17f8ee", "date": "2026-11-27"}
#: Client CPU per acquire+release pair (``time.process_time``, median), µs, by (series, N).
CPU_REFERENCE_US = {
    ("redlock", 1): 215.4,
    ("redlock", 5): 374.1,
    ("redlock_blocking", 1): 231.2,
    ("redlock_blocking", 5): 403.6,
}
#: Memory each held lock costs (tracemalloc, 10,000 held at once, 5 nodes), bytes, by key of ``memory``.
MEMORY_REFERENCE_BYTES = {"per_lock_bytes": 1240.8, "async_per_lock_bytes": 1246.0}
#: p99 of an acquire+release pair at N = 5 divided by the every-reply floor's p99 in the same run.
P99_REFERENCE_RATIO = {"redlock": 0.85, "redlock_blocking": 0.99}
#: Validity a lock won in line hands over less than an uncontended acquire (medians), ms: the
#: millisecond a node may drop when it sets an expiry, which the wait's measure leaves out.
VALIDITY_LOSS_REFERENCE_MS = 1.31

#: The median pair above the every-reply floor at N = 1 (µs), by series: the 2026-11-27 table
#: (docs/scaling_table.rst, ``make bench-scaling``) that the engine's reshaping set out to halve.
OVERHEAD_REFERENCE_US = {"redlock": 150.0, "redlock_blocking": 174.0}

CPU_FACTOR = 0.5  # at most half the reference
OVERHEAD_FACTOR = 0.5  # the N = 1 overhead above the floor, at most half the reference
FLOOR_FACTOR_N5 = 1.10  # the N = 5 median against the every-reply floor
ASYNC_RESHAPE_FACTOR = 1.15  # the AsyncLockManager median against the asyncio floor, after the reshaping
OVERHEAD_US = 30.0  # above the every-reply floor, at every N
ASYNC_FACTOR = 1.10  # AsyncLockManager against the asyncio floor
MEMORY_TOLERANCE = 1.02  # tracemalloc's per-lock average moves by a few bytes between runs
P99_TOLERANCE = 1.10  # p99 is the noisiest number here
VALIDITY_TOLERANCE = 2.0  # not crediting the wait would lose the whole time in line (~10 ms with 8 workers)
FAIRNESS = 1.2  # the busiest worker's acquisitions over the least busy one's
ADMIN_MS = 150.0

SERIES_NAMES = {"redlock": "non-blocking", "redlock_blocking": "blocking"}
CONTENDER = "django_redlock"
COMPETITOR = "python-redis-lock (1 node)"
FLOOR = "raw-socket floor (5 nodes)"


def verdict(value: float | None, op: str, limit: float | None) -> str:
    """``met`` when ``value op limit`` holds (``op`` is ``<=`` or ``>=``); ``not measured`` without a number."""
    if op not in ("<=", ">="):
        raise ValueError(f"op must be '<=' or '>=', not {op!r}")
    if value is None or limit is None:
        return UNMEASURED
    return MET if (value <= limit if op == "<=" else value >= limit) else NOT_MET


def target(
    name: str,
    value: float | None,
    op: str,
    limit: float | None,
    rule: str,
    unit: str,
    basis: str = "",
    basis_value: float | None = None,
) -> dict[str, Any]:
    """One target as the JSON results keep it: what was measured, against what, the limit and the verdict.

    ``rule`` says how the limit follows from the basis (``"reference / 2"``), ``basis`` names it.
    """
    return {"target": name, "value": value, "unit": unit, "basis": basis, "basis_value": basis_value,
            "op": op, "limit": limit, "rule": rule, "verdict": verdict(value, op, limit)}


def _times(factor: float, value: float | None) -> float | None:
    return None if value is None else value * factor


def _plus(offset: float | None, value: float | None) -> float | None:
    return None if value is None or offset is None else value + offset


REFERENCE_NAME = f"reference ({REFERENCE['commit']}, {REFERENCE['date']})"


def _get(table: Any, *path: Any) -> Any:
    """``table[a][b]...``, or None where any step is missing."""
    for step in path:
        if not isinstance(table, dict) or step not in table:
            return None
        table = table[step]
    return table


# -- scaling.py ------------------------------------------------------------------------------


def scaling_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets judged from a ``scaling.py`` run's results (the shape of ``docs/scaling.json``)."""
    points = {name: row["points"] for name, row in results["latency"]["series"].items()}
    found: list[dict[str, Any]] = []
    for series, label in SERIES_NAMES.items():
        for n in (1, 5):
            reference = CPU_REFERENCE_US[series, n]
            found.append(target(
                f"client CPU per pair, {label}, N = {n}", _get(points, series, str(n), "cpu_median_us"), "<=",
                reference * CPU_FACTOR, "≤ reference / 2", "µs", REFERENCE_NAME, reference))
    for series, label in SERIES_NAMES.items():
        for n in results["node_counts"]:
            floor = _get(points, "floor_all", str(n), "median_us")
            found.append(target(
                f"median above the every-reply floor, {label}, N = {n}", _get(points, series, str(n), "median_us"),
                "<=", _plus(OVERHEAD_US, floor), f"≤ floor + {OVERHEAD_US:g} µs", "µs", "floor_all", floor))
    for series, label in SERIES_NAMES.items():
        floor = _get(points, "floor_all", "1", "median_us")
        reference = OVERHEAD_REFERENCE_US[series]
        found.append(target(
            f"median above the every-reply floor at most half the reference, {label}, N = 1",
            _get(points, series, "1", "median_us"), "<=", _plus(reference * OVERHEAD_FACTOR, floor),
            f"≤ floor + reference overhead ({reference:g} µs) / 2", "µs", "floor_all", floor))
        floor = _get(points, "floor_all", "5", "median_us")
        found.append(target(
            f"median against the every-reply floor, {label}, N = 5", _get(points, series, "5", "median_us"), "<=",
            _times(FLOOR_FACTOR_N5, floor), f"≤ {FLOOR_FACTOR_N5:g} × floor", "µs", "floor_all", floor))
    async_series = _get(results, "async", "series") or {}
    floor = _get(async_series, "floor_async", "median_us")
    found.append(target(
        "AsyncLockManager pair, median, at most 1.15 × floor", _get(async_series, "redlock_async", "median_us"), "<=",
        _times(ASYNC_RESHAPE_FACTOR, floor), f"≤ {ASYNC_RESHAPE_FACTOR:g} × floor", "µs", "floor_async", floor))
    for stat, label in (("median_us", "median"), ("p99_us", "p99")):
        floor = _get(async_series, "floor_async", stat)
        found.append(target(
            f"AsyncLockManager pair, {label}", _get(async_series, "redlock_async", stat), "<=",
            _times(ASYNC_FACTOR, floor), f"≤ {ASYNC_FACTOR:g} × floor", "µs", "floor_async", floor))
    memory = results.get("memory") or {}
    for key, label in (("per_lock_bytes", "LockManager"), ("async_per_lock_bytes", "AsyncLockManager")):
        reference = MEMORY_REFERENCE_BYTES[key]
        found.append(target(
            f"memory per held lock, {label}", memory.get(key), "<=", reference * MEMORY_TOLERANCE,
            f"≤ {MEMORY_TOLERANCE:g} × reference", "B", REFERENCE_NAME, reference))
    for series, label in SERIES_NAMES.items():
        floor = _get(points, "floor_all", "5", "p99_us")
        ratio = P99_REFERENCE_RATIO[series]
        found.append(target(
            f"p99 of a pair, {label}, N = 5", _get(points, series, "5", "p99_us"), "<=",
            _times(ratio * P99_TOLERANCE, floor), f"≤ floor × {ratio:.2f} (reference ratio) × {P99_TOLERANCE:g}",
            "µs", "floor_all", floor))
    return found


# -- bench.py --------------------------------------------------------------------------------


def contention_targets(contention: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets judged from ``bench.py``'s contention section (8 workers, one key)."""
    rows = contention.get("libraries", {})
    ours = rows.get(CONTENDER, {})
    rtt = contention.get("loopback_rtt_us")
    floor_p50 = _get(rows, FLOOR, "handoff_p50_ms")
    fresh, waited = ours.get("fresh_validity_median_ms"), ours.get("validity_median_ms")
    reference = VALIDITY_LOSS_REFERENCE_MS
    return [
        target("contention: acquisitions/s, 5 nodes", ours.get("acq_per_s"), ">=",
               _get(rows, COMPETITOR, "acq_per_s"), "≥ python-redis-lock", "/s", COMPETITOR,
               _get(rows, COMPETITOR, "acq_per_s")),
        target("contention: fairness, max/min acquisitions per worker", ours.get("max_over_min"), "<=", FAIRNESS, "",
               "×"),
        target("contention: hand-off p50", ours.get("handoff_p50_ms"), "<=",
               _plus(None if rtt is None else rtt / 1000, floor_p50), "≤ floor + 1 loopback round trip", "ms",
               FLOOR, floor_p50),
        target("contention: validity lost by a lock won in line (uncontended − won in line, medians)",
               None if fresh is None or waited is None else fresh - waited, "<=", reference * VALIDITY_TOLERANCE,
               f"≤ {VALIDITY_TOLERANCE:g} × reference", "ms", REFERENCE_NAME, reference),
    ]


def admin_targets(admin: dict[str, Any]) -> list[dict[str, Any]]:
    """``admin_render.py``'s cases: ``redlock list`` (text, JSON) and each admin page, median under the limit."""
    locks = f"{admin['locks']:,} locks" if isinstance(admin.get("locks"), int) else "locks"
    names = {"list_text": "redlock list (text)", "list_json": "redlock list --json"}
    measured = admin.get("cases") or {name: {} for name in names}  # a failed run: the lists, not measured
    measured = {case: row for case, row in measured.items() if case != "listing"}  # lock_listing() alone: no target
    cases = sorted(measured.items(), key=lambda item: item[0] not in names)  # the lists first
    return [target(f"{names.get(case, f'admin page: {case}')}, {locks}", row.get("median_ms"), "<=", ADMIN_MS, "",
                   "ms") for case, row in cases]


# -- output ----------------------------------------------------------------------------------


def _number(value: float | None, unit: str) -> str:
    if value is None:
        return "–"
    text = f"{value:,.2f}" if abs(value) < 10 else f"{value:,.0f}"
    return f"{text} {unit}" if unit not in ("×",) else f"{text}×"


def _columns(item: dict[str, Any]) -> tuple[str, str, str, str, str]:
    unit = item["unit"]
    basis = f"{item['basis']} {_number(item['basis_value'], unit)}" if item["basis"] else "–"
    limit = f"{item['op'].replace('<=', '≤').replace('>=', '≥')} {_number(item['limit'], unit)}"
    if item["rule"]:
        limit += f" ({item['rule']})"
    return item["target"], _number(item["value"], unit), basis, limit, item["verdict"]


def block(targets: Iterable[dict[str, Any]]) -> str:
    """The targets as text, one line each: target, measured, basis (floor or reference), limit, verdict."""
    rows = [_columns(item) for item in targets]
    if not rows:
        return ""
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["", "targets (measured; the floor from this run, or the recorded reference; limit; verdict)"]
    lines += ["  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[4]
              for row in rows]
    return "\n".join(lines)


def rst(targets: Sequence[dict[str, Any]]) -> list[str]:
    """The targets as a reStructuredText list-table (lines)."""
    lines = [".. list-table::", "   :header-rows: 1", "", "   * - Target", "     - Measured",
             "     - Floor (same run) or reference", "     - Limit", "     - Verdict"]
    for item in targets:
        lines += [f"   * - {cell}" if i == 0 else f"     - {cell}" for i, cell in enumerate(_columns(item))]
    return lines
