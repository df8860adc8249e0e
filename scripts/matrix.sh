#!/bin/sh
# Run the suite (without the browser test) on the other supported Python/Django/redis-py
# combinations, each in its own virtualenv (.venv-matrix-<python>):
#   Python 3.13 + the newest Django (6.1) + the newest redis-py the package allows,
#   Python 3.12 + Django 6.0 + the oldest redis-py it allows.
# `make test` covers the third corner: Django 5.2 LTS on the oldest supported Python, 3.11.
# Usage: scripts/matrix.sh   (skips a pair whose interpreter is not installed)
set -eu

# Keep these in step with `dependencies` in pyproject.toml.
REDIS_OLDEST="redis==6.4.0"
REDIS_NEWEST="redis>=8.1,<8.2"

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
for pair in "3.13|django>=6.1,<6.2|$REDIS_NEWEST" "3.12|django>=6.0,<6.1|$REDIS_OLDEST"; do
    version="${pair%%|*}"
    rest="${pair#*|}"
    django="${rest%%|*}"
    redis="${rest#*|}"
    if ! python=$(find_python "$version"); then
        echo "matrix: Python $version not found, skipping ($django, $redis)"
        continue
    fi
    venv=".venv-matrix-$version"
    if [ ! -x "$venv/bin/python" ]; then
        "$python" -m venv "$venv"
    fi
    if ! out=$("$venv/bin/python" -m pip install -q "pip>=25.1" 2>&1 \
        && "$venv/bin/python" -m pip install -q -e . --group test "$django" "$redis" 2>&1); then
        echo "$out"
        echo "matrix: Python $version: installing the test group with $django and $redis failed"
        status=1
        continue
    fi
    echo "matrix: Python $version, $("$venv/bin/python" -c 'import django, redis; print("Django", django.get_version() + ", redis-py", redis.__version__)')"
    "$venv/bin/python" -m pytest -q -m "not browser and not torture" -p no:cacheprovider || status=1
done
exit $status
