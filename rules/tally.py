"""Folding priced events into per-tag-set sums: the pure half of the aggregation.

An event's *dimensions* are its tags plus the pseudo-tags ``category``, ``resource_type`` and
``billing`` (they win over a tag of the same name). A distinct set of dimensions is a *tag
set*, named by a short stable digest. Spend, usage quantity and waste are summed per tag set
and per 5-minute slot of event time; coarser buckets (hour, day) are sums of slots and are
derived by the store. Everything is integer micro-units.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rules.events import AnyEvent, FaultEvent, UsageEvent, UtilizationEvent
from rules.prices import PriceBook, PricingError, exact, to_micro

SLOT_S = 300
PSEUDO_TAGS = ("category", "resource_type", "billing")
COST, QUANTITY = "c", "q"
WASTE_PREFIX = "w:"
_TAGSET_CACHE_MAX = 200_000


def tagset_json(dims: Mapping[str, str]) -> str:
    """Canonical JSON of a tag set: sorted keys, no spaces; its digest is the tag set id."""
    return json.dumps(dims, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def tagset_id(canonical: str) -> str:
    return hashlib.blake2b(canonical.encode(), digest_size=8).hexdigest()


def event_digest(event_id: str) -> bytes:
    """What the dedup memory keeps of an event id: 12 bytes, collision-free in practice."""
    return hashlib.blake2b(event_id.encode(), digest_size=12).digest()


def quantity_micro(quantity: float) -> int:
    return to_micro(exact(quantity))


@dataclass(slots=True)
class Sample:
    """The latest utilization reading of one resource and metric in a batch."""

    ts: float
    value: float
    resource_type: str
    tags: dict[str, str]


@dataclass
class Tally:
    """Sums of one batch: (tag set id, slot start) → {measure: micro-units}.

    ``digests`` lists each counted event's dedup digest with its event-time hour, so the store
    can refuse a batch whose event was already counted and the worker can fold it again
    without that event.
    """

    sums: dict[tuple[str, int], dict[str, int]] = field(default_factory=dict)
    tagsets: dict[str, str] = field(default_factory=dict)
    digests: list[tuple[bytes, int]] = field(default_factory=list)
    samples: dict[tuple[str, str], list[tuple[float, float]]] = field(default_factory=dict)
    latest: dict[tuple[str, str], Sample] = field(default_factory=dict)
    faults: list[tuple[float, str]] = field(default_factory=list)
    events: int = 0

    def add(self, tsid: str, ts: float, measure: str, micro: int) -> None:
        slot = int(ts // SLOT_S) * SLOT_S
        cell = self.sums.get((tsid, slot))
        if cell is None:
            cell = self.sums[(tsid, slot)] = {}
        cell[measure] = cell.get(measure, 0) + micro


class Folder:
    """Prices and folds events; caches tag-set identities across batches (bounded)."""

    def __init__(self, prices: PriceBook) -> None:
        self.prices = prices
        self._ids: dict[tuple[object, ...], tuple[str, str]] = {}

    def _tagset(self, tags: Mapping[str, str], resource_type: str, category: str,
                billing: str) -> tuple[str, str]:
        key = (tuple(sorted(tags.items())), resource_type, category, billing)
        found = self._ids.get(key)
        if found is None:
            dims = dict(tags)
            dims.update(category=category, resource_type=resource_type, billing=billing)
            canonical = tagset_json(dims)
            found = (tagset_id(canonical), canonical)
            if len(self._ids) >= _TAGSET_CACHE_MAX:
                self._ids.clear()
            self._ids[key] = found
        return found

    def price(self, events: Iterable[AnyEvent]) -> None:
        """Raise ``PricingError`` for the first event the book cannot price (no side effects)."""
        for index, event in enumerate(events):
            try:
                if isinstance(event, UsageEvent):
                    self.prices.charge(event)
                elif isinstance(event, FaultEvent):
                    self.prices.waste(event)
            except PricingError as exc:
                raise PricingError(exc.code, f"event {index}: {exc.reason}") from exc

    def fold(self, tally: Tally, events: Iterable[AnyEvent], skip: frozenset[bytes] = frozenset()
             ) -> None:
        """Add events to ``tally``; events whose digest is in ``skip`` or already folded are
        ignored (a resend inside the same batch counts once)."""
        seen = {d for d, _ in tally.digests}
        for event in events:
            digest = event_digest(event.event_id)
            if digest in skip or digest in seen:
                continue
            ts = event.unix_ts
            _FOLDERS[type(event)](self, tally, event, ts)
            seen.add(digest)
            tally.digests.append((digest, int(ts // 3600) * 3600))
            tally.events += 1

    def _usage(self, tally: Tally, event: UsageEvent, ts: float) -> None:
        charge = self.prices.charge(event)
        tsid, canonical = self._tagset(event.tags, event.resource_type, charge.category,
                                       charge.billing)
        tally.tagsets[tsid] = canonical
        tally.add(tsid, ts, COST, charge.cost_micro)
        tally.add(tsid, ts, QUANTITY, quantity_micro(event.quantity))

    def _fault(self, tally: Tally, event: FaultEvent, ts: float) -> None:
        price = self.prices.price_of(event.resource_type)
        tsid, canonical = self._tagset(event.tags, event.resource_type, price.category,
                                       price.billing)
        tally.tagsets[tsid] = canonical
        tally.add(tsid, ts, WASTE_PREFIX + event.fault.value, self.prices.waste(event))
        tally.faults.append((ts, event.model_dump_json(exclude_none=True)))

    def _utilization(self, tally: Tally, event: UtilizationEvent, ts: float) -> None:
        key = (event.resource_id, event.metric)
        tally.samples.setdefault(key, []).append((ts, event.value))
        latest = tally.latest.get(key)
        if latest is None or ts >= latest.ts:
            tally.latest[key] = Sample(ts, event.value, event.resource_type, dict(event.tags))


_FOLDERS: dict[type, Callable[[Folder, Tally, Any, float], None]] = {
    UsageEvent: Folder._usage,
    FaultEvent: Folder._fault,
    UtilizationEvent: Folder._utilization,
}
