"""The budget gauges and spend counters of ``/metrics``, read from Redis by the leader.

One series per budget rule × group (labelled ``rule`` and the group's tag values), so their
number is bounded by the rules, not by the tag sets:

* ``costline_budget_spent``, ``costline_budget_limit``: spend so far in the rule's period and
  its budget line, in the currency;
* ``costline_budget_forecast``: spend projected to the period end at the last hours' rate
  (while the period runs and an hour of it is known);
* ``costline_budget_state``: 0 ok, 1 forecast past the budget line, 2 past a warning line,
  3 past the budget line (``costline.streams.api.budgets.STATES``).

``costline_spend_total``, labelled by the tag keys of ``COSTLINE_METRICS_SPEND_KEYS``, is the
gross spend of the calendar month so far (``COSTLINE_TIMEZONE``): it only grows within a
month and starts again at the next, which Prometheus reads as a counter reset, so
``increase(costline_spend_total[1h])`` is the spend of the last hour. (Net spend would fall
with a credit, which a counter must not.)

Only the leader reads them (every ``COSTLINE_METRICS_REFRESH_S``, in a thread), so a group of
workers exposes each series once; the other workers expose none.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from costline.rules.durations import period_bounds
from costline.rules.prices import MICRO
from costline.rules.state import through
from costline.streams.api.answers import OpenData
from costline.streams.api.budgets import STATES

Labels = tuple[tuple[str, str], ...]
Series = dict[Labels, float]
BUDGET_SERIES = ("budget_spent", "budget_limit", "budget_forecast", "budget_state")
GAUGE_HELP = {
    "budget_spent": "spend so far in the budget rule's period, per group (currency)",
    "budget_limit": "the budget line of the rule, per group (currency)",
    "budget_forecast": "spend projected to the period end at the last hours' rate (currency)",
    "budget_state": "0 ok, 1 forecast past the budget line, 2 past a warning line, 3 past "
                    "the budget line",
    "spend_total": "gross spend of the calendar month so far (COSTLINE_TIMEZONE) by the tag "
                   "keys of COSTLINE_METRICS_SPEND_KEYS; starts again each month",
    "refusal_tally_errors_total": "dead letters the refusal tally could not count",
}


class BudgetGauges:
    """The last figures read, and the series they make."""

    def __init__(self, data: OpenData, keys: Sequence[str], is_leader: Callable[[], bool]
                 ) -> None:
        self.data, self.keys, self.is_leader = data, tuple(keys), is_leader
        self.series: dict[str, Series] = {}

    def refresh(self, now: float | None = None) -> None:
        """Read the budgets and the month's spend (blocking: run it in a thread)."""
        now = time.time() if now is None else now
        budgets = self.data.budgets()["budgets"]
        zone = self.data.settings.timezone
        start, end = period_bounds(now, "month", zone)
        with self.data.lock:
            gross = self.data.state.totals("gross", {}, self.keys, start,
                                           min(float(through(now)), end))
        found = budget_series(budgets)
        found["spend_total"] = {tuple(zip(self.keys, group, strict=True)): value / MICRO
                                for group, value in gross.items()}
        self.series = found

    def read(self, name: str) -> Callable[[], Series]:
        """The gauge callable ``Metrics`` renders on a scrape: nothing on a non-leader."""
        def current() -> Series:
            return dict(self.series.get(name, {})) if self.is_leader() else {}
        return current


def budget_series(budgets: Sequence[Mapping[str, Any]]) -> dict[str, Series]:
    """The four budget series of ``/api/v1/budgets``'s rows."""
    out: dict[str, Series] = {name: {} for name in BUDGET_SERIES}
    for row in budgets:
        labels = _labels(row["rule"], row["group"])
        out["budget_spent"][labels] = float(Decimal(row["spent"]))
        if row["limit"] is not None:
            out["budget_limit"][labels] = float(Decimal(row["limit"]))
        if row["forecast"] is not None:
            out["budget_forecast"][labels] = float(Decimal(row["forecast"]["spent"]))
        out["budget_state"][labels] = float(STATES.index(row["state"]))
    return out


def _labels(rule: str, group: Mapping[str, str]) -> Labels:
    """``rule`` and the group's tags; a tag named ``rule`` is labelled ``group_rule``."""
    tags = {("group_rule" if key == "rule" else key): value for key, value in group.items()}
    return (("rule", rule), *sorted(tags.items()))
