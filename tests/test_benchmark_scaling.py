"""The node-count benchmark runs (quick mode: N = 1 and 3, a few pairs, a short delay-line run)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_scaling_quick(tmp_path):
    out = tmp_path / "scaling.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "scaling.py"), "--quick", "--rtt-ms", "1",
         "--json", str(out), "--rst", str(tmp_path / "table.rst")],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    results = json.loads(out.read_text())
    series = results["latency"]["series"]
    assert set(series) == {"redlock", "redlock_blocking", "floor_quorum", "floor_all", "redis_py"}
    assert series["redlock"]["points"]["3"]["median_us"] > 0 and series["redlock"]["fit"] is not None
    assert results["async"]["series"]["redlock_async"]["median_us"] > 0
    assert results["async"]["series"]["floor_async"]["median_us"] > 0 and "floor_ratio" in results["async"]
    assert results["memory"]["per_lock_bytes"] > 0 and results["memory"]["manager_bytes"] > 0
    # The delay lines add a round trip; no timing targets beyond "it is there" (the machine may be busy).
    assert results["rtt"]["measured_rtt_us"] > 500
    assert ".. scaling-rtt" in (tmp_path / "table.rst").read_text()
    # The client CPU per pair is printed, and the targets last, each with a verdict, kept and tabled.
    assert "client CPU per pair, median" in result.stdout
    block = result.stdout[result.stdout.rindex("targets ("):].splitlines()[1:]
    judged = results["targets"]
    # CPU, above the floor at N = 1 and 3, the reshaping's three per series and one for asyncio, async, memory, p99
    assert len(block) == len(judged) == 4 + 2 * 2 + 2 * 2 + 1 + 2 + 2 + 2
    for line, target in zip(block, judged):
        assert line.strip().startswith(target["target"]) and line.endswith(target["verdict"])
    by_name = {t["target"]: t for t in judged}
    assert by_name["client CPU per pair, non-blocking, N = 5"]["verdict"] == "not measured"  # --quick: N = 1, 3
    cpu = by_name["client CPU per pair, non-blocking, N = 1"]
    assert cpu["value"] == series["redlock"]["points"]["1"]["cpu_median_us"] and cpu["limit"] == cpu["basis_value"] / 2
    above = by_name["median above the every-reply floor, blocking, N = 3"]
    assert above["basis_value"] == series["floor_all"]["points"]["3"]["median_us"]
    assert above["limit"] == above["basis_value"] + 30 and above["verdict"] in {"met", "NOT met"}
    table = (tmp_path / "table.rst").read_text()
    assert table.startswith(".. scaling-targets\n") and "median above the every-reply floor, blocking, N = 3" in table
    # --render-only writes the same tables again from the results, targets included.
    rendered = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "scaling.py"), "--render-only", "--json", str(out),
         "--rst", str(tmp_path / "again.rst")],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    assert rendered.returncode == 0, rendered.stderr
    assert (tmp_path / "again.rst").read_text() == table


def test_scaling_targets_on_made_up_numbers():
    """Each target reads its own numbers: the limit follows from the floor or the reference."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import targets

    def point(median, p99=None, cpu=None):
        return {"median_us": median, "p99_us": p99 or median * 2, "cpu_median_us": cpu or median}

    floor = {str(n): point(100.0 + n, p99=1000.0) for n in (1, 5)}
    fast = {"1": point(120.0, cpu=100.0), "5": point(135.0, cpu=150.0, p99=700.0)}
    slow = {"1": point(140.0, cpu=200.0), "5": point(136.0, cpu=300.0, p99=2000.0)}
    results = {
        "node_counts": [1, 5],
        "latency": {"series": {"redlock": {"points": fast}, "redlock_blocking": {"points": slow},
                               "floor_all": {"points": floor}}},
        "async": {"series": {"redlock_async": {"median_us": 110.0, "p99_us": 500.0},
                             "floor_async": {"median_us": 100.0, "p99_us": 400.0}}},
        "memory": {"per_lock_bytes": targets.MEMORY_REFERENCE_BYTES["per_lock_bytes"],
                   "async_per_lock_bytes": targets.MEMORY_REFERENCE_BYTES["async_per_lock_bytes"] * 1.03},
    }
    verdicts = {t["target"]: t["verdict"] for t in targets.scaling_targets(results)}
    assert verdicts == {
        "client CPU per pair, non-blocking, N = 1": "met",  # 100 <= 229.1 / 2
        "client CPU per pair, non-blocking, N = 5": "met",
        "client CPU per pair, blocking, N = 1": "NOT met",
        "client CPU per pair, blocking, N = 5": "NOT met",
        "median above the every-reply floor, non-blocking, N = 1": "met",  # 120 <= 101 + 30
        "median above the every-reply floor, non-blocking, N = 5": "met",
        "median above the every-reply floor, blocking, N = 1": "NOT met",  # 140 > 131
        "median above the every-reply floor, blocking, N = 5": "NOT met",  # 136 > 135
        "median above the every-reply floor at most half the reference, non-blocking, N = 1": "met",  # 120 <= 101 + 75
        "median above the every-reply floor at most half the reference, blocking, N = 1": "met",  # 140 <= 101 + 87
        "median against the every-reply floor, non-blocking, N = 5": "NOT met",  # 135 > 1.1 x 105
        "median against the every-reply floor, blocking, N = 5": "NOT met",
        "AsyncLockManager pair, median, at most 1.15 × floor": "met",  # 110 <= 1.15 x 100
        "AsyncLockManager pair, median": "met",  # 110 <= 1.1 x 100
        "AsyncLockManager pair, p99": "NOT met",
        "memory per held lock, LockManager": "met",
        "memory per held lock, AsyncLockManager": "NOT met",  # 3 % above the reference
        "p99 of a pair, non-blocking, N = 5": "met",  # 700 <= 1000 x 0.73 x 1.1
        "p99 of a pair, blocking, N = 5": "NOT met",
    }
