"""Real ``redis-server`` processes for tests, benchmarks and the demo.

Each :class:`RedisServer` is its own process on a free loopback port, with no
persistence unless asked, and can be killed (SIGKILL), paused (SIGSTOP),
resumed (SIGCONT) and restarted empty. Nothing here imports Django.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import NamedTuple

__all__ = [
    "RedisServer",
    "RedisServers",
    "ServerIdentity",
    "expected_server",
    "find_redis_server",
    "free_port",
    "identify_server",
    "identity_from_info",
]

#: Which server the tests must run on, e.g. ``"redis 6.2"`` or ``"valkey 8"`` (a product and a
#: version prefix); unset: whatever :func:`find_redis_server` finds.
EXPECT_ENV = "REDLOCK_TEST_SERVER"

INSTALL_HINT = (
    "redis-server was not found on PATH. Install it (Debian/Ubuntu: "
    "'apt-get install redis-server', macOS: 'brew install redis') or set "
    "REDIS_SERVER to the binary's path."
)


def find_redis_server() -> str:
    """Return the server binary: ``$REDIS_SERVER`` (any redis-server or valkey-server), else
    ``redis-server`` on PATH; raise with install advice when there is none."""
    path = os.environ.get("REDIS_SERVER") or shutil.which("redis-server")
    if not path:
        raise RuntimeError(INSTALL_HINT)
    if os.sep in path and not os.access(path, os.X_OK):
        raise RuntimeError(f"REDIS_SERVER is {path!r}, which is not an executable file.")
    return path


class ServerIdentity(NamedTuple):
    """What a server binary says it is in ``INFO server``."""

    product: str  # "redis" or "valkey"
    version: str  # e.g. "7.0.15"; Valkey's own version, not the Redis version it mimics
    binary: str

    def __str__(self) -> str:
        return f"{self.product} {self.version} ({self.binary})"

    def matches(self, wanted: str) -> bool:
        """Whether this is ``wanted``: ``"valkey"``, ``"redis 7"``, ``"redis 6.2"``, ``"valkey 8.1.8"``."""
        product, _, version = wanted.strip().lower().partition(" ")
        version = version.strip()
        return product == self.product and (not version or f"{self.version}.".startswith(f"{version}."))


def identity_from_info(info: Mapping[str, object], binary: str = "") -> ServerIdentity:
    """The product and version in an ``INFO server`` reply (Valkey also reports a Redis version)."""
    if info.get("server_name") == "valkey" or "valkey_version" in info:
        return ServerIdentity("valkey", str(info.get("valkey_version", "?")), binary)
    return ServerIdentity("redis", str(info.get("redis_version", "?")), binary)


def identify_server(binary: str | None = None) -> ServerIdentity:
    """Start ``binary`` (default: :func:`find_redis_server`) for a moment and ask it ``INFO server``."""
    import redis

    binary = binary or find_redis_server()
    server = RedisServer(binary=binary).start()
    try:
        with redis.Redis(port=server.port or 0, socket_timeout=5) as client:
            info = client.info("server")
    finally:
        server.stop()
    return identity_from_info(info, binary)


def expected_server() -> str | None:
    """``$REDLOCK_TEST_SERVER``: the server the tests were asked to run on (None: any)."""
    return os.environ.get(EXPECT_ENV) or None


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _answers_ping(port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One real redis-server process that a test can start, fault and stop."""

    def __init__(
        self,
        port: int | None = None,
        *,
        extra_args: Sequence[str] = (),
        workdir: str | None = None,
        password: str | None = None,
        tls: tuple[str, str, str] | None = None,
        binary: str | None = None,
    ) -> None:
        """``tls`` is ``(cert file, key file, CA file)``: also listen with TLS on :attr:`tls_port`.
        ``binary``: the server to run (default: :func:`find_redis_server`)."""
        self.binary = binary
        self.port = port
        self.tls = tls
        self.tls_port: int | None = None
        self.extra_args = list(extra_args)
        self.password = password
        self._own_dir = workdir is None
        self.workdir = workdir or tempfile.mkdtemp(prefix="redlock-redis-")
        self.process: subprocess.Popen[bytes] | None = None
        self.paused = False

    # -- addresses -------------------------------------------------------
    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    @property
    def tls_url(self) -> str:
        """``rediss://`` URL of the TLS port (servers started with ``tls=...``)."""
        return f"rediss://127.0.0.1:{self.tls_port}/0"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<RedisServer 127.0.0.1:{self.port} {state}{' paused' if self.paused else ''}>"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    # -- life cycle ------------------------------------------------------
    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start the server and return once it answers PING."""
        binary = self.binary or find_redis_server()
        for _attempt in range(5):
            port = self.port or free_port()
            args = [
                binary,
                "--port", str(port),
                "--bind", "127.0.0.1",
                "--dir", self.workdir,
                "--save", "",
                "--appendonly", "no",
                "--daemonize", "no",
                "--protected-mode", "no",
                "--loglevel", "warning",
                "--logfile", os.path.join(self.workdir, f"redis-{port}.log"),
                "--tcp-backlog", "128",
            ]
            if self.password:
                args += ["--requirepass", self.password]
            if self.tls:
                self.tls_port = self.tls_port or free_port()
                cert, key, ca = self.tls
                args += ["--tls-port", str(self.tls_port), "--tls-cert-file", cert, "--tls-key-file", key]
                args += ["--tls-ca-cert-file", ca, "--tls-auth-clients", "no"]
            args += self.extra_args
            self.process = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    break  # could not bind: try another port
                if self._ready(port):
                    self.port = port
                    self.paused = False
                    return self
                time.sleep(0.01)  # polling a process we just started: no event to await
            self._reap()
            if self.port:  # a fixed port that will not come up: do not wander off it
                break
        raise RuntimeError(f"{binary} did not start on port {self.port or 'any'}; see {self.workdir}")

    def _ready(self, port: int) -> bool:
        if not self.password:
            return _answers_ping(port)
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
                sock.sendall(f"AUTH {self.password}\r\nPING\r\n".encode())
                data = b""
                while data.count(b"\r\n") < 2:
                    chunk = sock.recv(64)
                    if not chunk:
                        return False
                    data += chunk
                return b"+PONG" in data
        except OSError:
            return False

    def _reap(self) -> None:
        if self.process is not None:
            if self.process.poll() is None:
                if self.paused:
                    os.kill(self.process.pid, signal.SIGCONT)
                self.process.kill()
            self.process.wait()
        self.process = None
        self.paused = False

    def kill(self) -> None:
        """SIGKILL the server: it loses every key (no persistence)."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None
        self.paused = False

    def pause(self) -> None:
        """SIGSTOP the server: connections stay open but nothing is answered."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)
        self.paused = True

    def resume(self, wait: bool = True) -> None:
        """SIGCONT a paused server; by default, return once it answers again."""
        assert self.process is not None and self.port is not None
        os.kill(self.process.pid, signal.SIGCONT)
        self.paused = False
        if wait:
            deadline = time.monotonic() + 5
            while not self._ready(self.port) and time.monotonic() < deadline:
                time.sleep(0.005)

    @contextmanager
    def paused_for_block(self) -> Iterator[None]:
        """Keep the server paused for the ``with`` block."""
        self.pause()
        try:
            yield
        finally:
            self.resume()

    def restart(self) -> RedisServer:
        """Kill the server and start it again, empty, on the same port."""
        self.kill()
        return self.start()

    def stop(self) -> None:
        """Stop the server and remove its working directory."""
        self._reap()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def flushall(self) -> None:
        """Empty the server (it must be running and not paused)."""
        assert self.port is not None
        with socket.create_connection(("127.0.0.1", self.port), timeout=2) as sock:
            prefix = f"AUTH {self.password}\r\n" if self.password else ""
            sock.sendall(f"{prefix}FLUSHALL\r\n".encode())
            need = 2 if self.password else 1
            data = b""
            while data.count(b"\r\n") < need:
                chunk = sock.recv(256)
                if not chunk:
                    break
                data += chunk


class RedisServers(list[RedisServer]):
    """A list of independent :class:`RedisServer` masters started together."""

    def __init__(self, count: int = 5, **kwargs: object) -> None:
        super().__init__(RedisServer(**kwargs) for _ in range(count))  # type: ignore[arg-type]

    @property
    def urls(self) -> list[str]:
        return [server.url for server in self]

    def start(self) -> RedisServers:
        try:
            for server in self:
                server.start()
        except Exception:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for server in self:
            server.stop()

    def heal(self) -> None:
        """Resume paused servers, start killed ones, and empty them all."""
        for server in self:
            if server.paused:
                server.resume()
            if not server.running:
                server.start()
            server.flushall()

    def __enter__(self) -> RedisServers:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
