"""Folding priced events into per-tag-set sums: the pure half of the aggregation.

An event's *dimensions* are its tags plus the pseudo-tags ``category``, ``resource_type`` and
``billing`` (they win over a tag of the same name). A distinct set of dimensions is a *tag
set*, named by a short stable digest. Spend, usage quantity and waste are summed per tag set
and per 5-minute slot of event time; coarser buckets (hour, day) are sums of slots and are
derived by the store. Everything is integer micro-units.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from json.encoder import encode_basestring as _quoted
from typing import Any

from costline.rules.events import AnyEvent, FaultEvent, UsageEvent, UtilizationEvent
from costline.rules.prices import Charge, PriceBook, PricingError

SLOT_S = 300
PSEUDO_TAGS = ("category", "resource_type", "billing")
COST, QUANTITY = "c", "q"
WASTE_PREFIX = "w:"
# The cache of tag-set ids has two generations of at most this many entries each. An entry (the
# key, the id, the canonical JSON) takes ~560 bytes with the throughput bench's tag sets
# (tracemalloc), so ~27 MiB at most, whatever the tag count (see ``Folder._tagset``).
_TAGSET_CACHE_MAX = 25_000


def tagset_json(dims: Mapping[str, str]) -> str:
    """Canonical JSON of a tag set: sorted keys, no spaces; its digest is the tag set id.

    The text of ``json.dumps(dims, sort_keys=True, separators=(",", ":"),
    ensure_ascii=False)``, built from the string quoting that call uses, in two thirds of its
    time: ``dumps`` with options builds an encoder on every call.
    """
    return "{" + ",".join([_quoted(k) + ":" + _quoted(v) for k, v in sorted(dims.items())]) + "}"


def tagset_id(canonical: str) -> str:
    return hashlib.blake2b(canonical.encode(), digest_size=8).hexdigest()


def event_digest(event_id: str) -> bytes:
    """What the dedup memory keeps of an event id: 12 bytes, collision-free in practice."""
    return hashlib.blake2b(event_id.encode(), digest_size=12).digest()


@dataclass(slots=True)
class Sample:
    """The latest utilization reading of one resource and metric in a batch."""

    ts: float
    value: float
    resource_type: str
    tags: dict[str, str]


@dataclass(slots=True)  # not frozen: a frozen dataclass is built field by field, slowly
class Priced:
    """An event ready to fold, with everything the fold needs worked out once: its time,
    its dedup digest, and what the book says it adds (a ``Charge`` for usage, the waste in
    micro-units for a fault, nothing for a utilization sample). A batch folded again without
    some duplicates does none of this work twice."""

    event: AnyEvent
    amount: Charge | int | None
    ts: float
    digest: bytes


@dataclass
class Tally:
    """Sums of one batch: (tag set id, slot start) → {measure: micro-units}.

    ``digests`` holds each counted event's dedup digest under its event-time hour, so the
    store can refuse a batch whose event was already counted and the worker can fold it again
    without that event.
    """

    sums: dict[tuple[str, int], dict[str, int]] = field(default_factory=dict)
    tagsets: dict[str, str] = field(default_factory=dict)
    digests: dict[int, list[bytes]] = field(default_factory=dict)
    # The digests above as one set: a window is folded into take after take, so resends are
    # found without rebuilding it each time.
    seen: set[bytes] = field(default_factory=set)
    samples: dict[tuple[str, str], list[tuple[float, float]]] = field(default_factory=dict)
    latest: dict[tuple[str, str], Sample] = field(default_factory=dict)
    faults: list[tuple[float, str]] = field(default_factory=list)
    events: int = 0

    def add(self, tsid: str, slot: int, measure: str, micro: int) -> None:
        """Add to one measure of a tag set's sums in the 5-minute slot starting at ``slot``."""
        cell = self.sums.setdefault((tsid, slot), {})
        cell[measure] = cell.get(measure, 0) + micro

    def absorb(self, later: Tally) -> None:
        """Add the tally of later events, none of them in this one (their digests are
        disjoint): the same as folding them here after this one's. ``later`` is used up (its
        cells and lists become this one's)."""
        sums = self.sums
        for key, cell in later.sums.items():
            mine = sums.get(key)
            if mine is None:
                sums[key] = cell
            else:
                for measure, micro in cell.items():
                    mine[measure] = mine.get(measure, 0) + micro
        self.tagsets.update(later.tagsets)
        for hour, digests in later.digests.items():
            hourly = self.digests.get(hour)
            if hourly is None:
                self.digests[hour] = digests
            else:
                hourly += digests
        self.seen |= later.seen
        for metric, samples in later.samples.items():
            self.samples.setdefault(metric, []).extend(samples)
        for metric, sample in later.latest.items():
            latest = self.latest.get(metric)
            if latest is None or sample.ts >= latest.ts:  # as a later fold would keep it
                self.latest[metric] = sample
        self.faults += later.faults
        self.events = len(self.seen)

    def packed(self) -> list[Any]:
        """The tally as plain lists, maps, numbers and strings (for msgpack; ``unpacked``
        rebuilds it). ``seen`` is not sent: it is the digests again."""
        return [
            [x for (tsid, slot), cell in self.sums.items() for x in (tsid, slot, cell)],
            self.tagsets, self.digests,
            [[*key, samples] for key, samples in self.samples.items()],
            [[*key, s.ts, s.value, s.resource_type, s.tags] for key, s in self.latest.items()],
            self.faults,
        ]

    @classmethod
    def unpacked(cls, data: list[Any]) -> Tally:
        sums, tagsets, digests, samples, latest, faults = data
        each = iter(sums)
        tally = cls(
            sums={(tsid, slot): cell for tsid, slot, cell in zip(each, each, each, strict=True)},
            tagsets=tagsets, digests=digests,
            samples={(rid, metric): [tuple(x) for x in taken] for rid, metric, taken in samples},
            latest={(rid, metric): Sample(ts, value, rt, tags)
                    for rid, metric, ts, value, rt, tags in latest},
            faults=[tuple(fault) for fault in faults],
        )
        for hourly in digests.values():
            tally.seen.update(hourly)
        tally.events = len(tally.seen)
        return tally


