"""Growth: the recent window against the average of the baseline before it."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Annotated, ClassVar, Literal

from pydantic import Field, ValidationInfo, WithJsonSchema, field_validator

from costline.rules.durations import Money, WindowDuration, format_duration
from costline.rules.findings import (
    Finding,
    Line,
    amount_text,
    labels_text,
    money_text,
    top_contributors,
)
from costline.rules.kinds import Rule, kind
from costline.rules.kinds._windows import (
    EfficiencyComparison,
    WindowComparison,
    baseline_covers_window,
    compare_efficiency,
    compare_windows,
)
from costline.rules.state import StateView

GROWTH_LINE = "growth"
BASELINE_LINE = "baseline"

Ratio = Annotated[
    Decimal, Field(gt=1), WithJsonSchema({"type": "number", "exclusiveMinimum": 1})
]


@kind("growth")
class GrowthRule(Rule):
    """Spend, usage or the cost of training growing faster than it used to, per group.

    Fires when the total over ``window`` is at least ``ratio`` times the average total per
    ``window`` over the ``baseline`` before it. A baseline below ``min_baseline`` (money for
    ``metric: cost``, units of the resource for ``metric: quantity``) never fires, and
    neither does a group whose history does not yet cover the whole baseline. On
    ``quantity``, match one ``resource_type`` so the units agree (GB-hours of checkpoints
    measure how much is stored). ``metric: cost_per_token`` compares a group's spend per
    million tokens trained (progress events) with the baseline's: a run whose efficiency
    regresses — a slow node, a bad config change, a data-loader stall — when grouped by
    ``job``; its ``min_baseline`` is the baseline's spend.

    ```yaml
    rules:
      - name: checkpoint-growth
        kind: growth
        metric: quantity
        match: {resource_type: storage.checkpoint}
        group_by: [project]
        window: 6h
        baseline: 7d
        ratio: 2
        min_baseline: 100000
        severity: warning
        notify: {slack: "#ml-storage"}
    ```
    """

    inhibited_by_faults: ClassVar[bool] = True

    kind: Literal["growth"]
    metric: Literal["cost", "quantity", "cost_per_token"] = Field(
        "cost", description="cost (money), quantity (the price book unit of what is matched) "
        "or cost_per_token (money per million tokens trained)"
    )
    window: WindowDuration = Field(description="the recent span whose total is compared")
    baseline: WindowDuration = Field(
        description="the span before window whose average per window is the expected total"
    )
    ratio: Ratio = Field(description="the growth line: window total ≥ ratio × expected fires")
    min_baseline: Money = Field(
        0, description="a smaller baseline total never fires (in the metric's unit)"
    )

    @field_validator("baseline")
    @classmethod
    def _baseline(cls, baseline: int, info: ValidationInfo) -> int:
        return baseline_covers_window(baseline, info)

    def value_unit(self, units: Mapping[str, str]) -> str:
        """Money, or the price book unit of the one resource type a quantity rule matches."""
        if self.metric == "cost":
            return "currency"
        if self.metric == "cost_per_token":
            return "currency_per_mtok"
        return units.get(self.match.get("resource_type", ""), "units")

    def evaluate(self, state: StateView, now: float) -> list[Finding]:
        metric = self.metric
        if metric == "cost_per_token":
            return [self._efficiency_finding(c) for c in compare_efficiency(
                state, self.match, self.group_by, now, self.window, self.baseline)
                if c.grew(self.ratio, self.min_baseline)]
        compared = compare_windows(
            state, metric, self.match, self.group_by, now, self.window, self.baseline
        )
        return [
            self._finding(state, c, metric) for c in compared
            if c.grew(self.ratio, self.min_baseline)
        ]

    def _finding(self, state: StateView, compared: WindowComparison,
                 metric: Literal["cost", "quantity"]) -> Finding:
        line = Line(GROWTH_LINE, compared.growth_line(self.ratio))
        return Finding(
            group=dict(zip(self.group_by, compared.group, strict=True)),
            value=compared.current,
            line=line.name,
            threshold=line.value,
            rank=1,
            lines=(Line(BASELINE_LINE, compared.expected), line),
            period=(compared.start, compared.end),
            top=top_contributors(
                state,
                metric,
                self.match,
                self.group_by,
                compared.group,
                compared.start,
                compared.end,
            ),
            rate_per_hour=compared.rate_per_hour,
        )

    def _efficiency_finding(self, compared: EfficiencyComparison) -> Finding:
        line = Line(GROWTH_LINE, compared.growth_line(self.ratio))
        return Finding(
            group=dict(zip(self.group_by, compared.group, strict=True)),
            value=compared.current, line=line.name, threshold=line.value, rank=1,
            lines=(Line(BASELINE_LINE, compared.expected), line),
            period=(compared.start, compared.end),
        )

    def summarize(self, finding: Finding, currency: str) -> str:
        def amount(micro: int) -> str:
            if self.metric == "cost":
                return money_text(micro, currency)
            if self.metric == "cost_per_token":
                return f"{money_text(micro, currency)} per million tokens"
            return f"{amount_text(micro)} units"

        if self.metric == "cost_per_token":
            expected = finding.lines[0].value
            times = f"{Decimal(finding.value) / expected:.1f}x" if expected else "far above"
            return (
                f"{labels_text(finding.group)} spent {amount(finding.value)} in the last "
                f"{format_duration(self.window)}, {times} the {amount(expected)} of the "
                f"{format_duration(self.baseline)} before (growth line {self.ratio}x)."
            )

        expected = finding.lines[0].value
        times = f"{Decimal(finding.value) / expected:.1f}x" if expected else "far above"
        return (
            f"{labels_text(finding.group)} used {amount(finding.value)} of {self.metric} in the "
            f"last {format_duration(self.window)}, {times} the {amount(expected)} per "
            f"{format_duration(self.window)} of the {format_duration(self.baseline)} before "
            f"(growth line {self.ratio}x)."
        )

