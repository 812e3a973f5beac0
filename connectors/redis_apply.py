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
from importlib import resources
from typing import Any

import msgpack

from costline.connectors.redis_client import AsyncRedisClient
from costline.connectors.redis_keys import (
    USAGE,
    Calendar,
    FirstsLogSize,
    Retention,
    bucket_key,
    slots_key,
    wm_key,
)
from costline.rules.runs import CHECKPOINTS, RESTORES, RUN_ENDS
from costline.rules.tally import Tally

HISTORY_S = 86400
FAULTS_KEPT_S = 7 * 86400
RECORDS_KEPT_S = {CHECKPOINTS: 400 * 86400, RUN_ENDS: 400 * 86400, RESTORES: 7 * 86400}
"""How much event time each record set keeps, behind its newest record: a checkpoint and a
run's end as long as daily buckets, a restore as long as faults."""
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
#  13 records: set name, trim below, {score, member, ...}, ...
# Amounts are integers, or decimal strings from 2^53 on.
# Replies: {2} applied; {0, stored watermark}; {1, positions of digests counted before}.
# The script is ``apply_window.lua`` beside this module.
_SCRIPT = (resources.files("costline.connectors") / "apply_window.lua").read_text()


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

    def __init__(self, redis: AsyncRedisClient, namespace: str, calendar: Calendar,
                 dedup_ttl: int, retention: Retention | None = None,
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
            _history(tally), _faults(tally), _records(tally),
        ], use_bin_type=False)
        return packed, order

    def _buckets(self, slot: str, tally: Tally) -> list[Any]:
        """Per bucket key: its time to live, its usage fields and its waste fields, each
        the sum of the tally's 5-minute cells the bucket covers.

        A 5-minute key's usage fields are the cells themselves (a tally has one cell per tag
        set and slot); only an hour's and a day's are summed over several."""
        usage: dict[str, dict[str, list[int]]] = {}
        waste: dict[str, dict[str, int]] = {}
        ttls: dict[str, int] = {}
        keys = self._keys_of(slot, ttls)
        for (tsid, five), cell in tally.usage.items():
            field = tsid + USAGE
            five_key, hour_key, day_key = keys(five)
            fields = usage.get(five_key)
            if fields is None:
                fields = usage[five_key] = {}
            fields[field] = [cell.gross, cell.quantity, cell.credits]
            for key in (hour_key, day_key):
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
        if gross < _LUA_EXACT and quantity < _LUA_EXACT and credits < _LUA_EXACT:
            flat += (field, gross, quantity, credits)  # the usual field: no call per amount
        else:
            flat += (field, _wire(gross), _wire(quantity), _wire(credits))
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


def _records(tally: Tally) -> list[Any]:
    by_set: dict[str, list[tuple[float, str]]] = {}
    for name, ts, record in tally.records:
        by_set.setdefault(name, []).append((ts, record))
    flat: list[Any] = []
    for name, kept in by_set.items():
        newest = max(ts for ts, _ in kept)
        pairs: list[str] = []
        for ts, record in kept:
            pairs += [repr(ts), record]
        flat += [name, repr(newest - RECORDS_KEPT_S.get(name, FAULTS_KEPT_S)), pairs]
    return flat
