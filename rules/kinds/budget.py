"""Calendar budgets: spend so far in the day, week or month against warning lines and a limit."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, WithJsonSchema, field_validator, model_validator
from pydantic_core import PydanticCustomError

from costline.rules.durations import Money, Period, TimeZoneName, period_bounds, rfc3339
from costline.rules.enforce_params import LIMIT, Enforce
from costline.rules.findings import (
    Finding,
    Forecast,
    Line,
    fraction_of,
    highest_crossed,
    labels_text,
    money_text,
    top_contributors,
)
from costline.rules.kinds import ZONE_FIELD, Presentation, Rule, configured_zone, kind, listed
from costline.rules.state import Group, Measure, StateView, align_down, through

FORECAST_WINDOW_S = 6 * 3600
FORECAST_MIN_HISTORY_S = 3600
FORECAST_LINE = "forecast"
LIMIT_LINE = LIMIT

Fraction = Annotated[
    Decimal,
    Field(gt=0, lt=1),
    WithJsonSchema({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}),
]


WarningLines = Annotated[tuple[Fraction, ...], listed("fractions, e.g. [0.5, 0.8]")]


@dataclass(frozen=True)
class _Span:
    """The budget period and how far into it the stored totals reach."""

    start: float
    end: float
    upto: float
    now: float


@kind("budget")
class BudgetRule(Rule):
    """A budget per group for each calendar day, week or month.

    Spend so far is compared with the warning lines (``warn_at`` × ``limit``) and the budget
    line (``limit``); the alert reports the highest line reached, so 50% → 80% → 100% is one
    alert escalating, not three. With ``forecast`` the burn rate of the last six hours is
    projected to the period end, and the alert says when the budget line will be crossed
    before it is. With ``enforce`` the group's spend is stopped at a line, not only reported
    (docs/ENFORCE.md).

    Spend is the net of the bill by default: credits, refunds and downward adjustments are
    taken off, as the invoice takes them off. ``basis: gross`` watches the spend before them,
    for a team whose credits run out or that must not lean on them (AWS Budgets offers the
    same choice).

    ```yaml
    rules:
      - name: team-monthly
        kind: budget
        match: {env: prod}
        group_by: [team]
        period: month
        timezone: Europe/Berlin
        basis: net
        limit: 10000
        warn_at: [0.5, 0.8]
        forecast: true
        severity: warning
        notify: {slack: "#ml-budgets", route_by_tag: owner}
        enforce: {connector: slurm, action: hold_pending, account_tag: team, grace: 15m}
        mode: dry_run
    ```
    """

    presentation = Presentation(bar=True, spend=True)

    kind: Literal["budget"]
    period: Period = Field("month", description="the calendar period: day, week or month")
    timezone: TimeZoneName = ZONE_FIELD
    basis: Literal["net", "gross"] = Field(
        "net", description="net: spend less credits, refunds and downward adjustments (what "
        "the bill says); gross: spend before them"
    )
    limit: Money = Field(description="the budget line: spend per group and period")
    warn_at: WarningLines = Field(
        (), description="warning lines, as fractions of limit below 1, ascending"
    )
    forecast: bool = Field(
        False, description="also warn when the period-end projection crosses limit"
    )
    enforce: Enforce | None = Field(
        None, description="stop the group's spend at a line through a connector, after a grace"
    )

    @field_validator("timezone", mode="before")
    @classmethod
    def _zone(cls, value: Any, info: ValidationInfo) -> Any:
        return configured_zone(value, info)

    @field_validator("limit")
    @classmethod
    def _positive(cls, value: int) -> int:
        if value <= 0:
            raise PydanticCustomError("limit", "a budget line must be above 0")
        return value

    @field_validator("warn_at")
    @classmethod
    def _ascending(cls, value: tuple[Decimal, ...]) -> tuple[Decimal, ...]:
        if any(b <= a for a, b in zip(value, value[1:], strict=False)):
            raise PydanticCustomError(
                "warn_at", "warning lines must be listed in ascending order, each once"
            )
        return value

    @property
    def measure(self) -> Measure:
        """The stored measure the budget watches: net spend is ``cost``."""
        return "gross" if self.basis == "gross" else "cost"

    @model_validator(mode="after")
    def _exempt_what_a_group_has(self) -> BudgetRule:
        """An enforcement is exempted by its group's tags: a key outside ``group_by`` is in no
        group, and would exempt nothing while reading as if it did."""
        if self.enforce is None:
            return self
        stray = sorted(set(self.enforce.exempt) - set(self.group_by))
        if stray:
            raise PydanticCustomError(
                "enforce", "enforce exempt: {keys} not in group_by, so it would exempt nothing "
                "(a group has only its group_by tags)", {"keys": ", ".join(stray)})
        return self

    @model_validator(mode="after")
    def _enforce_at_a_line(self) -> BudgetRule:
        enforce = self.enforce
        if enforce is None or isinstance(enforce.at, str):
            if enforce is not None and enforce.at == FORECAST_LINE and not self.forecast:
                raise PydanticCustomError("enforce", "enforce at: forecast needs forecast: true")
            return self
        if enforce.at not in self.warn_at:
            raise PydanticCustomError(
                "enforce", "enforce at: {at} is not one of warn_at", {"at": str(enforce.at)})
        return self

    def budget_lines(self) -> tuple[Line, ...]:
        """Warning lines then the budget line, least serious first."""
        return _budget_lines(self.limit, self.warn_at)

    def evaluate(self, state: StateView, now: float) -> list[Finding]:
        start, end = period_bounds(now, self.period, self.timezone)
        span = _Span(start, end, min(through(now), end), now)
        spent = state.totals(self.measure, self.match, self.group_by, start, span.upto)
        rates = self._burn_rates(state, span) if self.forecast else {}
        findings = []
        for group, value in sorted(spent.items()):
            finding = self._judge(state, span, group, value, rates.get(group))
            if finding is not None:
                findings.append(finding)
        return findings

    def _judge(
        self, state: StateView, span: _Span, group: Group, value: int, rate: Decimal | None
    ) -> Finding | None:
        lines = self.budget_lines()
        projection = self._project(span, value, rate)
        crossed = highest_crossed(value, lines)
        if crossed is None and projection is None:
            return None
        rank, line = crossed if crossed else (-1, Line(FORECAST_LINE, self.limit))
        return Finding(
            group=dict(zip(self.group_by, group, strict=True)),
            value=value,
            line=line.name,
            threshold=line.value,
            rank=rank,
            lines=lines,
            period=(span.start, span.end),
            top=top_contributors(
                state, self.measure, self.match, self.group_by, group, span.start, span.upto
            ),
            forecast=projection,
        )

    def _burn_rates(self, state: StateView, span: _Span) -> dict[Group, Decimal]:
        """Spend per second over the recent complete buckets, per group."""
        rate_end = align_down(span.now)
        rate_start = max(span.start, rate_end - FORECAST_WINDOW_S)
        seconds = int(rate_end - rate_start)
        if seconds < FORECAST_MIN_HISTORY_S:
            return {}
        recent = state.totals(self.measure, self.match, self.group_by, rate_start, rate_end)
        return {group: Decimal(total) / seconds for group, total in recent.items()}

    def _project(self, span: _Span, value: int, rate: Decimal | None) -> Forecast | None:
        """The period-end projection, if it crosses a budget line not yet reached."""
        if rate is None or rate <= 0 or value >= self.limit:
            return None
        projected = value + int(rate * Decimal(span.end - span.now))
        if projected < self.limit:
            return None
        crosses_at = span.now + float((self.limit - value) / rate)
        return Forecast(projected, crosses_at)

    def summarize(self, finding: Finding, currency: str) -> str:
        who = labels_text(finding.group)
        spent = money_text(finding.value, currency)
        budget = money_text(self.limit, currency)
        before = " before credits" if self.basis == "gross" else ""
        sentence = f"{who} has spent {spent}{before} this {self.period} of a {budget} budget"
        if finding.line != FORECAST_LINE:
            sentence += f", past the {_line_words(finding.line)}"
            sentence += f" of {money_text(finding.threshold, currency)}"
        if finding.forecast is not None:
            sentence += _forecast_words(finding.forecast, currency)
        return sentence + "."


@lru_cache(maxsize=4096)
def _budget_lines(limit: int, warn_at: tuple[Decimal, ...]) -> tuple[Line, ...]:
    """The lines of a limit (made once: every finding of the rule carries them)."""
    warnings = [Line(_warning_name(f), fraction_of(limit, f)) for f in warn_at]
    return (*warnings, Line(LIMIT_LINE, limit))


def _warning_name(fraction: Decimal) -> str:
    percent = fraction * 100
    text = str(int(percent)) if percent == percent.to_integral_value() else f"{percent:f}"
    return f"warn_{text}"


def _line_words(name: str) -> str:
    if name == LIMIT_LINE:
        return "budget line"
    return f"{name.removeprefix('warn_')}% warning line"


def _forecast_words(forecast: Forecast, currency: str) -> str:
    crosses = "" if forecast.crosses_at is None else f" at {rfc3339(forecast.crosses_at)}"
    projected = money_text(forecast.value, currency)
    return f"; at the current rate it crosses the budget line{crosses} ({projected} by period end)"

