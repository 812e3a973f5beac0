"""Log explosions: observability spend jumping against its baseline or past a rate per hour."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, WithJsonSchema, field_validator, model_validator
from pydantic_core import PydanticCustomError

from costline.rules.durations import Money, WindowDuration, format_duration
from costline.rules.findings import (
    Finding,
    Line,
    labels_text,
    money_text,
    per_hour,
    top_contributors,
)
from costline.rules.kinds import Presentation, Rule, kind
from costline.rules.kinds._windows import WindowComparison, baseline_covers_window, compare_windows
from costline.rules.state import StateView

OBSERVABILITY = {"category": "observability"}
GROWTH_LINE = "growth"
MAX_RATE_LINE = "max_rate"

Ratio = Annotated[
    Decimal, Field(gt=1), WithJsonSchema({"type": "number", "exclusiveMinimum": 1})
]


@kind("log_explosion")
class LogExplosionRule(Rule):
    """Observability spend (logs, metrics, traces) exploding, per group.

    A debug flag left on in a 2,000-GPU job can ingest more logs in an hour than the job
    costs. The rule reads spend in the ``observability`` category (unless ``match`` names
    another category) and fires when the money rate over ``window`` is ``ratio`` times its
    average over the ``baseline`` before it, or above ``max_rate`` per hour whatever the
    history. The alert carries the rate per hour.

    ```yaml
    rules:
      - name: log-explosion
        kind: log_explosion
        group_by: [project, job]
        window: 15m
        baseline: 1d
        ratio: 5
        max_rate: 40
        severity: critical
        notify: {slack: "#ml-oncall"}
    ```
    """

    presentation = Presentation(unit="currency_per_hour")

    kind: Literal["log_explosion"]
    window: WindowDuration = Field(
        900, json_schema_extra={"default": "15m"},
        description="the recent span whose spend rate is compared",
    )
    baseline: WindowDuration = Field(
        86_400, json_schema_extra={"default": "1d"},
        description="the span before window whose average rate is the expected one",
    )
    ratio: Ratio | None = Field(
        None, description="the growth line: window rate ≥ ratio × baseline rate fires"
    )
    max_rate: Money | None = Field(
        None, description="the rate line: spend per hour that fires whatever the history"
    )

    @field_validator("baseline")
    @classmethod
    def _baseline(cls, baseline: int, info: ValidationInfo) -> int:
        return baseline_covers_window(baseline, info)

    @model_validator(mode="after")
    def _has_a_line(self) -> LogExplosionRule:
        if self.ratio is None and self.max_rate is None:
            raise PydanticCustomError("log_explosion", "set ratio, max_rate, or both")
        return self

    @property
    def selection(self) -> dict[str, str]:
        return {**OBSERVABILITY, **self.match}

    def evaluate(self, state: StateView, now: float) -> list[Finding]:
        compared = compare_windows(
            state, "cost", self.selection, self.group_by, now, self.window, self.baseline
        )
        found = (self._judge(state, c) for c in compared)
        return [finding for finding in found if finding is not None]

    def _lines(self, compared: WindowComparison) -> tuple[list[Line], list[Line]]:
        """All lines as rates per hour, and the ones the window reached."""
        lines, reached = [], []
        if self.ratio is not None:
            line = Line(GROWTH_LINE, per_hour(compared.growth_line(self.ratio), self.window))
            lines.append(line)
            if compared.grew(self.ratio):
                reached.append(line)
        if self.max_rate is not None:
            line = Line(MAX_RATE_LINE, self.max_rate)
            lines.append(line)
            if compared.current * 3600 >= self.max_rate * self.window:
                reached.append(line)
        return lines, reached

    def _judge(self, state: StateView, compared: WindowComparison) -> Finding | None:
        lines, reached = self._lines(compared)
        if not reached:
            return None
        line = reached[-1]
        return Finding(
            group=dict(zip(self.group_by, compared.group, strict=True)),
            value=compared.rate_per_hour,
            line=line.name,
            threshold=line.value,
            rank=lines.index(line),
            lines=tuple(lines),
            period=(compared.start, compared.end),
            top=top_contributors(
                state,
                "cost",
                self.selection,
                self.group_by,
                compared.group,
                compared.start,
                compared.end,
            ),
            rate_per_hour=compared.rate_per_hour,
        )

    def summarize(self, finding: Finding, currency: str) -> str:
        rate = money_text(finding.value, currency)
        line = money_text(finding.threshold, currency)
        reason = "above max_rate" if finding.line == MAX_RATE_LINE else f"{self.ratio}x baseline"
        return (
            f"{labels_text(finding.group)} is spending {rate}/h on observability over the last "
            f"{format_duration(self.window)} ({reason}: line {line}/h)."
        )
