"""The docs build with warnings as errors (when Sphinx is installed, as `make test` does)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_docs_build_without_warnings(tmp_path):
    pytest.importorskip("sphinx", reason="Sphinx is not installed (pip install --group docs)")
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(ROOT / "docs"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env={"DOCS_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_demo_variables_are_documented():
    """Every DEMO_* variable the demo reads is in install.rst's "The demo" table, with its default."""
    import re

    sources = [ROOT / "example_project" / "run_demo.py", ROOT / "example_project" / "demo" / "settings.py"]
    read = {}
    for path in sources:
        for name, default in re.findall(r'os\.environ\.get\("(DEMO_\w+)"(?:, "([^"]*)")?', path.read_text()):
            read[name] = default
    assert {"DEMO_HOST", "DEMO_PORT", "DEMO_REDIS_PORTS", "DEMO_SINGLE_NODE", "DEMO_DB"} <= set(read)
    install = (ROOT / "docs" / "install.rst").read_text()
    section = install[install.index(".. _demo:"):]
    rows = dict(re.findall(r"\* - ``(DEMO_\w+)``\n\s+- (\S+)", section))
    for name, default in read.items():
        assert name in rows, f"{name} is read by the demo but not documented in docs/install.rst"
        if default:
            assert rows[name] == f"``{default}``", (name, rows[name], default)
