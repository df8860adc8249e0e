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
