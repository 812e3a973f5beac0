"""A budget group's state, and the gauge series of ``/api/v1/budgets``'s rows: one per rule
× group, labelled by the rule and the group's tags."""

from __future__ import annotations

import pytest

from costline.connectors.report_html import BudgetChart, BudgetGroup, BudgetLine, Projection, Span
from costline.streams.api.budgets import budget_state
from costline.streams.worker.budget_gauges import budget_series

LINES = (BudgetLine("warn_50", 50_000_000), BudgetLine("warn_80", 80_000_000),
         BudgetLine("limit", 100_000_000))
CHART = BudgetChart("team-monthly", Span(0, 1, "month", "UTC"), LINES, (), {}, ("team",))


@pytest.mark.parametrize(("spent", "projected", "forecast", "state"), [
    (10_000_000, None, True, "ok"),
    (10_000_000, 90_000_000, True, "ok"),
    (10_000_000, 100_000_000, True, "forecast"),
    (10_000_000, 100_000_000, False, "ok"),
    (50_000_000, 200_000_000, True, "warning"),
    (99_999_999, None, True, "warning"),
    (100_000_000, None, False, "over"),
])
def test_the_state_is_the_highest_line_reached_then_the_forecast(
        spent: int, projected: int | None, forecast: bool, state: str) -> None:
    group = BudgetGroup({"team": "a"}, (), spent,
                        Projection(0, projected) if projected is not None else None)
    assert budget_state(group, CHART, forecast) == state


def test_one_series_per_rule_and_group_a_tag_named_rule_relabelled() -> None:
    rows = [{"rule": "r", "group": {"team": "a", "rule": "x"}, "spent": "12.500000",
             "limit": "100.000000", "forecast": None, "state": "warning"},
            {"rule": "r", "group": {"team": "b", "rule": ""}, "spent": "1.000000",
             "limit": "100.000000", "forecast": {"spent": "150.000001"}, "state": "forecast"}]
    series = budget_series(rows)
    a = (("rule", "r"), ("group_rule", "x"), ("team", "a"))
    b = (("rule", "r"), ("group_rule", ""), ("team", "b"))
    assert series["budget_spent"] == {a: 12.5, b: 1.0}
    assert series["budget_limit"] == {a: 100.0, b: 100.0}
    assert series["budget_forecast"] == {b: 150.000001}
    assert series["budget_state"] == {a: 2.0, b: 1.0}
