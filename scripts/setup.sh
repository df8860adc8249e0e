#!/bin/sh
# Prepare a machine for the demo and the tests: redis-server, a virtualenv, the
# Python packages. Usage: scripts/setup.sh [extras] (default: test).
# Installs Debian packages only when run as root with apt-get available;
# otherwise says exactly what is missing.
set -eu

EXTRAS="${1:-test}"
VENV="${VENV:-.venv}"
PYTHON="${PYTHON:-python3}"
WANT_BROWSER="${WANT_BROWSER:-0}"

missing=""
command -v redis-server >/dev/null 2>&1 || [ -n "${REDIS_SERVER:-}" ] || missing="$missing redis-server"
"$PYTHON" -c "import venv, ensurepip" >/dev/null 2>&1 || missing="$missing python3-venv"
if [ "$WANT_BROWSER" = 1 ] && ! command -v chromium >/dev/null 2>&1; then
    missing="$missing chromium"
fi
if [ "${WANT_POSTGRES:-0}" = 1 ] && ! command -v initdb >/dev/null 2>&1 \
    && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    missing="$missing postgresql"
fi

if [ -n "$missing" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "Installing Debian packages:$missing"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >/dev/null
        apt-get install -y -qq $missing >/dev/null
        # The package may start a system redis on 6379; ours run on their own ports.
    else
        for pkg in $missing; do
            case "$pkg" in
                chromium) echo "note: chromium not found; the browser test will be skipped (Debian: apt-get install chromium)." ;;
                postgresql) echo "note: PostgreSQL not found; the fencing test runs on SQLite only (Debian: apt-get install postgresql)." ;;
                *)
                    echo "error: '$pkg' is required. Install it first:" >&2
                    echo "  Debian/Ubuntu: sudo apt-get install $pkg" >&2
                    [ "$pkg" = redis-server ] && echo "  macOS: brew install redis   (or set REDIS_SERVER=/path/to/redis-server)" >&2
                    exit 1 ;;
            esac
        done
    fi
fi

if [ ! -x "$VENV/bin/python" ]; then
    echo "Creating virtualenv $VENV"
    "$PYTHON" -m venv "$VENV"
fi
STAMP="$VENV/.installed-$EXTRAS"
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ]; then
    echo "Installing django-redlock[$EXTRAS] into $VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
    "$VENV/bin/python" -m pip install -q -e ".[$EXTRAS]"
    touch "$STAMP"
fi
