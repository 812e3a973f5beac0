"""Where costline keeps its state in Redis, and the time buckets it sums into.

Every key of one input partition shares the hash tag ``{NS:SRC:P}`` (``SRC`` is ``usage`` or
``faults``), so a partition's batch, its offset watermark and its dedup memory live in one
Redis Cluster slot and can be updated by one atomic script. Readers sum over the partitions
listed in ``NS:slots``.

The keys, their types and how long they live are listed in ``docs/STATE.md``.

Daily buckets are local dates in the zone the namespace records (``connectors.bucket_zone``);
hourly and 5-minute buckets are UTC-aligned. Every zone's offset is a whole number of quarter
hours today, so 5-minute slots align with every local midnight and any calendar period is
covered exactly.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

SLOT_S = 300
HOUR_S = 3600


@dataclass(frozen=True)
class Retention:
    """Seconds a bucket key lives after its last write (bounded memory, documented above)."""

    five_min: int = 2 * 86400
    hour: int = 35 * 86400
    day: int = 400 * 86400


def slot_tag(namespace: str, source: str, partition: int) -> str:
    return f"{{{namespace}:{source}:{partition}}}"


def slots_key(namespace: str) -> str:
    return f"{namespace}:slots"


def meta_key(namespace: str) -> str:
    return f"{namespace}:meta"


def wm_key(slot: str) -> str:
    return f"{slot}:wm"


def tagsets_key(slot: str) -> str:
    return f"{slot}:tagsets"


def first_seen_key(slot: str) -> str:
    return f"{slot}:first"


def faults_key(slot: str) -> str:
    return f"{slot}:faults"


def seen_key(slot: str, hour: int) -> str:
    return f"{slot}:seen:{hour}"


def util_key(slot: str) -> str:
    return f"{slot}:util"


def history_key(slot: str, resource_id: str, metric: str) -> str:
    return f"{slot}:uh:{resource_id}\t{metric}"


def bucket_key(slot: str, size: str, label: str | int) -> str:
    return f"{slot}:b:{size}:{label}"


class Calendar:
    """Local dates of 5-minute slots in one time zone, cached (they are asked for per batch)."""

    def __init__(self, timezone: str) -> None:
        self.zone = ZoneInfo(timezone)
        self._dates: dict[int, str] = {}

    def date_of(self, slot: int) -> str:
        found = self._dates.get(slot)
        if found is None:
            if len(self._dates) > 100_000:
                self._dates.clear()
            found = self._dates[slot] = datetime.fromtimestamp(slot, self.zone).date().isoformat()
        return found

    def day_bounds(self, ts: float) -> tuple[int, int, str]:
        """[start, end) in Unix seconds of the local day containing ``ts``, and its date."""
        local = datetime.fromtimestamp(ts, self.zone)
        start = local.replace(hour=0, minute=0, second=0, microsecond=0)
        end = (start + timedelta(days=1)).replace(tzinfo=None).replace(tzinfo=self.zone)
        return int(start.timestamp()), int(end.timestamp()), start.date().isoformat()


def cover(start: float, end: float, calendar: Calendar) -> Iterator[tuple[str, str | int]]:
    """The fewest buckets whose union is [start, end): whole local days, then whole hours,
    then 5-minute slots. ``start`` and ``end`` are rounded out to 5-minute boundaries.

    An hour never steps over a local midnight, so in a zone whose midnight falls on the half
    hour the walk still reaches it with 5-minute slots and takes the day bucket from there.
    """
    t = int(start // SLOT_S) * SLOT_S
    stop = -int(-end // SLOT_S) * SLOT_S
    while t < stop:
        day_start, day_end, date = calendar.day_bounds(t)
        if t == day_start and day_end <= stop:
            yield "1d", date
            t = day_end
        elif t % HOUR_S == 0 and t + HOUR_S <= min(stop, day_end):
            yield "1h", t
            t += HOUR_S
        else:
            yield "5m", t
            t += SLOT_S
