"""Time buckets: local dates of slots, and the fewest buckets that cover a range."""

from __future__ import annotations

from datetime import date, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costline.connectors.redis_keys import Calendar, cover

ZONES = ["UTC", "Asia/Shanghai", "Asia/Kolkata", "Asia/Kathmandu", "America/New_York",
         "America/Santiago", "Australia/Lord_Howe", "Pacific/Chatham", "America/St_Johns"]
SIZES = {"5m": 300, "1h": 3600}


def at(text: str) -> int:
    """Unix seconds of an RFC 3339 time with an offset."""
    return int(datetime.fromisoformat(text).timestamp())


def midnight(day: date, zone: ZoneInfo) -> int:
    return int(datetime.combine(day, time(0), tzinfo=zone).timestamp())


def interval(bucket: tuple[str, str | int], zone: ZoneInfo) -> tuple[int, int]:
    """[start, end) in Unix seconds of a bucket, computed independently of the code under test."""
    size, label = bucket
    if size == "1d":
        day = date.fromisoformat(str(label))
        return midnight(day, zone), midnight(day + timedelta(days=1), zone)
    assert isinstance(label, int)
    return label, label + SIZES[size]


def intervals(start: int, end: int, zone_name: str) -> list[tuple[int, int]]:
    zone = ZoneInfo(zone_name)
    return [interval(b, zone) for b in cover(start, end, Calendar(zone_name))]


def assert_exact_cover(spans: list[tuple[int, int]], start: int, end: int) -> None:
    """Sorted, no gaps, no overlaps, first start and last end on the range's ends."""
    assert spans, "an empty cover"
    assert spans[0][0] == start
    assert spans[-1][1] == end
    for (_, previous_end), (next_start, _) in zip(spans, spans[1:], strict=False):
        assert next_start == previous_end
    assert sum(e - s for s, e in spans) == end - start


def test_a_whole_local_day_in_shanghai_is_one_day_bucket():
    start, end = at("2026-11-30T00:00:00+08:00"), at("2026-12-01T00:00:00+08:00")
    assert list(cover(start, end, Calendar("Asia/Shanghai"))) == [("1d", "2026-11-30")]


def test_a_whole_utc_day_in_shanghai_is_not_a_local_day():
    start, end = at("2026-11-30T00:00:00Z"), at("2026-12-01T00:00:00Z")
    buckets = list(cover(start, end, Calendar("Asia/Shanghai")))
    assert ("1d", "2026-11-30") not in buckets
    assert {size for size, _ in buckets} == {"1h"}
    assert len(buckets) == 24


def test_a_local_month_in_shanghai_is_the_days_of_the_month():
    start, end = at("2026-11-01T00:00:00+08:00"), at("2026-12-01T00:00:00+08:00")
    expected = [("1d", f"2026-11-{day:02d}") for day in range(1, 31)]
    assert list(cover(start, end, Calendar("Asia/Shanghai"))) == expected


def test_a_utc_range_from_ten_past_five_to_one_is_slots_then_hours():
    start, end = at("2026-11-30T10:05:00Z"), at("2026-11-30T13:00:00Z")
    slots = [("5m", at(f"2026-11-30T10:{minute:02d}:00Z")) for minute in range(5, 60, 5)]
    hours = [("1h", at("2026-11-30T11:00:00Z")), ("1h", at("2026-11-30T12:00:00Z"))]
    assert list(cover(start, end, Calendar("UTC"))) == slots + hours


def test_a_range_ending_mid_hour_ends_with_slots():
    start, end = at("2026-11-30T11:00:00Z"), at("2026-11-30T12:10:00Z")
    assert list(cover(start, end, Calendar("UTC"))) == [
        ("1h", at("2026-11-30T11:00:00Z")),
        ("5m", at("2026-11-30T12:00:00Z")),
        ("5m", at("2026-11-30T12:05:00Z")),
    ]


def test_a_range_is_rounded_out_to_five_minute_boundaries():
    start, end = at("2026-11-30T11:01:00Z"), at("2026-11-30T11:09:59Z")
    assert list(cover(start, end, Calendar("UTC"))) == [
        ("5m", at("2026-11-30T11:00:00Z")),
        ("5m", at("2026-11-30T11:05:00Z")),
    ]


def test_an_empty_aligned_range_has_no_buckets():
    t = at("2026-11-30T11:00:00Z")
    assert list(cover(t, t, Calendar("UTC"))) == []


@pytest.mark.parametrize("start", ["2026-11-01T12:00:00Z", "2026-11-01T12:05:00Z",
                                   "2026-11-01T18:30:00Z"])
def test_a_range_in_kolkata_with_its_half_hour_offset_is_covered_exactly(start):
    start_ts, end_ts = at(start), at("2026-11-04T03:05:00Z")
    assert_exact_cover(intervals(start_ts, end_ts, "Asia/Kolkata"), start_ts, end_ts)


