"""Log explosion rules: observability spend against its baseline or a rate per hour."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from tests.unit.rulefiles.builders import HOUR, MIN, T0, rule, state, usage

LOGS: dict[str, Any] = {
    "kind": "log_explosion",
    "group_by": ["job"],
    "window": "15m",
    "baseline": "1d",
    "ratio": 5,
}


def logs(ts: float, gb: float, **tags: str) -> object:
    return usage(ts, gb, "logs.ingest", **tags)


def steady_logs(gb_per_hour: float, **tags: str) -> list[object]:
    return [logs(T0 - (h + 1) * HOUR, gb_per_hour, **tags) for h in range(26)]


def test_a_jump_against_the_baseline_fires_with_its_rate_per_hour() -> None:
    found = state(*steady_logs(4, job="run-42"), logs(T0 - 10 * MIN, 20, job="run-42"))
    explosion = rule(**LOGS)
    [finding] = explosion.evaluate(found, T0)
    assert finding.line == "growth"
    assert finding.rate_per_hour == 40_000_000
    assert finding.value == finding.rate_per_hour
    assert [line.name for line in finding.lines] == ["growth"]
    assert explosion.value_unit({}) == "currency_per_hour"


def test_steady_logging_does_not_fire() -> None:
    found = state(*steady_logs(4, job="run-42"), logs(T0 - 10 * MIN, 1, job="run-42"))
    assert rule(**LOGS).evaluate(found, T0) == []


def test_max_rate_fires_without_any_history() -> None:
    found = state(logs(T0 - 10 * MIN, 100, job="new-run"))
    [finding] = rule(**LOGS, max_rate=100).evaluate(found, T0)
    assert (finding.line, finding.threshold, finding.value) == (
        "max_rate",
        100_000_000,
        200_000_000,
    )
    assert [line.name for line in finding.lines] == ["growth", "max_rate"]


def test_only_observability_spend_counts() -> None:
    found = state(*steady_logs(4, job="run-42"), usage(T0 - 10 * MIN, 1000, job="run-42"))
    assert rule(**LOGS, max_rate=1).evaluate(found, T0) == []


def test_a_line_is_required() -> None:
    with pytest.raises(ValidationError, match="set ratio, max_rate, or both"):
        rule(kind="log_explosion", window="15m", baseline="1d")
