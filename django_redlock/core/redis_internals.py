"""The private parts of redis-py the engine uses, and the one check that the installed redis-py has them.

redis-py makes each connection (TCP or TLS, AUTH, SELECT); then the engine reads and writes the
connected socket itself. That needs a few attributes redis-py does not promise to keep:
``pyproject.toml`` bounds ``redis`` to the versions the suite runs on (:data:`OLDEST` to
:data:`NEWEST`), and :func:`check` fails at import, naming the version and what is missing,
rather than letting a lock fail later with an ``AttributeError``.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio as aredis

__all__ = ["NEWEST", "OLDEST", "REQUIRED", "UnsupportedRedisPy", "check", "missing"]

#: The oldest redis-py the suite runs on (``make test-matrix``), and the newest minor version.
OLDEST = "6.4.0"
NEWEST = "8.1"

#: (class, attribute, what the engine does with it), looked up on an unconnected instance: the
#: constructor sets ``_sock``, ``_reader`` and ``_writer``.
REQUIRED: tuple[tuple[str, str, str], ...] = (
    ("redis.Connection", "_sock", "the sync engine reads and writes the connected socket itself"),
    ("redis.Connection", "_connect", "a TLS node opens its TCP connection with it, then wraps it in the node's one context"),
    ("redis.asyncio.Connection", "_reader", "the asyncio engine checks that nothing follows the handshake"),
    ("redis.asyncio.Connection", "_writer", "the asyncio engine takes over the connection's transport"),
    ("redis.asyncio.Connection", "_connection_arguments", "a TLS node passes the node's one context to asyncio"),
)

_CLASSES: dict[str, Any] = {"redis.Connection": redis.Connection, "redis.asyncio.Connection": aredis.Connection}


_ABSENT = object()


class UnsupportedRedisPy(ImportError):
    """The installed redis-py lacks an attribute the engine uses."""


def missing() -> list[tuple[str, str, str]]:
    """The entries of :data:`REQUIRED` the installed redis-py does not have (or has only as an abstract method)."""
    instances = {name: cls() for name, cls in _CLASSES.items()}  # no I/O: a connection connects on first use
    gaps = []
    for name, attribute, use in REQUIRED:
        value = getattr(instances[name], attribute, _ABSENT)
        if value is _ABSENT or getattr(value, "__isabstractmethod__", False):
            gaps.append((name, attribute, use))
    return gaps


def check() -> None:
    """Raise :class:`UnsupportedRedisPy` naming redis-py's version and each attribute it lacks."""
    gaps = missing()
    if gaps:
        lacks = "; ".join(f"{name} has no {attribute!r} ({use})" for name, attribute, use in gaps)
        raise UnsupportedRedisPy(
            f"django-redlock cannot use redis-py {getattr(redis, '__version__', '(unknown version)')}: {lacks}. "
            f"It is tested with redis-py {OLDEST} to {NEWEST}.x: pip install 'redis>={OLDEST},<{_next_minor(NEWEST)}'."
        )


def _next_minor(version: str) -> str:
    major, minor = version.split(".")[:2]
    return f"{major}.{int(minor) + 1}"
