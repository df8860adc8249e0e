"""The benchmark script runs (quick mode: django-redlock only, a few hundred pairs)."""

import datetime
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _today() -> set[str]:
    now = datetime.datetime.now(datetime.timezone.utc)
    return {(now - datetime.timedelta(minutes=m)).date().isoformat() for m in (0, 5)}  # a run across midnight


def test_bench_quick(tmp_path):
    out = tmp_path / "bench.json"
    table = tmp_path / "table.rst"
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench.py"), "--quick", "--budget", "30", "--json", str(out),
         "--rst", str(table)],
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
    # The table says when and how it was measured, so a regenerated table always carries both.
    produced = json.loads(out.read_text())["produced"]
    assert produced["date"] in _today()
    assert produced["command"] == f"python benchmarks/bench.py --quick --budget 30 --json {out} --rst {table}"
    assert f"Measured on {produced['date']} with ``{produced['command']}``." in table.read_text()


def test_bench_contention_quick(tmp_path):
    """The contention scenario runs: 4 workers take turns on one key for ~1.5 s; the numbers are sane.

    No timing targets here (the machine may be busy): only that every worker got the lock, that
    nobody held it while another did, and that the hand-off statistics exist.
    """
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [
            sys.executable, str(ROOT / "benchmarks" / "bench.py"), "--only", "contention",
            "--contention-libraries", "django_redlock,redis-py Lock (1 node) sleep=1 ms",
            "--workers", "4", "--seconds", "1.5", "--budget", "60",
            "--json", str(out), "--rst", str(tmp_path / "table.rst"),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    contention = json.loads(out.read_text())["contention"]
    assert contention["workers"] == 4
    for name in ("django_redlock", "redis-py Lock (1 node) sleep=1 ms"):
        row = contention["libraries"][name]
        assert "error" not in row and "timeout_s" not in row, row
        assert row["overlaps"] == 0  # never two holders at once
        assert len(row["per_worker"]) == 4 and sum(row["per_worker"]) == row["acquisitions"]
        assert row["acquisitions"] >= 4 and row["acq_per_s"] > 0
        assert 0 <= row["same_worker_share"] <= 1
        assert 0 < row["handoff_p50_ms"] <= row["handoff_p99_ms"]
        assert row["hold_median_ms"] >= 1.0  # each holder slept its 1 ms
    # A line that wakes the next waiter serves every worker, not just the last releaser.
    assert contention["libraries"]["django_redlock"]["per_worker_min"] > 0
    table = (tmp_path / "table.rst").read_text()
    assert "hand-off p50" in table and "django_redlock" in table
    assert contention["produced"]["date"] in _today()
    assert contention["produced"]["command"].startswith("python benchmarks/bench.py --only contention --contention-")
    assert f"with ``{contention['produced']['command']}``." in table


@pytest.mark.parametrize(
    "script, results, table",
    [("bench.py", "benchmarks.json", "benchmarks_table.rst"), ("scaling.py", "scaling.json", "scaling_table.rst")],
)
def test_docs_tables_render_from_their_json(tmp_path, script, results, table):
    """The committed tables are what ``--render-only`` writes from the committed results, date and command included."""
    shutil.copy(ROOT / "docs" / results, tmp_path / results)
    out = tmp_path / table
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--render-only", "--json", str(tmp_path / results),
         "--rst", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    assert text == (ROOT / "docs" / table).read_text()
    assert "Measured on 20" in text and "Date and command of this run not recorded" not in text
    assert (tmp_path / results).read_bytes() == (ROOT / "docs" / results).read_bytes()  # rendering writes no results


def test_render_only_needs_results(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench.py"), "--render-only", "--json", str(tmp_path / "none.json"),
         "--rst", str(tmp_path / "t.rst")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode != 0
    assert "--render-only: --json must name an existing results file" in result.stderr


def test_resp_reader_quick(tmp_path):
    """The reader comparison runs (with or without hiredis) and counts the replies a pair reads."""
    out = tmp_path / "resp.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "resp_reader.py"), "--rounds", "1", "--iterations", "20",
         "--pairs", "50", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    found = json.loads(out.read_text())
    assert found["per reply"]["+OK"]["bytes"] == 5 and found["per reply"]["+OK"]["pure (ReplyBuffer)"] > 0
    for n, replies in (("1", 2), ("5", 10)):  # a vote and a release on each node
        for driver in ("sync", "async"):
            row = found["per pair"][n][driver]
            assert abs(row["replies per pair"] - replies) <= 1, row
            assert 0 < row["pure, as the drivers read"] < row["whole pair"]
