"""Durations, money and calendar periods as rule files write them.

People write ``15m`` and ``10000``; the engine works in whole seconds and integer micro-units,
so every comparison is exact. The pydantic types below carry their own JSON Schema, which is
what editors see through ``costline rules schema``.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal, InvalidOperation
from typing import Annotated, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import AfterValidator, PlainValidator, WithJsonSchema
from pydantic_core import PydanticCustomError

from costline.rules.prices import exact, to_micro

_UNIT_SECONDS = (("w", 604_800), ("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1))
_DURATION = re.compile(r"^(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
DURATION_PATTERN = _DURATION.pattern
MAX_DURATION_S = 400 * 86_400


def parse_duration(text: str) -> int:
    """``30s``, ``15m``, ``2h``, ``7d``, ``1w`` or a descending mix (``1h30m``) → seconds."""
    found = _DURATION.match(text.strip())
    if not text.strip() or found is None:
        raise ValueError(f"bad duration {text!r}: write it like 30s, 15m, 2h or 7d")
    seconds = sum(
        int(count) * size
        for count, (_, size) in zip(found.groups(), _UNIT_SECONDS, strict=True)
        if count
    )
    if seconds > MAX_DURATION_S:
        raise ValueError(f"bad duration {text!r}: longer than 400 days")
    return seconds


def format_duration(seconds: int) -> str:
    """Seconds → the shortest duration text that parses back to them: 5400 → ``1h30m``."""
    if seconds == 0:
        return "0s"
    parts = []
    rest = seconds
    for unit, size in _UNIT_SECONDS:
        count, rest = divmod(rest, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


def _duration(value: object) -> int:
    if not isinstance(value, str):
        raise PydanticCustomError(
            "duration", "a duration is text like 30s, 15m, 2h or 7d, got {value}", {"value": value}
        )
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise PydanticCustomError("duration", "{reason}", {"reason": str(exc)}) from exc


def _positive(seconds: int) -> int:
    if seconds <= 0:
        raise PydanticCustomError("duration", "the duration must be longer than 0s")
    return seconds


_DURATION_SCHEMA = {
    "type": "string",
    "pattern": DURATION_PATTERN,
    "examples": ["30s", "15m", "2h", "7d"],
}

Duration = Annotated[int, PlainValidator(_duration), WithJsonSchema(_DURATION_SCHEMA)]
"""Seconds, written as ``30s``/``15m``/``2h``/``7d``; ``0s`` allowed."""

PositiveDuration = Annotated[
    int,
    PlainValidator(_duration),
    AfterValidator(_positive),
    WithJsonSchema(_DURATION_SCHEMA),
]
"""A duration longer than zero: idle time, grace periods."""


def _whole_buckets(seconds: int) -> int:
    if seconds % 300:
        raise PydanticCustomError("duration", "the duration must be a whole multiple of 5m")
    return seconds


WindowDuration = Annotated[
    int,
    PlainValidator(_duration),
    AfterValidator(_positive),
    AfterValidator(_whole_buckets),
    WithJsonSchema(_DURATION_SCHEMA),
]
"""A window of whole 5-minute buckets, the granularity the stores answer at."""


def _money(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        raise PydanticCustomError(
            "money", "an amount of money is a number, got {value}", {"value": repr(value)}
        )
    try:
        amount = exact(value)
    except InvalidOperation as exc:
        raise PydanticCustomError("money", "not a number") from exc
    if not amount.is_finite() or amount < 0:
        raise PydanticCustomError("money", "an amount of money is a finite number >= 0")
    return to_micro(amount)


Money = Annotated[
    int, PlainValidator(_money), WithJsonSchema({"type": "number", "minimum": 0})
]
"""An amount in the price book's currency, held as integer micro-units."""


def _zone(value: str) -> str:
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise PydanticCustomError(
            "time_zone", "unknown IANA time zone {value}", {"value": repr(value)}
        ) from exc
    return value


TimeZoneName = Annotated[str, AfterValidator(_zone)]
"""An IANA zone name such as ``Europe/Berlin``."""

Period = Literal["day", "week", "month"]


def _next_start(start: date, period: Period) -> date:
    if period == "day":
        return start + timedelta(days=1)
    if period == "week":
        return start + timedelta(days=7)
    year, month = divmod(start.year * 12 + start.month, 12)
    return date(year, month + 1, 1)


def _first_day(today: date, period: Period) -> date:
    if period == "week":
        return today - timedelta(days=today.weekday())
    if period == "month":
        return today.replace(day=1)
    return today


def period_bounds(now: float, period: Period, zone: str) -> tuple[float, float]:
    """The calendar period containing ``now`` as [start, end) Unix seconds.

    Periods start at local midnight in ``zone`` (weeks on Monday, months on the 1st), so a
    budget day in Asia/Shanghai runs 16:00–16:00 UTC and a DST change makes a day 23 or 25
    hours long, as the people paying the bill count it.
    """
    tz = ZoneInfo(zone)
    first = _first_day(datetime.fromtimestamp(now, tz).date(), period)
    start = datetime.combine(first, time(), tz)
    end = datetime.combine(_next_start(first, period), time(), tz)
    return start.timestamp(), end.timestamp()


def rfc3339(ts: float) -> str:
    """Unix seconds → RFC 3339 in UTC with a ``Z``, seconds precision."""
    return datetime.fromtimestamp(int(ts), UTC).isoformat().replace("+00:00", "Z")


def parse_time(value: str | float | int | datetime) -> float:
    """RFC 3339 with an offset, a datetime with a zone, or Unix seconds → Unix seconds."""
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, int | float):
        return float(value)
    else:
        text = value.strip()
        try:
            return float(text)
        except ValueError:
            moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        raise ValueError(f"time {value!s} has no offset; write it like 2026-11-30T08:00:00Z")
    return moment.timestamp()


MOMENT_FORMS = ("RFC 3339 with an offset (2026-11-30T08:00:00Z), Unix seconds, now, today, "
                "yesterday, or a time ago such as -2h or -7d")


def parse_moment(text: str, now: float, zone: str) -> float:
    """A moment as people ask for one on the command line: what ``parse_time`` reads, or
    ``now``, ``today`` and ``yesterday`` (their local midnight in ``zone``: a moment inside
    that day, week or month), or a time ago (``-2h``, ``-7d``)."""
    word = text.strip().lower()
    if word == "now":
        return now
    if word in ("today", "yesterday"):
        day = datetime.fromtimestamp(now, ZoneInfo(zone)).date()
        if word == "yesterday":
            day -= timedelta(days=1)
        return datetime.combine(day, time(), ZoneInfo(zone)).timestamp()
    if word.startswith("-") and _DURATION.match(word[1:]):
        return now - parse_duration(word[1:])
    try:
        return parse_time(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a time: write {MOMENT_FORMS}") from None
