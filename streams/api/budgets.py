"""Each budget rule × group as the API, the dashboard and the gauges show it: spent so far in
the rule's period, the budget line and the warning lines, the projection to the period end,
and a state.

The figures are the report's (``costline.streams.cli.report.budget_charts``): the same reads,
the same burn rate, so the page, the gauges and ``costline report`` never disagree. The state
says where the spend stands, whatever the alert's ``for`` delay:

| state | gauge | when |
|---|---|---|
| ``ok`` | 0 | below every line, and not projected past the budget line |
| ``forecast`` | 1 | below every line, projected past the budget line (a rule with forecast) |
| ``warning`` | 2 | past a warning line |
| ``over`` | 3 | past the budget line |
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from costline.connectors.report_html import BudgetChart, BudgetGroup
from costline.rules.alerts import AlertBook
from costline.rules.durations import rfc3339
from costline.rules.engine import alert_id
from costline.rules.kinds.budget import LIMIT_LINE, BudgetRule
from costline.rules.loader import RuleSet
from costline.rules.prices import format_micro

STATES = ("ok", "forecast", "warning", "over")


def budget_state(group: BudgetGroup, chart: BudgetChart, forecast: bool) -> str:
    """Where a group's spend stands against its rule's lines (``STATES``)."""
    reached = [line for line in chart.lines if group.spent >= line.amount]
    if reached:
        return "over" if reached[-1].name == LIMIT_LINE else "warning"
    limit = chart.lines[-1].amount if chart.lines else None
    projected = group.projection.value if group.projection is not None else None
    if forecast and limit is not None and projected is not None and projected >= limit:
        return "forecast"
    return "ok"


def budget_rows(charts: Sequence[BudgetChart], rules: RuleSet, book: AlertBook,
                points: bool = False) -> list[dict[str, Any]]:
    """One row per budget rule × group, rules in their order, groups by spend descending.
    With ``points``, each group's spend so far at the end of every hour of the period."""
    forecasts = {rule.name: rule.forecast for rule in rules if isinstance(rule, BudgetRule)}
    rows = []
    for chart in charts:
        for group in chart.groups:
            line = _highest(group, chart)
            row: dict[str, Any] = {
                "rule": chart.rule,
                "group": dict(group.labels),
                "period": {"kind": chart.span.kind, "timezone": chart.span.zone,
                           "start": rfc3339(chart.span.start), "end": rfc3339(chart.span.end)},
                "spent": format_micro(group.spent),
                "limit": format_micro(chart.lines[-1].amount) if chart.lines else None,
                "lines": [{"name": item.name, "amount": format_micro(item.amount)}
                          for item in chart.lines],
                "line": line,
                "forecast": _forecast(group),
                "state": budget_state(group, chart, forecasts.get(chart.rule, False)),
                "alert": _alert(book, chart.rule, group.labels),
            }
            if points:
                row["points"] = [[rfc3339(at), format_micro(amount)]
                                 for at, amount in group.points]
            rows.append(row)
    return rows


def _highest(group: BudgetGroup, chart: BudgetChart) -> str | None:
    reached = [line.name for line in chart.lines if group.spent >= line.amount]
    return reached[-1] if reached else None


def _forecast(group: BudgetGroup) -> dict[str, Any] | None:
    projection = group.projection
    if projection is None:
        return None
    return {"at": rfc3339(projection.at), "spent": format_micro(projection.value),
            "crosses_at": rfc3339(projection.crosses_at)
            if projection.crosses_at is not None else None}


def _alert(book: AlertBook, rule: str, labels: Mapping[str, str]) -> dict[str, Any] | None:
    alert = book.alerts.get(alert_id(rule, dict(labels)))
    if alert is None:
        return None
    mute = alert.mute
    return {"state": alert.state, "line": alert.payload.get("line"),
            "since": rfc3339(alert.since), "muted": mute.reason if mute else None,
            "muted_by": mute.by if mute else None,
            "muted_until": rfc3339(mute.until) if mute else None}
