"""The floor of the contention scenario: the least a waiting line on N nodes can cost a hand-off.

:class:`HandoffFloor` is a client on raw sockets, nothing else: it takes the key with
``SET key token NX PX`` on every node and holds it once a majority granted; when refused it
waits with ``BLPOP`` on a wake list on the first node, which every release pushes to (in the
same script that deletes the key there, so the wake-up costs the releaser nothing extra). A
refused attempt that won some nodes gives them back the same way, wake-up included, so two
attempts that split the vote cannot leave everyone waiting. ``BLPOP`` gives up after
``wake_timeout`` seconds and the waiter tries again: a lost wake-up costs that much, never a
hang. No timeouts, no clocks, no validity, no reconnects: only the round trips any such
design pays. :func:`ping_rtt_us` measures the loopback round trip the targets allow on top.
"""

from __future__ import annotations

import select
import socket
import statistics
import time
from collections.abc import Callable

RELEASE = b"if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"
#: The same on the node that holds the wake list, and a push to it (kept to one entry).
RELEASE_AND_WAKE = (
    b"local mine = redis.call('get', KEYS[1]) == ARGV[1] if mine then redis.call('del', KEYS[1]) end "
    b"redis.call('lpush', KEYS[2], 1) redis.call('ltrim', KEYS[2], 0, 0) return mine and 1 or 0"
)


def command(*parts: bytes) -> bytes:
    """One command in RESP, the protocol Redis speaks."""
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(part), part) for part in parts)


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _receive(sock: socket.socket, complete: Callable[[bytes], bool]) -> bytes:
    """Read from ``sock`` until ``complete(what was read)``."""
    data = b""
    while not complete(data):
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("a node closed the connection")
        data += chunk
    return data


def _lines(count: int) -> Callable[[bytes], bool]:
    return lambda data: data.count(b"\r\n") >= count


class HandoffFloor:
    """A blocking lock on ``ports`` (a majority decides) that waits on a ``BLPOP`` wake list."""

    def __init__(self, ports: list[int], token: str, wake_timeout: float = 0.1) -> None:
        if not ports:
            raise ValueError("ports: at least one node is needed")
        self.socks = [_connect(port) for port in ports]
        self.waker = _connect(ports[0])  # BLPOP blocks its connection: a socket of its own
        self.token = token.encode()
        self.timeout = b"%g" % wake_timeout
        self.quorum = len(ports) // 2 + 1
        self.poller = select.poll()
        self.index: dict[int, int] = {}
        for i, sock in enumerate(self.socks):
            self.poller.register(sock, select.POLLIN)
            self.index[sock.fileno()] = i
        self.owed = [0] * len(self.socks)
        self.partial = [b""] * len(self.socks)
        self.shas: list[bytes] = []
        for i, sock in enumerate(self.socks):  # loaded once, before any timing
            sock.sendall(command(b"SCRIPT", b"LOAD", RELEASE_AND_WAKE if i == 0 else RELEASE))
            self.shas.append(_receive(sock, _lines(2)).split(b"\r\n")[1])

    def acquire(self, name: str) -> str:
        key = name.encode()
        while True:
            granted = self._set(key)
            if granted >= self.quorum:
                return name
            if granted:
                self._release(key)  # give back what this attempt won, and wake the line
            self._wait(key)

    def _wait(self, key: bytes) -> None:
        """BLPOP the wake list: a ``*-1`` line after the timeout, a [list, value] array (five lines) on a wake-up."""
        self.waker.sendall(command(b"BLPOP", key + b":wake", self.timeout))
        _receive(self.waker, lambda data: data.startswith(b"*-1\r\n") or data.count(b"\r\n") >= 5)

    def release(self, name: str) -> None:
        self._release(name.encode())

    def _set(self, key: bytes) -> int:
        """Write SET NX PX to every node; return how many granted: once a majority did, else once all answered."""
        self._send([command(b"SET", key, self.token, b"NX", b"PX", b"10000")] * len(self.socks))
        granted = 0
        while granted < self.quorum and any(self.owed):
            granted += self._read().count(b"+OK")
        return granted

    def _release(self, key: bytes) -> None:
        """Compare-and-delete on every node (with the wake-up on the first); wait for every reply."""
        wake = key + b":wake"
        self._send([command(b"EVALSHA", sha, b"2", key, wake, self.token) for sha in self.shas])
        while any(self.owed):
            self._read()

    def _send(self, wires: list[bytes]) -> None:
        for i, (sock, wire) in enumerate(zip(self.socks, wires)):
            sock.sendall(wire)
            self.owed[i] += 1

    def _read(self) -> list[bytes]:
        """The replies that have come in (each one line here); late ones of an earlier round come first."""
        replies: list[bytes] = []
        for fd, _event in self.poller.poll():
            i = self.index[fd]
            chunk = self.socks[i].recv(4096)
            if not chunk:
                raise ConnectionError("a node closed the connection")
            *lines, self.partial[i] = (self.partial[i] + chunk).split(b"\r\n")
            self.owed[i] -= len(lines)
            replies += lines
        return replies

    def close(self) -> None:
        for sock in (*self.socks, self.waker):
            sock.close()


def ping_rtt_us(port: int, count: int = 2000) -> float:
    """The loopback round trip: the median time of a ``PING`` on a raw socket, in µs."""
    if count < 1:
        raise ValueError(f"count must be at least 1, not {count!r}")
    sock = _connect(port)
    try:
        ping, samples = command(b"PING"), []
        for _ in range(count):
            started = time.perf_counter()
            sock.sendall(ping)
            _receive(sock, _lines(1))
            samples.append(time.perf_counter() - started)
    finally:
        sock.close()
    return statistics.median(samples) * 1e6
