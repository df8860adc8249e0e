"""Lua scripts the engine runs on each node.

Each script is atomic on its node. In a fan-out round a connection sends a
script's source (EVAL) the first time and its hash (EVALSHA) after that; a
NOSCRIPT reply (the node flushed its scripts) is answered with the source.
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


# The data set a vote counts on (see docs/safety.rst, "Data replaced behind open connections"). Each
# node keeps a marker key ("<prefix>dataset") whose token names its data set; whatever replaces the
# data set (a full sync as a replica, FLUSHALL, FLUSHDB, SWAPDB, a reload of another server's dump)
# takes the marker away or brings another one. A vote script starts with _GUARD: its last two ARGV, taken off
# before the rest of the script reads ARGV, are the marker key and the token the caller knows this
# node's data set by ('': none known yet, no check). Another token, or none, refuses the vote with
# the error "DATASET <token>" (a missing marker is created first), atomically with the vote.
# A new token: from a seed unique to the node and the moment (a probe's holder value and node name; a
# vote's holder value and the node's previous token), never the same on two nodes.
_NEW_TOKEN = "string.sub(redis.sha1hex({seed}), 1, 16)"

#: The error a vote refused by _GUARD begins with; the data set's token follows.
REPLACED = "DATASET"

# _GUARD in two halves: _GUARD_ARGS takes its two ARGV off; _GUARD_CHECK refuses (EXTEND checks only
# where it re-creates a key).
_GUARD_ARGS = """
local mark, known = ARGV[#ARGV - 1], ARGV[#ARGV]
ARGV[#ARGV] = nil
ARGV[#ARGV] = nil
"""
_GUARD_CHECK = f"""
if known ~= '' then
    local found = redis.call('get', mark)
    if found ~= known then
        if not found then
            found = {_NEW_TOKEN.format(seed="(ARGV[1] or '') .. known")}
            redis.call('set', mark, found)
        end
        return redis.error_reply('{REPLACED} ' .. found)
    end
end
"""
_GUARD = _GUARD_ARGS + _GUARD_CHECK

# KEYS[1] the marker key; ARGV[1] a seed unique to this node and probe. Reply the token of this
# node's data set, created if there is none. Sent with the restart probe of each new connection.
DATASET = Script(
    "dataset",
    f"""
local found = redis.call('get', KEYS[1])
if not found then
    found = {_NEW_TOKEN.format(seed="ARGV[1]")}
    redis.call('set', KEYS[1], found)
end
return found
""",
)

# A vote on one resource that does not wait: SET NX PX behind _GUARD.
# KEYS[1] lock key; ARGV[1] holder value, ARGV[2] ttl ms, then _GUARD's two. Replies +OK or nil.
VOTE = Script("vote", _GUARD + "return redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])\n")

# The waiting line of a resource, on each node (see docs/safety.rst, "Waiting in line"):
#   queue  (zset) place -> ticket: the order, the same on every node (the waiter picks its ticket once);
#   places (zset) place -> expiry in node milliseconds: a place not refreshed in time is forgotten;
#   wake list  prefix .. place: pushed when the lock may be free and that place is first in line.
# ACQUIRE and RELEASE take one or more resources (several: all or nothing), as KEYS in threes:
#   KEYS[i] lock key, KEYS[i + 1] queue, KEYS[i + 2] places, for i = 1, 4, 7, ...
# Both forget expired places before they read a line (a resource nobody waits for has none).
_LINE = """
local now
-- The node's clock in milliseconds, read once per script and only when a line is read.
local function clock()
    if not now then
        local t = redis.call('time')
        now = t[1] * 1000 + math.floor(t[2] / 1000)
    end
    return now
end
-- Forget the places in line whose expiry has passed; true while anyone waits.
local function waiting(queue, places)
    if redis.call('exists', queue) == 0 then
        return false
    end
    local expired = redis.call('zrangebyscore', places, '-inf', clock())
    if #expired > 0 then
        redis.call('zrem', places, unpack(expired))
        redis.call('zrem', queue, unpack(expired))
        return redis.call('exists', queue) == 1
    end
    return true
end
"""

#: Reply of ACQUIRE when a lock is held by another value.
HELD = 0
#: Reply of ACQUIRE in "wait" mode when the waiter's place is gone (expired, or the call left).
NO_PLACE = -1
#: Reply of ACQUIRE when the locks are free but another waiter is first in a line.
NOT_FIRST = -2

# KEYS in threes (see above).
# ARGV[1] holder value, ARGV[2] ttl ms, ARGV[3] mode, ARGV[4] place, ARGV[5] ticket,
# ARGV[6] place lifetime ms, ARGV[7], ARGV[8], ... the place's wake list of each resource,
# then _GUARD's two (taken off first).
# SET every lock key to the value with PX ttl, only if none is set and the caller is first
# in every line it is in:
#   "once": no place; refused while anyone waits (the engine's non-blocking calls on one
#            resource send VOTE instead);
#   "join": take (or refresh) a place at ARGV[5] in every line (not needed when all are free
#           and nobody waits), then vote;
#   "wait": sent right behind a BLPOP on the wake lists; votes only if the place is still in every line.
# Replies +OK (granted: the place leaves this node's lines) or HELD / NO_PLACE / NOT_FIRST.
ACQUIRE = Script(
    "acquire",
    _GUARD
    + _LINE
    + """
local mode, place = ARGV[3], ARGV[4]
local lines, line, held = {}, false, false
for i = 1, #KEYS, 3 do
    lines[i] = waiting(KEYS[i + 1], KEYS[i + 2])
    line = line or lines[i]
    held = held or redis.call('exists', KEYS[i]) == 1
end
if mode == 'wait' then
    for j = 7, #ARGV do
        redis.call('del', ARGV[j])
    end
    for i = 1, #KEYS, 3 do
        if not lines[i] or not redis.call('zscore', KEYS[i + 2], place) then
            return -1
        end
    end
end
if mode ~= 'once' and (held or line) then
    local life = tonumber(ARGV[6])
    local expiry = clock() + life
    for i = 1, #KEYS, 3 do
        redis.call('zadd', KEYS[i + 1], ARGV[5], place)
        redis.call('zadd', KEYS[i + 2], expiry, place)
        if redis.call('pttl', KEYS[i + 1]) < life then
            redis.call('pexpire', KEYS[i + 1], life)
            redis.call('pexpire', KEYS[i + 2], life)
        end
        lines[i] = true
    end
    line = true
end
if held then
    return 0
end
if line then
    for i = 1, #KEYS, 3 do
        if lines[i] and redis.call('zrange', KEYS[i + 1], 0, 0)[1] ~= place then
            return -2
        end
    end
    for i = 1, #KEYS, 3 do
        if lines[i] then
            redis.call('zrem', KEYS[i + 1], place)
            redis.call('zrem', KEYS[i + 2], place)
        end
    end
end
local reply
for i = 1, #KEYS, 3 do
    reply = redis.call('set', KEYS[i], ARGV[1], 'PX', ARGV[2])
end
return reply
""",
)

# KEYS in threes (see above).
# ARGV[1] holder value, ARGV[2] the caller's place ('' for none), ARGV[3] lifetime ms of a wake
# token and of a kept place, ARGV[4] '' to leave the lines, or the caller's ticket to stay in them
# (a failed attempt of a call that goes on waiting: a node that granted it had taken its place out),
# ARGV[5], ARGV[6], ... the wake list prefix of each resource.
# Delete each lock key that still holds our value (never another holder's lock), leave or keep the
# place, and wake whoever is first in line of each lock that is now free.
# Replies 1 when every key held our value (all deleted), else 0.
RELEASE = Script(
    "release",
    _LINE
    + """
local released = 1
for i = 1, #KEYS, 3 do
    if redis.call('get', KEYS[i]) == ARGV[1] then
        redis.call('del', KEYS[i])
    else
        released = 0
    end
    local line = redis.call('exists', KEYS[i + 1]) == 1
    if ARGV[2] ~= '' and ARGV[4] ~= '' then
        local life = tonumber(ARGV[3])
        redis.call('zadd', KEYS[i + 1], ARGV[4], ARGV[2])
        redis.call('zadd', KEYS[i + 2], clock() + life, ARGV[2])
        if redis.call('pttl', KEYS[i + 1]) < life then
            redis.call('pexpire', KEYS[i + 1], life)
            redis.call('pexpire', KEYS[i + 2], life)
        end
        line = true
    elseif line and ARGV[2] ~= '' then
        redis.call('zrem', KEYS[i + 1], ARGV[2])
        redis.call('zrem', KEYS[i + 2], ARGV[2])
    end
    if line and redis.call('exists', KEYS[i]) == 0 and waiting(KEYS[i + 1], KEYS[i + 2]) then
        local wake = ARGV[5 + (i - 1) / 3] .. redis.call('zrange', KEYS[i + 1], 0, 0)[1]
        redis.call('rpush', wake, 1)
        redis.call('pexpire', wake, ARGV[3])
    end
end
return released
""",
)

#: Reply of EXTEND when it re-created a key this node had lost (and extended the others).
RECREATED = 2

# KEYS the lock keys (one per resource); ARGV[1] holder value, ARGV[2] new ttl in milliseconds,
# ARGV[3] '1' to re-create a key this node lost ('' not to), then _GUARD's two.
# Only if every key still holds our value, make each live at least ARGV[2] more ms: never
# shorter than it already does (another handle on the same value may count on that); reply 1.
# Keys that are missing (the node restarted, or they expired) are re-created with SET NX (our
# value, the new ttl) only when ARGV[3] is '1' (the node may vote: see NodeBooks.recreating) and
# the data set is the one the caller knows (_GUARD_CHECK, as for a vote); reply RECREATED. A key
# another value holds, or a missing one not re-created: nothing changes, reply 0.
EXTEND = Script(
    "extend",
    _GUARD_ARGS
    + """
local missing = false
for i = 1, #KEYS do
    local found = redis.call('get', KEYS[i])
    if not found then
        missing = true
    elseif found ~= ARGV[1] then
        return 0
    end
end
if missing then
    if ARGV[3] ~= '1' then
        return 0
    end
"""
    + _GUARD_CHECK
    + f"""
    for i = 1, #KEYS do
        redis.call('set', KEYS[i], ARGV[1], 'NX', 'PX', ARGV[2])
    end
end
local ttl = tonumber(ARGV[2])
for i = 1, #KEYS do
    if redis.call('pttl', KEYS[i]) < ttl then
        redis.call('pexpire', KEYS[i], ttl)
    end
end
if missing then
    return {RECREATED}
end
return 1
""",
)

# KEYS the fencing counter keys (one per resource); ARGV _GUARD's two. Each counter (nil: none),
# from the data set the caller knows (a replaced one may have lost the highest).
FENCE_READ = Script("fence_read", _GUARD + "return redis.call('mget', unpack(KEYS))\n")

# KEYS the fencing counter keys (one per resource); ARGV[1] the token chosen by the holder, then
# _GUARD's two. Raise each counter to ARGV[1] unless it is already higher; reply the lowest counter.
FENCE_RAISE = Script(
    "fence_raise",
    _GUARD
    + """
local wanted = tonumber(ARGV[1])
local lowest
for i = 1, #KEYS do
    local current = tonumber(redis.call('get', KEYS[i]) or '0')
    if wanted > current then
        redis.call('set', KEYS[i], ARGV[1])
        current = wanted
    end
    if not lowest or current < lowest then
        lowest = current
    end
end
return lowest
""",
)

# The node's now, and how many places in a line are live (expiry, in node ms, after now): what
# INSPECT and LIST report as calls waiting (ACQUIRE and RELEASE forget the other places).
_LIVE = """
local clock = redis.call('time')
local after = '(' .. (clock[1] * 1000 + math.floor(clock[2] / 1000))
local function live(places)
    return redis.call('zcount', places, after, '+inf')
end
"""

# KEYS: lock keys; ARGV[1] their head ("<prefix>lock:"), ARGV[2] the head of the places
# zsets ("<prefix>places:"): the script names each resource's line itself, as RELEASE names
# wake lists (passing every places key would double the request).
# Return value and remaining ttl (ms) of each key, flattened, then one array of
# (index, live places) pairs for the keys whose resource has anyone in line. Read-only.
INSPECT = Script(
    "inspect",
    _LIVE
    + """
local cut = #ARGV[1] + 1
local out, waiting = {}, {}
for i, key in ipairs(KEYS) do
    out[2 * i - 1] = redis.call('get', key) or false
    out[2 * i] = redis.call('pttl', key)
    local count = live(ARGV[2] .. string.sub(key, cut))
    if count > 0 then
        waiting[#waiting + 1] = i
        waiting[#waiting + 1] = count
    end
end
out[2 * #KEYS + 1] = waiting
return out
""",
)

# ARGV[1] SCAN cursor, ARGV[2] MATCH pattern, ARGV[3] COUNT, ARGV[4] what to read of each key found:
#   'n' its name; 'v' its name and value ('' when not a string); 't' its name and ttl ms;
#   'vt' name, value and ttl; 'w' (a walk of the places zsets): the lock key of each line
#   with live places, and how many;
# ARGV[5] the head of the lock keys, ARGV[6] the head of the places zsets, ARGV[7] '1' for a
# binary-safe reply (see below).
# SCAN on until the cursor is back at 0, at least ARGV[3] keys are found, or ten pages are walked
# (a search matching little needs few round trips; the node is never held long). Values come from
# one MGET a page, not a call a key. Reply {cursor, how many keys, names, values (or live places),
# ttls}, each column one NUL-separated string: one string splits far faster than an array is
# parsed. A NUL inside a name or value shows as more parts than keys; the caller then asks for
# the same page with ARGV[7] '1', and the columns come as arrays. Read-only.
LIST = Script(
    "list",
    _LIVE
    + """
local call = redis.call
local cursor, wanted, fields = ARGV[1], tonumber(ARGV[3]), ARGV[4]
local cut = #ARGV[6] + 1
local names, values, ttls, n, found = {}, {}, {}, 0, 0
for _ = 1, 10 do
    local page = call('scan', cursor, 'match', ARGV[2], 'count', wanted)
    cursor = page[1]
    local keys = page[2]
    if fields == 'w' then
        for _, places in ipairs(keys) do
            local count = live(places)
            if count > 0 then
                n = n + 1
                names[n] = ARGV[5] .. string.sub(places, cut)
                values[n] = count
            end
        end
    elseif fields == 'n' or fields == 't' then
        for _, key in ipairs(keys) do
            n = n + 1
            names[n] = key
            if fields == 't' then
                ttls[n] = call('pttl', key)
            end
        end
    elseif #keys > 0 then
        local read = call('mget', unpack(keys))  -- a page of COUNT 1000 keys: far below unpack's limit
        for i, key in ipairs(keys) do
            n = n + 1
            names[n] = key
            values[n] = read[i] or ''
            if fields == 'vt' then
                ttls[n] = call('pttl', key)
            end
        end
    end
    found = found + #keys
    if cursor == '0' or found >= wanted then
        break
    end
end
if ARGV[7] == '1' then
    return {cursor, n, names, values, ttls}
end
return {cursor, n, table.concat(names, '\\0'), table.concat(values, '\\0'), table.concat(ttls, '\\0')}
""",
)


#: The scripts whose last two ARGV are _GUARD's: each node's books fill in its data-set token.
GUARDED = frozenset((VOTE, ACQUIRE, FENCE_READ, FENCE_RAISE, EXTEND))
