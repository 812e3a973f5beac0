"""The read side of the Redis state: spend, waste and usage per group over any interval.

Implements the rule engine's ``StateView`` (and its optional history, cell, hour-mark and
fault views) by summing the buckets that ``costline.connectors.redis_keys.cover`` picks, over every
partition slot.

Daily buckets are chosen in the zone the worker recorded (``costline.connectors.bucket_zone``), not
in
the reader's own: the reader's zone only decides which period is asked for.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, cast

from pydantic_core import from_json

from costline.connectors import bucket_zone
from costline.connectors.first_log import FirstsAt, FirstsLog, told_since
from costline.connectors.redis_client import RedisClient
from costline.connectors.redis_keys import (
    LEGACY_USAGE,
    USAGE,
    Calendar,
    Retention,
    bucket_key,
    cover,
    decoded,
    dedup_key,
    faults_key,
    first_seen_key,
    history_key,
    slots_key,
    tagsets_key,
    util_key,
)
from costline.connectors.redis_records import TrainingRecords
from costline.rules.events import RUN_TAG, FaultEvent
from costline.rules.inventory import Checkpoint, Pin, Restore
from costline.rules.runs import FAILED_RUN, RunEnd, failed_mark, failed_run_waste
from costline.rules.state import (
    USAGE_CHARGE,
    Dimensions,
    FaultRecord,
    Group,
    Measure,
    ResourceSamples,
    group_of,
    matches,
)

# A measure's amount in a usage field's parts, "<gross> <quantity> [<credits>]".
_USAGE_AMOUNT: dict[str, Callable[[list[bytes]], int]] = {
    "cost": lambda parts: int(parts[0]) - (int(parts[2]) if len(parts) > 2 else 0),
    "gross": lambda parts: int(parts[0]),
    "credits": lambda parts: int(parts[2]) if len(parts) > 2 else 0,
    "quantity": lambda parts: int(parts[1]),
}
# Buckets read in one round trip: two days of hourly buckets. Their fields are held until
# summed, so a month's hours are read in pieces.
_BUCKETS_PER_READ = 48
# A bucket as ``cover`` names it: its size and label.
Bucket = tuple[str, str | int]
class RedisState:
    """Reads what the aggregation wrote; one instance may serve many queries."""

    def __init__(self, redis: RedisClient, namespace: str, timezone: str) -> None:
        """``timezone`` names daily buckets only while the namespace records no zone (before
        a worker has started on it)."""
        self.redis = redis
        self.namespace = namespace
        self._own_calendar = Calendar(timezone)
        self._recorded_calendar: Calendar | None = None
        # Per slot: tag set id (``id\tw:fault`` with a fault type) → its dimensions, read
        # once (they never change) and kept as the one tuple every reader uses.
        self._dims: dict[str, dict[str, Dimensions]] = {}
        # Tag sets repeat a few keys, values and pairs: each is kept only once, which keeps an
        # evaluation of many tag sets well below the memory of a copy per tag set.
        self._shared: dict[Any, Any] = {}
        self._firsts_log = FirstsLog(redis)
        self.records = TrainingRecords(redis, namespace, self.slots)

    # -- catalogue ------------------------------------------------------------------

    @property
    def calendar(self) -> Calendar:
        """The calendar daily buckets are named in. The recorded zone never changes once
        written, so it is read until found and then kept."""
        if self._recorded_calendar is None:
            zone = bucket_zone.recorded(self.redis, self.namespace)
            if zone is None:
                return self._own_calendar
            self._recorded_calendar = Calendar(zone)
        return self._recorded_calendar

    def _firsts(self, slot: str) -> dict[str, int]:
        """Tag set id → start of its oldest 5-minute slot, of one partition slot."""
        return {decoded(k): int(v) for k, v in self.redis.hgetall(first_seen_key(slot)).items()}

    def slots(self) -> list[str]:
        return sorted(decoded(s) for s in self.redis.smembers(slots_key(self.namespace)))

    def _tagsets(self, slot: str, wanted: Iterable[str]) -> dict[str, Dimensions]:
        """The slot's known dimensions, with those of ``wanted`` read if not known yet."""
        known = self._dims.setdefault(slot, {})
        missing = [t for t in set(wanted) if t not in known]
        if missing:
            raws = self.redis.hmget(tagsets_key(slot), missing)
            # pydantic's JSON parser: 100,000 tag sets in 0.13-0.18 s (json.loads: 0.39-0.46)
            for tsid, raw in zip(missing, raws, strict=True):
                known[tsid] = self._dimensions(from_json(raw)) if raw else ()
        return known

    def _dimensions(self, plain: Mapping[str, str]) -> Dimensions:
        shared = self._shared
        pairs = []
        if "charge" not in plain:  # stored only for money other than metered usage
            plain = {**plain, "charge": USAGE_CHARGE}
        for pair in plain.items():
            found = shared.get(pair)
            if found is None:  # a new pair: its key and its value may still be known
                key, value = pair
                found = (shared.setdefault(key, key), shared.setdefault(value, value))
                shared[found] = found
            pairs.append(found)
        pairs.sort()
        return tuple(pairs)

    # -- StateView ------------------------------------------------------------------

    def totals(self, measure: Measure, match: Mapping[str, str], group_by: Sequence[str],
               start: float, end: float) -> dict[Group, int]:
        return self._totals((measure,), match, group_by, start, end)[measure]

    def totals_each(self, measures: Sequence[Measure], match: Mapping[str, str],
                    group_by: Sequence[str], start: float, end: float
                    ) -> dict[Measure, dict[Group, int]]:
        """``totals`` of several measures from one read of their buckets (``TotalsEach``):
        spend and waste of a month are in the same daily buckets. A measure named twice is
        answered once."""
        distinct = tuple(dict.fromkeys(measures))
        return self._totals(distinct, match, group_by, start, end) if distinct else {}

    def _totals(self, measures: Sequence[Measure], match: Mapping[str, str],
                group_by: Sequence[str], start: float, end: float
                ) -> dict[Measure, dict[Group, int]]:
        out: dict[Measure, dict[Group, int]] = {measure: defaultdict(int) for measure in measures}
        decided: dict[int, Group | None] = {}
        for _, measure, dims, value in self._cells(measures, [(start, end)]):
            group = _decide(dims, match, group_by, decided)
            if group is not None:
                out[measure][group] += value
        return {measure: dict(sums) for measure, sums in out.items()}

    def cells(self, measure: Measure, start: float, end: float) -> dict[Dimensions, int]:
        """Every tag set's sum of ``measure`` over [start, end) (``CellView``)."""
        out: dict[Dimensions, int] = {}
        for _, _, dims, value in self._cells((measure,), [(start, end)]):
            out[dims] = out.get(dims, 0) + value
        return out

    def interval_cells(self, measures: Sequence[Measure],
                       intervals: Sequence[tuple[float, float]]
                       ) -> list[dict[Dimensions, dict[Measure, int]]]:
        """Every tag set's sum of each of ``measures`` over each of ``intervals``, one dict
        per interval, from one read of their buckets: the FOCUS export reads a day of hours
        at a time, gross, credits and quantity together."""
        out: list[dict[Dimensions, dict[Measure, int]]] = [{} for _ in intervals]
        for index, measure, dims, value in self._cells(measures, intervals):
            sums = out[index].setdefault(dims, {})
            sums[measure] = sums.get(measure, 0) + value
        return out

    def firsts(self, measure: Measure) -> dict[Dimensions, float]:
        """Start of every tag set's oldest 5-minute slot (kept per tag set, whatever the
        measure)."""
        out: dict[Dimensions, float] = {}
        for slot in self.slots():
            firsts = self._firsts(slot)
            known = self._tagsets(slot, firsts)
            for tsid, first in firsts.items():
                key = known[tsid]
                out[key] = min(out.get(key, float(first)), float(first))
        return out

    def firsts_changes(self, since: Hashable | None
                       ) -> tuple[FirstsAt | None, dict[Dimensions, float] | None]:
        """What changed in ``firsts`` since ``since`` (``FirstsLog``), from each slot's log of
        first-bucket changes (one script call a slot). Where the first buckets stand is each
        slot's last entry: its number and its token. The changes cannot be told when a slot
        was not read before, when its log moved on past the entry last read or lost it (a
        Redis that restarted without its last writes), or when an entry says "read them
        all"; nothing is kept while a slot's first buckets changed without an entry (its
        token is not its last entry's) or are held with neither (written before tokens
        were)."""
        marks = {slot: (n, token) for slot, n, token in cast(FirstsAt, since or ())}
        stands_at: list[tuple[str, int, str]] = []
        changes: dict[Dimensions, float] | None = {} if since is not None else None
        for slot in self.slots():
            mark = marks.get(slot)
            stands, entries = self._firsts_log.read(slot, mark)
            if stands is None:
                return None, None
            stands_at.append((slot, *stands))
            if changes is not None:
                told = told_since(mark, stands, entries)
                if told is None:
                    changes = None
                else:
                    self._add_changes(slot, told, changes)
        return tuple(stands_at), changes

    def _add_changes(self, slot: str, told: list[tuple[str, int]],
                     changes: dict[Dimensions, float]) -> None:
        known = self._tagsets(slot, (tsid for tsid, _ in told))
        for tsid, first in told:
            key = known[tsid]
            if first < changes.get(key, first + 1):
                changes[key] = float(first)

    def hour_marks(self, hours: Sequence[int]) -> dict[int, int]:
        """Events counted per hour of event time, from the dedup memory (``HourMarks``): a
        late event moves the mark of its hour. A month of hours is asked several times a
        second, so each slot's hours are read in one round trip."""
        # A run that fails makes all of its spend waste, in every hour it ran: the failed
        # runs are part of every hour's mark.
        failed = self.records.failed_runs()
        marks = dict.fromkeys(hours, failed_mark(failed) if failed else 0)
        for slot in self.slots():
            pipe = self.redis.pipeline(transaction=False)
            for hour in hours:
                pipe.hget(dedup_key(slot, hour), "n")
            for hour, count in zip(hours, pipe.execute(), strict=True):
                marks[hour] += int(count or 0)
        return marks

    def short_lived_parts(self, start: float, end: float, now: float) -> list[str]:
        """The bucket sizes [start, end) is read from whose retention its event time is past:
        a period in another zone than the recorded one has its edges read from hourly (35 d)
        or 5-minute (48 h) buckets, which may be gone by now (kept from their last write)."""
        kept = {"1h": Retention.hour, "5m": Retention.five_min}
        return sorted({size for size, label in cover(start, end, self.calendar)
                       if size in kept and int(label) < now - kept[size]})

    def series(self, measure: Measure, match: Mapping[str, str], group_by: Sequence[str],
               start: float, end: float, step: int = 3600) -> dict[Group, dict[int, int]]:
        """Sums per group per ``step``-second interval (hourly by default): peaks and charts.

        Intervals are aligned to UTC multiples of ``step``; the first and last are cut at
        ``start`` and ``end`` (a day in a half-hour zone starts mid-hour), so no interval
        counts spend from outside the period."""
        steps = range(int(start // step) * step, math.ceil(end), step)
        parts = [(max(t, start), min(t + step, end)) for t in steps]
        out: dict[Group, dict[int, int]] = defaultdict(lambda: defaultdict(int))
        decided: dict[int, Group | None] = {}
        for index, _, dims, value in self._cells((measure,), parts):
            group = _decide(dims, match, group_by, decided)
            if group is not None:
                out[group][steps[index]] += value
        return {g: dict(v) for g, v in out.items()}

    def _cells(self, measures: Sequence[Measure], intervals: Sequence[tuple[float, float]]
               ) -> Iterable[tuple[int, Measure, Dimensions, int]]:
        """(interval's index, measure, dimensions, micro-units): each tag set's sum of each of
        ``measures`` over each of ``intervals`` in each slot that holds it.

        The evaluator asks about the last hour several times a second, a month's report reads
        every tag set's daily buckets and its charts every hour of the month, so a slot's
        buckets are read in few round trips (``_BUCKETS_PER_READ`` at a time) and once for all
        measures, their fields summed per tag set as read (a bucket holds the other measures
        too, skipped unparsed) and turned into dimensions once per tag set and interval, not
        once per bucket.
        """
        calendar = self.calendar  # read until a worker has recorded the zone: once here
        covers = [list(cover(start, end, calendar)) for start, end in intervals]
        failed = self.records.failed_runs() if "waste" in measures else frozenset()
        for slot in self.slots():
            for first, chunk in _chunks(covers, _BUCKETS_PER_READ):
                pipe = self.redis.pipeline(transaction=False)
                for buckets in chunk:
                    for size, label in buckets:
                        pipe.hgetall(bucket_key(slot, size, label))
                hashes = iter(pipe.execute())
                for index, buckets in enumerate(chunk, first):
                    read = [next(hashes) for _ in buckets]
                    for measure in measures:
                        for dims, value in self._slot_sums(slot, read, measure, failed):
                            yield index, measure, dims, value

    def _slot_sums(self, slot: str, hashes: list[Any], measure: Measure,
                   failed: frozenset[str] = frozenset()) -> Iterable[tuple[Dimensions, int]]:
        """Each tag set's sum of ``measure`` over a slot's buckets ``hashes`` (as read); with
        waste, the ``failed_run`` waste of the tag sets of ``failed`` runs too."""
        sums: dict[str, int] = {}
        for fields in hashes:
            _sum_fields(fields, measure, sums)
        known = self._tagsets(slot, {name.partition("\t")[0] for name in sums})
        for name, value in sums.items():
            tsid, _, fault = name.partition("\t")
            yield (self._waste_dims(slot, tsid, fault) if fault else known[tsid]), value
        if measure == "waste" and failed:
            yield from self._failed_sums(slot, hashes, sums, failed)

    def _failed_sums(self, slot: str, hashes: list[Any], wasted: Mapping[str, int],
                     failed: frozenset[str]) -> Iterable[tuple[Dimensions, int]]:
        """The ``failed_run`` waste of a slot's tag sets of failed runs: their spend less the
        fault waste counted for them (``costline.rules.runs``)."""
        costs: dict[str, int] = {}
        for fields in hashes:
            _sum_fields(fields, "cost", costs)
        by_tagset: dict[str, int] = defaultdict(int)
        for name, value in wasted.items():
            by_tagset[name.partition("\t")[0]] += value
        # A tag set's usage and its faults are on the home partitions of their own ids: a slot
        # may hold either alone, and the parts add up to the whole.
        tagsets = costs.keys() | by_tagset.keys()
        known = self._tagsets(slot, tagsets)
        for tsid in tagsets:
            if dict(known[tsid]).get(RUN_TAG) in failed:
                waste = failed_run_waste(costs.get(tsid, 0), by_tagset.get(tsid, 0))
                if waste:
                    yield self._waste_dims(slot, tsid, FAILED_RUN), waste

    def _waste_dims(self, slot: str, tsid: str, fault: str) -> Dimensions:
        """A tag set's dimensions plus its fault type, made once and kept (callers may
        remember a decision per dimensions object)."""
        known = self._dims[slot]
        key = f"{tsid}\tw:{fault}"
        found = known.get(key)
        if found is None:
            found = known[key] = self._dimensions({**dict(known[tsid]), "fault": fault})
        return found

    def samples(self, metric: str, match: Mapping[str, str], since: float
                ) -> list[ResourceSamples]:
        found: dict[str, tuple[str, dict[str, str], list[tuple[float, float]]]] = {}
        for slot in self.slots():
            util: dict[bytes, bytes] = self.redis.hgetall(util_key(slot))  # type: ignore[assignment]
            wanted: list[str] = []
            for field, raw in util.items():
                resource_id, _, sample_metric = decoded(field).partition("\t")
                if sample_metric != metric:
                    continue
                latest = json.loads(decoded(raw).split("|", 1)[1])
                dims = {**latest["tags"], "resource_type": latest["resource_type"]}
                if not matches(match, dims):
                    continue
                found.setdefault(resource_id, (latest["resource_type"], latest["tags"], []))
                wanted.append(resource_id)
            # One round trip for the histories of a slot, not one per resource.
            pipe = self.redis.pipeline(transaction=False)
            for resource_id in wanted:
                pipe.zrangebyscore(history_key(slot, resource_id, metric), since, "+inf")
            for resource_id, members in zip(wanted, pipe.execute(), strict=True):
                found[resource_id][2].extend(_points(members))
        return [
            ResourceSamples(rid, rtype, tags, sorted(set(points)))
            for rid, (rtype, tags, points) in sorted(found.items())
        ]

    # -- optional views -------------------------------------------------------------

    def earliest(self, measure: Measure, match: Mapping[str, str]) -> float | None:
        oldest: float | None = None
        for slot in self.slots():
            firsts = self._firsts(slot)
            known = self._tagsets(slot, firsts)
            for tsid, first in firsts.items():
                if matches(match, dict(known[tsid])) and (oldest is None or first < oldest):
                    oldest = float(first)
        return oldest

    def earliest_by(self, measure: Measure, match: Mapping[str, str], group_by: Sequence[str]
                    ) -> dict[Group, float]:
        """``earliest`` of every group at once (one pass instead of one per group)."""
        found: dict[Group, float] = {}
        for slot in self.slots():
            firsts = self._firsts(slot)
            known = self._tagsets(slot, firsts)
            for tsid, first in firsts.items():
                dims = dict(known[tsid])
                if matches(match, dims):
                    group = group_of(group_by, dims)
                    found[group] = min(found.get(group, float(first)), float(first))
        return found

    # -- training records (costline.connectors.redis_records) ---------------------------

    def run_ends(self) -> list[RunEnd]:
        return self.records.run_ends()

    def checkpoints(self) -> list[Checkpoint]:
        return self.records.checkpoints()

    def restores(self, since: float) -> list[Restore]:
        return self.records.restores(since)

    def pins(self) -> dict[str, Pin]:
        return self.records.pins()

    def faults(self, since: float) -> list[FaultRecord]:
        records: list[FaultRecord] = []
        for slot in self.slots():
            raws: list[bytes] = self.redis.zrangebyscore(  # type: ignore[assignment]
                faults_key(slot), since, "+inf")
            records.extend(_fault_record(raw) for raw in raws)
        return sorted(records, key=lambda r: r.ts)


def _decide(dims: Dimensions, match: Mapping[str, str], group_by: Sequence[str],
            decided: dict[int, Group | None]) -> Group | None:
    """The group of a tag set's dimensions (``None``: not matched), kept in ``decided`` by the
    id of the dimensions, which never change and are kept in ``_dims``: decided once per
    query, however many intervals and measures it sums."""
    key = id(dims)
    if key not in decided:
        plain = dict(dims)
        decided[key] = group_of(group_by, plain) if matches(match, plain) else None
    return decided[key]


def _chunks(covers: list[list[Bucket]], most: int) -> Iterable[tuple[int, list[list[Bucket]]]]:
    """Consecutive runs of ``covers`` (each interval's buckets) of at most ``most`` buckets,
    or of one interval with more, with the index of each run's first interval."""
    first, count = 0, 0
    run: list[list[Bucket]] = []
    for index, buckets in enumerate(covers):
        if run and count + len(buckets) > most:
            yield first, run
            first, run, count = index, [], 0
        run.append(buckets)
        count += len(buckets)
    if run:
        yield first, run


def _sum_fields(fields: Mapping[bytes, bytes] | Mapping[str, str], measure: Measure,
                sums: dict[str, int]) -> None:
    """Add a bucket's fields of ``measure`` to ``sums`` by tag set (``tsid\tfault`` for
    waste); the other measures' fields are skipped without being decoded."""
    if measure == "waste":
        for field, value in fields.items():
            if b":w:" not in field if isinstance(field, bytes) else ":w:" not in field:
                continue  # usage: most fields, not decoded
            tsid, _, fault = decoded(field).partition(":w:")
            if fault:
                name = f"{tsid}\t{fault}"
                sums[name] = sums.get(name, 0) + int(value)
        return
    amount_of = _USAGE_AMOUNT[measure]
    usage = USAGE.encode()
    legacy = LEGACY_USAGE.get(measure)
    old = legacy.encode() if legacy else None
    for field, value in fields.items():
        raw = field if isinstance(field, bytes) else field.encode()
        if raw.endswith(usage):
            parts = value.split() if isinstance(value, bytes) else value.encode().split()
            tsid, amount = raw[:-len(usage)].decode(), amount_of(parts)
        elif old is not None and raw.endswith(old):
            tsid, amount = raw[:-len(old)].decode(), int(value)
        else:
            continue  # waste: not decoded
        sums[tsid] = sums.get(tsid, 0) + amount


def _points(members: list[bytes]) -> list[tuple[float, float]]:
    points = []
    for member in members:
        ts, _, value = decoded(member).partition(":")
        points.append((float(ts), float(value)))
    return points


def _fault_record(raw: bytes) -> FaultRecord:
    event = FaultEvent.model_validate_json(raw)
    return FaultRecord(
        ts=event.unix_ts, fault=event.fault.value, resource_type=event.resource_type,
        units=event.units, lost_seconds=event.lost_seconds,
        recovery_seconds=event.recovery_seconds, tags=dict(event.tags),
    )