def test_a_kolkata_range_reaching_local_midnight_by_slots_switches_to_day_buckets():
    start, end = at("2026-11-01T18:05:00Z"), at("2026-11-03T20:00:00Z")
    slots = [("5m", at(f"2026-11-01T18:{minute:02d}:00Z")) for minute in range(5, 30, 5)]
    days = [("1d", "2026-11-02"), ("1d", "2026-11-03")]
    tail = [("5m", at("2026-11-03T18:30:00Z")), ("5m", at("2026-11-03T18:35:00Z")),
            ("5m", at("2026-11-03T18:40:00Z")), ("5m", at("2026-11-03T18:45:00Z")),
            ("5m", at("2026-11-03T18:50:00Z")), ("5m", at("2026-11-03T18:55:00Z")),
            ("1h", at("2026-11-03T19:00:00Z"))]
    assert list(cover(start, end, Calendar("Asia/Kolkata"))) == slots + days + tail


def test_a_kolkata_range_starting_on_a_utc_hour_still_uses_day_buckets():
    start, end = at("2026-11-01T18:00:00Z"), at("2026-11-03T18:30:00Z")
    slots = [("5m", at(f"2026-11-01T18:{minute:02d}:00Z")) for minute in range(0, 30, 5)]
    expected = slots + [("1d", "2026-11-02"), ("1d", "2026-11-03")]
    assert list(cover(start, end, Calendar("Asia/Kolkata"))) == expected


@pytest.mark.parametrize(
    ("zone", "day", "hours"),
    [("America/New_York", "2026-03-08", 23), ("America/New_York", "2026-11-01", 25),
     ("America/Santiago", "2026-09-06", 23), ("America/Santiago", "2026-04-04", 25),
     ("Australia/Lord_Howe", "2026-04-05", 24.5)],
)
def test_a_local_day_of_a_clock_change_is_one_day_bucket(zone, day, hours):
    local = ZoneInfo(zone)
    start = midnight(date.fromisoformat(day), local)
    end = midnight(date.fromisoformat(day) + timedelta(days=1), local)
    assert end - start == hours * 3600
    assert list(cover(start, end, Calendar(zone))) == [("1d", day)]


