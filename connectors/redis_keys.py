"""Where costline keeps its state in Redis, and the time buckets it sums into.

Every key of one home partition of the ledger shares the hash tag ``{NS:ledger:P}``, so a
partition's window, its offset watermark and its dedup memory live in one Redis Cluster slot
and are updated by one atomic script. Readers sum over the slots listed in ``NS:slots``
(which also lists the per-input-partition slots ``{NS:usage:P}`` and ``{NS:faults:P}`` of
earlier versions, still read).

The keys, their types and how long they live are listed in ``docs/STATE.md``.

Daily buckets are local dates in the zone the namespace records
(``costline.connectors.bucket_zone``);
hourly and 5-minute buckets are UTC-aligned. Every zone's offset is a whole number of quarter
hours today, so 5-minute slots align with every local midnight and any calendar period is
covered exactly.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from zoneinfo import ZoneInfo

SLOT_S = 300
HOUR_S = 3600


@dataclass(frozen=True)
class Retention:
    """Seconds a bucket key lives after its last write (bounded memory, documented above)."""

    five_min: int = 2 * 86400
    hour: int = 35 * 86400
    day: int = 400 * 86400


@dataclass(frozen=True)
class FirstsLogSize:
    """How much of the log of first-bucket changes (``S:first:log``) a slot keeps: its last
    ``entries`` entries, as long as they name at most ``named`` tag sets in all; a write that
    changes more than that is logged as "read them all". The log fills up to that and stays
    there (about 30 bytes a tag set it names: under 2 MB a slot). A reader that falls further
    behind reads in full."""

    entries: int = 10_000
    named: int = 50_000


def decoded(value: bytes | str) -> str:
    """A key, field or value as Redis returned it (bytes unless the client decodes) → text."""
    return value.decode() if isinstance(value, bytes) else value


LEDGER = "ledger"


def slot_tag(namespace: str, partition: int, source: str = LEDGER) -> str:
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


def first_version_key(slot: str) -> str:
    return f"{slot}:first:version"


def first_count_key(slot: str) -> str:
    return f"{slot}:first:count"


def first_log_key(slot: str) -> str:
    return f"{slot}:first:log"


def faults_key(slot: str) -> str:
    return f"{slot}:faults"


def record_key(slot: str, name: str) -> str:
    """A record set of a slot (``checkpoints``, ``restores``, ``runs``): a sorted set of the
    events as written, by event time."""
    return f"{slot}:rec:{name}"


def record_writes_key(slot: str, name: str) -> str:
    """How many writes a record set has had: it moves whenever the set may have changed."""
    return f"{record_key(slot, name)}:n"


def dedup_key(slot: str, hour: int) -> str:
    """The dedup table of an hour of event time: a hash of its size (``l``, ``s``) and of the
    events counted in that hour (``n``); its sets are ``<this key>:<i>``."""
    return f"{slot}:dd:{hour}"


def util_key(slot: str) -> str:
    return f"{slot}:util"


def history_key(slot: str, resource_id: str, metric: str) -> str:
    return f"{slot}:uh:{resource_id}\t{metric}"


def bucket_key(slot: str, size: str, label: str | int) -> str:
    return f"{slot}:b:{size}:{label}"


# A bucket's usage field of a tag set, ``<tag set id>:u``, holds "<gross> <quantity>" in
# micro-units, or "<gross> <quantity> <credits>" once it has credits (net cost is gross −
# credits); its waste fields are ``<tag set id>:w:<fault>``. (Buckets written before usage
# fields existed hold ``<tag set id>:c`` and ``<tag set id>:q`` instead; readers add both.)
USAGE = ":u"
LEGACY_USAGE = {"cost": ":c", "gross": ":c", "quantity": ":q"}


class Calendar:
    """Local dates of 5-minute slots in one time zone, cached (they are asked for per batch)."""

    def __init__(self, timezone: str) -> None:
        self.zone = ZoneInfo(timezone)
        self._dates: dict[int, str] = {}
        self._runs: dict[str, bool] = {}

    def date_of(self, slot: int) -> str:
        found = self._dates.get(slot)
        if found is None:
            if len(self._dates) > 100_000:
                self._dates.clear()
            found = self._dates[slot] = datetime.fromtimestamp(slot, self.zone).date().isoformat()
        return found

    def day_bounds(self, ts: float) -> tuple[int, int, str]:
        """[start, end) in Unix seconds of the local day containing ``ts``, and its date."""
        day = datetime.fromtimestamp(ts, self.zone).date()
        return self._midnight(day), self._midnight(day + timedelta(days=1)), day.isoformat()

    def is_one_run(self, day: str) -> bool:
        """Whether the slots dated ``day`` are exactly ``day_bounds`` of it, so its day bucket
        may stand for that interval. Not when the clocks went back over a midnight, from just
        after it to the day before (America/St_Johns until 2011: the dates of its slots go
        D-1, D, D-1, D), nor forward over one from before it (the day starts at the
        change, before its midnight read with the old offset)."""
        found = self._runs.get(day)
        if found is None:
            if len(self._runs) > 10_000:
                self._runs.clear()
            first = date.fromisoformat(day)
            found = self._runs[day] = (self._changes_once(first)
                                       and self._changes_once(first + timedelta(days=1)))
        return found

    def _changes_once(self, day: date) -> bool:
        """Whether the dates of slots turn to ``day`` at its first midnight and never back."""
        first = self._midnight(day)
        again = int(datetime.combine(day, time(0, fold=1), tzinfo=self.zone).timestamp())
        label = day.isoformat()
        if self.date_of(first - SLOT_S) == label:
            return False  # the day began before this midnight, at a change of offset
        # A second midnight is a repeat of the day only if the slot before it is in the day.
        return again <= first or self.date_of(again - SLOT_S) == label

    def _midnight(self, day: date) -> int:
        """The first instant of ``day``: with ``fold=0`` a midnight the clocks go back to
        (America/Havana, Atlantic/Azores) is its first occurrence, and a midnight they skip
        (America/Santiago) is read with the earlier offset, which lands on the first instant
        after the gap. A ``ts`` in the repeated hour must not start its day at the second
        midnight: that day bucket would hold the hour before it too."""
        return int(datetime.combine(day, time(0), tzinfo=self.zone).timestamp())


def cover(start: float, end: float, calendar: Calendar) -> Iterator[tuple[str, str | int]]:
    """The fewest buckets whose union is [start, end): whole local days, then whole hours,
    then 5-minute slots. ``start`` and ``end`` are rounded out to 5-minute boundaries.

    A day bucket holds every slot of its date, so it is taken only from the day's first
    midnight and only if those slots are one interval (``Calendar.is_one_run``). In a zone
    whose midnight falls on the half hour, an hour steps over a local midnight only when the
    day that starts there is not taken whole: the walk then reaches that day with 5-minute
    slots, and a question of whole UTC hours (an export, hourly charts) is answered from hours,
    which are kept 35 days where slots are kept two.
    """
    t = int(start // SLOT_S) * SLOT_S
    stop = -int(-end // SLOT_S) * SLOT_S
    while t < stop:
        day_start, day_end, day = calendar.day_bounds(t)
        if _takes_day(t, stop, calendar, (day_start, day_end, day)):
            yield "1d", day
            t = day_end
        elif t % HOUR_S == 0 and t + HOUR_S <= stop and (
                t + HOUR_S <= day_end
                or not _takes_day(day_end, stop, calendar, calendar.day_bounds(day_end))):
            yield "1h", t
            t += HOUR_S
        else:
            yield "5m", t
            t += SLOT_S


def _takes_day(t: int, stop: int, calendar: Calendar, bounds: tuple[int, int, str]) -> bool:
    """Whether the walk to ``stop`` takes the bucket of the local day ``bounds`` (``day_bounds``
    of ``t``) whole from ``t``."""
    day_start, day_end, day = bounds
    return t == day_start and day_end <= stop and calendar.is_one_run(day)
