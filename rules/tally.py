"""Folding ledger entries into sums: what one Redis write of a home partition adds.

A *tally* sums, per tag set and 5-minute slot of event time, the gross spend (positive
charges), the credits (negative charges, kept as a positive amount), the usage quantity and
the waste per fault type, all in integer micro-units; it also keeps each counted event's dedup
digest under its event-time hour, the utilization samples, the fault records and the records
kept as written (checkpoints, restores, run ends: ``records``). Coarser
buckets (hour, day) are sums of slots, worked out by the writer.

An event whose digest the tally already holds, or that Redis said was counted (``skip``), is
not folded again: a resend counts once.
"""

from __future__ import annotations

from collections.abc import Iterable, Set
from dataclasses import dataclass, field

from costline.rules.ledger import FAULT, RECORD, SAMPLE, USAGE, Entry, Record

HOUR_S = 3600


@dataclass(slots=True)
class Usage:
    """The usage of one tag set in one slot."""

    gross: int = 0
    credits: int = 0
    quantity: int = 0


@dataclass(slots=True)
class Sample:
    """The latest utilization reading of one resource and metric."""

    ts: float
    value: float
    resource_type: str
    tags: dict[str, str]


@dataclass
class Tally:
    """What a window of ledger records adds to Redis."""

    usage: dict[tuple[str, int], Usage] = field(default_factory=dict)
    waste: dict[tuple[str, int, str], int] = field(default_factory=dict)
    tagsets: dict[str, str] = field(default_factory=dict)
    # dedup digest of every counted event, by the hour of its event time
    digests: dict[int, list[int]] = field(default_factory=dict)
    seen: set[int] = field(default_factory=set)
    samples: dict[tuple[str, str], list[tuple[float, float]]] = field(default_factory=dict)
    latest: dict[tuple[str, str], Sample] = field(default_factory=dict)
    faults: list[tuple[float, str]] = field(default_factory=list)
    # (record set, ts, the event as JSON) of every counted record entry
    records: list[tuple[str, float, str]] = field(default_factory=list)

    @property
    def events(self) -> int:
        """Events counted (a utilization sample is not: it is a gauge, never deduplicated)."""
        return len(self.seen)

    @property
    def empty(self) -> bool:
        return not (self.seen or self.samples)

    def fold(self, records: Iterable[Record], skip: Set[int] = frozenset()) -> None:
        """Add the entries of ``records``, in order; an event already folded or in ``skip``
        is ignored."""
        seen, digests, tagsets = self.seen, self.digests, self.tagsets
        for record in records:
            named = record.tagsets
            for entry in record.entries:
                kind = entry[0]
                if kind == SAMPLE:
                    self._sample(entry)
                    continue
                dedup = entry[1]
                if dedup in seen or dedup in skip:
                    continue
                seen.add(dedup)
                slot = entry[2]
                hour = slot - slot % HOUR_S
                hourly = digests.get(hour)
                if hourly is None:
                    digests[hour] = [dedup]
                else:
                    hourly.append(dedup)
                if kind == RECORD:
                    self.records.append((entry[3], entry[4], entry[5]))
                    continue
                tsid = entry[3]
                if tsid not in tagsets:
                    tagsets[tsid] = named[tsid]
                if kind == USAGE:
                    self._usage(tsid, slot, entry)
                elif kind == FAULT:
                    self._fault(tsid, slot, entry)

    def _usage(self, tsid: str, slot: int, entry: Entry) -> None:
        cell = self.usage.get((tsid, slot))
        if cell is None:
            cell = self.usage[(tsid, slot)] = Usage()
        cost = entry[4]
        if cost >= 0:
            cell.gross += cost
        else:
            cell.credits -= cost
        cell.quantity += entry[5]

    def _fault(self, tsid: str, slot: int, entry: Entry) -> None:
        key = (tsid, slot, entry[4])
        self.waste[key] = self.waste.get(key, 0) + entry[5]
        self.faults.append((entry[6], entry[7]))

    def _sample(self, entry: Entry) -> None:
        _, resource_id, metric, ts, value, resource_type, tags = entry
        key = (resource_id, metric)
        points = self.samples.get(key)
        if points is None:
            self.samples[key] = [(ts, value)]
        else:
            points.append((ts, value))
        latest = self.latest.get(key)
        if latest is None or ts >= latest.ts:
            self.latest[key] = Sample(ts, value, resource_type, tags)


def tally_of(records: Iterable[Record], skip: Set[int] = frozenset()) -> Tally:
    tally = Tally()
    tally.fold(records, skip)
    return tally
