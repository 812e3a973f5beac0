"""Apply one partition's batch to Redis exactly once: sums, dedup memory and watermark together.

Kafka transactions end at Kafka's edge, so exactly-once into Redis comes from here. One Lua
script per batch checks that the partition's stored watermark is the one the worker last
wrote (``expected``); only then does it check the batch's event ids against the dedup memory,
add the sums and move the watermark, all in one atomic step. A replayed batch finds a newer
watermark and changes nothing; a Redis that restarted and lost its last writes shows an older
watermark, and the worker seeks back to it.
"""

from __future__ import annotations

import json
from collections.abc import Collection
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
    decoded,
    slots_key,
    wm_key,
)
from costline.rules.tally import COST, QUANTITY, WASTE_PREFIX, Tally

HISTORY_S = 86400
# The most a bucket field may hold, in micro-units (Redis integers stop at 2^63 - 1; the script
# compares in doubles, so it keeps some room for their rounding).
SUM_LIMIT = 9_200_000_000_000_000_000
# Integers Lua's doubles hold exactly; a larger delta travels as a decimal string.
_LUA_EXACT = 2**53
# Tag sets known to be in Redis, across all the partition slots a writer serves (~135 bytes
# each, ~16 MiB in all): the budget is split evenly between the slots, and a slot over its
# share is cleared. A budget per slot would grow with the partitions a worker owns (24 slots
# of 50,000 would be ~155 MiB).
KNOWN_TAGSETS_MAX = 120_000
FAULTS_KEPT_S = 7 * 86400