@settings(deadline=None, max_examples=200)
@given(
    zone=st.sampled_from(ZONES),
    first=st.integers(min_value=at("2025-01-01T00:00:00Z") // 300,
                      max_value=at("2027-12-31T00:00:00Z") // 300),
    slots=st.one_of(st.integers(min_value=1, max_value=300),
                    st.integers(min_value=1, max_value=45 * 288)),
)
def test_buckets_are_sorted_disjoint_and_cover_any_aligned_range_exactly(zone, first, slots):
    start, end = first * 300, (first + slots) * 300
    buckets = list(cover(start, end, Calendar(zone)))
    for size, label in buckets:
        if size != "1d":
            assert label % SIZES[size] == 0
    assert_exact_cover(intervals(start, end, zone), start, end)


def test_a_usage_at_half_past_eleven_utc_is_on_the_next_local_date_in_shanghai():
    slot = at("2026-11-30T23:30:00Z")
    assert Calendar("Asia/Shanghai").date_of(slot) == "2026-12-01"
    assert Calendar("UTC").date_of(slot) == "2026-11-30"
    assert Calendar("America/New_York").date_of(slot) == "2026-11-30"


def test_date_of_is_the_local_date_on_both_sides_of_local_midnight():
    calendar = Calendar("Asia/Kolkata")
    assert calendar.date_of(at("2026-11-30T18:25:00Z")) == "2026-11-30"
    assert calendar.date_of(at("2026-11-30T18:30:00Z")) == "2026-12-01"


def test_day_bounds_are_the_local_midnights_around_a_time():
    start, end, day = Calendar("Asia/Shanghai").day_bounds(at("2026-11-30T23:30:00Z"))
    assert (start, end, day) == (at("2026-12-01T00:00:00+08:00"),
                                 at("2026-12-02T00:00:00+08:00"), "2026-12-01")


# -- every slot once, around the clock changes of 2025 ---------------------------------------

SWEEP_ZONES = ["UTC", "Europe/Berlin", "Asia/Kolkata", "Australia/Lord_Howe",
               "America/Santiago", "America/Havana", "Atlantic/Azores", "Africa/Cairo"]
# Zones without clock changes are swept around the fall-backs at local midnight instead.
QUIET_ANCHORS = [at("2025-10-26T01:00:00Z"), at("2025-11-02T05:00:00Z")]


def transitions(zone: ZoneInfo, year: int = 2025) -> list[int]:
    """The first instants of ``year`` with a new UTC offset (changes on a UTC hour only)."""
    first = at(f"{year}-01-01T00:00:00Z")
    found, previous = [], None
    for t in range(first, first + 366 * 86400, 3600):
        offset = datetime.fromtimestamp(t, zone).utcoffset()
        if previous is not None and offset != previous:
            found.append(t)
        previous = offset
    return found


def slots_by_date(calendar: Calendar, first: int, last: int) -> dict[str, list[int]]:
    """Every 5-minute slot of [first, last) under its local date: what a day bucket holds."""
    found: dict[str, list[int]] = {}
    for slot in range(first, last, 300):
        found.setdefault(calendar.date_of(slot), []).append(slot)
    return found


def expanded(buckets: list[tuple[str, str | int]], days: dict[str, list[int]]) -> list[int]:
    slots: list[int] = []
    for size, label in buckets:
        if size == "1d":
            slots.extend(days[str(label)])
        else:
            assert isinstance(label, int)
            slots.extend(range(label, label + SIZES[size], 300))
    return slots


def sweep(zone_name: str, anchor: int) -> None:
    """Windows starting at every slot from 26 h before ``anchor`` to 2 h after it, each with
    ends from one slot to past the next local midnight: their buckets hold each slot of the
    window once and nothing else."""
    calendar = Calendar(zone_name)
    days = slots_by_date(Calendar(zone_name), anchor - 3 * 86400, anchor + 3 * 86400)
    for start in range(anchor - 26 * 3600, anchor + 2 * 3600 + 1, 300):
        ends = {start + 300, start + 3900, start + 86400, start + 90300, anchor + 26 * 3600}
        for end in sorted(e for e in ends if e > start):
            buckets = list(cover(start, end, calendar))
            assert sorted(expanded(buckets, days)) == list(range(start, end, 300)), (
                zone_name, datetime.fromtimestamp(start, calendar.zone).isoformat(),
                datetime.fromtimestamp(end, calendar.zone).isoformat(), buckets)


@pytest.mark.parametrize("zone_name", SWEEP_ZONES)
def test_every_slot_of_a_window_near_a_2025_clock_change_is_covered_once(zone_name):
    anchors = transitions(ZoneInfo(zone_name)) or QUIET_ANCHORS
    for anchor in anchors:
        sweep(zone_name, anchor)


def test_a_window_from_five_past_the_first_of_two_azores_midnights_counts_each_slot_once():
    # 2025-10-26 in the Azores: midnight at 00:00Z, then the clocks go back to midnight at
    # 01:00Z; the day is 25 hours long and starts at the first one.
    start, end = at("2025-10-26T00:05:00Z"), at("2025-10-27T03:00:00Z")
    buckets = list(cover(start, end, Calendar("Atlantic/Azores")))
    assert ("1d", "2025-10-26") not in buckets
    assert_exact_cover(intervals(start, end, "Atlantic/Azores"), start, end)


def test_days_the_clocks_went_back_over_midnight_into_are_covered_slot_by_slot():
    # St John's went back at 00:01 until 2011: 2010-11-07 00:00 (one slot), then 2010-11-06
    # 23:05 again. Neither date's slots are one interval, so no window takes their buckets.
    start, end = at("2010-11-06T00:00:00-02:30"), at("2010-11-08T00:00:00-03:30")
    buckets = list(cover(start, end, Calendar("America/St_Johns")))
    assert ("1d", "2010-11-06") not in buckets and ("1d", "2010-11-07") not in buckets
    assert ("1d", "2010-11-05") in list(cover(start - 86400, end, Calendar("America/St_Johns")))
    sweep("America/St_Johns", at("2010-11-07T02:35:00Z"))


def test_day_bounds_in_the_repeated_midnight_hour_are_the_whole_25_hour_day():
    for ts in (at("2025-10-26T00:30:00Z"), at("2025-10-26T01:30:00Z")):
        assert Calendar("Atlantic/Azores").day_bounds(ts) == (
            at("2025-10-26T00:00:00Z"), at("2025-10-27T01:00:00Z"), "2025-10-26")


@settings(deadline=None, max_examples=300)
@given(
    zone_name=st.sampled_from(SWEEP_ZONES),
    anchor=st.sampled_from(sorted({t for z in SWEEP_ZONES for t in transitions(ZoneInfo(z))})),
    offset=st.integers(min_value=-60 * 12, max_value=60 * 12),
    slots=st.integers(min_value=1, max_value=4 * 288),
)
def test_buckets_near_any_2025_clock_change_hold_each_slot_of_the_window_once(
        zone_name, anchor, offset, slots):
    start = anchor + offset * 300
    end = start + slots * 300
    calendar = Calendar(zone_name)
    days = slots_by_date(calendar, start - 2 * 86400, end + 2 * 86400)
    buckets = list(cover(start, end, calendar))
    assert sorted(expanded(buckets, days)) == list(range(start, end, 300))


def test_a_utc_hour_over_a_kolkata_midnight_is_its_hour_bucket():
    """Slots are kept two days and hours 35: a question of whole UTC hours (an export of last
    month, hourly charts) reads the hour that holds local midnight, not its slots."""
    start = at("2026-11-01T18:00:00Z")  # 23:30 IST, midnight at 18:30Z
    assert list(cover(start, start + 3600, Calendar("Asia/Kolkata"))) == [("1h", start)]
    hours = list(cover(start, start + 6 * 3600, Calendar("Asia/Kolkata")))
    assert hours == [("1h", start + i * 3600) for i in range(6)]
