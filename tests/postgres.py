"""A throwaway PostgreSQL server for tests: initdb in a temp dir, its own port, trust auth."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile

from django_redlock.testing import free_port


def find_pg_bin() -> str | None:
    initdb = shutil.which("initdb")
    if initdb:
        return os.path.dirname(initdb)
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return os.path.dirname(found[-1]) if found else None


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
        subprocess.run([*self.prefix, *args], check=True, capture_output=True, timeout=120)

    def start(self) -> PostgresServer:
        data = os.path.join(self.dir, "data")
        self._run(os.path.join(self.bin, "initdb"), "-D", data, "-A", "trust", "-U", "postgres", "--no-sync")
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(os.path.join(self.bin, "pg_ctl"), "-D", data, "-o", options, "-l",
                  os.path.join(self.dir, "log"), "-w", "start")
        return self

    def stop(self) -> None:
        data = os.path.join(self.dir, "data")
        if os.path.isdir(data):
            subprocess.run([*self.prefix, os.path.join(self.bin, "pg_ctl"), "-D", data, "-m", "immediate", "stop"],
                           capture_output=True, timeout=60)
        shutil.rmtree(self.dir, ignore_errors=True)