# One argument, a msgpack array (decoded by Redis's own cmsgpack, so a batch of 50,000
# events costs one string to send, not a million arguments to pack):
#   1 expected watermark   2 new watermark   3 slot tag   4 dedup ttl
#   5 ttl of 5-minute, 6 of hourly, 7 of daily buckets
#   8 seen:    hour, {digest...}, hour, {...}, ...
#   9 tagsets: id, canonical json, first slot, ...
#  10 buckets: slot, its 5-minute, hourly and daily bucket keys, ...  (every slot in the cells)
#  11 cells:   "<tagset id>:w:<fault>", slot, delta, ...  (an integer; a decimal string when
#              beyond 2^53, which Lua's doubles and msgpack's conversion to them cannot hold)
#  12 latest:  resource\tmetric, ts, json, ...
#  13 history: resource\tmetric, trim below, {score, member, ...}, ...
#  14 faults:  trim below, {score, member, ...}   (or empty)
#  15 exact:   1 when the batch's amounts add up past 2^53: the script then leaves every
#              addition to Redis's integers instead of summing in Lua's doubles
#  16 limit:   the most a bucket field may hold (``SUM_LIMIT``)
#  17 first-bucket log: {entries it keeps, tag sets they may name} (``FirstsLogSize``)
#  18 usage:   "<tagset id>:u", slot, cost delta, quantity delta, ...  (as the cells' deltas)
# Replies: {2} applied; {0, stored watermark}; {1, positions of counted digests};
# {3, "<bucket key> <tag set id>:<measure>", its stored value, ... for each sum the batch would
# take past the limit}.
# Keys are built here from the slot tag: they all share it, so they live in the slot of
# KEYS[1] on a Redis Cluster.
_SCRIPT = """
local a = cmsgpack.unpack(ARGV[1])
local S = a[3]
local cur = redis.call('GET', KEYS[1])
if not cur then cur = '-1' end
if cur ~= tostring(a[1]) then return {0, cur} end
-- 2,000 arguments a call: an even number, so field-value pairs are never split.
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
-- The new value of each bucket field, worked out before anything is written: a script that
-- fails halfway keeps what it wrote (Redis has no rollback), so a sum that would pass what
-- Redis's 64-bit integers hold refuses the batch here, whole. One HMGET per 1,000 fields. Lua's
-- doubles add integers exactly below 2^53: a value that is or would become 10^15 or more is
-- left to HINCRBY (``big``), and only compared with the limit here, with room for the
-- doubles' rounding. A sum below 10^15 is handed to Redis as a Lua number, with no
-- string.format per field: Redis 7.0 and Valkey 9 write an integral number as that integer,
-- which a test checks on round sums.
local LIMIT = tonumber(a[16])
local EXACT = a[15] == 1
-- read before anything is written: a payload without them fails here, not halfway
local LOG_ENTRIES, LOG_NAMED = tonumber(a[17][1]), tonumber(a[17][2])
-- The fields of ``sums`` (field → addition), what ``key`` holds in each (false: nothing) and
-- how many there are: one HMGET per 1,000 fields.
local function stored(key, sums)
  local names, n = {}, 0
  for field in pairs(sums) do
    n = n + 1
    names[n] = field
  end
  local olds = {}
  local first = 1
  while first <= n do
    local last = math.min(first + 999, n)
    local got = redis.call('HMGET', key, unpack(names, first, last))
    for j = first, last do olds[j] = got[j - first + 1] end
    first = last + 1
  end
  return names, olds, n
end
-- Returns the field-value pairs to HSET and the fields to leave to HINCRBY.
local function plan(key, fields, over)
  local out, big, o = {}, {}, 0
  local names, olds, n = stored(key, fields)
  for j = 1, n do
    local name, was = names[j], olds[j]
    local sum = fields[name]
    if was then sum = sum + tonumber(was) end
    if sum >= LIMIT or sum <= -LIMIT then
      over[#over + 1] = key .. ' ' .. name
      over[#over + 1] = was or '0'
    elseif not EXACT and sum > -1e15 and sum < 1e15 and (not was or #was < 16) then
      out[o + 1] = name
      out[o + 2] = sum
      o = o + 2
    else
      big[#big + 1] = name
    end
  end
  return out, big
end
-- A usage field holds "<cost> <quantity>": hash fields read and written are most of the
-- script's time, and one field where there were two took Redis's CPU per event from 9.1-11.2
-- to 6.2-7.5 µs (bench/stages.py, docs/STATE.md).
-- The stored parts of a usage field, as numbers and as the strings they were read from.
local function parts(was)
  if not was then return 0, 0, '0', '0' end
  local space = string.find(was, ' ', 1, true)
  local c, q = string.sub(was, 1, space - 1), string.sub(was, space + 1)
  return tonumber(c), tonumber(q), c, q
end
-- Exact sum of two decimal strings of non-negative integers (amounts are never negative),
-- for sums past what doubles hold.
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
local function decimal(delta)
  if type(delta) == 'number' then return string.format('%.0f', delta) end
  return delta
end
-- Whether a part of a usage field stays within the limit; if not, names it in ``over`` as
-- "<bucket key> <tag set id>:<measure>" with the stored value.
local function within(key, field, measure, sum, stored_part, over)
  if sum < LIMIT and sum > -LIMIT then return true end
  over[#over + 1] = key .. ' ' .. string.sub(field, 1, -2) .. measure
  over[#over + 1] = stored_part
  return false
end
-- As ``plan`` for a bucket's usage fields: the field-value pairs to HSET, and the fields whose
-- sums doubles may not hold ({field, stored cost, stored quantity}), added exactly later.
local function plan_usage(key, costs, quantities, over)
  local out, big, o = {}, {}, 0
  local names, olds, n = stored(key, costs)
  for j = 1, n do
    local field = names[j]
    local wc, wq, sc, sq = parts(olds[j])
    local c, q = wc + costs[field], wq + quantities[field]
    local fits_cost = within(key, field, 'c', c, sc, over)
    local fits_quantity = within(key, field, 'q', q, sq, over)
    if fits_cost and fits_quantity then
      if not EXACT and c < 1e15 and q < 1e15 and c > -1e15 and q > -1e15 then
        out[o + 1] = field
        out[o + 2] = string.format('%.0f %.0f', c, q)
        o = o + 2
      else
        big[#big + 1] = {field, sc, sq}
      end
    end
  end
  return out, big
end
local seen = a[8]
local dups = {}
local pos = 0
for i = 1, #seen, 2 do
  local digests = seen[i + 1]
  local found = chunked('SMISMEMBER', S .. ':seen:' .. seen[i], digests, 1, #digests)
  for j = 1, #found do
    if found[j] == 1 then dups[#dups + 1] = pos + j - 1 end
  end
  pos = pos + #digests
end
if #dups > 0 then return {1, dups} end
-- buckets: for each 5-minute slot in the batch, the sums of its three buckets (when the batch
-- is flagged ``exact`` these doubles are only estimates, for the limit check)
local sums = {}
local usums = {}  -- bucket key → {usage field → cost}, {usage field → quantity}
local ttls = {}
local tiers = {}
local b_keys = {}
local b = a[10]
for i = 1, #b, 4 do
  local keys = {}
  for t = 1, 3 do
    local key = b[i + t]
    if not sums[key] then
      sums[key] = {}
      usums[key] = {{}, {}}
      ttls[key] = a[4 + t]
    end
    keys[t] = sums[key]
  end
  tiers[b[i]] = keys
  b_keys[b[i]] = {b[i + 1], b[i + 2], b[i + 3]}
end
local cells = a[11]
for i = 1, #cells, 3 do
  local keys = tiers[cells[i + 1]]
  local field = cells[i]
  local delta = tonumber(cells[i + 2])
  local five, hour, day = keys[1], keys[2], keys[3]
  five[field] = (five[field] or 0) + delta
  hour[field] = (hour[field] or 0) + delta
  day[field] = (day[field] or 0) + delta
end
local usage = a[18]
for i = 1, #usage, 4 do
  local keys = b_keys[usage[i + 1]]
  local field = usage[i]
  local c, q = tonumber(usage[i + 2]), tonumber(usage[i + 3])
  for t = 1, 3 do
    local costs, quantities = usums[keys[t]][1], usums[keys[t]][2]
    costs[field] = (costs[field] or 0) + c
    quantities[field] = (quantities[field] or 0) + q
  end
end
local plans = {}
local uplans = {}
local over = {}
for key, fields in pairs(sums) do
  plans[key] = {plan(key, fields, over)}
  uplans[key] = {plan_usage(key, usums[key][1], usums[key][2], over)}
end
if #over > 0 then return {3, over} end
-- From here on every write succeeds: the batch is counted whole.
-- Usage sums past what doubles hold: the batch's additions to them, exactly, as decimal
-- strings (in an ``exact`` batch, every usage field's).
local function exact_usage()
  local out = {}
  for key, _ in pairs(usums) do out[key] = {} end
  for i = 1, #usage, 4 do
    local c, q = decimal(usage[i + 2]), decimal(usage[i + 3])
    local field = usage[i]
    for t = 1, 3 do
      local per = out[b_keys[usage[i + 1]][t]]
      local was = per[field]
      if was then per[field] = {dadd(was[1], c), dadd(was[2], q)} else per[field] = {c, q} end
    end
  end
  return out
end
local exact_adds = nil
for key, plan_ in pairs(uplans) do
  local out, big = plan_[1], plan_[2]
  chunked('HSET', key, out, 1, #out)
  if #big > 0 and EXACT and not exact_adds then exact_adds = exact_usage() end
  for j = 1, #big do
    local field, sc, sq = big[j][1], big[j][2], big[j][3]
    local c, q
    if EXACT then
      c, q = exact_adds[key][field][1], exact_adds[key][field][2]
    else
      c, q = decimal(usums[key][1][field]), decimal(usums[key][2][field])
    end
    redis.call('HSET', key, field, dadd(sc, c) .. ' ' .. dadd(sq, q))
  end
end
for i = 1, #seen, 2 do
  local key = S .. ':seen:' .. seen[i]
  chunked('SADD', key, seen[i + 1], 1, #seen[i + 1])
  redis.call('EXPIRE', key, a[4])
end
local tagsets = a[9]
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
    local now = redis.call('TIME')
    local token = now[1] .. '.' .. now[2]
    redis.call('SET', firsts .. ':version', token)
    local n = redis.call('INCR', firsts .. ':count')
    local log = firsts .. ':log'
    -- a batch that changes more than the log may name (a worker's first windows) is logged
    -- as '*': read them all
    local named, changed = #lowered / 2, '*'
    if named <= LOG_NAMED then changed = table.concat(lowered, ' ') else named = 0 end
    redis.call('RPUSH', log, n .. ' ' .. token .. ' ' .. named .. ' ' .. changed)
    -- the oldest entries go while the log is longer or names more than it may (this cannot
    -- fail: an error here would leave the batch half written)
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
if EXACT then
  -- amounts too large to add exactly in Lua's doubles: let Redis add each one. Amounts are
  -- never negative (events and prices are not), so each running total stays below the one
  -- the plan checked against the limit.
  for i = 1, #cells, 3 do
    for t = 1, 3 do
      redis.call('HINCRBY', b_keys[cells[i + 1]][t], cells[i], cells[i + 2])
    end
  end
else
  for key, fields in pairs(sums) do
    local out, big = plans[key][1], plans[key][2]
    chunked('HSET', key, out, 1, #out)
    for j = 1, #big do
      redis.call('HINCRBY', key, big[j], string.format('%.0f', fields[big[j]]))
    end
  end
end
for key, _ in pairs(sums) do redis.call('EXPIRE', key, ttls[key]) end
local latest = a[12]
local util = S .. ':util'
for i = 1, #latest, 3 do
  local old = redis.call('HGET', util, latest[i])
  if (not old) or tonumber(string.match(old, '^[^|]+')) <= tonumber(latest[i + 1]) then
    redis.call('HSET', util, latest[i], latest[i + 1] .. '|' .. latest[i + 2])
  end
end
local history = a[13]
for i = 1, #history, 3 do
  local key = S .. ':uh:' .. history[i]
  chunked('ZADD', key, history[i + 2], 1, #history[i + 2])
  redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. history[i + 1])
  redis.call('EXPIRE', key, 172800)
end
local faults = a[14]
if #faults > 0 then
  local key = S .. ':faults'
  chunked('ZADD', key, faults[2], 1, #faults[2])
  redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. faults[1])
end
redis.call('SET', KEYS[1], tostring(a[2]))
return {2}
"""


@dataclass(frozen=True)
class Applied:
    pass


@dataclass(frozen=True)
class Mismatch:
    """The stored watermark is not the one this worker last wrote."""

    stored: int


@dataclass(frozen=True)
class Duplicates:
    """These digests were counted before; fold the batch again without them."""

    digests: frozenset[bytes]


@dataclass(frozen=True)
class Overflow:
    """Nothing was written: these sums would pass ``SUM_LIMIT``. Each is named
    "<bucket key> <tag set id>:<measure>" (``c``, ``q`` or ``w:<fault>``), with the value Redis
    holds for it."""

    stored: dict[str, int]


Outcome = Applied | Mismatch | Duplicates | Overflow


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
        """Drop what is known of a slot this writer no longer serves (its share goes to the
        others)."""
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
        if code == 3:
            names, values = reply[1][::2], reply[1][1::2]
            return Overflow({decoded(n): int(v) for n, v in zip(names, values, strict=True)})
        return Duplicates(frozenset(order[int(p)] for p in reply[1]))

    def additions(self, slot: str, tally: Tally, names: Collection[str]) -> dict[str, int]:
        """What ``tally`` adds to each of the sums ``names`` (as ``Overflow`` names them)."""
        out: dict[str, int] = {}
        for (tsid, five), measures in tally.sums.items():
            for key in self._bucket_keys(slot, five):
                for measure, delta in measures.items():
                    name = f"{key} {tsid}:{measure}"
                    if name in names:
                        out[name] = out.get(name, 0) + delta
        return out

    def payload(self, slot: str, expected: int, new_wm: int, tally: Tally,
                tagsets: list[tuple[str, str, int]]) -> tuple[bytes, list[bytes]]:
        """The script's argument, and the digests in the order the script numbers them."""
        seen, order = _seen(tally)
        waste, usage = _cells(tally)
        ret = self.retention
        packed = msgpack.packb([
            expected, new_wm, slot, self.dedup_ttl, ret.five_min, ret.hour, ret.day,
            seen, [field for entry in tagsets for field in entry], self._buckets(slot, tally),
            waste, _latest(tally), _history(tally), _faults(tally), _needs_exact(tally),
            str(SUM_LIMIT), [self.firsts_log.entries, self.firsts_log.named], usage,
        ], use_bin_type=False)
        return packed, order

    def _buckets(self, tag: str, tally: Tally) -> list[Any]:
        out: list[Any] = []
        for slot in {slot for _, slot in tally.sums}:
            out += [slot, *self._bucket_keys(tag, slot)]
        return out

    def _bucket_keys(self, tag: str, slot: int) -> tuple[str, str, str]:
        """The 5-minute, hourly and daily buckets a 5-minute slot's sums are added to."""
        return (bucket_key(tag, "5m", slot), bucket_key(tag, "1h", slot - slot % 3600),
                bucket_key(tag, "1d", self.calendar.date_of(slot)))


def _seen(tally: Tally) -> tuple[list[Any], list[bytes]]:
    flat: list[Any] = []
    order: list[bytes] = []
    for hour, digests in tally.digests.items():
        flat += [hour, digests]
        order += digests
    return flat, order


def _new_tagsets(tally: Tally, known: dict[str, int]) -> list[tuple[str, str, int]]:
    """(id, canonical json, oldest slot) of the tag sets Redis does not have yet, or has only
    with a newer oldest slot than this batch's."""
    first: dict[str, int] = {}
    for tsid, slot in tally.sums:
        if slot < first.get(tsid, slot + 1):
            first[tsid] = slot
    return [
        (tsid, canonical, first.get(tsid, 0))
        for tsid, canonical in tally.tagsets.items()
        if first.get(tsid, 0) < known.get(tsid, 1 << 62)
    ]


def _cells(tally: Tally) -> tuple[list[Any], list[Any]]:
    """The script's waste cells and its usage cells (``USAGE`` fields: cost and quantity)."""
    waste: list[Any] = []
    usage: list[Any] = []
    for (tsid, slot), measures in tally.sums.items():
        cost, quantity = measures.get(COST), measures.get(QUANTITY)
        if cost is not None or quantity is not None:
            usage += [tsid + USAGE, slot, _wire(cost or 0), _wire(quantity or 0)]
        if len(measures) == 2 and cost is not None and quantity is not None:
            continue  # most cells: usage alone
        for measure, delta in measures.items():
            if measure.startswith(WASTE_PREFIX):
                waste += [f"{tsid}:{measure}", slot, _wire(delta)]
    return waste, usage


def _wire(delta: int) -> int | str:
    """A delta as the script takes it: a decimal string when Lua's doubles cannot hold it."""
    return delta if -_LUA_EXACT < delta < _LUA_EXACT else str(delta)


def _needs_exact(tally: Tally) -> int:
    """1 when Lua's doubles could not add this batch's amounts exactly."""
    total = sum(abs(d) for measures in tally.sums.values() for d in measures.values())
    return 1 if total >= _LUA_EXACT else 0


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
