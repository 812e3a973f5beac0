"""Durations, money and calendar periods as rule files write them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from costline.rules.durations import (
    MAX_DURATION_S,
    Duration,
    Money,
    format_duration,
    parse_duration,
    parse_time,
    period_bounds,
    rfc3339,
)
from tests.unit.rulefiles.builders import HOUR, at


class _Keys(BaseModel):
    wait: Duration = 0
    limit: Money = 0


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30),
        ("15m", 900),
        ("2h", 7200),
        ("7d", 604800),
        ("1w", 604800),
        ("1h30m", 5400),
        ("0s", 0),
    ],
)
def test_durations_are_read_as_seconds(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "15", "15 m", "1.5h", "m", "30m1h", "-5m", "401d"])
def test_bad_durations_are_refused_with_an_example(text: str) -> None:
    with pytest.raises(ValueError, match="bad duration"):
        parse_duration(text)


@given(st.integers(min_value=0, max_value=MAX_DURATION_S))
def test_formatting_a_duration_reads_back_the_same_seconds(seconds: int) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


def test_a_number_is_not_a_duration() -> None:
    with pytest.raises(ValidationError, match="a duration is text like 30s"):
        _Keys.model_validate({"wait": 30})


def test_money_is_exact_micro_units_of_what_was_written() -> None:
    assert _Keys.model_validate({"limit": 0.1}).limit == 100_000
    assert _Keys.model_validate({"limit": 10000}).limit == 10_000_000_000
    assert _Keys.model_validate({"limit": 1234.5678905}).limit == 1_234_567_890


@pytest.mark.parametrize("bad", [-1, True, "100", float("nan")])
def test_money_must_be_a_finite_non_negative_number(bad: object) -> None:
    with pytest.raises(ValidationError):
        _Keys.model_validate({"limit": bad})


def test_a_usage_at_2330_utc_falls_on_the_next_day_in_shanghai() -> None:
    late = at("2026-11-29T23:30")
    start, end = period_bounds(late, "day", "Asia/Shanghai")
    assert (rfc3339(start), rfc3339(end)) == ("2026-11-29T16:00:00Z", "2026-11-30T16:00:00Z")
    utc_start, _ = period_bounds(late, "day", "UTC")
    assert rfc3339(utc_start) == "2026-11-29T00:00:00Z"


def test_weeks_start_on_monday_and_months_on_the_first() -> None:
    sunday = at("2026-11-29T12:00")
    assert rfc3339(period_bounds(sunday, "week", "UTC")[0]) == "2026-11-23T00:00:00Z"
    start, end = period_bounds(at("2026-12-31T23:59"), "month", "UTC")
    assert (rfc3339(start), rfc3339(end)) == ("2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z")


def test_a_day_with_a_dst_change_is_23_hours_long() -> None:
    start, end = period_bounds(at("2026-03-29T12:00"), "day", "Europe/Berlin")
    assert end - start == 23 * HOUR


def test_times_read_as_rfc3339_or_unix_seconds() -> None:
    assert parse_time("2026-11-30T08:00:00Z") == at("2026-11-30T08:00")
    assert parse_time("2026-11-30T16:00:00+08:00") == at("2026-11-30T08:00")
    assert parse_time(at("2026-11-30T08:00")) == at("2026-11-30T08:00")
    with pytest.raises(ValueError, match="no offset"):
        parse_time("2026-11-30T08:00:00")


NOW = 1796340600.0  # 2026-12-03T23:30:00Z, 2026-12-04T00:30 in Europe/Paris


@pytest.mark.parametrize(("text", "zone", "moment"), [
    ("now", "UTC", NOW),
    ("today", "UTC", 1796256000.0),  # 2026-12-03T00:00:00Z
    ("yesterday", "UTC", 1796169600.0),  # 2026-12-02T00:00:00Z
    ("Yesterday", "Europe/Paris", 1796252400.0),  # 2026-12-03T00:00+01:00
    ("-2h", "UTC", NOW - 7200),
    ("-7d", "UTC", NOW - 7 * 86400),
    ("2026-11-30T08:00:00Z", "UTC", 1796025600.0),
    ("1796169600", "UTC", 1796169600.0),
])
def test_a_moment_can_be_a_word_or_a_time_ago(text: str, zone: str, moment: float) -> None:
    from costline.rules.durations import parse_moment

    assert parse_moment(text, NOW, zone) == moment


@pytest.mark.parametrize("text", ["last week", "2h", "-2x", "2026-11-30T08:00:00"])
def test_a_moment_that_does_not_read_names_the_forms_that_do(text: str) -> None:
    from costline.rules.durations import parse_moment

    with pytest.raises(ValueError, match="now, today, yesterday, or a time ago such as -2h"):
        parse_moment(text, NOW, "UTC")
