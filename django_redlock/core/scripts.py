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


# The waiting line of a resource, on each node (see docs/safety.rst, "Waiting in line"):
#   queue  (zset) place -> ticket: the order, the same on every node (the waiter picks its ticket once);
#   places (zset) place -> expiry in node milliseconds: a place not refreshed in time is forgotten;
#   wake list  prefix .. place: pushed when the lock may be free and that place is first in line.
# Both scripts forget expired places before they read a line (a resource nobody waits for has none).
# Forget the places in line whose expiry (node ms) has passed; sets ``line`` to whether anyone waits.
_FORGET_EXPIRED = """
    local clock = redis.call('time')
    now = clock[1] * 1000 + math.floor(clock[2] / 1000)
    local expired = redis.call('zrangebyscore', KEYS[3], '-inf', now)
    if #expired > 0 then
        redis.call('zrem', KEYS[3], unpack(expired))
        redis.call('zrem', KEYS[2], unpack(expired))
        line = redis.call('exists', KEYS[2]) == 1
    end
"""

#: Reply of ACQUIRE when the lock is held by another value.
HELD = 0
#: Reply of ACQUIRE in "wait" mode when the waiter's place is gone (expired, or the call left).
NO_PLACE = -1
#: Reply of ACQUIRE when the lock is free but another waiter is first in line.
NOT_FIRST = -2

# KEYS[1] lock key, KEYS[2] queue, KEYS[3] places.
# ARGV[1] holder value, ARGV[2] ttl ms, ARGV[3] mode, ARGV[4] place, ARGV[5] ticket,
# ARGV[6] place lifetime ms, ARGV[7] the place's wake list.
# SET key value NX PX ttl, and only for the first in line:
#   "once": no place; refused while anyone waits (the engine's non-blocking calls send a plain SET NX PX);
#   "join": take (or refresh) a place at ARGV[5] (not needed when the lock is free and nobody waits), then vote;
#   "wait": sent right behind a BLPOP on the wake list; votes only if the place still exists.
# Replies +OK (granted: the place leaves this node's line) or HELD / NO_PLACE / NOT_FIRST.
ACQUIRE = Script(
    "acquire",
    """
local mode = ARGV[3]
local now = nil
local line = redis.call('exists', KEYS[2]) == 1
if line then
"""
    + _FORGET_EXPIRED
    + """
end
if mode == 'wait' then
    redis.call('del', ARGV[7])
    if not line or not redis.call('zscore', KEYS[3], ARGV[4]) then
        return -1
    end
end
local held = redis.call('exists', KEYS[1]) == 1
if mode ~= 'once' and (held or line) then
    if not now then
        local clock = redis.call('time')
        now = clock[1] * 1000 + math.floor(clock[2] / 1000)
    end
    local life = tonumber(ARGV[6])
    redis.call('zadd', KEYS[2], ARGV[5], ARGV[4])
    redis.call('zadd', KEYS[3], now + life, ARGV[4])
    if redis.call('pttl', KEYS[2]) < life then
        redis.call('pexpire', KEYS[2], life)
        redis.call('pexpire', KEYS[3], life)
    end
    line = true
end
if held then
    return 0
end
if line then
    if redis.call('zrange', KEYS[2], 0, 0)[1] ~= ARGV[4] then
        return -2
    end
    redis.call('zrem', KEYS[2], ARGV[4])
    redis.call('zrem', KEYS[3], ARGV[4])
end
return redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])
""",
)

# KEYS[1] lock key, KEYS[2] queue, KEYS[3] places.
# ARGV[1] holder value, ARGV[2] the caller's place ('' for none), ARGV[3] wake list prefix,
# ARGV[4] wake token lifetime ms.
# Delete the key only if it still holds our value (never another holder's lock), leave
# the line, and if the lock is now free wake whoever is first in line.
RELEASE = Script(
    "release",
    """
local released = 0
if redis.call('get', KEYS[1]) == ARGV[1] then
    released = redis.call('del', KEYS[1])
end
local line = redis.call('exists', KEYS[2]) == 1
if line and ARGV[2] ~= '' then
    redis.call('zrem', KEYS[2], ARGV[2])
    redis.call('zrem', KEYS[3], ARGV[2])
    line = redis.call('exists', KEYS[2]) == 1
end
if line and redis.call('exists', KEYS[1]) == 0 then
    local now
"""
    + _FORGET_EXPIRED
    + """
    if line then
        local wake = ARGV[3] .. redis.call('zrange', KEYS[2], 0, 0)[1]
        redis.call('rpush', wake, 1)
        redis.call('pexpire', wake, ARGV[4])
    end
end
return released
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

# KEYS: lock keys found by SCAN; ARGV[1] their head ("<prefix>lock:"), ARGV[2] the head of
# the places zsets ("<prefix>places:"): the script names each resource's line itself, as
# RELEASE names wake lists (passing every places key would double the request).
# Return value and remaining ttl (ms) of each key, flattened, then one array of
# (index, live places) pairs for the keys whose resource has anyone in line (expiry
# after the node's now), so one round trip reads a whole SCAN page. Read-only.
INSPECT = Script(
    "inspect",
    """
local clock = redis.call('time')
local after = '(' .. (clock[1] * 1000 + math.floor(clock[2] / 1000))
local cut = #ARGV[1] + 1
local out, waiting = {}, {}
for i, key in ipairs(KEYS) do
    out[2 * i - 1] = redis.call('get', key) or false
    out[2 * i] = redis.call('pttl', key)
    local live = redis.call('zcount', ARGV[2] .. string.sub(key, cut), after, '+inf')
    if live > 0 then
        waiting[#waiting + 1] = i
        waiting[#waiting + 1] = live
    end
end
out[2 * #KEYS + 1] = waiting
return out
""",
)
