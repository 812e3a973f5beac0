"""The ledger: every event, priced, on the home partition of its event id.

Keys of the input topics are free: a producer may key by host, by job or not at all, and may
resend an event in another batch, on another partition, from another client. Intake
therefore prices each input message and sends each of its events to the *home* partition of
its event id on the ledger topic (a utilization sample, which is never deduplicated, to its
resource's). Every copy of an event meets its first copy's dedup memory there, and a home
partition's dedup memory, sums and offset watermark live in one Redis slot, updated by one
atomic script (``costline.connectors.redis_apply``).

A message is priced whole or refused whole (``Intake.take``); once priced, its events are
independent entries. A ledger record is one msgpack message holding the tag sets its entries
name and the entries themselves:

* usage: ``(USAGE, dedup, slot, tag set, cost, quantity)``, cost signed (a credit is negative)
* fault: ``(FAULT, dedup, slot, tag set, fault type, waste, ts, the fault as JSON)``
* sample: ``(SAMPLE, resource id, metric, ts, value, resource type, tags)``
* record: ``(RECORD, dedup, slot, record set, ts, the event as JSON)``: a fact kept as written
  (a checkpoint, a restore, a run's end), not summed

A progress event is counted as usage with no cost: one usage entry per quantity it reports
(``costline.rules.runs``), each with the digest of the event id and its quantity's name, so a
resend counts each of them once.

``dedup`` is 63 bits of the event id's digest (a positive 64-bit integer, as Redis keeps it
in a compact integer set); ``slot`` is the start of the event's 5-minute slot. Amounts are
integer micro-units.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from json.encoder import encode_basestring as _quoted
from typing import Any

import msgpack

from costline.rules.events import (
    AnyEvent,
    ChargeKind,
    CheckpointEvent,
    FaultEvent,
    ProgressEvent,
    Rejection,
    RestoreEvent,
    RunEndEvent,
    UsageEvent,
    UtilizationEvent,
    parse_message,
)
from costline.rules.inventory import checkpoint_record, hourly_storage
from costline.rules.prices import MICRO, PriceBook, PricingError
from costline.rules.runs import (
    CHECKPOINTS,
    PROGRESS_BILLING,
    PROGRESS_CATEGORY,
    PROGRESS_SAMPLES,
    PROGRESS_STEPS,
    PROGRESS_TOKENS,
    RESTORES,
    RUN_ENDS,
)
from costline.rules.state import USAGE_CHARGE

SLOT_S = 300
USAGE, FAULT, SAMPLE, RECORD = 0, 1, 2, 3
# A ledger record holds at most this many entries (a few hundred KiB), so a take of large
# batches never makes a Kafka message near the topics' size limit.
RECORD_ENTRIES = 10_000
FORMAT = 1
RECORDS_FORMAT = 2
"""A ledger message holding record entries: a worker that does not know them skips the
message as unreadable instead of misreading it."""
# The cache of tag-set ids has two generations of at most this many entries each (~560 bytes
# an entry: the key, the id and the canonical JSON), so ~27 MiB at most.
_TAGSET_CACHE_MAX = 25_000
_LOW_64 = (1 << 64) - 1

Entry = tuple[Any, ...]


def tagset_json(dims: Mapping[str, str]) -> str:
    """Canonical JSON of a tag set: sorted keys, no spaces; its digest is the tag set id.

    The text of ``json.dumps(dims, sort_keys=True, separators=(",", ":"),
    ensure_ascii=False)``, built from the string quoting that call uses, without building an
    encoder on every call.
    """
    return "{" + ",".join([_quoted(k) + ":" + _quoted(v) for k, v in sorted(dims.items())]) + "}"


def tagset_id(canonical: str) -> str:
    return hashlib.blake2b(canonical.encode(), digest_size=8).hexdigest()


def event_key(event_id: str, partitions: int) -> tuple[int, int]:
    """(dedup digest, home partition) of an event id.

    The digest is 63 bits: collisions within one home partition's hour are about one in 10^17
    for a thousand events a second. The home comes from other bits of the same hash, so a home
    partition's digests are spread evenly over its dedup buckets.
    """
    value = int.from_bytes(hashlib.blake2b(event_id.encode(), digest_size=16).digest(), "big")
    # the first 8 bytes' top 63 bits; the last 8 bytes
    return value >> 65, (value & _LOW_64) % partitions


def resource_home(resource_id: str, partitions: int) -> int:
    """The home partition of a resource's utilization samples."""
    digest = hashlib.blake2b(resource_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % partitions


@dataclass(slots=True)
class Record:
    """One ledger message: entries for one home partition, and the tag sets they name."""

    tagsets: dict[str, str] = field(default_factory=dict)
    entries: list[Entry] = field(default_factory=list)

    def encode(self) -> bytes:
        flat = [x for pair in self.tagsets.items() for x in pair]
        version = RECORDS_FORMAT if any(e[0] == RECORD for e in self.entries) else FORMAT
        return msgpack.packb([version, flat, self.entries], use_bin_type=True)  # type: ignore[no-any-return]

    @classmethod
    def decode(cls, raw: bytes) -> Record:
        version, flat, entries = msgpack.unpackb(raw, raw=False, use_list=False,
                                                 strict_map_key=False)
        if version not in (FORMAT, RECORDS_FORMAT):
            raise ValueError(f"ledger record format {version}, this worker reads "
                             f"{FORMAT} and {RECORDS_FORMAT}")
        each = iter(flat)
        return cls(dict(zip(each, each, strict=True)), list(entries))


@dataclass(slots=True)
class Taken:
    """A take of input messages priced: the refused ones as (index, code, reason), and for
    each home partition its records, encoded."""

    refused: list[tuple[int, str, str]]
    records: dict[int, list[bytes]]
    events: int


class Intake:
    """Parses, prices and routes input messages; caches tag-set identities (bounded)."""

    def __init__(self, prices: PriceBook, partitions: int) -> None:
        self.prices = prices
        self.partitions = partitions
        self._ids: dict[tuple[str, ...], tuple[str, str]] = {}
        self._older: dict[tuple[str, ...], tuple[str, str]] = {}
        self._homes: dict[str, int] = {}

    def take(self, values: Sequence[bytes], now: float | None = None) -> Taken:
        """Price a take of messages. A message is refused whole (an invalid event, one the
        book cannot price) or all its events become entries; an event sent twice within the
        take goes twice to its home, which counts it once."""
        refused: list[tuple[int, str, str]] = []
        records: dict[int, Record] = {}
        events = 0
        for index, value in enumerate(values):
            verdict = parse_message(value, now)
            if isinstance(verdict, Rejection):
                refused.append((index, verdict.code, verdict.reason))
                continue
            try:
                events += self.route(verdict.events, verdict.times, records)
            except PricingError as exc:
                refused.append((index, exc.code, exc.reason))
        return Taken(refused, {home: list(_encoded(record)) for home, record in records.items()},
                     events)

    def route(self, events: Sequence[AnyEvent], times: Sequence[float] | None = None,
              records: dict[int, Record] | None = None) -> int:
        """Price parsed events (one message) and add each to its home partition's record in
        ``records``; returns how many. Raises ``PricingError`` naming the first event the
        book cannot price, before any is added: a message is counted whole or not at all."""
        if times is None:
            times = [event.unix_ts for event in events]
        priced = []
        for index, event in enumerate(events):
            try:
                priced.append(_ENTRIES[type(event)](self, event, times[index]))
            except PricingError as exc:
                raise PricingError(exc.code, f"event {index}: {exc.reason}") from exc
        if records is None:
            records = {}
        for home, entry, tagset in priced:
            record = records.get(home)
            if record is None:
                record = records[home] = Record()
            if entry[0] == PROGRESS:
                for part, named in zip(entry[1], tagset, strict=True):
                    record.entries.append(part)
                    record.tagsets[named[0]] = named[1]
                continue
            record.entries.append(entry)
            if tagset is not None:
                record.tagsets[tagset[0]] = tagset[1]
        return len(priced)

    def records(self, events: Sequence[AnyEvent]) -> dict[int, Record]:
        """Parsed events priced into one record per home partition (rule tests, tools)."""
        records: dict[int, Record] = {}
        self.route(events, None, records)
        return records

    def _tagset(self, tags: Mapping[str, str], resource_type: str, category: str,
                billing: str, charge: str) -> tuple[str, str]:
        # Keyed by the tags in the order they came: producers repeat their order, and the id
        # is computed from the sorted, canonical form, so order never splits a set.
        key = (*tags, *tags.values(), resource_type, category, billing, charge)
        found = self._ids.get(key)
        if found is None:
            # Two generations: when the young one is full it becomes the old one and the
            # previous old one is dropped; a tag set found in the old one moves back. The
            # popular tag sets are never worked out again, however many rare ones pass.
            found = self._older.get(key)
            if found is None:
                dims = dict(tags)
                dims.update(category=category, resource_type=resource_type, billing=billing)
                if charge != USAGE_CHARGE:
                    dims["charge"] = charge
                else:  # readers take a tag set without one as usage, whatever its tags say
                    dims.pop("charge", None)
                canonical = tagset_json(dims)
                found = (tagset_id(canonical), canonical)
            if len(self._ids) >= _TAGSET_CACHE_MAX:
                self._older, self._ids = self._ids, {}
            self._ids[key] = found
        return found

    def _usage(self, event: UsageEvent, ts: float
               ) -> tuple[int, Entry, tuple[str, str]]:
        charge = self.prices.charge(event)
        tagset = self._tagset(event.tags, event.resource_type, charge.category, charge.billing,
                              _CHARGE_NAMES[charge.charge])
        dedup, home = event_key(event.event_id, self.partitions)
        slot = int(ts // SLOT_S) * SLOT_S
        return home, (USAGE, dedup, slot, tagset[0], charge.cost_micro,
                      charge.quantity_micro), tagset

    def _fault(self, event: FaultEvent, ts: float) -> tuple[int, Entry, tuple[str, str]]:
        waste = self.prices.waste(event)
        price = self.prices.price_of(event.resource_type)
        tagset = self._tagset(event.tags, event.resource_type, price.category, price.billing,
                              USAGE_CHARGE)
        dedup, home = event_key(event.event_id, self.partitions)
        slot = int(ts // SLOT_S) * SLOT_S
        return home, (FAULT, dedup, slot, tagset[0], event.fault.value, waste, ts,
                      event.model_dump_json(exclude_none=True)), tagset

    def _progress(self, event: ProgressEvent, ts: float
                  ) -> tuple[int, Entry, list[tuple[str, str]]]:
        """One no-cost usage entry per quantity: tokens and samples in millions (a micro-unit
        is one), steps as steps."""
        quantities = [(PROGRESS_TOKENS, event.tokens), (PROGRESS_STEPS, event.steps * MICRO)]
        if event.samples is not None:
            quantities.append((PROGRESS_SAMPLES, event.samples))
        _, home = event_key(event.event_id, self.partitions)
        slot = int(ts // SLOT_S) * SLOT_S
        entries, tagsets = [], []
        for resource_type, micro in quantities:
            tagset = self._tagset(event.tags, resource_type, PROGRESS_CATEGORY, PROGRESS_BILLING,
                                  USAGE_CHARGE)
            dedup, _ = event_key(f"{event.event_id}#{resource_type}", self.partitions)
            entries.append((USAGE, dedup, slot, tagset[0], 0, micro))
            tagsets.append(tagset)
        return home, (PROGRESS, entries), tagsets

    def _record(self, name: str, event: AnyEvent, ts: float, text: str | None = None
                ) -> tuple[int, Entry, None]:
        dedup, home = event_key(event.event_id, self.partitions)
        slot = int(ts // SLOT_S) * SLOT_S
        if text is None:
            text = event.model_dump_json(exclude_none=True)
        return home, (RECORD, dedup, slot, name, ts, text), None

    def _checkpoint(self, event: CheckpointEvent, ts: float) -> tuple[int, Entry, None]:
        """Kept with what its tier costs per hour for its bytes; a tier the book does not
        price per GB-hour is refused."""
        self.prices.storage_price(event.tier)
        hourly = hourly_storage(self.prices, event.tier, event.bytes)
        return self._record(CHECKPOINTS, event, ts, checkpoint_record(event, hourly))

    def _restore(self, event: RestoreEvent, ts: float) -> tuple[int, Entry, None]:
        return self._record(RESTORES, event, ts)

    def _run_end(self, event: RunEndEvent, ts: float) -> tuple[int, Entry, None]:
        return self._record(RUN_ENDS, event, ts)

    def _sample(self, event: UtilizationEvent, ts: float) -> tuple[int, Entry, None]:
        home = self._homes.get(event.resource_id)
        if home is None:
            if len(self._homes) >= _TAGSET_CACHE_MAX:
                self._homes.clear()
            home = self._homes[event.resource_id] = resource_home(event.resource_id,
                                                                  self.partitions)
        return home, (SAMPLE, event.resource_id, event.metric, ts, event.value,
                      event.resource_type, dict(event.tags)), None


_CHARGE_NAMES = {kind: kind.value for kind in ChargeKind}

_ENTRIES: dict[type, Callable[[Intake, Any, float], tuple[int, Entry, Any]]] = {
    UsageEvent: Intake._usage,
    FaultEvent: Intake._fault,
    UtilizationEvent: Intake._sample,
    ProgressEvent: Intake._progress,
    CheckpointEvent: Intake._checkpoint,
    RestoreEvent: Intake._restore,
    RunEndEvent: Intake._run_end,
}
PROGRESS = -1
"""Marks a priced progress event, whose usage entries ``Intake.route`` adds one by one."""


def _encoded(record: Record) -> Iterator[bytes]:
    """A record as one or more ledger messages of at most ``RECORD_ENTRIES`` entries, each
    naming the tag sets of its own entries."""
    if len(record.entries) <= RECORD_ENTRIES:
        yield record.encode()
        return
    for start in range(0, len(record.entries), RECORD_ENTRIES):
        part = record.entries[start:start + RECORD_ENTRIES]
        named = {entry[3] for entry in part if entry[0] in (USAGE, FAULT)}
        yield Record({t: record.tagsets[t] for t in named}, part).encode()
