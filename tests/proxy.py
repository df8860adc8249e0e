"""A small TCP proxy between the engine and one real redis-server, for fault tests.

It stands in for the *network*: bytes are forwarded unchanged, but a test can
hold them (keep them and deliver them later, in order), delay them, or let new
connections through while older ones stay frozen. Held client->server bytes are
delivered even after the client closed its side: the proxy keeps its upstream
connection open until the held bytes have been flushed, which is what a late
TCP retransmission after a network blip looks like to the server.

Use it as a node URL: ``Proxy(server.port).start().url`` is
``redis://127.0.0.1:<proxy port>/0``. Plain threads and real sockets only.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

__all__ = ["Proxy"]

_CHUNK = 65536


class Pipe:
    """One proxied connection: client socket <-> upstream socket."""

    def __init__(self, proxy: Proxy, client: socket.socket, upstream: socket.socket, number: int) -> None:
        self.proxy = proxy
        self.number = number
        self.client = client
        self.upstream = upstream
        self.client_closed = False
        self.upstream_closed = False
        # client -> server
        self.up_frozen = False  # once a byte is held, every later byte on this pipe is held too (order)
        self.up_held = bytearray()
        self.up_forwarded = bytearray()
        # server -> client
        self.down_frozen = False
        self.down_held = bytearray()
        self.down_seen = bytearray()  # every byte the server sent on this pipe
        self.damaged = False  # bytes were lost in a partition
        self.reset = False  # the client's side was reset

    def __repr__(self) -> str:
        return f"<Pipe #{self.number} held={len(self.up_held)}/{len(self.down_held)} closed={self.client_closed}>"


class Proxy:
    """Forward 127.0.0.1:<port> to a real node, with controls to hold, delay and flush bytes.

    Controls (all thread-safe, all per proxy):

    * :meth:`hold_requests` / :meth:`pass_requests`: client->server bytes arriving
      from now on are held (per connection, in order) / forwarded. A connection
      that already holds bytes stays frozen until :meth:`flush_requests`, so
      ``pass_requests()`` lets *new* connections through while old ones wait.
    * :meth:`hold_replies` / :meth:`pass_replies` / :meth:`flush_replies`: the same
      for server->client bytes.
    * ``delay_requests`` / ``delay_replies``: seconds to wait before forwarding
      each chunk (applied in the pumping thread, so order is kept).
    * ``split_replies``: seconds between the first byte of each server->client chunk
      and the rest (a reply that arrives in two packets, the second late).
    * :meth:`wait_held`: block until held client->server bytes satisfy a test.
    * :meth:`hold_requests_from` / :meth:`hold_replies_after`: start holding at a given command
      (the chunk that contains a pattern, or the replies sent after it was forwarded).
    * :meth:`hold_connection_from`: hold the first client->server chunk containing a given
      pattern, and every later byte of that connection (other connections go on).
    * :meth:`cut_after` / :meth:`heal`: a partition that starts right after a given
      command went through (everything later is lost, both ways) and its end.
    * ``reset_loses_held``: a reset of a client's connection loses the client->server
      bytes still on their way, held or delayed (by default they are delivered later, even
      after the client left).
    """

    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(128)
        self.port: int = self.listener.getsockname()[1]
        self.pipes: list[Pipe] = []
        self.cond = threading.Condition()
        self.holding_requests = False
        self.holding_replies = False
        self.delay_requests = 0.0
        self.delay_replies = 0.0
        self.split_replies = 0.0
        self.closed = False
        self.cut_pattern: bytes | None = None
        self.hold_requests_pattern: tuple[bytes, ...] = ()
        self.hold_replies_pattern: tuple[bytes, ...] = ()
        self.cut = False  # a partition: every byte, both ways, on every connection, is lost
        self.hold_pattern: bytes | None = None
        #: A reset of the client's connection (closed with unread bytes, or sent bytes after it
        #: closed) loses the client->server bytes still on their way (held or delayed): a node's
        #: stack refuses what comes after the reset.
        self.reset_loses_held = False
        self._threads: list[threading.Thread] = []

    # -- life cycle --------------------------------------------------------

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def url_with(self, userinfo: str) -> str:
        return f"redis://{userinfo}@127.0.0.1:{self.port}/0"

    def start(self) -> Proxy:
        self._spawn(self._accept)
        return self

    def close(self) -> None:
        with self.cond:
            self.closed = True
            pipes = list(self.pipes)
            self.cond.notify_all()
        try:
            self.listener.close()
        except OSError:
            pass
        for pipe in pipes:
            _close(pipe.client)
            _close(pipe.upstream)

    def __enter__(self) -> Proxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        self._threads.append(thread)

    # -- controls ------------------------------------------------------------

    def hold_requests(self) -> None:
        with self.cond:
            self.holding_requests = True

    def pass_requests(self) -> None:
        """New bytes are forwarded again; connections that hold bytes stay frozen until flushed."""
        with self.cond:
            self.holding_requests = False

    def flush_requests(self, wait: bool = True, timeout: float = 5.0) -> None:
        """Deliver every held client->server byte, in order, and unfreeze those connections.

        With ``wait``, return once the server has answered every command delivered
        so far on those connections (one RESP reply per command), so that their
        effects are visible to the next client.
        """
        targets: list[tuple[Pipe, int]] = []
        with self.cond:
            for pipe in [p for p in self.pipes if p.up_frozen]:
                data = bytes(pipe.up_held)
                pipe.up_held.clear()
                pipe.up_frozen = False
                if self._lost_to_reset(pipe):
                    _shutdown_write(pipe.upstream)
                    continue
                try:
                    pipe.upstream.sendall(data)
                except OSError:
                    continue
                pipe.up_forwarded += data
                targets.append((pipe, count_resp(bytes(pipe.up_forwarded))))
        if not wait:
            return
        deadline = time.monotonic() + timeout
        with self.cond:
            for pipe, commands in targets:
                while count_resp(bytes(pipe.down_seen)) < commands and not pipe.upstream_closed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise AssertionError(f"{pipe}: the server did not answer the flushed commands")
                    self.cond.wait(left)

    def hold_connection_from(self, pattern: bytes) -> None:
        """Arm a hold: the first client->server chunk containing ``pattern`` and every later byte of
        its connection are held (until :meth:`flush_requests`); other connections go on."""
        with self.cond:
            self.hold_pattern = pattern

    def hold_replies(self) -> None:
        with self.cond:
            self.holding_replies = True

    def pass_replies(self) -> None:
        with self.cond:
            self.holding_replies = False

    def flush_replies(self) -> None:
        """Deliver every held server->client byte, in order, and unfreeze those connections."""
        with self.cond:
            for pipe in self.pipes:
                if not pipe.down_frozen:
                    continue
                data = bytes(pipe.down_held)
                pipe.down_held.clear()
                pipe.down_frozen = False
                if not pipe.client_closed:
                    try:
                        pipe.client.sendall(data)
                    except OSError:
                        pass

    def cut_after(self, pattern: bytes) -> None:
        """Arm a partition: right after a client->server chunk containing ``pattern`` has been
        forwarded, every later byte (both ways, all connections, new ones too) is lost until :meth:`heal`."""
        with self.cond:
            self.cut_pattern = pattern

    def wait_cut(self, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not self.cut:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"proxy {self.port}: the partition never started")
                self.cond.wait(left)

    def heal(self) -> None:
        """End the partition. Connections that lost bytes are reset (as after a real partition)."""
        with self.cond:
            self.cut = False
            self.cut_pattern = None
            broken = [p for p in self.pipes if p.damaged]
        for pipe in broken:
            _close(pipe.client)
            _close(pipe.upstream)

    def hold_requests_from(self, *patterns: bytes) -> None:
        """Hold client->server bytes from the first chunk that contains one of ``patterns`` on (that
        chunk too), as :meth:`hold_requests` from that moment."""
        with self.cond:
            self.hold_requests_pattern = patterns

    def hold_replies_after(self, *patterns: bytes) -> None:
        """Hold server->client bytes from the moment the first chunk that contains one of
        ``patterns`` was forwarded, as :meth:`hold_replies` from that moment: its reply is held."""
        with self.cond:
            self.hold_replies_pattern = patterns

    def held_requests(self) -> bytes:
        with self.cond:
            return b"".join(bytes(p.up_held) for p in self.pipes)

    def held_replies(self) -> bytes:
        with self.cond:
            return b"".join(bytes(p.down_held) for p in self.pipes)

    def wait_held(self, test: Callable[[bytes], bool], timeout: float = 5.0, replies: bool = False) -> None:
        """Block until the held bytes (all connections, joined) pass ``test``."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                held = b"".join(bytes(p.down_held if replies else p.up_held) for p in self.pipes)
                if test(held):
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"proxy {self.port}: held bytes never matched; held {held[:300]!r}")
                self.cond.wait(left)

    def connections(self) -> int:
        with self.cond:
            return len(self.pipes)

    # -- pumping -------------------------------------------------------------

    def _accept(self) -> None:
        number = 0
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _close(client)
                continue
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            number += 1
            pipe = Pipe(self, client, upstream, number)
            with self.cond:
                if self.closed:
                    _close(client)
                    _close(upstream)
                    return
                self.pipes.append(pipe)
            self._spawn(self._pump_up, pipe)
            self._spawn(self._pump_down, pipe)

    def _lost_to_reset(self, pipe: Pipe) -> bool:
        """With :attr:`reset_loses_held`: True once the client's side was reset (closed with unread
        bytes, or sent bytes after it closed); the bytes not delivered to the server yet are lost."""
        if self.reset_loses_held and not pipe.reset:
            try:
                pipe.reset = pipe.client.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0
            except OSError:
                pass
        return self.reset_loses_held and pipe.reset

    def _pump_up(self, pipe: Pipe) -> None:
        """client -> server."""
        while True:
            try:
                data = pipe.client.recv(_CHUNK)
            except ConnectionResetError:
                pipe.reset, data = True, b""
            except OSError:
                data = b""
            if not data:
                break
            if self.delay_requests:
                time.sleep(self.delay_requests)  # the fault under test: late delivery
            with self.cond:
                if self._lost_to_reset(pipe):
                    continue
                if self.cut:
                    pipe.damaged = True
                    continue
                if any(pattern in data for pattern in self.hold_requests_pattern):
                    self.holding_requests = True
                    self.hold_requests_pattern = ()
                if self.hold_pattern is not None and self.hold_pattern in data:
                    pipe.up_frozen, self.hold_pattern = True, None
                if pipe.up_frozen or self.holding_requests:
                    pipe.up_frozen = True
                    pipe.up_held += data
                    self.cond.notify_all()
                    continue
                try:
                    pipe.upstream.sendall(data)
                    pipe.up_forwarded += data
                except OSError:
                    break
                if any(pattern in data for pattern in self.hold_replies_pattern):
                    self.holding_replies = True  # under the lock: the reply cannot pass before this
                    self.hold_replies_pattern = ()
                if self.cut_pattern is not None and self.cut_pattern in data:
                    self.cut = True
                    self.cut_pattern = None
                    self.cond.notify_all()
        with self.cond:
            pipe.client_closed = True
            if self._lost_to_reset(pipe):
                pipe.up_held.clear()
                pipe.up_frozen = False
            keep = pipe.up_frozen
            self.cond.notify_all()
        if not keep:
            # Nothing held: the server sees the client leave, as without a proxy.
            _shutdown_write(pipe.upstream)
        # Held bytes: keep the upstream open; flush_requests() delivers them later
        # and close() ends the connection.

    def _pump_down(self, pipe: Pipe) -> None:
        """server -> client."""
        while True:
            try:
                data = pipe.upstream.recv(_CHUNK)
            except OSError:
                data = b""
            if not data:
                break
            if self.delay_replies:
                time.sleep(self.delay_replies)
            with self.cond:
                if self.cut:
                    pipe.damaged = True
                    continue
                pipe.down_seen += data
                if pipe.down_frozen or self.holding_replies:
                    pipe.down_frozen = True
                    pipe.down_held += data
                    self.cond.notify_all()
                    continue
                self.cond.notify_all()
                if pipe.client_closed:
                    continue
                split = self.split_replies if len(data) > 1 else 0.0
                if not split:
                    try:
                        pipe.client.sendall(data)
                    except OSError:
                        pass
                    continue
            try:  # the first byte now, the rest late (outside the lock: the controls stay usable)
                pipe.client.sendall(data[:1])
                time.sleep(split)
                pipe.client.sendall(data[1:])
            except OSError:
                pass
        with self.cond:
            pipe.upstream_closed = True
            self.cond.notify_all()
        _shutdown_write(pipe.client)


def count_resp(data: bytes) -> int:
    """How many complete top-level RESP2 values (commands or replies) ``data`` holds."""
    count = 0
    pos = 0
    while True:
        after = _skip_resp(data, pos)
        if after is None:
            return count
        count += 1
        pos = after


def _skip_resp(data: bytes, pos: int) -> int | None:
    end = data.find(b"\r\n", pos)
    if end < 0 or pos >= len(data):
        return None
    kind = data[pos : pos + 1]
    after = end + 2
    if kind in (b"+", b"-", b":"):
        return after
    if kind == b"$":
        size = int(data[pos + 1 : end])
        if size < 0:
            return after
        return after + size + 2 if len(data) >= after + size + 2 else None
    if kind == b"*":
        items = int(data[pos + 1 : end])
        for _ in range(max(items, 0)):
            nxt = _skip_resp(data, after)
            if nxt is None:
                return None
            after = nxt
        return after
    return after  # an inline command (e.g. "PING\r\n")


def _shutdown_write(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass
