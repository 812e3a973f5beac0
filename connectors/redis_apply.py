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
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from connectors.redis_keys import (
    HOUR_S,
    Calendar,
    Retention,
    bucket_key,
    faults_key,
    first_seen_key,
    history_key,
    seen_key,
    slots_key,
    tagsets_key,
    util_key,
    wm_key,
)
from rules.tally import Tally

HISTORY_S = 86400
FAULTS_KEPT_S = 7 * 86400
CHUNK = 2000

# ARGV layout: expected, new_wm, seen_ttl,
#   nseen, (key_index, count, digest*count)*,
#   ntagsets, (id, json, first_slot)*,
#   nbuckets, (key_index, ttl, nfields, (field, delta)*)*,
#   nlatest, (field, ts, payload)*,
#   nhistory, (key_index, ttl, trim_before, count, (score, member)*)*,
#   nfaults, [trim_before, (score, member)*]
_SCRIPT = """
local cur = redis.call('GET', KEYS[1])
if not cur then cur = '-1' end
if cur ~= ARGV[1] then return {0, cur} end
local new_wm = ARGV[2]
local seen_ttl = tonumber(ARGV[3])
local i = 4
local nseen = tonumber(ARGV[i]); i = i + 1
local seen_start = i
local dups = {}
local pos = 0
for _ = 1, nseen do
  local key = KEYS[tonumber(ARGV[i])]
  local count = tonumber(ARGV[i + 1])
  i = i + 2
  local first = i
  while first < i + count do
    local last = math.min(first + 1999, i + count - 1)
    local found = redis.call('SMISMEMBER', key, unpack(ARGV, first, last))
    for j = 1, #found do
      if found[j] == 1 then dups[#dups + 1] = pos + (first - i) + j - 1 end
    end
    first = last + 1
  end
  pos = pos + count
  i = i + count
end
if #dups > 0 then return {1, dups} end
i = seen_start
for _ = 1, nseen do
  local key = KEYS[tonumber(ARGV[i])]
  local count = tonumber(ARGV[i + 1])
  i = i + 2
  local first = i
  while first < i + count do
    local last = math.min(first + 1999, i + count - 1)
    redis.call('SADD', key, unpack(ARGV, first, last))
    first = last + 1
  end
  if count > 0 then redis.call('EXPIRE', key, seen_ttl) end
  i = i + count
end
local ntagsets = tonumber(ARGV[i]); i = i + 1
for _ = 1, ntagsets do
  redis.call('HSETNX', KEYS[2], ARGV[i], ARGV[i + 1])
  local first = redis.call('HGET', KEYS[5], ARGV[i])
  if (not first) or tonumber(first) > tonumber(ARGV[i + 2]) then
    redis.call('HSET', KEYS[5], ARGV[i], ARGV[i + 2])
  end
  i = i + 3
end
local nbuckets = tonumber(ARGV[i]); i = i + 1
for _ = 1, nbuckets do
  local key = KEYS[tonumber(ARGV[i])]
  local ttl = tonumber(ARGV[i + 1])
  local nfields = tonumber(ARGV[i + 2])
  i = i + 3
  for _ = 1, nfields do
    redis.call('HINCRBY', key, ARGV[i], ARGV[i + 1])
    i = i + 2
  end
  redis.call('EXPIRE', key, ttl)
end
local nlatest = tonumber(ARGV[i]); i = i + 1
for _ = 1, nlatest do
  local field = ARGV[i]
  local ts = tonumber(ARGV[i + 1])
  local old = redis.call('HGET', KEYS[3], field)
  if (not old) or tonumber(string.match(old, '^[^|]+')) <= ts then
    redis.call('HSET', KEYS[3], field, ARGV[i + 1] .. '|' .. ARGV[i + 2])
  end
  i = i + 3
end
local nhistory = tonumber(ARGV[i]); i = i + 1
for _ = 1, nhistory do
  local key = KEYS[tonumber(ARGV[i])]
  local ttl = tonumber(ARGV[i + 1])
  local trim = ARGV[i + 2]
  local count = tonumber(ARGV[i + 3])
  i = i + 4
  redis.call('ZADD', key, unpack(ARGV, i, i + 2 * count - 1))
  redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. trim)
  redis.call('EXPIRE', key, ttl)
  i = i + 2 * count
end
local nfaults = tonumber(ARGV[i]); i = i + 1
if nfaults > 0 then
  redis.call('ZADD', KEYS[4], unpack(ARGV, i + 1, i + 2 * nfaults))
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', '(' .. ARGV[i])
end
redis.call('SET', KEYS[1], new_wm)
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


Outcome = Applied | Mismatch | Duplicates


class _Script:
    """KEYS and ARGV of one call, built side by side."""

    def __init__(self, slot: str) -> None:
        self.keys: list[str] = [wm_key(slot), tagsets_key(slot), util_key(slot),
                                faults_key(slot), first_seen_key(slot)]
        self.args: list[Any] = []
        self._index: dict[str, int] = {}

    def key(self, name: str) -> int:
        index = self._index.get(name)
        if index is None:
            self.keys.append(name)
            index = self._index[name] = len(self.keys)
        return index


class BatchWriter:
    """Turns a ``Tally`` into one script call for one partition slot."""

    def __init__(self, redis: Redis, namespace: str, calendar: Calendar, dedup_ttl: int,
                 retention: Retention | None = None) -> None:
        self.redis = redis
        self.namespace = namespace
        self.calendar = calendar
        self.dedup_ttl = dedup_ttl
        self.retention = retention or Retention()
        self._script = redis.register_script(_SCRIPT)

    async def watermark(self, slot: str) -> int:
        raw = await self.redis.get(wm_key(slot))
        return -1 if raw is None else int(raw)

    async def register_slots(self, slots: list[str]) -> None:
        """List partition slots where readers will find them (idempotent)."""
        if slots:
            await self.redis.sadd(slots_key(self.namespace), *slots)

    async def apply(self, slot: str, expected: int, new_wm: int, tally: Tally) -> Outcome:
        call, order = self._build(slot, expected, new_wm, tally)
        reply = await self._script(keys=call.keys, args=call.args)
        code = int(reply[0])
        if code == 2:
            return Applied()
        if code == 0:
            return Mismatch(int(reply[1]))
        return Duplicates(frozenset(order[int(p)] for p in reply[1]))

    def _build(self, slot: str, expected: int, new_wm: int, tally: Tally
               ) -> tuple[_Script, list[bytes]]:
        """The script call, and the digests in the order the script numbers them."""
        call = _Script(slot)
        args = call.args
        args += [str(expected), str(new_wm), self.dedup_ttl]
        order = self._seen(call, slot, tally)
        self._tagsets(call, tally)
        self._buckets(call, slot, tally)
        self._utilization(call, slot, tally)
        self._faults(call, tally)
        return call, order

    def _tagsets(self, call: _Script, tally: Tally) -> None:
        first: dict[str, int] = {}
        for tsid, slot5 in tally.sums:
            if slot5 < first.get(tsid, slot5 + 1):
                first[tsid] = slot5
        call.args.append(len(tally.tagsets))
        for tsid, canonical in tally.tagsets.items():
            call.args += [tsid, canonical, first.get(tsid, 0)]

    def _faults(self, call: _Script, tally: Tally) -> None:
        call.args.append(len(tally.faults))
        if tally.faults:
            newest = max(ts for ts, _ in tally.faults)
            call.args.append(repr(newest - FAULTS_KEPT_S))
            for ts, record in tally.faults:
                call.args += [repr(ts), record]

    def _seen(self, call: _Script, slot: str, tally: Tally) -> list[bytes]:
        by_hour: dict[int, list[bytes]] = defaultdict(list)
        for digest, hour in tally.digests:
            by_hour[hour].append(digest)
        order: list[bytes] = []
        call.args.append(len(by_hour))
        for hour, digests in by_hour.items():
            call.args += [call.key(seen_key(slot, hour)), len(digests), *digests]
            order += digests
        return order

    def _buckets(self, call: _Script, slot: str, tally: Tally) -> None:
        ret = self.retention
        buckets: dict[str, tuple[int, dict[str, int]]] = {}

        def add(name: str, ttl: int, field: str, delta: int) -> None:
            entry = buckets.get(name)
            if entry is None:
                entry = buckets[name] = (ttl, {})
            fields = entry[1]
            fields[field] = fields.get(field, 0) + delta

        date_of = self.calendar.date_of
        for (tsid, slot5), measures in tally.sums.items():
            hour = slot5 // HOUR_S * HOUR_S
            names = (
                (bucket_key(slot, "5m", slot5), ret.five_min),
                (bucket_key(slot, "1h", hour), ret.hour),
                (bucket_key(slot, "1d", date_of(slot5)), ret.day),
            )
            for measure, delta in measures.items():
                field = f"{tsid}:{measure}"
                for name, ttl in names:
                    add(name, ttl, field, delta)
        call.args.append(len(buckets))
        for name, (ttl, fields) in buckets.items():
            call.args += [call.key(name), ttl, len(fields)]
            for field, delta in fields.items():
                call.args += [field, delta]

    def _utilization(self, call: _Script, slot: str, tally: Tally) -> None:
        call.args.append(len(tally.latest))
        for (resource_id, metric), sample in tally.latest.items():
            payload = json.dumps(
                {"value": sample.value, "resource_type": sample.resource_type,
                 "tags": sample.tags}, separators=(",", ":"))
            call.args += [f"{resource_id}\t{metric}", repr(sample.ts), payload]
        call.args.append(len(tally.samples))
        for (resource_id, metric), points in tally.samples.items():
            newest = max(ts for ts, _ in points)
            call.args += [call.key(history_key(slot, resource_id, metric)), 2 * HISTORY_S,
                          repr(newest - HISTORY_S), len(points)]
            for ts, value in points:
                call.args += [repr(ts), f"{ts!r}:{value!r}"]
