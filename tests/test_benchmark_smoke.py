"""The benchmark script runs (quick mode: django-redlock only, a few hundred pairs)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_bench_quick(tmp_path):
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench.py"), "--quick", "--budget", "30", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    row = json.loads(out.read_text())["libraries"]["django_redlock"]
    assert row["healthy"]["median_us"] > 0 and row["one_paused"]["median_us"] > 0
    assert row["majority_paused"]["acquired"] is False
    assert row["majority_paused"]["fail_ms"] < 500  # a few node timeouts, not seconds
