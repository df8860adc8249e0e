"""Throwaway PostgreSQL servers for tests: initdb in a temp dir, its own port, trust auth.

``PostgresServer.standby()`` adds a streaming replica of a started server that applies
each commit a fixed delay late, as a replica behind a busy primary does.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time

from django_redlock.testing import free_port


def find_pg_bin() -> str | None:
    initdb = shutil.which("initdb")
    if initdb:
        return os.path.dirname(os.path.realpath(initdb))  # a symlink's directory may hold no pg_basebackup
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return os.path.dirname(found[-1]) if found else None


def usable_server() -> PostgresServer:
    """A server not yet started; the test is skipped where PostgreSQL or psycopg is missing."""
    import pytest

    server = PostgresServer()
    if not server.available:
        pytest.skip("PostgreSQL is not installed (Debian: apt-get install postgresql); SQLite run only")
    pytest.importorskip("psycopg", reason="psycopg is not installed (pip install 'psycopg[binary]')")
    return server


class PostgresServer:
    def __init__(self) -> None:
        self.bin = find_pg_bin()
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="redlock-pg-")
        self.prefix: list[str] = []
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                self.bin = None
            else:
                shutil.chown(self.dir, "postgres")
                self.prefix = ["runuser", "-u", "postgres", "--"]

    @property
    def available(self) -> bool:
        return self.bin is not None

    def _run(self, *args: str) -> None:
        done = subprocess.run([*self.prefix, *args], capture_output=True, text=True, timeout=120)
        if done.returncode:
            raise RuntimeError(f"{os.path.basename(args[0])} exited {done.returncode}: {done.stderr.strip()}")

    def start(self) -> PostgresServer:
        data = os.path.join(self.dir, "data")
        self._run(os.path.join(self.bin, "initdb"), "-D", data, "-A", "trust", "-U", "postgres", "--no-sync")
        self._start(data)
        return self

    def _start(self, data: str, *settings: str) -> None:
        options = " ".join([f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off", *settings])
        self._run(os.path.join(self.bin, "pg_ctl"), "-D", data, "-o", options, "-l",
                  os.path.join(self.dir, "log"), "-w", "start")

    def standby(self, apply_delay_ms: int) -> PostgresServer:
        """Start a hot standby of this server that applies every commit ``apply_delay_ms`` late."""
        replica = PostgresServer()
        data = os.path.join(replica.dir, "data")
        replica._run(os.path.join(self.bin, "pg_basebackup"), "-h", "127.0.0.1", "-p", str(self.port),
                     "-U", "postgres", "-D", data, "-R", "-X", "stream", "--no-sync")
        replica._start(data, "-c hot_standby=on", f"-c recovery_min_apply_delay={apply_delay_ms}ms")
        return replica

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run one statement with psql; its output, unaligned and without headers."""
        out = subprocess.run(
            [os.path.join(self.bin, "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
             "-d", database, "-XAtc", sql],
            check=True, capture_output=True, text=True, timeout=60,
        )
        return out.stdout.strip()

    def wait_replayed(self, standby: PostgresServer, seconds: float = 60.0) -> None:
        """Wait until ``standby`` has applied everything this server has written so far."""
        lsn = self.psql("SELECT pg_current_wal_lsn()")
        deadline = time.monotonic() + seconds
        while standby.psql(f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn") != "t":
            if time.monotonic() > deadline:
                raise AssertionError(f"the standby did not replay up to {lsn} within {seconds} s")
            time.sleep(0.05)

    def stop(self) -> None:
        data = os.path.join(self.dir, "data")
        if os.path.isdir(data):
            subprocess.run([*self.prefix, os.path.join(self.bin, "pg_ctl"), "-D", data, "-m", "immediate", "stop"],
                           capture_output=True, timeout=60)
        shutil.rmtree(self.dir, ignore_errors=True)
