"""A simulated Redis master: the commands and scripts the engine uses, nothing more.

Commands arrive as tuples exactly as the engine builds them (``str``, ``bytes``
or ``int`` arguments); keys and values are stored as bytes. Replies have the
shapes the engine's RESP2 parser produces: ``bytes`` for simple and bulk
strings, ``int``, ``None`` for nil, ``list`` for arrays, and error replies as
exception *instances* (``ResponseError``, ``NoScriptError``) that are returned,
not raised.

Expiry is lazy and measured on the node's own drifting clock. Faults:
:meth:`SimNode.crash` (connections reset; data lost unless ``fsync_always``),
:meth:`SimNode.start` (new run id, uptime from 0, empty script cache),
:meth:`SimNode.pause` / :meth:`SimNode.resume` (SIGSTOP: input waits in the
buffers and is processed in arrival order on resume).
"""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING, Any, Callable, Sequence

from redis.exceptions import NoScriptError, ResponseError

from django_redlock.core.scripts import EXTEND, FENCE_RAISE, INSPECT, RELEASE

from .clock import Clock

if TYPE_CHECKING:
    from .world import World

__all__ = ["SimNode", "parse_commands", "glob_to_regex"]

NOSCRIPT = "NOSCRIPT No matching script. Please use EVAL."
NOPERM_INFO = "NOPERM User lock has no permissions to run the 'info' command"
NOPERM_CONFIG = "NOPERM User lock has no permissions to run the 'config|get' command"


def _b(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value).encode()
    if isinstance(value, float):
        return repr(value).encode()
    raise TypeError(f"cannot send {type(value).__name__} to Redis")


def _s(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _int(value: Any) -> int:
    try:
        return int(_s(value))
    except ValueError:
        raise _Error("ERR value is not an integer or out of range") from None


class _Error(Exception):
    """Raised inside a command; turned into a returned ``ResponseError``."""


def glob_to_regex(pattern: bytes) -> re.Pattern[bytes]:
    """Redis glob (``*``, ``?``, ``[...]``, ``\\`` escapes) as a compiled regex."""
    out = []
    i = 0
    n = len(pattern)
    while i < n:
        c = pattern[i : i + 1]
        if c == b"\\" and i + 1 < n:
            out.append(re.escape(pattern[i + 1 : i + 2]))
            i += 2
            continue
        if c == b"*":
            out.append(b".*")
        elif c == b"?":
            out.append(b".")
        elif c == b"[":
            j = pattern.find(b"]", i + 1)
            if j < 0:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1 : j]
                if body.startswith(b"^"):
                    body = b"^" + body[1:].replace(b"\\", b"\\\\")
                else:
                    body = body.replace(b"\\", b"\\\\")
                out.append(b"[" + body + b"]")
                i = j + 1
                continue
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile(b"".join(out) + b"\\Z", re.DOTALL)


def parse_commands(data: bytes) -> list[tuple[bytes, ...]]:
    """Split packed RESP2 requests (what the engine writes to a socket) into tuples.

    For a driver that holds the engine's encoded bytes rather than tuples.
    """
    out: list[tuple[bytes, ...]] = []
    pos = 0
    while pos < len(data):
        end = data.index(b"\r\n", pos)
        if data[pos : pos + 1] != b"*":
            raise ValueError("not a RESP2 request")
        count = int(data[pos + 1 : end])
        pos = end + 2
        args = []
        for _ in range(count):
            end = data.index(b"\r\n", pos)
            size = int(data[pos + 1 : end])
            start = end + 2
            args.append(bytes(data[start : start + size]))
            pos = start + size + 2
        out.append(tuple(args))
    return out


