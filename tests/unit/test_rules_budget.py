"""Budget rules: spend so far in a calendar period against warning lines and a budget line."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from costline.rules.durations import rfc3339
from costline.rules.events import ChargeKind, UsageEvent
from costline.rules.findings import Finding
from costline.rules.kinds.budget import BudgetRule
from costline.rules.memory_state import InMemoryState
from tests.unit.rulefiles.builders import HOUR, MIN, T0, at, rule, state, usage

MONTHLY: dict[str, Any] = {
    "kind": "budget",
    "group_by": ["team"],
    "period": "month",
    "limit": 10000,
    "warn_at": [0.5, 0.8],
}


def evaluate(found: InMemoryState, now: float, **keys: object) -> list[Finding]:
    return rule(**{**MONTHLY, **keys}).evaluate(found, now)


def test_below_the_first_warning_line_nothing_is_found() -> None:
    assert evaluate(state(usage(T0, 1999, team="pretrain")), T0 + HOUR) == []


def test_the_highest_line_reached_is_reported_with_every_line() -> None:
    found = state(usage(T0, 3300, team="pretrain"), usage(T0, 2100, team="posttrain"))
    by_team = {f.group["team"]: f for f in evaluate(found, T0 + HOUR)}
    assert by_team["pretrain"].line == "warn_80"
    assert by_team["pretrain"].value == 8_250_000_000
    assert by_team["pretrain"].threshold == 8_000_000_000
    assert by_team["posttrain"].line == "warn_50"
    assert [(line.name, line.value) for line in by_team["pretrain"].lines] == [
        ("warn_50", 5_000_000_000),
        ("warn_80", 8_000_000_000),
        ("limit", 10_000_000_000),
    ]
    assert by_team["posttrain"].rank < by_team["pretrain"].rank


def test_reaching_the_limit_is_the_budget_line() -> None:
    [finding] = evaluate(state(usage(T0, 4000, team="pretrain")), T0 + HOUR)
    assert (finding.line, finding.rank) == ("limit", 2)


def test_spend_of_the_previous_period_does_not_count() -> None:
    found = state(
        usage(at("2026-10-31T23:00"), 4000, team="pretrain"),
        usage(at("2026-11-01T01:00"), 100, team="pretrain"),
    )
    assert evaluate(found, at("2026-11-01T02:00")) == []
    [october] = evaluate(found, at("2026-10-31T23:30"))
    assert (rfc3339(october.period[0]), rfc3339(october.period[1])) == (
        "2026-10-01T00:00:00Z",
        "2026-11-01T00:00:00Z",
    )


def test_spend_in_the_bucket_in_progress_counts() -> None:
    [finding] = evaluate(state(usage(T0 + 2 * MIN, 4000, team="pretrain")), T0 + 3 * MIN)
    assert finding.line == "limit"


def test_a_day_budget_counts_in_its_own_time_zone() -> None:
    late = usage(at("2026-11-29T23:30"), 500, team="dev")
    found = state(late)
    keys = {"period": "day", "limit": 2000, "warn_at": [0.5], "forecast": False}
    now = at("2026-11-30T01:00")
    [shanghai] = evaluate(found, now, timezone="Asia/Shanghai", **keys)
    assert shanghai.line == "warn_50"
    assert evaluate(found, now, timezone="UTC", **keys) == []


def test_the_configured_zone_is_the_default() -> None:
    configured = rule(default_zone="Asia/Shanghai", **MONTHLY)
    assert isinstance(configured, BudgetRule) and configured.timezone == "Asia/Shanghai"
    explicit = rule(default_zone="Asia/Shanghai", **{**MONTHLY, "timezone": "Europe/Berlin"})
    assert isinstance(explicit, BudgetRule) and explicit.timezone == "Europe/Berlin"


def test_top_contributors_are_the_three_biggest_jobs() -> None:
    found = state(*(usage(T0, q, team="pretrain", job=f"run-{q}") for q in (100, 3000, 400, 900)))
    [finding] = evaluate(found, T0 + HOUR)
    assert [(dict(c.group), c.value) for c in finding.top] == [
        ({"job": "run-3000"}, 7_500_000_000),
        ({"job": "run-900"}, 2_250_000_000),
        ({"job": "run-400"}, 1_000_000_000),
    ]


def _steady(hours: int, per_hour: float) -> InMemoryState:
    """A team burning ``per_hour`` GPU-hours every hour since Nov 30 00:00."""
    start = at("2026-11-30T00:00")
    return state(*(usage(start + h * HOUR, per_hour, team="pretrain") for h in range(hours)))


def test_the_forecast_says_when_the_budget_line_will_be_crossed() -> None:
    found = _steady(8, 40)
    [finding] = evaluate(
        found, at("2026-11-30T08:00"), period="day", forecast=True, warn_at=[0.9], limit=2000
    )
    assert finding.line == "forecast"
    assert finding.threshold == 2_000_000_000
    assert finding.forecast is not None
    assert finding.forecast.value == 2_400_000_000
    assert finding.forecast.crosses_at is not None
    assert rfc3339(finding.forecast.crosses_at) == "2026-11-30T20:00:00Z"


def test_a_forecast_that_stays_under_the_budget_is_not_reported() -> None:
    found = _steady(8, 10)
    assert evaluate(found, at("2026-11-30T08:00"), period="day", forecast=True, limit=2000) == []


def test_a_crossed_warning_line_carries_the_forecast() -> None:
    found = _steady(8, 40)
    [finding] = evaluate(
        found, at("2026-11-30T08:00"), period="day", forecast=True, warn_at=[0.25], limit=2000
    )
    assert finding.line == "warn_25"
    assert finding.forecast is not None


def test_no_forecast_in_the_first_hour_of_a_period() -> None:
    found = state(usage(at("2026-11-30T00:05"), 500, team="pretrain"))
    assert (
        evaluate(found, at("2026-11-30T00:30"), period="day", forecast=True, limit=2000, warn_at=[])
        == []
    )


def test_the_summary_names_the_group_the_figure_and_the_line() -> None:
    budget = rule(**MONTHLY)
    [finding] = budget.evaluate(state(usage(T0, 3300, team="pretrain")), T0 + HOUR)
    assert budget.summarize(finding, "USD") == (
        "team=pretrain has spent $8,250.00 this month of a $10,000.00 budget, "
        "past the 80% warning line of $8,000.00."
    )


def test_a_budget_line_of_zero_is_refused() -> None:
    with pytest.raises(ValidationError, match="a budget line must be above 0"):
        rule(**{**MONTHLY, "limit": 0})


def credit(ts: float, amount: float, **tags: str) -> UsageEvent:
    """A credit of ``amount`` on the bill (a negative cost)."""
    return usage(ts, 0, **tags).model_copy(update={"cost": -amount, "charge": ChargeKind.credit})


def test_a_net_budget_counts_credits_off_and_a_gross_budget_does_not() -> None:
    found = state(usage(T0, 3300, team="pretrain"),  # 8250
                  credit(T0 + MIN, 1000, team="pretrain"))  # net 7250
    [net] = evaluate(found, T0 + HOUR)
    [gross] = evaluate(found, T0 + HOUR, basis="gross")
    assert (net.line, net.value) == ("warn_50", 7_250_000_000)
    assert (gross.line, gross.value) == ("warn_80", 8_250_000_000)
    assert rule(**MONTHLY).basis == "net"


def test_a_gross_budget_says_its_figure_is_before_credits() -> None:
    budget = rule(**MONTHLY, basis="gross")
    found = state(usage(T0, 3300, team="pretrain"), credit(T0, 5000, team="pretrain"))
    [finding] = budget.evaluate(found, T0 + HOUR)
    assert budget.summarize(finding, "USD").startswith(
        "team=pretrain has spent $8,250.00 before credits this month")


def test_a_budget_basis_is_net_or_gross() -> None:
    with pytest.raises(ValidationError, match="basis"):
        rule(**MONTHLY, basis="credits")
