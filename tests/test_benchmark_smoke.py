"""The benchmark script runs (quick mode: django-redlock only, a few hundred pairs)."""

import datetime
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import targets  # noqa: E402

VERDICTS = {"met", "NOT met", "not measured"}


def _run(script: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python benchmarks/SCRIPT ARGS...`` from the repository's root, its output captured."""
    command = [sys.executable, str(ROOT / "benchmarks" / script), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def _today() -> set[str]:
    now = datetime.datetime.now(datetime.timezone.utc)
    return {(now - datetime.timedelta(minutes=m)).date().isoformat() for m in (0, 5)}  # a run across midnight


def test_bench_quick(tmp_path):
    out = tmp_path / "bench.json"
    table = tmp_path / "table.rst"
    result = _run("bench.py", "--quick", "--budget", "30", "--json", str(out), "--rst", str(table))
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
    # The contention section ran on the floor too, and judged its targets: printed last, kept, tabled.
    contention = json.loads(out.read_text())["contention"]
    assert contention["libraries"][targets.FLOOR]["overlaps"] == 0
    assert contention["loopback_rtt_us"] > 0
    judged = contention["targets"]
    assert [t["verdict"] in VERDICTS for t in judged] == [True] * 4
    hand_off = next(t for t in judged if t["target"] == "contention: hand-off p50")
    assert hand_off["basis_value"] == contention["libraries"][targets.FLOOR]["handoff_p50_ms"]
    assert hand_off["limit"] == pytest.approx(hand_off["basis_value"] + contention["loopback_rtt_us"] / 1000)
    assert next(t for t in judged if t["target"].startswith("contention: acquisitions/s"))["verdict"] == "not measured"
    block = result.stdout[result.stdout.rindex("targets ("):]
    assert [line.split()[0] for line in block.splitlines()[1:]] == ["contention:"] * 4
    assert "Targets:" in table.read_text() and "contention: hand-off p50" in table.read_text()
    assert "admin" not in json.loads(out.read_text())  # --quick runs admin_render.py only when named


def test_bench_contention_quick(tmp_path):
    """The contention scenario runs: 4 workers take turns on one key for ~1.5 s; the numbers are sane.

    No timing targets here (the machine may be busy): only that every worker got the lock, that
    nobody held it while another did, and that the hand-off statistics exist.
    """
    out = tmp_path / "bench.json"
    result = _run(
        "bench.py", "--only", "contention",
        "--contention-libraries", f"django_redlock,redis-py Lock (1 node) sleep=1 ms,{targets.FLOOR}",
        "--workers", "4", "--seconds", "1.5", "--budget", "60",
        "--json", str(out), "--rst", str(tmp_path / "table.rst"),
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    contention = json.loads(out.read_text())["contention"]
    assert contention["workers"] == 4
    for name in ("django_redlock", "redis-py Lock (1 node) sleep=1 ms", targets.FLOOR):
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
    # Nearly every turn was won in line; each handed over about a fresh acquire's validity (ttl 10 s).
    ours = contention["libraries"]["django_redlock"]
    assert ours["won_in_line"] > ours["acquisitions"] / 2
    assert 9000 < ours["validity_min_ms"] <= ours["validity_median_ms"] <= 10_000
    assert 9000 < ours["fresh_validity_median_ms"] <= 10_000
    assert "validity_median_ms" not in contention["libraries"][targets.FLOOR]  # its locks have no validity
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
    result = _run(script, "--render-only", "--json", str(tmp_path / results), "--rst", str(out), timeout=60)
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    assert text == (ROOT / "docs" / table).read_text()
    assert "Measured on 20" in text and "Date and command of this run not recorded" not in text
    assert (tmp_path / results).read_bytes() == (ROOT / "docs" / results).read_bytes()  # rendering writes no results


def test_render_only_needs_results(tmp_path):
    result = _run("bench.py", "--render-only", "--json", str(tmp_path / "none.json"), "--rst", str(tmp_path / "t.rst"),
                  timeout=60)
    assert result.returncode != 0
    assert "--render-only: --json must name an existing results file" in result.stderr


def test_bench_admin_section(tmp_path):
    """``make bench`` runs admin_render.py as bench.py's admin section and judges what it prints."""
    out = tmp_path / "bench.json"
    result = _run("bench.py", "--quick", "--only", "admin", "--json", str(out), "--rst", str(tmp_path / "table.rst"),
                  timeout=300)
    assert result.returncode == 0, result.stderr
    admin = json.loads(out.read_text())["admin"]
    assert admin["locks"] == 10_000 and admin["cases"]["list_text"]["median_ms"] > 0
    names = [t["target"] for t in admin["targets"]]
    assert names[:2] == ["redlock list (text), 10,000 locks", "redlock list --json, 10,000 locks"]
    assert len(names) == len(admin["cases"]) - 1  # every case but lock_listing() alone is judged
    assert "listing" in admin["cases"] and not any("lock_listing" in name for name in names)
    block = result.stdout[result.stdout.rindex("targets ("):]
    assert "redlock list --json, 10,000 locks" in block and "admin page: -ttl, 10,000 locks" in block
    assert "redlock list (text), 10,000 locks" in (tmp_path / "table.rst").read_text()


@pytest.mark.parametrize(
    "value, op, limit, expected",
    [(1.0, "<=", 1.0, "met"), (1.01, "<=", 1.0, "NOT met"), (2.0, ">=", 2.0, "met"), (1.99, ">=", 2.0, "NOT met"),
     (None, "<=", 1.0, "not measured"), (1.0, ">=", None, "not measured")],
)
def test_verdict(value, op, limit, expected):
    assert targets.verdict(value, op, limit) == expected


def test_verdict_rejects_an_unknown_comparison():
    with pytest.raises(ValueError, match="op must be"):
        targets.verdict(1.0, "<", 2.0)


def _contention(**ours):
    return {
        "loopback_rtt_us": 50.0,
        "libraries": {
            targets.CONTENDER: {"acq_per_s": 900.0, "max_over_min": 1.1, "handoff_p50_ms": 0.5,
                                "validity_median_ms": 9897.0, "fresh_validity_median_ms": 9898.0, **ours},
            targets.FLOOR: {"handoff_p50_ms": 0.45},
            targets.COMPETITOR: {"acq_per_s": 800.0},
        },
    }


def test_contention_targets_on_made_up_numbers():
    judged = {t["target"].split(",")[0].split(" (")[0]: t for t in targets.contention_targets(_contention())}
    assert {name: t["verdict"] for name, t in judged.items()} == {
        "contention: acquisitions/s": "met",
        "contention: fairness": "met",
        "contention: hand-off p50": "met",  # 0.5 ms <= 0.45 ms + 50 µs
        "contention: validity lost by a lock won in line": "met",  # 1 ms lost, reference 1.31 ms
    }
    assert judged["contention: hand-off p50"]["limit"] == pytest.approx(0.5)
    worse = _contention(acq_per_s=799.0, max_over_min=1.21, handoff_p50_ms=0.51, validity_median_ms=9890.0)
    assert [t["verdict"] for t in targets.contention_targets(worse)] == ["NOT met"] * 4
    unmeasured = _contention()
    del unmeasured["libraries"][targets.FLOOR], unmeasured["loopback_rtt_us"]
    assert [t["verdict"] for t in targets.contention_targets(unmeasured)][2] == "not measured"


def test_admin_targets_on_made_up_numbers():
    judged = targets.admin_targets({"locks": 10_000, "cases": {"ttl": {"median_ms": 150.1}, "list_json": {
        "median_ms": 149.9}, "list_text": {"median_ms": 12.0}, "listing": {"median_ms": 170.0}}})  # listing: no target
    assert [(t["target"], t["verdict"]) for t in judged] == [
        ("redlock list --json, 10,000 locks", "met"), ("redlock list (text), 10,000 locks", "met"),
        ("admin page: ttl, 10,000 locks", "NOT met")]
    failed = targets.admin_targets({"error": "admin_render.py exited with 1 and printed no results"})
    assert [(t["target"], t["verdict"]) for t in failed] == [
        ("redlock list (text), locks", "not measured"), ("redlock list --json, locks", "not measured")]


def test_targets_block_and_table():
    judged = [targets.target("client CPU per pair", 120.0, "<=", 100.0, "≤ reference / 2", "µs", "reference", 200.0),
              targets.target("fairness", None, "<=", 1.2, "", "×")]
    block = targets.block(judged).splitlines()
    assert block[1].startswith("targets (")
    assert block[2].split() == ["client", "CPU", "per", "pair", "120", "µs", "reference", "200", "µs", "≤", "100",
                                "µs", "(≤", "reference", "/", "2)", "NOT", "met"]
    assert block[3].split()[-2:] == ["not", "measured"] and "≤ 1.20×" in block[3]
    table = "\n".join(targets.rst(judged))
    assert "   * - client CPU per pair\n     - 120 µs\n     - reference 200 µs\n" in table
    assert targets.block([]) == ""


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
