"""Lua scripts the engine runs on each node.

Each script is atomic on its node. Scripts are sent with EVALSHA and fall back
to EVAL once per connection when the node does not know them yet (NOSCRIPT).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Script:
    name: str
    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())


def script_command(script: Script, keys: Sequence[str], args: Sequence[Any]) -> tuple[Any, ...]:
    """``EVALSHA`` of ``script``; a node that answers NOSCRIPT gets the source (see the books)."""
    return ("EVALSHA", script.sha, len(keys), *keys, *args)


# KEYS[1] lock key; ARGV[1] holder value.
# Delete the key only if it still holds our value: never another holder's lock.
RELEASE = Script(
    "release",
    """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('del', KEYS[1])
end
return 0
""",
)

# KEYS[1] lock key; ARGV[1] holder value; ARGV[2] new ttl in milliseconds.
# Reset the ttl only if the key still holds our value; an expired key is not recreated.
EXTEND = Script(
    "extend",
    """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
""",
)

# KEYS[1] fencing counter key; ARGV[1] the token chosen by the holder.
# Raise the counter to ARGV[1] unless it is already higher; return the counter.
FENCE_RAISE = Script(
    "fence_raise",
    """
local current = tonumber(redis.call('get', KEYS[1]) or '0')
local wanted = tonumber(ARGV[1])
if wanted > current then
    redis.call('set', KEYS[1], ARGV[1])
    return wanted
end
return current
""",
)

# KEYS: lock keys found by SCAN. Return value and remaining ttl (ms) of each,
# flattened, so one round trip reads a whole SCAN page.
INSPECT = Script(
    "inspect",
    """
local out = {}
for i, key in ipairs(KEYS) do
    out[2 * i - 1] = redis.call('get', key) or false
    out[2 * i] = redis.call('pttl', key)
end
return out
""",
)
