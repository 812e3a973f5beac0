"""A ``StateView`` held in memory: what rule tests, backtests and unit tests evaluate against.

It prices events exactly as the stream processors do (``PriceBook.charge`` and
``PriceBook.waste``, dedup by ``event_id``) and answers at the same 5-minute granularity as
the Redis store, so a rule test predicts production. Sums are also kept per hour and per UTC
day, so a month-long budget is a few dozen lookups rather than thousands.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from costline.rules.events import (
    RUN_TAG,
    AnyEvent,
    CheckpointEvent,
    FaultEvent,
    ProgressEvent,
    RestoreEvent,
    RunEndEvent,
    UsageEvent,
    UtilizationEvent,
)
from costline.rules.inventory import (
    Change,
    Checkpoint,
    Pin,
    Restore,
    Written,
    build_inventory,
    hourly_storage,
)
from costline.rules.prices import PriceBook, exact, to_micro
from costline.rules.runs import (
    FAILED_RUN,
    PROGRESS_BILLING,
    PROGRESS_CATEGORY,
    PROGRESS_SAMPLES,
    PROGRESS_STEPS,
    PROGRESS_TOKENS,
    RunEnd,
    failed_run_waste,
    failed_runs,
)
from costline.rules.state import (
    BUCKET_S,
    FaultRecord,
    Group,
    Measure,
    ResourceSamples,
    align_down,
    dimensions_of,
    group_of,
    matches,
)

_TIERS = (86_400, 3_600, BUCKET_S)
DimensionsKey = tuple[tuple[str, str], ...]


def _covering(start: float, end: float) -> Iterator[tuple[int, int]]:
    """The fewest (bucket size, bucket start) whose union covers [start, end) rounded out."""
    t = align_down(start)
    stop = -int(-end // BUCKET_S) * BUCKET_S  # as connectors.redis_keys.cover rounds out
    while t < stop:
        size = next(s for s in _TIERS if t % s == 0 and t + s <= stop)
        yield size, t
        t += size


@dataclass
class _Sums:
    """One measure's sums: tier size → bucket start → dimensions → micro-units."""

    tiers: dict[int, dict[int, dict[DimensionsKey, int]]] = field(
        default_factory=lambda: {size: {} for size in _TIERS}
    )
    earliest: dict[DimensionsKey, int] = field(default_factory=dict)

    def add(self, ts: float, dims: DimensionsKey, micro: int) -> None:
        for size, buckets in self.tiers.items():
            cell = buckets.setdefault(align_down(ts, size), {})
            cell[dims] = cell.get(dims, 0) + micro
        slot = align_down(ts)
        if slot < self.earliest.get(dims, slot + 1):
            self.earliest[dims] = slot


@dataclass
class _Series:
    resource_type: str
    tags: dict[str, str]
    dims: dict[str, str]
    points: list[tuple[float, float]] = field(default_factory=list)


