#!/bin/sh
# Run the suite (without the browser test) on other Python/Django pairs when
# those interpreters exist: Python 3.12 + Django 6.x, Python 3.10 + Django 4.2.
# Usage: scripts/matrix.sh   (skips a pair whose interpreter is not installed)
set -eu

find_python() {
    for candidate in "$HOME/.pyenv/versions/$1"*/bin/python "python$1"; do
        # pyenv shims exist on PATH even when they cannot run: try it.
        if "$candidate" -c "import sys" >/dev/null 2>&1; then
            command -v "$candidate"
            return 0
        fi
    done
    return 1
}

status=0
for pair in "3.12|django>=6.0,<6.2" "3.10|django>=4.2,<5.0"; do
    version="${pair%%|*}"
    django="${pair#*|}"
    if ! python=$(find_python "$version"); then
        echo "matrix: Python $version not found, skipping ($django)"
        continue
    fi
    venv=".venv-matrix-$version"
    if [ ! -x "$venv/bin/python" ]; then
        "$python" -m venv "$venv"
    fi
    "$venv/bin/python" -m pip install -q -e ".[test]" "$django" 2>&1 | grep -v "^WARNING" || true
    echo "matrix: Python $version, $("$venv/bin/python" -c 'import django; print("Django", django.get_version())')"
    "$venv/bin/python" -m pytest -q -m "not browser and not torture" -p no:cacheprovider || status=1
done
exit $status
