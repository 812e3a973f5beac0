"""Apply one window of a ledger partition to Redis exactly once: sums, dedup memory and
watermark together, in one script call.

Kafka transactions end at Kafka's edge, so exactly-once into Redis comes from here. The script
checks that the partition's stored watermark is the one the worker expects; only then does it
check the window's event digests against the dedup memory, and if none was counted before, it
adds the sums, remembers the digests and moves the watermark, all in one atomic step. Every key
it touches shares the partition's hash tag, so on a Redis Cluster it runs on one shard.

Sums are decimal strings of any size: a running total past what 64-bit integers or Lua's
doubles hold is added digit by digit, so no amount is ever refused for its size.

The dedup memory of a partition is one table per hour of event time: integer sets (Redis keeps
a set of up to 512 integers as a sorted array, 8 bytes a member) that split one at a time as
the table grows (linear hashing), so each set stays small enough to stay compact whatever the
rate. A table's keys are ``S:dd:H`` (its size: level ``l``, next set to split ``s``, events
``n``) and ``S:dd:H:i`` (its sets); they live ``COSTLINE_DEDUP_HORIZON_S`` after their last
write.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgpack
from redis.asyncio import Redis

from costline.connectors.redis_keys import (
    USAGE,
    Calendar,
    FirstsLogSize,
    Retention,
    bucket_key,
    slots_key,
    wm_key,
)
from costline.rules.tally import Tally

HISTORY_S = 86400
FAULTS_KEPT_S = 7 * 86400
# Average members per dedup set before the table splits one more: sets not split yet in a
# round hold up to twice that, which stays well under the 512 a compact set may hold.
DEDUP_LOAD = 180
# Integers Lua's doubles hold exactly; a larger amount travels as a decimal string.
_LUA_EXACT = 2**53
# Tag sets known to be in Redis, across all the partition slots a writer serves (~135 bytes
# each, ~16 MiB in all): the budget is split evenly between the slots, and a slot over its
# share is cleared.
KNOWN_TAGSETS_MAX = 120_000

# One argument, a msgpack array (decoded by Redis's own cmsgpack):
#   1 expected watermark   2 new watermark (both decimal strings)   3 slot tag
#   4 dedup ttl   5 dedup load (DEDUP_LOAD)
#   6 dedup:   hour, {digest, ...}, ...            (digests as decimal strings)
#   7 buckets: key, ttl, {field, gross, quantity, credits, ...}, {field, waste, ...}, ...
#   8 tagsets: id, canonical json, first slot, ...
#   9 first-bucket log: {entries it keeps, tag sets they may name} (``FirstsLogSize``)
#  10 latest:  resource\tmetric, ts, json, ...
#  11 history: resource\tmetric, trim below, {score, member, ...}, ...
#  12 faults:  trim below, {score, member, ...}   (or empty)
# Amounts are integers, or decimal strings from 2^53 on.
# Replies: {2} applied; {0, stored watermark}; {1, positions of digests counted before}.
_SCRIPT = """
local a = cmsgpack.unpack(ARGV[1])
local S = a[3]
local cur = redis.call('GET', KEYS[1]) or '-1'
if cur ~= a[1] then return {0, cur} end
local TTL, LOAD = a[4], a[5]
-- 2,000 arguments a call (an even number: field-value pairs are never split); Lua's unpack
-- takes fewer than 8,000.
local function chunked(cmd, key, list, from, to)
  local out = {}
  local first = from
  while first <= to do
    local last = math.min(first + 1999, to)
    local r = redis.call(cmd, key, unpack(list, first, last))
    if type(r) == 'table' then
      for j = 1, #r do out[#out + 1] = r[j] end
    end
    first = last + 1
  end
  return out
end

-- Dedup tables. A digest's selector is its top bits; set i of a table at level L with s sets
-- split this round holds the digests whose selector is i mod 2^L (mod 2^(L+1) for i < s).
local function selector(d) return math.floor(tonumber(d) / 2147483648) end
local function set_of(t, u)
  local i = u % 2 ^ t.L
  if i < t.s then i = u % 2 ^ (t.L + 1) end
  return i
