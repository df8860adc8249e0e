"""Every module of django_redlock stays at most 600 lines and opens with a docstring saying what it holds."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "django_redlock"
MOST_LINES = 600
MODULES = sorted(PACKAGE.rglob("*.py"))


def test_the_package_is_found() -> None:
    assert PACKAGE / "core" / "lock.py" in MODULES


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(PACKAGE)))
def test_a_module_is_small_enough(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MOST_LINES, f"{path.relative_to(PACKAGE)} has {lines} lines (at most {MOST_LINES}): split it"


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(PACKAGE)))
def test_a_module_says_what_it_holds(path: Path) -> None:
    docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
    first = docstring.split("\n", 1)[0].strip()
    # A sentence, not a bare name: a few words at least.
    assert len(first.split()) >= 4, f"{path.relative_to(PACKAGE)}: the docstring's first line should say what it holds"
