"""Rule unit tests, after ``promtool test rules``: given these events, expect these alerts.

A test file names rule files (relative to itself), optionally a price book, and a list of
tests. Each test feeds its events into an ``InMemoryState`` in time order and runs the engine
every five minutes up to ``eval_time``, exactly as the worker would, so ``for``, escalation,
silences and inhibition behave as in production. The alerts active at ``eval_time`` must be
exactly the expected ones (of the rules the test evaluates).

```yaml
rule_files: [../budgets.yaml]
prices: ../../prices/example.yaml      # optional; default: the configured price book
tests:
  - name: pretrain passes the 80% warning line
    eval_time: 2026-11-20T12:00:00Z
    events:
      - {kind: usage, ts: 2026-11-20T10:00:00Z, resource_id: n1, resource_type: gpu.h100,
         quantity: 80000, unit: gpu_hour, tags: {team: pretrain, env: prod}}
    expect_alerts:
      - {rule: team-monthly, group: {team: pretrain}, state: firing, line: warn_80}
```
Events may leave out ``event_id`` (one is made up per event). A test may also give gauge
samples as ``series`` (``{resource_id, resource_type, metric, tags, start, every, values:
[0.9, "0.01x40"]}``), ``silences`` (``{rule, matchers, ends_at}``), and ``rules`` to
evaluate only some rules of the files.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from costline.rules.alerts import AlertBook
from costline.rules.durations import PositiveDuration, TimeZoneName, parse_time
from costline.rules.engine import Engine
from costline.rules.events import EVENT_KINDS, AnyEvent, Event
from costline.rules.loader import RuleSet, load_rules
from costline.rules.memory_state import InMemoryState
from costline.rules.plugins import NO_PLUGINS, Plugins
from costline.rules.prices import PriceBook, PricingError
from costline.rules.silences import Silence
from costline.rules.state import BUCKET_S, align_down
from costline.rules.yaml_source import Document, SourceError, SourceInvalid, load_document

TimeValue = Annotated[AwareDatetime | float | int, Field(union_mode="left_to_right")]
_EVENT = TypeAdapter(Event)
_REPEAT = re.compile(r"^(-?\d+(?:\.\d+)?)x(\d+)$")


class ExpectedAlert(BaseModel):
    """An alert that must be active at ``eval_time``."""

    model_config = ConfigDict(extra="forbid")

    rule: str
    group: dict[str, str] = Field(default_factory=dict)
    state: Literal["pending", "firing", "silenced"] = "firing"
    line: str | None = None
    value: str | None = None


class SeriesSpec(BaseModel):
    """Gauge samples at a fixed interval: ``values: [0.9, "0.01x8"]`` is 0.9 then eight 0.01."""

    model_config = ConfigDict(extra="forbid")

    resource_id: str
    resource_type: str
    metric: str
    tags: dict[str, str] = Field(default_factory=dict)
    start: TimeValue
    every: PositiveDuration = 300
    values: list[float | Annotated[str, Field(pattern=_REPEAT.pattern)]]

    def expand(self) -> list[tuple[float, float]]:
        """(ts, value) of every sample."""
        flat = [v for item in self.values for v in _repeat(item)]
        first = parse_time(self.start)
        return [(first + i * self.every, value) for i, value in enumerate(flat)]

    def events(self, prefix: str) -> list[dict[str, Any]]:
        return [
            {
                "event_id": f"{prefix}-{number}",
                "kind": "utilization",
                "ts": ts,
                "resource_id": self.resource_id,
                "resource_type": self.resource_type,
                "metric": self.metric,
                "value": value,
                "tags": self.tags,
            }
            for number, (ts, value) in enumerate(self.expand())
        ]


def _repeat(item: float | str) -> list[float]:
    if isinstance(item, str):
        found = _REPEAT.match(item)
        assert found is not None
        return [float(found.group(1))] * int(found.group(2))
    return [item]


class SilenceSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = "test"
    rule: str | None = None
    matchers: dict[str, str] = Field(default_factory=dict)
    starts_at: TimeValue = 0
    ends_at: TimeValue


class RuleTestCase(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    eval_time: TimeValue
    start: TimeValue | None = None
    rules: list[str] | None = None
    events: list[dict[str, Any]] = Field(default_factory=list)
    series: list[SeriesSpec] = Field(default_factory=list)
    silences: list[SilenceSpec] = Field(default_factory=list)
    expect_alerts: list[ExpectedAlert] = Field(default_factory=list)


class RuleTestFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rule_files: list[str] = Field(min_length=1)
    prices: str | None = None
    timezone: TimeZoneName | None = None
    tests: list[RuleTestCase] = Field(min_length=1)


@dataclass(frozen=True)
class Observed:
    """An active alert as a test compares it."""

    rule: str
    group: Mapping[str, str]
    state: str
    line: str
    value: str

    def fits(self, expected: ExpectedAlert) -> bool:
        return (
            self.rule == expected.rule
            and dict(self.group) == expected.group
            and self.state == expected.state
            and expected.line in (None, self.line)
            and expected.value in (None, self.value)
        )

    def __str__(self) -> str:
        group = ", ".join(f"{k}={v}" for k, v in self.group.items())
        return f"{self.rule} {{{group}}} {self.state} line={self.line} value={self.value}"


@dataclass
class RuleTestOutcome:
    name: str
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems


@dataclass
class RuleTestReport:
    file: str
    outcomes: list[RuleTestOutcome]

    @property
    def passed(self) -> bool:
        return all(outcome.passed for outcome in self.outcomes)


def run_rule_tests(
    path: Path | str, prices: Path | str, timezone: str = "UTC", *, plugins: Plugins = NO_PLUGINS
) -> RuleTestReport:
    """Run every test of a test file; raise ``SourceInvalid`` if the file or its rules are bad.

    ``prices`` and ``timezone`` are the configured defaults, used unless the file sets them;
    ``plugins`` are what the rules may name beyond their kinds (``rules/plugins.py``).
    """
    document = load_document(path)
    try:
        spec = RuleTestFile.model_validate(document.data)
    except ValidationError as exc:
        raise SourceInvalid(document.errors_from(exc)) from exc
    base = Path(path).parent
    zone = spec.timezone or timezone
    book = PriceBook.load(base / spec.prices if spec.prices else prices)
    rules = load_rules([base / name for name in spec.rule_files], zone, plugins=plugins)
    cases = [_events_of(document, index, case) for index, case in enumerate(spec.tests)]
    outcomes = [
        _run_case(case, events, rules, book) for case, events in zip(spec.tests, cases, strict=True)
    ]
    return RuleTestReport(str(path), outcomes)


def _events_of(document: Document, index: int, case: RuleTestCase) -> list[AnyEvent]:
    events, errors = [], []
    for number, raw in enumerate(case.events):
        item = {"event_id": f"test-{index}-{number}", **raw}
        try:
            events.append(_EVENT.validate_json(json.dumps(item, default=_json_time)))
        except ValidationError as exc:
            errors.extend(_event_errors(document, exc, ("tests", index, "events", number)))
    for number, series in enumerate(case.series):
        try:
            samples = series.events(f"test-{index}-series-{number}")
            events.extend(_EVENT.validate_python(item) for item in samples)
        except ValidationError as exc:
            errors.extend(_event_errors(document, exc, ("tests", index, "series", number)))
    if errors:
        raise SourceInvalid(errors)
    return events


def _event_errors(
    document: Document, exc: ValidationError, base: tuple[int | str, ...]
) -> list[SourceError]:
    """Positioned errors of one event, without the ``kind`` tag pydantic puts in locations."""
    found = []
    for error in exc.errors(include_url=False, include_context=False):
        loc = tuple(error["loc"])
        if loc and loc[0] in EVENT_KINDS:
            loc = loc[1:]
        line, col = document.position(base + loc)
        field = ".".join(str(part) for part in base + loc)
        found.append(SourceError(document.file, line, col, f"{field}: {error['msg']}"))
    return found


def _json_time(value: object) -> str:
    """YAML timestamps travel as the RFC 3339 text a producer would send."""
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON")


def _run_case(
    case: RuleTestCase, events: Sequence[AnyEvent], rules: RuleSet, prices: PriceBook
) -> RuleTestOutcome:
    outcome = RuleTestOutcome(case.name)
    selected = rules.only(case.rules) if case.rules is not None else rules
    unknown = sorted(set(case.rules or ()) - {r.name for r in selected})
    outcome.problems.extend(f"no rule named {name!r}" for name in unknown)
    try:
        book = _replay(case, events, Engine.for_prices(selected, prices), prices)
    except PricingError as exc:
        outcome.problems.append(f"event not priced: {exc.reason}")
        return outcome
    _compare(outcome, _observed(book), case.expect_alerts)
    return outcome


def _replay(
    case: RuleTestCase, events: Sequence[AnyEvent], engine: Engine, prices: PriceBook
) -> AlertBook:
    """Feed events in time order and evaluate every 5 minutes up to ``eval_time``."""
    state = InMemoryState(prices)
    pending = sorted(events, key=lambda e: e.unix_ts)
    end = parse_time(case.eval_time)
    first = parse_time(case.start) if case.start is not None else _first_time(pending, end)
    silences = [_silence(s) for s in case.silences]
    book = AlertBook()
    for now in _steps(first, end):
        while pending and pending[0].unix_ts <= now:
            state.add(pending.pop(0))
        book = engine.evaluate(state, now, book, silences).book
    return book


def _first_time(events: Sequence[AnyEvent], end: float) -> float:
    return min(events[0].unix_ts, end) if events else end


def _steps(start: float, end: float) -> list[float]:
    """Every 5-minute boundary from ``start`` to ``end``, and ``end`` itself."""
    steps = [float(t) for t in range(align_down(start), int(end), BUCKET_S)]
    return [t for t in steps if t < end] + [end]


def _silence(spec: SilenceSpec) -> Silence:
    return Silence(
        id=spec.id,
        rule=spec.rule,
        matchers=spec.matchers,
        starts_at=parse_time(spec.starts_at),
        ends_at=parse_time(spec.ends_at),
    )


def _observed(book: AlertBook) -> list[Observed]:
    return [
        Observed(
            rule=alert.rule,
            group=dict(alert.payload.get("group") or {}),
            state="silenced" if alert.mute is not None else alert.state,
            line=str(alert.payload.get("line")),
            value=str(alert.payload.get("value")),
        )
        for alert in book.active()
    ]


def _compare(
    outcome: RuleTestOutcome, observed: list[Observed], expected: Sequence[ExpectedAlert]
) -> None:
    unmatched = list(observed)
    for want in expected:
        hit = next((alert for alert in unmatched if alert.fits(want)), None)
        if hit is None:
            outcome.problems.append(f"missing: {_describe(want)}")
        else:
            unmatched.remove(hit)
    outcome.problems.extend(f"unexpected: {alert}" for alert in unmatched)


def _describe(expected: ExpectedAlert) -> str:
    group = ", ".join(f"{k}={v}" for k, v in expected.group.items())
    extra = "".join(
        f" {key}={value}" for key, value in (("line", expected.line), ("value", expected.value))
        if value is not None
    )
    return f"{expected.rule} {{{group}}} {expected.state}{extra}"

