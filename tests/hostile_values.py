"""Values anyone who can write under the key prefix may leave on the nodes, written there straight."""

from __future__ import annotations

import redis

#: resource -> the value stored in its lock key: damaged dates, types and text, and text made to fool
#: an operator's terminal (a forged row, ESC/OSC sequences).
HOSTILE: dict[str, bytes] = {
    "date-1e20": b'{"t":"a1","h":"web-1","p":11,"a":1e20}',
    "date-nan": b'{"t":"a2","h":"web-1","p":12,"a":NaN}',
    "date-minus-1e20": b'{"t":"a3","h":"web-1","p":13,"a":-1e20}',
    "date-infinity": b'{"t":"a4","h":"web-1","p":14,"a":Infinity}',
    "date-huge-int": b'{"t":"a5","h":"web-1","p":15,"a":1' + b"0" * 400 + b"}",
    "types": b'{"t":"a6","h":7,"p":true,"a":true,"l":["x"],"n":99999}',
    "surrogates": b'{"t":"a7\\ud800","h":"\\udfff","p":17,"l":"by \\ud800"}',
    "nested": b"[" * 5000,
    "not-utf-8": b"\xff\xfe\x00\x1b[2J",
    "forged-row": (
        b'{"t":"a8","h":"web-1","p":18,'
        b'"l":"x\\nrefund-77                held by a quorum  3/3     9.0s        0  web-9:1\\u001b]0;pwned\\u0007\\u001b[2J"}'
    ),
    "esc\x1b[31mred\x1b[0m\nrefund-78": b'{"t":"a9","h":"web-\\u009b1\\u202e","p":19}',
}


def write_hostile(servers, ttl_ms: int = 60_000, prefix: str = "redlock:") -> None:
    """Every :data:`HOSTILE` value on every node, as a lock key held by a quorum."""
    for server in servers:
        with redis.Redis.from_url(server.url) as client:
            for resource, value in HOSTILE.items():
                client.set(f"{prefix}lock:{resource}".encode("utf-8"), value, px=ttl_ms)
