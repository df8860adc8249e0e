"""The docs build with warnings as errors (when Sphinx is installed, as `make test` does)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_docs_build_without_warnings(tmp_path):
    pytest.importorskip("sphinx", reason="Sphinx is not installed (pip install 'django-redlock[docs]')")
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(ROOT / "docs"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env={"DOCS_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
