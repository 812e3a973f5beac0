"""Each rule kind exactly at its lines, a micro-unit or a second short of them, and at the edges
of its periods and windows: rollover in zones that are not UTC, empty baselines, missing samples.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from costline.rules.durations import rfc3339
from costline.rules.events import FaultEvent, UsageEvent
from costline.rules.findings import Finding
from costline.rules.memory_state import InMemoryState
from tests.unit.rulefiles.builders import DAY, HOUR, MIN, T0, at, fault, rule, sample, state, usage

MICRO = Decimal("0.000001")


def spent(
    ts: float, amount: float | Decimal, resource_type: str = "gpu.h100", **tags: str
) -> UsageEvent:
    """A usage event whose producer stated its cost."""
    return usage(ts, 0, resource_type, **tags).model_copy(update={"cost": float(amount)})


def lines(findings: list[Finding]) -> list[str]:
    return [finding.line for finding in findings]


# -- budget ---------------------------------------------------------------------------------

BUDGET: dict[str, Any] = {"kind": "budget", "group_by": ["team"], "limit": 10000, "warn_at": [0.5]}


@pytest.mark.parametrize(
    ("amount", "expected"),
    [
        (Decimal(5000) - MICRO, []),
        (Decimal(5000), ["warn_50"]),
        (Decimal(10000) - MICRO, ["warn_50"]),
        (Decimal(10000), ["limit"]),
    ],
)
def test_a_budget_line_is_reached_at_its_value_not_a_micro_unit_before(
    amount: Decimal, expected: list[str]
) -> None:
    found = state(spent(T0, amount, team="pretrain"))
    assert lines(rule(**BUDGET).evaluate(found, T0 + HOUR)) == expected


KOLKATA_MIDNIGHT = at("2026-11-30T18:30")  # 1 December 00:00 IST: a new day and a new month


@pytest.mark.parametrize(
    ("period", "rollover"),
    [
        ("day", KOLKATA_MIDNIGHT),
        ("month", KOLKATA_MIDNIGHT),
        ("week", at("2026-11-29T18:30")),  # Monday 30 November 00:00 IST
    ],
)
def test_a_period_in_kolkata_rolls_over_at_local_midnight(period: str, rollover: float) -> None:
    found = state(
        spent(rollover - 1, 10000, team="pretrain"), spent(rollover, 5000, team="pretrain")
    )
    budget = rule(**{**BUDGET, "period": period, "timezone": "Asia/Kolkata"})
    [before] = budget.evaluate(found, rollover - 1)
    assert (before.line, before.value, before.period[1]) == ("limit", 10_000_000_000, rollover)
    [after] = budget.evaluate(found, rollover + 10 * MIN)
    assert (after.line, after.value, after.period[0]) == ("warn_50", 5_000_000_000, rollover)


@pytest.mark.parametrize(
    ("noon", "start", "end"),
    [
        ("2026-11-01T16:00", "2026-11-01T04:00:00Z", "2026-11-02T05:00:00Z"),  # 25 hours
        ("2026-03-08T16:00", "2026-03-08T05:00:00Z", "2026-03-09T04:00:00Z"),  # 23 hours
    ],
)
def test_a_new_york_day_across_a_dst_change_counts_every_local_hour(
    noon: str, start: str, end: str
) -> None:
    budget = rule(**{**BUDGET, "period": "day", "timezone": "America/New_York"})
    [midday] = budget.evaluate(state(spent(at(noon), 5000, team="pretrain")), at(noon))
    assert (rfc3339(midday.period[0]), rfc3339(midday.period[1])) == (start, end)
    first, last = midday.period
    found = state(
        spent(first - 1, 9000, team="pretrain"),
        spent(first, 3000, team="pretrain"),
        spent(last - 1, 2000, team="pretrain"),
        spent(last, 7000, team="pretrain"),
    )
    [late] = budget.evaluate(found, last - 1)
    assert (late.value, late.line) == (5_000_000_000, "warn_50")
    [next_day] = budget.evaluate(found, last)
    assert next_day.value == 7_000_000_000


def _hundred_an_hour(hours: int) -> InMemoryState:
    """100 USD of GPU time in each of the first ``hours`` hours of 30 November (UTC)."""
    midnight = at("2026-11-30T00:00")
    return state(*(usage(midnight + h * HOUR, 40, team="pretrain") for h in range(hours)))


@pytest.mark.parametrize(
    ("limit", "expected"), [(Decimal(2400), ["forecast"]), (Decimal(2400) + MICRO, [])]
)
def test_a_forecast_landing_exactly_on_the_budget_line_is_reported(
    limit: Decimal, expected: list[str]
) -> None:
    budget = rule(kind="budget", group_by=["team"], period="day", limit=limit, forecast=True)
    findings = budget.evaluate(_hundred_an_hour(6), at("2026-11-30T06:00"))
    assert lines(findings) == expected


def test_a_forecast_needs_one_complete_hour_of_the_period() -> None:
    budget = rule(kind="budget", group_by=["team"], period="day", limit=1000, forecast=True)
    found = _hundred_an_hour(1)
    assert budget.evaluate(found, at("2026-11-30T00:59:59")) == []
    [finding] = budget.evaluate(found, at("2026-11-30T01:00"))
    assert finding.forecast is not None and finding.forecast.value == 2_400_000_000


# -- growth and log explosion ------------------------------------------------------------------

GROWTH: dict[str, Any] = {
    "kind": "growth",
    "group_by": ["project"],
    "window": "1h",
    "baseline": "1d",
    "ratio": 2,
}


def _a_day_then_a_spike(first: float = T0 - 25 * HOUR) -> list[UsageEvent]:
    """10 USD in each hour of the baseline day (its first hour's at ``first``), then 20 USD in
    the hour before T0: exactly twice the hourly average."""
    day = [spent(T0 - (h + 2) * HOUR, 10, project="llm") for h in range(23)]
    return [spent(first, 10, project="llm"), *day, spent(T0 - HOUR, 20, project="llm")]


@pytest.mark.parametrize(
    ("min_baseline", "fires"), [(Decimal(240), True), (Decimal(240) + MICRO, False)]
)
def test_min_baseline_is_reached_at_its_value(min_baseline: Decimal, fires: bool) -> None:
    growth = rule(**GROWTH, min_baseline=min_baseline)
    assert bool(growth.evaluate(state(*_a_day_then_a_spike()), T0)) is fires


def test_a_baseline_reaching_back_exactly_to_its_start_is_ready_and_a_bucket_less_is_not() -> None:
    base_start = T0 - 25 * HOUR
    exact = state(*_a_day_then_a_spike())
    assert exact.earliest("cost", {}) == base_start
    assert lines(rule(**GROWTH).evaluate(exact, T0)) == ["growth"]
    late = state(*_a_day_then_a_spike(first=base_start + 5 * MIN))
    assert late.earliest("cost", {}) == base_start + 5 * MIN
    assert rule(**GROWTH).evaluate(late, T0) == []


def test_an_empty_baseline_never_grows_even_with_older_history() -> None:
    found = state(spent(T0 - 3 * DAY, 10, project="llm"), spent(T0 - HOUR, 500, project="llm"))
    assert found.earliest("cost", {}) == T0 - 3 * DAY
    assert rule(**GROWTH).evaluate(found, T0) == []
    logs = state(
        spent(T0 - 3 * DAY, 1, "logs.ingest", project="llm"),
        spent(T0 - HOUR, 50, "logs.ingest", project="llm"),
    )
    explosion: dict[str, Any] = {"kind": "log_explosion", "group_by": ["project"], "window": "1h"}
    assert rule(**explosion, ratio=2).evaluate(logs, T0) == []
    assert lines(rule(**explosion, ratio=2, max_rate=10).evaluate(logs, T0)) == ["max_rate"]


@pytest.mark.parametrize(("amount", "fires"), [(Decimal(10), True), (Decimal(10) - MICRO, False)])
def test_max_rate_is_reached_at_its_value(amount: Decimal, fires: bool) -> None:
    explosion = rule(kind="log_explosion", group_by=["job"], window="15m", max_rate=40)
    found = state(spent(T0 - 10 * MIN, amount, "logs.ingest", job="run-42"))
    assert lines(explosion.evaluate(found, T0)) == (["max_rate"] if fires else [])


def test_a_spike_leaves_the_window_on_the_bucket_boundary() -> None:
    explosion = rule(kind="log_explosion", group_by=["job"], window="15m", max_rate=40)
    found = state(spent(T0 - 14 * MIN, 20, "logs.ingest", job="run-42"))
    assert lines(explosion.evaluate(found, T0 - 10 * MIN)) == ["max_rate"]
    assert lines(explosion.evaluate(found, T0 + 4 * MIN + 59)) == ["max_rate"]
    assert explosion.evaluate(found, T0 + 5 * MIN) == []


# -- fault waste ------------------------------------------------------------------------------

WASTE: dict[str, Any] = {"kind": "fault_waste", "group_by": ["project"], "period": "day"}


def _hundred_wasted(ts: float = T0) -> FaultEvent:
    """40 GPUs of project llm redoing an hour at 2.50 USD: exactly 100 USD of waste."""
    return fault(ts, units=40, lost_seconds=3600, recovery_seconds=0, project="llm")


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        ({"max_waste": Decimal(100)}, ["max_waste"]),
        ({"max_waste": Decimal(100) + MICRO}, []),
        ({"max_share": Decimal("0.1")}, ["max_share"]),
        ({"max_share": Decimal("0.100000001")}, []),
        ({"max_share": 1}, []),
    ],
)
def test_waste_lines_are_reached_at_their_value(keys: dict[str, Any], expected: list[str]) -> None:
    found = state(spent(T0 - HOUR, 1000, project="llm"), _hundred_wasted())
    assert lines(rule(**WASTE, **keys).evaluate(found, T0 + MIN)) == expected


def test_all_of_a_groups_spend_wasted_reaches_a_share_of_one() -> None:
    found = state(spent(T0 - HOUR, 100, project="llm"), _hundred_wasted())
    assert lines(rule(**WASTE, max_share=1).evaluate(found, T0 + MIN)) == ["max_share"]


def test_without_spend_in_the_period_only_max_waste_can_fire() -> None:
    found = state(_hundred_wasted())
    assert rule(**WASTE, max_share=0.01).evaluate(found, T0 + MIN) == []
    assert lines(rule(**WASTE, max_share=0.01, max_waste=100).evaluate(found, T0 + MIN)) == [
        "max_waste"
    ]


def test_waste_of_the_previous_kolkata_day_does_not_count() -> None:
    half = fault(KOLKATA_MIDNIGHT, units=20, lost_seconds=3600, recovery_seconds=0, project="llm")
    found = state(_hundred_wasted(KOLKATA_MIDNIGHT - 1), half)
    kolkata = rule(**WASTE, timezone="Asia/Kolkata", max_waste=100)
    [before] = kolkata.evaluate(found, KOLKATA_MIDNIGHT - 1)
    assert (before.value, before.period[1]) == (100_000_000, KOLKATA_MIDNIGHT)
    assert kolkata.evaluate(found, KOLKATA_MIDNIGHT + MIN) == []
    assert rule(**WASTE, timezone="UTC", max_waste=100).evaluate(found, KOLKATA_MIDNIGHT + MIN)


# -- idle -------------------------------------------------------------------------------------

IDLE: dict[str, Any] = {"kind": "idle", "below": 0.05, "for": "30m"}


def every_minute(minutes: int, value: float = 0.01, start: float = T0, **tags: str) -> list[Any]:
    return [sample(start + m * MIN, value, **tags) for m in range(minutes + 1)]


def test_idle_fires_when_for_has_passed_to_the_second() -> None:
    found = state(*every_minute(30))
    assert rule(**IDLE).evaluate(found, T0 + 30 * MIN - 1) == []
    [finding] = rule(**IDLE).evaluate(found, T0 + 30 * MIN)
    assert finding.period == (T0, T0 + 30 * MIN)


@pytest.mark.parametrize(("value", "idle"), [(0.05, False), (0.0499, True)])
def test_a_sample_at_the_line_is_busy(value: float, idle: bool) -> None:
    found = state(*every_minute(30, value))
    assert bool(rule(**IDLE).evaluate(found, T0 + 30 * MIN)) is idle


@pytest.mark.parametrize(("gap", "idle"), [(5 * MIN, True), (5 * MIN + 1, False)])
def test_a_gap_of_max_gap_is_tolerated_and_a_second_more_is_not(gap: int, idle: bool) -> None:
    found = state(*every_minute(10), *every_minute(25, start=T0 + 10 * MIN + gap))
    now = T0 + 35 * MIN + gap
    assert bool(rule(**IDLE).evaluate(found, now)) is idle


@pytest.mark.parametrize(("silence", "idle"), [(5 * MIN, True), (5 * MIN + 1, False)])
def test_a_resource_is_idle_until_its_last_sample_is_older_than_max_gap(
    silence: int, idle: bool
) -> None:
    found = state(*every_minute(30))
    assert bool(rule(**IDLE).evaluate(found, T0 + 30 * MIN + silence)) is idle


def test_samples_of_another_metric_do_not_make_a_resource_idle() -> None:
    found = state(*every_minute(40, metric="mem_util"))
    assert rule(**IDLE).evaluate(found, T0 + 40 * MIN) == []
    assert rule(**IDLE, metric="mem_util").evaluate(found, T0 + 40 * MIN) != []