class SimNode:
    """One independent Redis master."""

    def __init__(
        self,
        world: World,
        name: str,
        clock: Clock | None = None,
        fsync_always: bool = False,
        deny_info: bool = False,
        deny_config: bool = False,
        flaky_info: float = 0.0,
    ) -> None:
        self.world = world
        #: Chance that INFO fails with a passing error (an overloaded node, a proxy hiccup).
        self.flaky_info = flaky_info
        self.name = name
        self.proc = world.process(name, clock)
        self.clock = self.proc.clock
        self.fsync_always = fsync_always
        self.deny_info = deny_info
        self.deny_config = deny_config
        #: key -> [value, expiry on the node's clock or None]
        self.data: dict[bytes, list[Any]] = {}
        #: While down after a crash that lost data: what it lost (the checker's view).
        self.lost: dict[bytes, list[Any]] = {}
        self.scripts: set[str] = set()
        self.up = False
        self.run_id = ""
        self.started_local = 0.0
        self.restarts = 0
        #: Called with no argument when the node crashes (the network resets connections)
        #: and when it resumes from a pause (the network delivers what waited).
        self.crash_listeners: list[Callable[[], None]] = []
        self.resume_listeners: list[Callable[[], None]] = []
        self.commands_run = 0
        self.start()

    # -- faults ------------------------------------------------------------------

    def crash(self) -> None:
        """Power loss: connections reset; keys survive only with fsync-always."""
        if not self.up:
            return
        self.up = False
        self.world.note(self.name, "CRASH", "(data kept: fsync always)" if self.fsync_always else "(data lost)")
        if not self.fsync_always:
            self.lost = self.data
            self.data = {}
        self.scripts.clear()
        if self.proc.frozen:  # a paused node that dies: its buffered input dies with it
            self.proc.frozen = False
            self.proc.deferred.clear()
            self.world.fault_end(f"frozen:{self.name}")
        self.world.fault_begin(f"down:{self.name}")
        for listener in list(self.crash_listeners):
            listener()

    def start(self) -> None:
        """Boot: new run id, uptime from zero, empty script cache."""
        if self.up:
            return
        self.up = True
        self.restarts += 1 if self.run_id else 0
        self.run_id = self.world.token(20)
        self.started_local = self.clock.now()
        self.world.note(self.name, "START", f"run_id={self.run_id[:8]}", f"keys={len(self.data)}")
        self.world.fault_end(f"down:{self.name}")

    def restart(self, down_for: float) -> None:
        """Crash now and start again ``down_for`` true seconds later."""
        self.crash()
        self.world.after(down_for, self.start)

    def pause(self) -> None:
        """SIGSTOP: input is accepted and buffered, nothing is answered."""
        if self.up:
            self.world.freeze(self.proc)

    def resume(self) -> None:
        """SIGCONT: buffered commands are processed in arrival order."""
        if self.proc.frozen:
            self.world.thaw(self.proc)
            for listener in list(self.resume_listeners):
                listener()

    @property
    def paused(self) -> bool:
        return self.proc.frozen

    # -- state, for the checker and tests ----------------------------------------

    def _live(self, key: bytes) -> list[Any] | None:
        entry = self.data.get(key)
        if entry is not None and entry[1] is not None and self.clock.now() >= entry[1]:
            del self.data[key]
            return None
        return entry

    def peek(self, key: Any) -> tuple[bytes, float | None] | None:
        """``(value, true seconds left or None)`` of a live key, without side effects on time."""
        entry = self._live(_b(key))
        if entry is None:
            return None
        if entry[1] is None:
            return entry[0], None
        return entry[0], self.clock.true_duration(entry[1] - self.clock.now())

    def peek_lost(self, key: Any, window: float = 0.0) -> tuple[bytes, float | None] | None:
        """Like :meth:`peek`, for a key this node lost in a crash: while it is down, or up for
        less than ``window`` seconds of its own clock (a restarted node sits out that long)."""
        entry = self.lost.get(_b(key))
        if entry is None or (self.up and self.clock.now() - self.started_local >= window):
            return None
        if entry[1] is None:
            return entry[0], None
        left = entry[1] - self.clock.now()
        return (entry[0], self.clock.true_duration(left)) if left > 0 else None

    def holders(self) -> dict[bytes, bytes]:
        """Every live key and its value."""
        return {k: e[0] for k in list(self.data) if (e := self._live(k)) is not None}

    def holds_value(self, value: Any) -> bool:
        v = _b(value)
        return any(val == v for val in self.holders().values())

    # -- commands ----------------------------------------------------------------

    def execute(self, command: Sequence[Any]) -> Any:
        """Run one command now; return its reply (errors as exception instances)."""
        self.commands_run += 1
        try:
            name = _s(command[0]).upper()
            handler = _COMMANDS.get(name)
            if handler is None:
                raise _Error(f"ERR unknown command '{_s(command[0])}'")
            return handler(self, command[1:])
        except _Error as exc:
            text = str(exc)
            return NoScriptError(text) if text.startswith("NOSCRIPT") else ResponseError(text)
        except (IndexError, ValueError, TypeError) as exc:
            return ResponseError(f"ERR syntax error ({exc})")

    def _set(self, args: Sequence[Any]) -> Any:
        key, value = _b(args[0]), _b(args[1])
        nx = xx = False
        ttl_ms: int | None = None
        i = 2
        while i < len(args):
            opt = _s(args[i]).upper()
            if opt == "NX":
                nx = True
            elif opt == "XX":
                xx = True
            elif opt in ("PX", "EX"):
                amount = _int(args[i + 1])
                if amount <= 0:
                    raise _Error("ERR invalid expire time in 'set' command")
                ttl_ms = amount if opt == "PX" else amount * 1000
                i += 1
            else:
                raise _Error("ERR syntax error")
            i += 1
        exists = self._live(key) is not None
        if (nx and exists) or (xx and not exists):
            return None
        expiry = None if ttl_ms is None else self.clock.now() + ttl_ms / 1000.0
        self.data[key] = [value, expiry]
        return b"OK"

    def _get(self, args: Sequence[Any]) -> Any:
        entry = self._live(_b(args[0]))
        return None if entry is None else entry[0]

    def _pttl(self, args: Sequence[Any]) -> int:
        entry = self._live(_b(args[0]))
        if entry is None:
            return -2
        if entry[1] is None:
            return -1
        return max(0, int((entry[1] - self.clock.now()) * 1000))

    def _pexpire(self, args: Sequence[Any]) -> int:
        key = _b(args[0])
        ms = _int(args[1])
        entry = self._live(key)
        if entry is None:
            return 0
        if ms <= 0:
            del self.data[key]
        else:
            entry[1] = self.clock.now() + ms / 1000.0
        return 1

    def _del(self, args: Sequence[Any]) -> int:
        n = 0
        for key in args:
            k = _b(key)
            if self._live(k) is not None:
                del self.data[k]
                n += 1
        return n

    def _exists(self, args: Sequence[Any]) -> int:
        return sum(1 for key in args if self._live(_b(key)) is not None)

    def _ping(self, args: Sequence[Any]) -> bytes:
        return _b(args[0]) if args else b"PONG"

    def _info(self, args: Sequence[Any]) -> bytes:
        if self.deny_info:
            raise _Error(NOPERM_INFO)
        if self.flaky_info and self.world.chance(self.flaky_info, "flaky info"):
            raise _Error("ERR INFO failed for a passing reason")
        uptime = int(self.clock.now() - self.started_local)
        return (
            b"# Server\r\nredis_version:7.0.0\r\nredis_mode:standalone\r\n"
            b"run_id:%s\r\nuptime_in_seconds:%d\r\n" % (self.run_id.encode(), uptime)
        )

    def _config(self, args: Sequence[Any]) -> list[bytes]:
        if _s(args[0]).upper() != "GET":
            raise _Error("ERR CONFIG subcommand not supported by the simulator")
        if self.deny_config:
            raise _Error(NOPERM_CONFIG)
        name = _s(args[1]).lower()
        values = {
            "appendonly": b"yes" if self.fsync_always else b"no",
            "appendfsync": b"always" if self.fsync_always else b"everysec",
        }
        if name not in values:
            return []
        return [name.encode(), values[name]]

    def _scan(self, args: Sequence[Any]) -> list[Any]:
        pattern = b"*"
        i = 1
        while i < len(args):
            opt = _s(args[i]).upper()
            if opt == "MATCH":
                pattern = _b(args[i + 1])
            elif opt != "COUNT":
                raise _Error("ERR syntax error")
            i += 2
        rx = glob_to_regex(pattern)
        keys = sorted(k for k in self.holders() if rx.match(k))
        return [b"0", keys]

    def _eval(self, args: Sequence[Any]) -> Any:
        source = _s(args[0])
        sha = hashlib.sha1(source.encode()).hexdigest()
        if sha not in _SCRIPTS:
            raise _Error("ERR the simulator does not implement this script")
        self.scripts.add(sha)
        return self._run(sha, args[1:])

    def _evalsha(self, args: Sequence[Any]) -> Any:
        sha = _s(args[0]).lower()
        if sha not in self.scripts:
            raise _Error(NOSCRIPT)
        return self._run(sha, args[1:])

    def _run(self, sha: str, rest: Sequence[Any]) -> Any:
        numkeys = _int(rest[0])
        keys = [_b(k) for k in rest[1 : 1 + numkeys]]
        argv = [_b(a) for a in rest[1 + numkeys :]]
        return _SCRIPTS[sha](self, keys, argv)

    # the four engine scripts, as their Lua does it

    def _release(self, keys: list[bytes], argv: list[bytes]) -> int:
        entry = self._live(keys[0])
        if entry is not None and entry[0] == argv[0]:
            del self.data[keys[0]]
            return 1
        return 0

    def _extend(self, keys: list[bytes], argv: list[bytes]) -> int:
        entry = self._live(keys[0])
        if entry is not None and entry[0] == argv[0]:
            return self._pexpire([keys[0], argv[1]])
        return 0

    def _fence_raise(self, keys: list[bytes], argv: list[bytes]) -> int:
        entry = self._live(keys[0])
        current = _lua_number(entry[0]) if entry is not None else 0
        wanted = _lua_number(argv[0])
        if wanted > current:
            self.data[keys[0]] = [argv[0], None]  # plain SET: no ttl
            return int(wanted)
        return int(current)

    def _inspect(self, keys: list[bytes], argv: list[bytes]) -> list[Any]:
        out: list[Any] = []
        for key in keys:
            out.append(self._get([key]))
            out.append(self._pttl([key]))
        out.append([])  # the simulator keeps no waiting lines: nobody waits
        return out

    def __repr__(self) -> str:
        state = "up" if self.up else "down"
        if self.paused:
            state = "paused"
        return f"<SimNode {self.name} {state} keys={len(self.data)}>"


def _lua_number(value: bytes) -> float:
    try:
        return float(value)
    except ValueError:
        raise _Error("ERR Error running script: attempt to compare nil with number") from None


_COMMANDS: dict[str, Callable[[SimNode, Sequence[Any]], Any]] = {
    "SET": SimNode._set,
    "GET": SimNode._get,
    "PTTL": SimNode._pttl,
    "PEXPIRE": SimNode._pexpire,
    "DEL": SimNode._del,
    "EXISTS": SimNode._exists,
    "PING": SimNode._ping,
    "INFO": SimNode._info,
    "CONFIG": SimNode._config,
    "SCAN": SimNode._scan,
    "EVAL": SimNode._eval,
    "EVALSHA": SimNode._evalsha,
}

_SCRIPTS: dict[str, Callable[[SimNode, list[bytes], list[bytes]], Any]] = {
    RELEASE.sha: SimNode._release,
    EXTEND.sha: SimNode._extend,
    FENCE_RAISE.sha: SimNode._fence_raise,
    INSPECT.sha: SimNode._inspect,
}