end
local function split(t)
  local from = t.key .. ':' .. t.s
  local members = redis.call('SMEMBERS', from)
  local moving = {}
  for i = 1, #members do
    if selector(members[i]) % 2 ^ (t.L + 1) ~= t.s then moving[#moving + 1] = members[i] end
  end
  if #moving > 0 then
    local to = t.key .. ':' .. (t.s + 2 ^ t.L)
    chunked('SREM', from, moving, 1, #moving)
    chunked('SADD', to, moving, 1, #moving)
    redis.call('EXPIRE', to, TTL)
  end
  t.s = t.s + 1
  if t.s == 2 ^ t.L then
    t.L = t.L + 1
    t.s = 0
  end
  t.changed = true
end
-- A table ready for ``incoming`` more digests: split ahead, so no set outgrows a compact one.
local function table_of(key, incoming)
  local m = redis.call('HMGET', key, 'l', 's', 'n')
  local t = {key = key, L = tonumber(m[1]) or 0, s = tonumber(m[2]) or 0,
             n = tonumber(m[3]) or 0, changed = false}
  while t.n + incoming > LOAD * (2 ^ t.L + t.s) do split(t) end
  return t
end
local function save(t)
  redis.call('HSET', t.key, 'l', t.L, 's', t.s, 'n', t.n)
  redis.call('EXPIRE', t.key, TTL)
end

local dd = a[6]
local tables, dups, pos = {}, {}, 0
for i = 1, #dd, 2 do
  local digests = dd[i + 1]
  local t = table_of(S .. ':dd:' .. dd[i], #digests)
  local groups = {}  -- set → {digests, their positions}
  for j = 1, #digests do
    local at = set_of(t, selector(digests[j]))
    local g = groups[at]
    if not g then
      g = {{}, {}}
      groups[at] = g
    end
    g[1][#g[1] + 1] = digests[j]
    g[2][#g[2] + 1] = pos + j - 1
  end
  for at, g in pairs(groups) do
    local found = chunked('SMISMEMBER', t.key .. ':' .. at, g[1], 1, #g[1])
    for k = 1, #found do
      if found[k] == 1 then dups[#dups + 1] = g[2][k] end
    end
  end
  t.groups = groups
  t.incoming = #digests
  tables[#tables + 1] = t
  pos = pos + #digests
end
if #dups > 0 then
  for _, t in ipairs(tables) do
    if t.changed then save(t) end
  end
  return {1, dups}
end
-- From here on every write succeeds: the window is counted whole.

-- Exact sum of two decimal strings of non-negative integers.
local function dadd(x, y)
  local out, carry, i, j = {}, 0, #x, #y
  while i > 0 or j > 0 or carry > 0 do
    local d = carry
    if i > 0 then d = d + string.byte(x, i) - 48 end
    if j > 0 then d = d + string.byte(y, j) - 48 end
    out[#out + 1] = d % 10
    carry = (d - d % 10) / 10
    i, j = i - 1, j - 1
  end
  local digits = string.reverse(table.concat(out))
  return string.match(digits, '^0*(%d-%d)$')
end
local function text(n)
  if type(n) == 'number' then return string.format('%.0f', n) end
  return n
end
-- A stored part (a decimal string, or false) plus an amount: doubles add integers exactly
-- below 2^53, so only sums from 10^15 on are added digit by digit.
local function plus(old, delta)
  if not old then return text(delta) end
  if type(delta) == 'number' and #old < 16 then
    local sum = tonumber(old) + delta
    if sum < 1e15 then return string.format('%.0f', sum) end
  end
  return dadd(old, text(delta))
end
-- A usage field holds "<gross> <quantity>", or "<gross> <quantity> <credits>" once it has
-- credits.
local function parts(was)
  if not was then return false, false, false end
  local g, q, k = string.match(was, '^(%d+) (%d+) ?(%d*)$')
  if k == '' then k = false end
  return g, q, k
end
local b = a[7]
for i = 1, #b, 4 do
  local key, usage, waste = b[i], b[i + 2], b[i + 3]
  local names = {}
  for j = 1, #usage, 4 do names[#names + 1] = usage[j] end
  for j = 1, #waste, 2 do names[#names + 1] = waste[j] end
  local olds = {}
  local first = 1
  while first <= #names do
    local last = math.min(first + 999, #names)
    local got = redis.call('HMGET', key, unpack(names, first, last))
    for j = first, last do olds[j] = got[j - first + 1] end
    first = last + 1
  end
  local out, n = {}, 0
  for j = 1, #usage, 4 do
    n = n + 1
    local g, q, k = parts(olds[n])
    local value = plus(g, usage[j + 1]) .. ' ' .. plus(q, usage[j + 2])
    if k or usage[j + 3] ~= 0 then value = value .. ' ' .. plus(k, usage[j + 3]) end
    out[#out + 1] = usage[j]
    out[#out + 1] = value
  end
  for j = 1, #waste, 2 do
    n = n + 1
    out[#out + 1] = waste[j]
    out[#out + 1] = plus(olds[n], waste[j + 1])
  end
  chunked('HSET', key, out, 1, #out)
  redis.call('EXPIRE', key, b[i + 1])
end

for _, t in ipairs(tables) do
  for at, g in pairs(t.groups) do
    local key = t.key .. ':' .. at
    chunked('SADD', key, g[1], 1, #g[1])
    redis.call('EXPIRE', key, TTL)
  end
  t.n = t.n + t.incoming
  save(t)
end

local tagsets = a[8]
if #tagsets > 0 then
  -- a tag set's id is the digest of its JSON, so setting it again writes the same value
  local ids, pairs_, lowered = {}, {}, {}
  for i = 1, #tagsets, 3 do
    ids[#ids + 1] = tagsets[i]
    pairs_[#pairs_ + 1] = tagsets[i]
    pairs_[#pairs_ + 1] = tagsets[i + 1]
  end
  chunked('HSET', S .. ':tagsets', pairs_, 1, #pairs_)
  local firsts = S .. ':first'
  local known = chunked('HMGET', firsts, ids, 1, #ids)
  for j = 1, #ids do
    local slot = tagsets[3 * j]
    if (not known[j]) or tonumber(known[j]) > slot then
      lowered[#lowered + 1] = ids[j]
      lowered[#lowered + 1] = string.format('%.0f', slot)
    end
  end
  chunked('HSET', firsts, lowered, 1, #lowered)
  if #lowered > 0 then
    -- a new token whenever the first buckets change, and an entry in their log saying what
    -- changed, numbered and bearing the token: readers keep what they derived from them and
    -- apply only the entries after the one they read last. The server's clock in
    -- microseconds: a Redis that lost writes and counts them again does not repeat a token
    -- it gave before (unless its clock went back).
    local LOG_ENTRIES, LOG_NAMED = tonumber(a[9][1]), tonumber(a[9][2])
    local now = redis.call('TIME')
    local token = now[1] .. '.' .. now[2]
    redis.call('SET', firsts .. ':version', token)
    local n = redis.call('INCR', firsts .. ':count')
    local log = firsts .. ':log'
    -- a window that changes more than the log may name (a worker's first windows) is
    -- logged as '*': read them all
    local named, changed = #lowered / 2, '*'
    if named <= LOG_NAMED then changed = table.concat(lowered, ' ') else named = 0 end
    redis.call('RPUSH', log, n .. ' ' .. token .. ' ' .. named .. ' ' .. changed)
    -- the oldest entries go while the log is longer or names more than it may
    local total = tonumber(redis.call('GET', log .. ':named') or '0') + named
    local len = redis.call('LLEN', log)
    while len > 1 and (len > LOG_ENTRIES or total > LOG_NAMED) do
      local oldest = redis.call('LPOP', log)
      total = total - (tonumber(string.match(oldest, '^%S+ %S+ (%d+)')) or 0)
      len = len - 1
    end
    -- with one entry left the count is that entry's: a count that drifted (its key lost
    -- while the log was not) is right again
    if len == 1 then total = named end
    redis.call('SET', log .. ':named', math.max(total, 0))
  end
end

local latest = a[10]
local util = S .. ':util'
for i = 1, #latest, 3 do
  local old = redis.call('HGET', util, latest[i])
  if (not old) or tonumber(string.match(old, '^[^|]+')) <= tonumber(latest[i + 1]) then
    redis.call('HSET', util, latest[i], latest[i + 1] .. '|' .. latest[i + 2])
  end
end
local history = a[11]
for i = 1, #history, 3 do
  local key = S .. ':uh:' .. history[i]
  chunked('ZADD', key, history[i + 2], 1, #history[i + 2])
  redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. history[i + 1])
  redis.call('EXPIRE', key, 172800)
end
local faults = a[12]
if #faults > 0 then
  local key = S .. ':faults'
  chunked('ZADD', key, faults[2], 1, #faults[2])
  redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. faults[1])
end
redis.call('SET', KEYS[1], a[2])
return {2}
"""


@dataclass(frozen=True)
class Applied:
    pass


@dataclass(frozen=True)
class Mismatch:
    """The stored watermark is not the one the worker expected."""

    stored: int


@dataclass(frozen=True)
class Duplicates:
    """These digests were counted before; fold the window again without them."""

    digests: frozenset[int]


Outcome = Applied | Mismatch | Duplicates


class BatchWriter:
    """Turns a ``Tally`` into one script call for one partition slot."""

    def __init__(self, redis: Redis, namespace: str, calendar: Calendar, dedup_ttl: int,
                 retention: Retention | None = None,
                 firsts_log: FirstsLogSize | None = None) -> None:
        self.redis = redis
        self.namespace = namespace
        self.calendar = calendar
        self.dedup_ttl = dedup_ttl
        self.retention = retention or Retention()
        self.firsts_log = firsts_log or FirstsLogSize()
        self._script = redis.register_script(_SCRIPT)
        # Per slot: tag set id → the oldest slot already recorded for it in Redis. A tag set
        # Redis already has is not sent again (most events repeat a known tag set).
        self._known: dict[str, dict[str, int]] = {}

    @property
    def known_tagsets(self) -> int:
        """Tag sets remembered as being in Redis, over every slot."""
        return sum(map(len, self._known.values()))

    def forget(self, slot: str) -> None:
        """Drop what is known of a slot this writer no longer serves."""
        self._known.pop(slot, None)

    async def watermark(self, slot: str) -> int:
        raw = await self.redis.get(wm_key(slot))
        return -1 if raw is None else int(raw)

    async def register_slots(self, slots: list[str]) -> None:
        """List partition slots where readers will find them (idempotent)."""
        if slots:
            await self.redis.sadd(slots_key(self.namespace), *slots)

    async def apply(self, slot: str, expected: int, new_wm: int, tally: Tally) -> Outcome:
        known = self._known.setdefault(slot, {})
        if len(known) > KNOWN_TAGSETS_MAX // len(self._known):
            known.clear()
        fresh = _new_tagsets(tally, known)
        payload, order = self.payload(slot, expected, new_wm, tally, fresh)
        reply = await self._script(keys=[wm_key(slot)], args=[payload])
        code = int(reply[0])
        if code == 2:
            known.update({tsid: first for tsid, _, first in fresh})
            return Applied()
        if code == 0:
            known.clear()  # Redis may have lost writes: assume it knows nothing
            return Mismatch(int(reply[1]))
        return Duplicates(frozenset(order[int(p)] for p in reply[1]))

    def payload(self, slot: str, expected: int, new_wm: int, tally: Tally,
                tagsets: list[tuple[str, str, int]]) -> tuple[bytes, list[int]]:
        """The script's argument, and the digests in the order the script numbers them."""
        dedup, order = _dedup(tally)
        packed = msgpack.packb([
            str(expected), str(new_wm), slot, self.dedup_ttl, DEDUP_LOAD, dedup,
            self._buckets(slot, tally), [field for entry in tagsets for field in entry],
            [self.firsts_log.entries, self.firsts_log.named], _latest(tally),
            _history(tally), _faults(tally),
        ], use_bin_type=False)
        return packed, order

    def _buckets(self, slot: str, tally: Tally) -> list[Any]:
        """Per bucket key: its time to live, its usage fields and its waste fields, each
        the sum of the tally's 5-minute cells the bucket covers."""
        usage: dict[str, dict[str, list[int]]] = {}
        waste: dict[str, dict[str, int]] = {}
        ttls: dict[str, int] = {}
        keys = self._keys_of(slot, ttls)
        for (tsid, five), cell in tally.usage.items():
            field = tsid + USAGE
            for key in keys(five):
                fields = usage.get(key)
                if fields is None:
                    fields = usage[key] = {}
                sums = fields.get(field)
                if sums is None:
                    fields[field] = [cell.gross, cell.quantity, cell.credits]
                else:
                    sums[0] += cell.gross
                    sums[1] += cell.quantity
                    sums[2] += cell.credits
        for (tsid, five, fault), micro in tally.waste.items():
            field = f"{tsid}:w:{fault}"
            for key in keys(five):
                fields_w = waste.setdefault(key, {})
                fields_w[field] = fields_w.get(field, 0) + micro
        out: list[Any] = []
        for key, ttl in ttls.items():
            out += [key, ttl, _usage_wire(usage.get(key, {})), _waste_wire(waste.get(key, {}))]
        return out

    def _keys_of(self, slot: str, ttls: dict[str, int]) -> Any:
        """The 5-minute, hourly and daily bucket keys a 5-minute slot's sums are added to
        (recording each key's time to live in ``ttls``)."""
        found: dict[int, tuple[str, str, str]] = {}
        ret = self.retention

        def keys(five: int) -> tuple[str, str, str]:
            got = found.get(five)
            if got is None:
                got = found[five] = (
                    bucket_key(slot, "5m", five), bucket_key(slot, "1h", five - five % 3600),
                    bucket_key(slot, "1d", self.calendar.date_of(five)))
                ttls[got[0]], ttls[got[1]], ttls[got[2]] = ret.five_min, ret.hour, ret.day
            return got
        return keys


def _dedup(tally: Tally) -> tuple[list[Any], list[int]]:
    flat: list[Any] = []
    order: list[int] = []
    for hour, digests in tally.digests.items():
        flat += [hour, [str(d) for d in digests]]
        order += digests
    return flat, order


def _wire(amount: int) -> int | str:
    """An amount as the script takes it: a decimal string when Lua's doubles cannot hold it."""
    return amount if amount < _LUA_EXACT else str(amount)


def _usage_wire(fields: dict[str, list[int]]) -> list[Any]:
    flat: list[Any] = []
    for field, (gross, quantity, credits) in fields.items():
        flat += [field, _wire(gross), _wire(quantity), _wire(credits)]
    return flat


def _waste_wire(fields: dict[str, int]) -> list[Any]:
    flat: list[Any] = []
    for field, micro in fields.items():
        flat += [field, _wire(micro)]
    return flat


def _new_tagsets(tally: Tally, known: dict[str, int]) -> list[tuple[str, str, int]]:
    """(id, canonical json, oldest slot) of the tag sets Redis does not have yet, or has only
    with a newer oldest slot than this window's."""
    first: dict[str, int] = {}
    for tsid, slot in _cells(tally):
        if slot < first.get(tsid, slot + 1):
            first[tsid] = slot
    return [
        (tsid, canonical, first.get(tsid, 0))
        for tsid, canonical in tally.tagsets.items()
        if first.get(tsid, 0) < known.get(tsid, 1 << 62)
    ]


def _cells(tally: Tally) -> Iterator[tuple[str, int]]:
    yield from tally.usage
    for tsid, slot, _ in tally.waste:
        yield tsid, slot


def _latest(tally: Tally) -> list[Any]:
    flat: list[Any] = []
    for (resource_id, metric), sample in tally.latest.items():
        payload = json.dumps({"value": sample.value, "resource_type": sample.resource_type,
                              "tags": sample.tags}, separators=(",", ":"))
        flat += [f"{resource_id}\t{metric}", repr(sample.ts), payload]
    return flat


def _history(tally: Tally) -> list[Any]:
    flat: list[Any] = []
    for (resource_id, metric), points in tally.samples.items():
        newest = max(ts for ts, _ in points)
        pairs: list[str] = []
        for ts, value in points:
            pairs += [repr(ts), f"{ts!r}:{value!r}"]
        flat += [f"{resource_id}\t{metric}", repr(newest - HISTORY_S), pairs]
    return flat


def _faults(tally: Tally) -> list[Any]:
    if not tally.faults:
        return []
    newest = max(ts for ts, _ in tally.faults)
    pairs: list[str] = []
    for ts, record in tally.faults:
        pairs += [repr(ts), record]
    return [repr(newest - FAULTS_KEPT_S), pairs]

