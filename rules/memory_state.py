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

from costline.rules.events import AnyEvent, FaultEvent, UsageEvent, UtilizationEvent
from costline.rules.prices import PriceBook, exact, to_micro
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
    stop = -(-int(end) // BUCKET_S) * BUCKET_S
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
    """Events in, exact totals out; implements ``StateView``, ``HistoryView``, ``FaultHistory``."""

    def __init__(self, prices: PriceBook) -> None:
        self.prices = prices
        self._seen: set[str] = set()
        self._sums: dict[Measure, _Sums] = {
            m: _Sums() for m in ("cost", "gross", "credits", "quantity", "waste")}
        self._series: dict[tuple[str, str], _Series] = {}
        self._faults: list[FaultRecord] = []

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
        sums = self._sums[measure]
        selected: dict[DimensionsKey, Group | None] = {}
        out: dict[Group, int] = {}
        for size, bucket in _covering(start, end):
            for dims, micro in sums.tiers[size].get(bucket, {}).items():
                if dims not in selected:
                    plain = dict(dims)
                    selected[dims] = group_of(group_by, plain) if matches(match, plain) else None
                group = selected[dims]
                if group is not None:
                    out[group] = out.get(group, 0) + micro
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


def _key(dims: Mapping[str, str]) -> DimensionsKey:
    return tuple(sorted(dims.items()))
