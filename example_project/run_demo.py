"""Run the example project: 5 local Redis masters, a migrated SQLite database, a demo user, runserver.

    python example_project/run_demo.py [host:port]

``make demo`` runs this after installing everything. Environment:
``DEMO_HOST`` / ``DEMO_PORT`` (default 127.0.0.1:8000) and ``DEMO_REDIS_PORTS``
(default 7101-7105). The masters keep their data under example_project/.redis/
and run with ``appendonly yes`` + ``appendfsync always`` (the recommended
persistence; demo/settings.py declares it, so they may vote at once after a restart). They are stopped when
the demo stops; masters left running by an earlier demo are reused.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from django_redlock.testing import RedisServer, find_redis_server  # noqa: E402

DATA = HERE / ".redis"
USER, PASSWORD = "demo", "demo-password"
DURABLE = ["--appendonly", "yes", "--appendfsync", "always"]


def listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.3)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def ours(port: int) -> bool:
    """Is the process on ``port`` a redis-server from an earlier demo run (its dir is ours)?"""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"CONFIG GET dir\r\n")
            data = sock.recv(4096)
    except OSError:
        return False
    return str(DATA) in data.decode("utf-8", "replace")


class Adopted:
    """A master left running by an earlier demo: reused now, shut down with this one."""

    def __init__(self, port: int) -> None:
        self.port = port

    def stop(self) -> None:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2) as sock:
                sock.sendall(b"SHUTDOWN\r\n")
                sock.recv(64)
        except OSError:
            pass


def start_masters(ports: list[int]) -> list[Any]:
    started: list[Any] = []
    for i, port in enumerate(ports):
        if listening(port):
            if ours(port):
                print(f"  redis master on :{port} is still running from an earlier demo: reusing it")
                started.append(Adopted(port))
                continue
            for server in started:
                server.stop()
            sys.exit(
                f"Port {port} is already used by another program. Stop it, or pick free ports, e.g.\n"
                f"  DEMO_REDIS_PORTS=7201,7202,7203,7204,7205 make demo"
            )
        workdir = DATA / f"node-{i + 1}"
        workdir.mkdir(parents=True, exist_ok=True)
        server = RedisServer(port=port, workdir=str(workdir), extra_args=DURABLE).start()
        started.append(server)
        print(f"  redis master on :{port} (data in {workdir.relative_to(ROOT)})")
    return started


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> int:
    signal.signal(signal.SIGTERM, _interrupt)  # stop the masters on SIGTERM too
    address = sys.argv[1] if len(sys.argv) > 1 else None
    host = os.environ.get("DEMO_HOST", "127.0.0.1")
    port = int(os.environ.get("DEMO_PORT", "8000"))
    if address:
        host, _, given = address.rpartition(":")
        host, port = host or "127.0.0.1", int(given)
    ports = [int(p) for p in os.environ.get("DEMO_REDIS_PORTS", "7101,7102,7103,7104,7105").split(",")]
    try:
        find_redis_server()
    except RuntimeError as exc:
        sys.exit(str(exc))
    if listening(port):
        sys.exit(f"Port {port} is already in use (another demo?). Use another one: DEMO_PORT=8001 make demo")

    print(f"Starting {len(ports)} independent Redis masters:")
    servers = start_masters(ports)
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="demo.settings", DEMO_REDIS_PORTS=",".join(map(str, ports)))
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(ROOT), env.get("PYTHONPATH", "")])
    manage = [sys.executable, str(HERE / "manage.py")]
    try:
        subprocess.run([*manage, "migrate", "--noinput", "-v", "0"], env=env, check=True)
        create_user = (
            "from django.contrib.auth import get_user_model as g; U = g(); "
            f"U.objects.filter(username={USER!r}).exists() or "
            f"U.objects.create_superuser({USER!r}, 'demo@example.com', {PASSWORD!r})"
        )
        subprocess.run([*manage, "shell", "-v", "0", "-c", create_user], env=env, check=True)
        url = f"http://{host}:{port}/"
        print()
        print(f"  Open {url}")
        print(f"  Admin: {url}admin/django_redlock/lock/  user {USER!r}, password {PASSWORD!r}")
        print("  Stop with Ctrl-C (the Redis masters stop with it).")
        print()
        server = subprocess.Popen([*manage, "runserver", f"{host}:{port}"], env=env)
        try:
            server.wait()
        finally:
            if server.poll() is None:
                server.terminate()
                server.wait(10)
    except KeyboardInterrupt:
        pass
    except subprocess.CalledProcessError as exc:
        print(f"demo: {' '.join(map(str, exc.cmd[1:3]))} failed with exit code {exc.returncode}", file=sys.stderr)
        return 1
    finally:
        for server in servers:
            server.stop()
        if servers:
            print("Stopped the Redis masters.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