class Folder:
    """Prices and folds events; caches tag-set identities across batches (bounded)."""

    def __init__(self, prices: PriceBook) -> None:
        self.prices = prices
        self._ids: dict[tuple[str, ...], tuple[str, str]] = {}
        self._older: dict[tuple[str, ...], tuple[str, str]] = {}

    def _tagset(self, tags: Mapping[str, str], resource_type: str, category: str,
                billing: str) -> tuple[str, str]:
        # Keyed by the tags in the order they came: producers repeat their order, and the
        # id itself is computed from the sorted, canonical form, so order never splits a set.
        # One flat tuple, the keys then the values (its length says how many of each), builds
        # and hashes faster than a tuple of (key, value) pairs: 1.11 against 1.36 µs per event
        # for building the key and looking it up (timeit, the throughput bench's events).
        key = (*tags, *tags.values(), resource_type, category, billing)
        found = self._ids.get(key)
        if found is None:
            # Two generations: when the young one is full it becomes the old one and the
            # previous old one is dropped; a tag set found in the old one moves back. The
            # popular tag sets, most of the events, are never worked out again, however
            # many rare ones pass (clearing one full dict made them all misses at once).
            found = self._older.get(key)
            if found is None:
                dims = dict(tags)
                dims.update(category=category, resource_type=resource_type, billing=billing)
                canonical = tagset_json(dims)
                found = (tagset_id(canonical), canonical)
            if len(self._ids) >= _TAGSET_CACHE_MAX:
                self._older, self._ids = self._ids, {}
            self._ids[key] = found
        return found

    def price(self, events: Sequence[AnyEvent],
              times: Sequence[float] | None = None) -> list[Priced]:
        """Price every event of a message, or raise ``PricingError`` naming the first one the
        book cannot price (a message is counted whole or not at all). ``times`` are the events'
        Unix times when the parser already worked them out."""
        if times is None:
            times = [event.unix_ts for event in events]
        priced: list[Priced] = []
        append = priced.append
        for index, event in enumerate(events):
            try:
                amount = _PRICERS[type(event)](self.prices, event)
            except PricingError as exc:
                raise PricingError(exc.code, f"event {index}: {exc.reason}") from exc
            append(Priced(event, amount, times[index], event_digest(event.event_id)))
        return priced

    def fold(self, tally: Tally, events: Iterable[AnyEvent | Priced],
             skip: Set[bytes] = frozenset()) -> None:
        """Add events to ``tally``; events whose digest is in ``skip`` or already folded are
        ignored (a resend inside the same batch counts once)."""
        seen, digests = tally.seen, tally.digests
        folders = _FOLDERS
        for item in events:
            priced = item if type(item) is Priced else self.price([item])[0]  # type: ignore[list-item]
            digest = priced.digest
            if digest in skip or digest in seen:
                continue
            seen.add(digest)
            # The slot is worked out once here, for the event's folder and its hour.
            slot = int(priced.ts // SLOT_S) * SLOT_S
            folders[type(priced.event)](self, tally, priced, slot)
            hour = slot - slot % 3600  # an hour is twelve whole slots
            hourly = digests.get(hour)
            if hourly is None:
                digests[hour] = [digest]
            else:
                hourly.append(digest)
        tally.events = len(seen)

    def _usage(self, tally: Tally, priced: Priced, slot: int) -> None:
        event: UsageEvent = priced.event  # type: ignore[assignment]
        charge: Charge = priced.amount  # type: ignore[assignment]
        tsid, canonical = self._tagset(event.tags, event.resource_type, charge.category,
                                       charge.billing)
        tally.tagsets[tsid] = canonical
        cell = tally.sums.get((tsid, slot))
        if cell is None:  # most of a window's cells are new: one dict built whole
            tally.sums[(tsid, slot)] = {COST: charge.cost_micro, QUANTITY: charge.quantity_micro}
        else:  # a fault of the same tag set may have made the cell
            cell[COST] = cell.get(COST, 0) + charge.cost_micro
            cell[QUANTITY] = cell.get(QUANTITY, 0) + charge.quantity_micro

    def _fault(self, tally: Tally, priced: Priced, slot: int) -> None:
        event: FaultEvent = priced.event  # type: ignore[assignment]
        price = self.prices.price_of(event.resource_type)
        tsid, canonical = self._tagset(event.tags, event.resource_type, price.category,
                                       price.billing)
        tally.tagsets[tsid] = canonical
        tally.add(tsid, slot, WASTE_PREFIX + event.fault.value, priced.amount)  # type: ignore[arg-type]
        tally.faults.append((priced.ts, event.model_dump_json(exclude_none=True)))

    def _utilization(self, tally: Tally, priced: Priced, slot: int) -> None:
        event: UtilizationEvent = priced.event  # type: ignore[assignment]
        key, ts = (event.resource_id, event.metric), priced.ts
        tally.samples.setdefault(key, []).append((ts, event.value))
        latest = tally.latest.get(key)
        if latest is None or ts >= latest.ts:
            tally.latest[key] = Sample(ts, event.value, event.resource_type, dict(event.tags))


_PRICERS: dict[type, Callable[[PriceBook, Any], Any]] = {
    UsageEvent: PriceBook.charge,
    FaultEvent: PriceBook.waste,
    UtilizationEvent: lambda book, event: None,
}

_FOLDERS: dict[type, Callable[[Folder, Tally, Priced, int], None]] = {
    UsageEvent: Folder._usage,
    FaultEvent: Folder._fault,
    UtilizationEvent: Folder._utilization,
}
