"""Fault waste: spend that bought nothing because a fault made jobs redo work and wait."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, WithJsonSchema, field_validator, model_validator
from pydantic_core import PydanticCustomError

from costline.rules.durations import Money, Period, TimeZoneName, period_bounds
from costline.rules.findings import (
    Finding,
    Line,
    fraction_of,
    highest_crossed,
    labels_text,
    money_text,
    top_contributors,
)
from costline.rules.kinds import ZONE_FIELD, Presentation, Rule, configured_zone, kind
from costline.rules.state import Group, StateView, narrowed, through

SHARE_LINE = "max_share"
WASTE_LINE = "max_waste"
FAULT = "fault"
_RANKS = {SHARE_LINE: 0, WASTE_LINE: 1}

Share = Annotated[
    Decimal,
    Field(gt=0, le=1),
    WithJsonSchema({"type": "number", "exclusiveMinimum": 0, "maximum": 1}),
]


@kind("fault_waste")
class FaultWasteRule(Rule):
    """Fault waste per group in a calendar period, as money or as a share of spend.

    Waste is what faults cost: accelerators redoing work lost since the last good checkpoint
    and idling through detection and restart. The rule fires when a group's waste in the
    period reaches ``max_waste``, or ``max_share`` of its spend; the alert names the fault
    types and the jobs that wasted most, which is where checkpoint intervals or flaky nodes
    need attention.

    ```yaml
    rules:
      - name: pretrain-fault-waste
        kind: fault_waste
        match: {stage: pretrain}
        group_by: [project]
        period: day
        max_waste: 2000
        max_share: 0.1
        severity: warning
        notify: {slack: "#ml-reliability"}
    ```
    """

    presentation = Presentation(bar=True)

    kind: Literal["fault_waste"]
    period: Period = Field("day", description="the calendar period: day, week or month")
    timezone: TimeZoneName = ZONE_FIELD
    max_waste: Money | None = Field(None, description="the waste line: waste per group and period")
    max_share: Share | None = Field(
        None, description="the share line: waste as a fraction of the group's spend (0 to 1]"
    )

    @field_validator("timezone", mode="before")
    @classmethod
    def _zone(cls, value: Any, info: ValidationInfo) -> Any:
        return configured_zone(value, info)

    @model_validator(mode="after")
    def _has_a_line(self) -> FaultWasteRule:
        if self.max_waste is None and self.max_share is None:
            raise PydanticCustomError("fault_waste", "set max_waste, max_share, or both")
        if self.max_share is not None and FAULT in self.group_by:
            raise PydanticCustomError(
                "fault_waste", "max_share compares with spend, which has no fault; "
                "do not group_by fault"
            )
        return self

    @property
    def spend_match(self) -> dict[str, str]:
        """Spend has no fault dimension: the share compares against all of the group's spend."""
        return {k: v for k, v in self.match.items() if k != FAULT}

    def evaluate(self, state: StateView, now: float) -> list[Finding]:
        start, end = period_bounds(now, self.period, self.timezone)
        upto = min(through(now), end)
        wasted = state.totals("waste", self.match, self.group_by, start, upto)
        spent = (
            state.totals("cost", self.spend_match, self.group_by, start, upto)
            if self.max_share is not None
            else {}
        )
        found = (
            self._judge(state, group, waste, spent.get(group, 0), (start, end), upto)
            for group, waste in sorted(wasted.items())
            if waste > 0
        )
        return [finding for finding in found if finding is not None]

    def lines_for(self, spend: int) -> tuple[Line, ...]:
        """The share line (in money, for this group's spend) then the waste line."""
        lines = []
        if self.max_share is not None and spend > 0:
            lines.append(Line(SHARE_LINE, fraction_of(spend, self.max_share)))
        if self.max_waste is not None:
            lines.append(Line(WASTE_LINE, self.max_waste))
        return tuple(lines)

    def _judge(
        self,
        state: StateView,
        group: Group,
        waste: int,
        spend: int,
        period: tuple[float, float],
        upto: float,
    ) -> Finding | None:
        lines = self.lines_for(spend)
        crossed = highest_crossed(waste, lines)
        if crossed is None:
            return None
        line = crossed[1]
        start = period[0]
        by_fault = state.totals(
            "waste", narrowed(self.match, self.group_by, group), (FAULT,), start, upto
        )
        return Finding(
            group=dict(zip(self.group_by, group, strict=True)),
            value=waste,
            line=line.name,
            threshold=line.value,
            rank=_RANKS[line.name],
            lines=lines,
            period=period,
            top=top_contributors(state, "waste", self.match, self.group_by, group, start, upto),
            basis=spend,
            faults={name[0]: micro for name, micro in sorted(by_fault.items()) if micro > 0},
        )

    def summarize(self, finding: Finding, currency: str) -> str:
        spend = finding.basis or 0
        share = f" ({Decimal(finding.value) * 100 / spend:.1f}% of spend)" if spend else ""
        faults = ", ".join(sorted(finding.faults or {}, key=lambda f: -(finding.faults or {})[f]))
        jobs = ", ".join(next(iter(c.group.values())) for c in finding.top)
        return (
            f"{labels_text(finding.group)} lost {money_text(finding.value, currency)} to faults "
            f"this {self.period}{share}, past the {finding.line} line of "
            f"{money_text(finding.threshold, currency)}; faults: {faults or 'none'}; "
            f"most wasteful: {jobs or 'unknown'}."
        )
