"""The package type-checks under ``mypy --strict``, and the decorators keep the signatures they wrap.

``tests/typing_sample.py`` decorates a function, a coroutine function, views and
management commands and states their exact types with ``assert_type``. Its
``if REJECTED:`` calls must each fail with the error code written beside them:
mypy checks them in a second run, so a decorator that let its callable's type
fall back to ``Callable[..., Any]`` fails this test either way.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mypy", reason="mypy is not installed (pip install --group test)")

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = Path("tests") / "typing_sample.py"
ERROR = re.compile(r"^(?P<path>[^:]+):(?P<line>\d+): error: .*\[(?P<code>[a-z-]+)\]$")


def mypy(*args: str, cache: str) -> subprocess.Popen[str]:
    """Start ``mypy --strict`` in the project (its [tool.mypy] settings), with a cache of its own.

    The two runs differ in their options: sharing one cache, each would invalidate the other's.
    """
    command = [sys.executable, "-m", "mypy", "--strict", "--cache-dir", f".mypy_cache/{cache}", *args]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(run: subprocess.Popen[str]) -> tuple[int, str]:
    output, _ = run.communicate(timeout=240)
    return run.returncode, output


def rejected_lines() -> dict[int, str]:
    """The sample's lines that must fail, with the error code each must fail with."""
    lines = (ROOT / SAMPLE).read_text().splitlines()
    expected = {}
    for number, line in enumerate(lines, start=1):
        match = re.search(r"# rejected: ([a-z-]+)$", line)
        if match:
            expected[number] = match.group(1)
    return expected


def test_package_and_sample_pass_and_wrong_calls_are_rejected() -> None:
    # Both runs at once: the first one on a machine parses Django's stubs twice.
    passing = mypy("--always-false", "REJECTED", "django_redlock", str(SAMPLE), cache="test-typing-pass")
    rejecting = mypy(str(SAMPLE), cache="test-typing-reject")
    code, output = finish(passing)
    rejected_code, rejected_output = finish(rejecting)

    assert code == 0, f"mypy --strict django_redlock {SAMPLE} failed:\n{output}"

    expected = rejected_lines()
    assert len(expected) >= 5, "the sample lost its rejected calls"
    assert rejected_code == 1, f"mypy exited {rejected_code}; expected 1, for the rejected calls:\n{rejected_output}"
    found: dict[int, set[str]] = {}
    for line in rejected_output.splitlines():
        match = ERROR.match(line)
        if match is None:
            assert ": note: " in line or line.startswith("Found "), f"unexpected mypy output:\n{rejected_output}"
            continue
        assert Path(match["path"]) == SAMPLE, f"an error outside the rejected calls:\n{rejected_output}"
        found.setdefault(int(match["line"]), set()).add(match["code"])
    assert found == {line: {code} for line, code in expected.items()}, (
        f"expected exactly these errors in {SAMPLE} (line: code): {expected}\nmypy said:\n{rejected_output}"
    )
