"""When an asyncio fan-out hears nothing from a node, what the client saw of that node's sockets.

Rarely, and only inside the whole suite, an ``AsyncLockManager``'s first acquire has heard no reply
from some live nodes for about a second. To tell a silent server from a socket the event loop does
not read, every asyncio fan-out of a test that ends with a node's "no reply within" notes, for each
of that node's connections still owed replies: the bytes the kernel holds unread, whether the loop's
selector lists the socket for reading, and whether the kernel's epoll set watches it
(``/proc/self/fdinfo``). A failing test's report shows them in a "silent nodes" section, with the
state of each test server's process.

Installed per test by an autouse fixture (tests/conftest.py): a module-scoped fixture, such as the
call budget's measurement, runs before it, with the engine as shipped.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import selectors
import struct
import termios
from collections.abc import Iterator
from typing import Any

import pytest

from django_redlock.core import async_manager, clock

#: What the fan-outs of the running test noted.
NOTES: list[str] = []


def _unread(fd: int) -> object:
    try:
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
    except OSError as exc:
        return f"? ({exc.strerror})"


def _epoll_watches(selector: Any, fd: int) -> object:
    """Whether the kernel's epoll set of ``selector`` has ``fd`` (Linux: /proc/self/fdinfo)."""
    try:
        with open(f"/proc/self/fdinfo/{selector.fileno()}") as info:
            return any(line.split()[:2] == ["tfd:", str(fd)] for line in info)
    except (OSError, AttributeError, ValueError):
        return "?"


def _note(anodes: Any, results: list[Any]) -> None:
    loop = asyncio.get_running_loop()
    selector = getattr(loop, "_selector", None)
    now = clock.now()
    for i, result in enumerate(results):
        if "no reply within" not in str(result):
            continue
        books = anodes[i].books_for(loop, os.getpid())
        owed = [(conn, since) for conn, since in books.parked.items() if conn.expect]
        if not owed:
            NOTES.append(f"node {i}: {result}; no connection owed replies")
        for conn, since in owed:
            sock = conn.transport.get_extra_info("socket")
            fd = sock.fileno() if sock is not None else -1
            try:
                key = selector.get_key(fd) if selector is not None and fd >= 0 else None
            except KeyError:
                key = None
            reading = key is not None and bool(key.events & selectors.EVENT_READ)
            NOTES.append(
                f"node {i}: {result}; fd {fd}, due {now - since:.3f} s, {len(conn.expect)} replies owed, "
                f"{_unread(fd) if fd >= 0 else '?'} bytes unread, selector reads it: {reading}, "
                f"epoll watches it: {_epoll_watches(selector, fd) if fd >= 0 else '?'}, "
                f"transport reading: {conn.transport.is_reading()}, closing: {conn.transport.is_closing()}"
            )


@pytest.fixture(autouse=True)
def silent_nodes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    original = async_manager.afanout

    async def afanout(anodes: Any, fan: Any, timeout: float) -> list[Any]:
        results = await original(anodes, fan, timeout)
        try:
            _note(anodes, results)
        except Exception as exc:  # noqa: BLE001 - a look that fails must not fail the test
            NOTES.append(f"look failed: {exc!r}")
        return results

    NOTES.clear()
    monkeypatch.setattr(async_manager, "afanout", afanout)
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed and NOTES:
        lines = NOTES[-40:]
        for server in item.funcargs.get("servers") or ():  # type: ignore[attr-defined]
            lines.append(f"server {server.port}: {_process_state(server)}")
        report.sections.append(("silent nodes", "\n".join(lines)))


def _process_state(server: Any) -> str:
    """The redis-server process's state letter (R running, S sleeping, T stopped) and CPU ticks."""
    process = getattr(server, "process", None)
    if process is None:
        return "no process"
    try:
        with open(f"/proc/{process.pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return f"pid {process.pid}, state {fields[0]}, utime {fields[11]}, stime {fields[12]}"
    except (OSError, IndexError):
        return f"pid {process.pid}, state unknown"
