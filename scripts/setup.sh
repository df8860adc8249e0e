#!/bin/sh
# Prepare a machine for the demo and the tests: redis-server, a virtualenv, the
# Python packages. Usage: scripts/setup.sh [groups] (default: test): the package, editable,
# with the comma-separated dependency groups of pyproject.toml (pip 25.1+ installs groups).
# Installs Debian packages only when run as root with apt-get available;
# otherwise says exactly what is missing.
set -eu

DEP_GROUPS="${1:-test}"
VENV="${VENV:-.venv}"
PYTHON="${PYTHON:-python3}"
WANT_BROWSER="${WANT_BROWSER:-0}"

required=""   # without these nothing runs
optional=""   # without these a few tests are skipped, with a reason
command -v redis-server >/dev/null 2>&1 || [ -n "${REDIS_SERVER:-}" ] || required="$required redis-server"
"$PYTHON" -c "import venv, ensurepip" >/dev/null 2>&1 || required="$required python3-venv"
if [ "$WANT_BROWSER" = 1 ] && ! command -v chromium >/dev/null 2>&1; then
    optional="$optional chromium"
fi
if [ "${WANT_POSTGRES:-0}" = 1 ] && ! command -v initdb >/dev/null 2>&1 \
    && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    optional="$optional postgresql"
fi

explain() {
    case "$1" in
        chromium) echo "note: chromium not installed; the browser test will be skipped (Debian: apt-get install chromium)." ;;
        postgresql) echo "note: PostgreSQL not installed; the fencing test runs on SQLite only (Debian: apt-get install postgresql)." ;;
        *)
            echo "error: '$1' is required. Install it first:" >&2
            echo "  Debian/Ubuntu: sudo apt-get install $1" >&2
            [ "$1" = redis-server ] && echo "  macOS: brew install redis   (or set REDIS_SERVER=/path/to/redis-server)" >&2
            return 1 ;;
    esac
}

if [ -n "$required$optional" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        export DEBIAN_FRONTEND=noninteractive
        echo "Installing Debian packages:$required$optional"
        apt-get update -qq >/dev/null 2>&1 || echo "note: apt-get update failed; trying the package lists we have."
        if [ -n "$required" ]; then
            apt-get install -y -qq $required >/dev/null || { for pkg in $required; do explain "$pkg" || true; done; exit 1; }
        fi
        for pkg in $optional; do
            apt-get install -y -qq "$pkg" >/dev/null 2>&1 || explain "$pkg"
        done
        # The redis-server package may start a system redis on 6379; ours use their own ports.
    else
        for pkg in $required $optional; do
            explain "$pkg" || exit 1
        done
    fi
fi

if [ ! -x "$VENV/bin/python" ]; then
    echo "Creating virtualenv $VENV"
    "$PYTHON" -m venv "$VENV"
fi
STAMP="$VENV/.installed-$DEP_GROUPS"
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ]; then
    echo "Installing django-redlock with the groups $DEP_GROUPS into $VENV"
    if ! "$VENV/bin/python" -m pip install -q "pip>=25.1" >/dev/null 2>&1 \
        && ! "$VENV/bin/python" -m pip install --help 2>/dev/null | grep -q -- "--group"; then
        echo "error: $VENV's pip cannot install dependency groups (pip 25.1 or newer needed) and upgrading it failed:" >&2
        echo "  $VENV/bin/python -m pip install 'pip>=25.1'" >&2
        exit 1
    fi
    set -- -e .
    for group in $(echo "$DEP_GROUPS" | tr ',' ' '); do
        set -- "$@" --group "$group"
    done
    "$VENV/bin/python" -m pip install -q "$@"
    touch "$STAMP"
fi
