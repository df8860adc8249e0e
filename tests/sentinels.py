"""A real Sentinel group for tests: one master, one replica and one or three ``redis-server --sentinel``
processes on free loopback ports, in a temporary directory.

Sentinel timings are short (``down-after-milliseconds`` 1000) and :meth:`SentinelGroup.failover`
forces a failover with ``SENTINEL FAILOVER`` and returns once every sentinel names the new master
and the old one follows it as a replica.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from typing import Any

import redis

from django_redlock.testing import RedisServer, find_redis_server, free_port
from tests.proxy import Proxy

SERVICE = "lockmaster"


class SentinelGroup:
    """``master`` and ``replica`` (:class:`RedisServer`), and ``sentinel_ports``."""

    def __init__(
        self,
        sentinels: int = 1,
        password: str | None = None,
        sentinel_password: str | None = None,
        tls: tuple[str, str, str] | None = None,
        stream: bool = False,
    ) -> None:
        """``tls``: ``(cert file, key file, CA file)``: everything speaks TLS (the servers also keep
        a plain port, for the fixture's own readiness checks). ``stream``: the replica replicates
        through a proxy, :attr:`stream`, that can hold the master's writes back (replication
        falling behind)."""
        self.stream: Proxy | None = None
        self._through_proxy = stream
        self.count = sentinels
        self.password = password
        self.sentinel_password = sentinel_password
        self.tls = tls
        self.workdir = tempfile.mkdtemp(prefix="redlock-sentinel-")
        self.master = self._server([])
        self.replica: RedisServer | None = None
        self.sentinel_ports: list[int] = []
        self._sentinels: list[subprocess.Popen[bytes]] = []

    def _auth_args(self) -> list[str]:
        return ["--masterauth", self.password] if self.password else []

    def _server(self, args: list[str]) -> RedisServer:
        # A replica's full sync starts at once (diskless syncs wait 5 s for more replicas by default).
        extra = [*self._auth_args(), "--repl-diskless-sync-delay", "0", *args]
        server = RedisServer(password=self.password, extra_args=extra, tls=self.tls)
        if self.tls:  # replicas and Sentinels must find each server at its TLS port
            server.tls_port = free_port()
            server.extra_args += ["--tls-replication", "yes", "--replica-announce-port", str(server.tls_port)]
        return server

    def port_of(self, server: RedisServer) -> int:
        """The port the Sentinels know ``server`` by."""
        port = server.tls_port if self.tls else server.port
        assert port is not None
        return port

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", port) for port in self.sentinel_ports]

    @property
    def servers(self) -> list[RedisServer]:
        return [self.master] + ([self.replica] if self.replica else [])

    def spec(self, **extra: Any) -> dict[str, Any]:
        """The ``REDLOCK_NODES`` entry for this group."""
        spec: dict[str, Any] = {"SENTINELS": self.addresses, "SERVICE": SERVICE}
        tls = {"ssl": True, "ssl_ca_certs": self.tls[2]} if self.tls else {}
        if self.password or tls:
            spec["OPTIONS"] = {**({"password": self.password} if self.password else {}), **tls}
        if self.sentinel_password or tls:
            spec["SENTINEL_OPTIONS"] = {**({"password": self.sentinel_password} if self.sentinel_password else {}), **tls}
        spec.update(extra)
        return spec

    # -- life cycle -------------------------------------------------------------

    def start(self) -> SentinelGroup:
        try:
            self.master.start()
            upstream = self.port_of(self.master)
            if self._through_proxy:
                self.stream = Proxy(upstream).start()
                upstream = self.stream.port
            self.replica = self._server(["--replicaof", "127.0.0.1", str(upstream)]).start()
            # Sentinels learn of replicas from the master's INFO: one already in sync is seen at once.
            self.wait_until(lambda: self._replicates_from(self.replica, self.master), "the replica is in sync")
            for _ in range(self.count):
                self._start_sentinel()
            self.wait_until(lambda: all(self.knows_replica(p) for p in self.sentinel_ports), "sentinels see the replica")
            if self.count > 1:
                self.wait_until(
                    lambda: all(self.state(p)["num-other-sentinels"] == self.count - 1 for p in self.sentinel_ports),
                    "sentinels see each other",
                )
        except Exception:
            self.stop()
            raise
        return self

    def _start_sentinel(self) -> None:
        binary = find_redis_server()
        for _attempt in range(5):
            port = free_port()
            conf = os.path.join(self.workdir, f"sentinel-{port}.conf")
            lines = [
                f"port {0 if self.tls else port}",
                "bind 127.0.0.1",
                "protected-mode no",
                f"dir {self.workdir}",
                f"logfile {os.path.join(self.workdir, f'sentinel-{port}.log')}",
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.port_of(self.master)} {max(1, self.count // 2 + 1)}",
                f"sentinel down-after-milliseconds {SERVICE} 1000",
                f"sentinel failover-timeout {SERVICE} 10000",
            ]
            if self.password:
                lines.append(f"sentinel auth-pass {SERVICE} {self.password}")
            if self.sentinel_password:
                lines += [f"requirepass {self.sentinel_password}", f"sentinel sentinel-pass {self.sentinel_password}"]
            if self.tls:
                cert, key, ca = self.tls
                lines += [f"tls-port {port}", f"tls-cert-file {cert}", f"tls-key-file {key}", f"tls-ca-cert-file {ca}",
                          "tls-auth-clients no", "tls-replication yes"]
            with open(conf, "w") as f:
                f.write("\n".join(lines) + "\n")
            process = subprocess.Popen(
                [binary, conf, "--sentinel"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and process.poll() is None:
                try:
                    self.client(port).ping()
                except redis.RedisError:
                    time.sleep(0.01)  # polling a process we just started: no event to await
                    continue
                self._sentinels.append(process)
                self.sentinel_ports.append(port)
                return
            process.kill()
            process.wait()
        raise RuntimeError(f"redis-server --sentinel did not start; see {self.workdir}")

    def stop(self) -> None:
        for process in self._sentinels:
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
            process.wait()
        self._sentinels = []
        if self.stream is not None:
            self.stream.close()
        for server in self.servers:
            server.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    # -- what the sentinels say ---------------------------------------------------

    def client(self, port: int) -> redis.Redis:
        tls = {"ssl": True, "ssl_ca_certs": self.tls[2]} if self.tls else {}
        return redis.Redis(port=port, password=self.sentinel_password, socket_timeout=2, **tls)

    def state(self, port: int) -> dict[str, Any]:
        with self.client(port) as c:
            return c.execute_command("SENTINEL MASTER", SERVICE)  # type: ignore[no-any-return]

    def knows_replica(self, port: int) -> bool:
        with self.client(port) as c:
            replicas = c.sentinel_slaves(SERVICE)
        return any(not (r["is_sdown"] or r["is_odown"]) and r.get("master-link-status") == "ok" for r in replicas)

    def master_port(self, port: int | None = None) -> int:
        return int(self.state(port or self.sentinel_ports[0])["port"])

    def current(self) -> RedisServer:
        """The server the first sentinel names as master."""
        port = self.master_port()
        return next(s for s in self.servers if self.port_of(s) == port)

    def wait_until(self, done: Any, what: str, seconds: float = 30.0) -> None:
        deadline = time.monotonic() + seconds
        while True:
            try:
                if done():
                    return
            except (redis.RedisError, OSError, KeyError, StopIteration):
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"Sentinel group: timed out waiting until {what}; see {self.workdir}")
            time.sleep(0.05)  # Sentinel has no event to subscribe to for these states

    def failover(self, settle: bool = False) -> RedisServer:
        """Force a failover; return the new master once every sentinel names it. With ``settle``,
        also wait until the old master replicates from it and the sentinels see it as a replica
        (Sentinel reconfigures it some seconds later): the next failover needs that."""
        old = self.current()
        new = next(s for s in self.servers if s is not old)
        self.wait_until(lambda: all(self.knows_replica(p) for p in self.sentinel_ports), "sentinels see the replica")
        with self.client(self.sentinel_ports[0]) as c:
            c.execute_command("SENTINEL", "FAILOVER", SERVICE)
        self.wait_until(lambda: all(self.master_port(p) == self.port_of(new) for p in self.sentinel_ports), "a new master")
        if settle:
            self.wait_until(lambda: self._replicates_from(old, new), "the old master follows the new one")
            self.wait_until(lambda: all(self.knows_replica(p) for p in self.sentinel_ports), "sentinels see the replica")
        return new

    def _replicates_from(self, server: RedisServer, master: RedisServer) -> bool:
        with redis.Redis(port=server.port, password=self.password, socket_timeout=2) as c:
            info = c.info("replication")
        ports = {self.port_of(master)} | ({self.stream.port} if self.stream and master is self.master else set())
        return info["role"] == "slave" and int(info["master_port"]) in ports and info["master_link_status"] == "up"