class InMemoryState:
    """Events in, exact totals out; implements ``StateView``, ``HistoryView``, ``FaultHistory``
    and the training records (``CheckpointInventory``, run ends)."""

    def __init__(self, prices: PriceBook) -> None:
        self.prices = prices
        self._seen: set[str] = set()
        self._sums: dict[Measure, _Sums] = {
            m: _Sums() for m in ("cost", "gross", "credits", "quantity", "waste")}
        self._series: dict[tuple[str, str], _Series] = {}
        self._faults: list[FaultRecord] = []
        self._written: list[Written] = []
        self._restores: list[Restore] = []
        self._ends: list[RunEnd] = []
        self._changes: dict[str, list[Change]] = {}
        self._pins: dict[str, Pin] = {}

    def add(self, event: AnyEvent) -> bool:
        """Count one event; ``False`` if its ``event_id`` was already counted.

        Raises ``PricingError`` for an event the price book cannot price, before anything is
        counted, as the stream processors reject it.
        """
        if event.event_id in self._seen:
            return False
        if isinstance(event, UsageEvent):
            self._add_usage(event)
        elif isinstance(event, FaultEvent):
            self._add_fault(event)
        elif isinstance(event, UtilizationEvent):
            self._add_sample(event)
        elif isinstance(event, ProgressEvent):
            self._add_progress(event)
        else:
            self._add_record(event)
        self._seen.add(event.event_id)
        return True

    def add_all(self, events: Iterable[AnyEvent]) -> int:
        """Count events; returns how many were new."""
        return sum(self.add(event) for event in events)

    def _add_usage(self, event: UsageEvent) -> None:
        charge = self.prices.charge(event)
        dims = dimensions_of(event.tags, event.resource_type, charge.category, charge.billing,
                             charge.charge.value)
        key, ts, cost = _key(dims), event.unix_ts, charge.cost_micro
        self._sums["cost"].add(ts, key, cost)
        self._sums["gross" if cost >= 0 else "credits"].add(ts, key, abs(cost))
        self._sums["quantity"].add(ts, key, to_micro(exact(event.quantity)))

    def _add_progress(self, event: ProgressEvent) -> None:
        quantities = [(PROGRESS_TOKENS, event.tokens), (PROGRESS_STEPS, event.steps * 10**6)]
        if event.samples is not None:
            quantities.append((PROGRESS_SAMPLES, event.samples))
        for resource_type, micro in quantities:
            dims = dimensions_of(event.tags, resource_type, PROGRESS_CATEGORY, PROGRESS_BILLING)
            key, ts = _key(dims), event.unix_ts
            for measure, amount in (("cost", 0), ("gross", 0), ("quantity", micro)):
                self._sums[measure].add(ts, key, amount)  # type: ignore[index]

    def _add_record(self, event: CheckpointEvent | RestoreEvent | RunEndEvent) -> None:
        if isinstance(event, CheckpointEvent):
            self.prices.storage_price(event.tier)
            self._written.append((event, hourly_storage(self.prices, event.tier, event.bytes)))
        elif isinstance(event, RestoreEvent):
            bisect.insort(self._restores, Restore(event.identity, event.tags[RUN_TAG],
                                                  event.unix_ts, event.read_seconds),
                          key=lambda r: r.ts)
        else:
            self._ends.append(RunEnd(event.tags[RUN_TAG], event.status.value, event.unix_ts,
                                     event.reason))

    def _add_fault(self, event: FaultEvent) -> None:
        waste = self.prices.waste(event)
        price = self.prices.price_of(event.resource_type)
        dims = dimensions_of(event.tags, event.resource_type, price.category, price.billing)
        dims["fault"] = event.fault.value
        self._sums["waste"].add(event.unix_ts, _key(dims), waste)
        record = FaultRecord(
            ts=event.unix_ts,
            fault=event.fault.value,
            resource_type=event.resource_type,
            units=event.units,
            lost_seconds=event.lost_seconds,
            recovery_seconds=event.recovery_seconds,
            tags=dict(event.tags),
        )
        bisect.insort(self._faults, record, key=lambda f: f.ts)

    def _add_sample(self, event: UtilizationEvent) -> None:
        key = (event.resource_id, event.metric)
        series = self._series.get(key)
        if series is None:
            price = self.prices.prices.get(event.resource_type)
            category = price.category.value if price else None
            billing = price.billing.value if price else None
            dims = dimensions_of(event.tags, event.resource_type, category, billing)
            series = self._series[key] = _Series(event.resource_type, dict(event.tags), dims)
        bisect.insort(series.points, (event.unix_ts, event.value))

    def totals(
        self,
        measure: Measure,
        match: Mapping[str, str],
        group_by: Sequence[str],
        start: float,
        end: float,
    ) -> dict[Group, int]:
        cells = self._cells(measure, start, end)
        if measure == "waste":
            cells.update(self._failed_cells(cells, start, end))
        out: dict[Group, int] = {}
        for dims, micro in cells.items():
            plain = dict(dims)
            if matches(match, plain):
                group = group_of(group_by, plain)
                out[group] = out.get(group, 0) + micro
        return out

    def _cells(self, measure: Measure, start: float, end: float) -> dict[DimensionsKey, int]:
        tiers = self._sums[measure].tiers
        out: dict[DimensionsKey, int] = {}
        for size, bucket in _covering(start, end):
            for dims, micro in tiers[size].get(bucket, {}).items():
                out[dims] = out.get(dims, 0) + micro
        return out

    def _failed_cells(self, wasted: Mapping[DimensionsKey, int], start: float, end: float
                      ) -> dict[DimensionsKey, int]:
        """The ``failed_run`` waste of the tag sets of failed runs over [start, end)."""
        failed = failed_runs(self._ends)
        if not failed:
            return {}
        by_tagset: dict[DimensionsKey, int] = {}
        for dims, micro in wasted.items():
            base = tuple(pair for pair in dims if pair[0] != "fault")
            by_tagset[base] = by_tagset.get(base, 0) + micro
        costs = self._cells("cost", start, end)
        out = {}
        for dims in costs.keys() | by_tagset.keys():
            if dict(dims).get(RUN_TAG) in failed:
                waste = failed_run_waste(costs.get(dims, 0), by_tagset.get(dims, 0))
                if waste:
                    out[_key({**dict(dims), "fault": FAILED_RUN})] = waste
        return out

    def samples(
        self, metric: str, match: Mapping[str, str], since: float
    ) -> list[ResourceSamples]:
        found = []
        for (resource_id, series_metric), series in sorted(self._series.items()):
            if series_metric != metric or not matches(match, series.dims):
                continue
            first = bisect.bisect_left(series.points, (since, float("-inf")))
            if first < len(series.points):
                found.append(
                    ResourceSamples(
                        resource_id, series.resource_type, series.tags, series.points[first:]
                    )
                )
        return found

    def earliest(self, measure: Measure, match: Mapping[str, str]) -> float | None:
        starts = [
            slot
            for dims, slot in self._sums[measure].earliest.items()
            if matches(match, dict(dims))
        ]
        return float(min(starts)) if starts else None

    def earliest_by(self, measure: Measure, match: Mapping[str, str], group_by: Sequence[str]
                    ) -> dict[Group, float]:
        """``earliest`` of every group at once (one pass instead of one per group)."""
        found: dict[Group, float] = {}
        for dims, slot in self._sums[measure].earliest.items():
            as_dict = dict(dims)
            if matches(match, as_dict):
                group = group_of(group_by, as_dict)
                found[group] = min(found.get(group, float(slot)), float(slot))
        return found

    def faults(self, since: float) -> list[FaultRecord]:
        first = bisect.bisect_left(self._faults, since, key=lambda f: f.ts)
        return self._faults[first:]

    # -- training records -------------------------------------------------------------

    def run_ends(self) -> list[RunEnd]:
        return list(self._ends)

    def checkpoints(self) -> list[Checkpoint]:
        return build_inventory(self._written, self._changes)

    def restores(self, since: float) -> list[Restore]:
        first = bisect.bisect_left(self._restores, since, key=lambda r: r.ts)
        return self._restores[first:]

    def pins(self) -> dict[str, Pin]:
        return dict(self._pins)

    def record_change(self, change: Change) -> None:
        """What the lifecycle did to a checkpoint (as ``CheckpointStore.record``)."""
        self._changes.setdefault(change.checkpoint_id, []).append(change)

    def pin(self, checkpoint_id: str, pin: Pin) -> None:
        self._pins[checkpoint_id] = pin


def _key(dims: Mapping[str, str]) -> DimensionsKey:
    return tuple(sorted(dims.items()))
