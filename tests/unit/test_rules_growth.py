"""Growth rules: the recent window against the baseline average, with guards against noise."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from pydantic import ValidationError

from costline.rules.memory_state import InMemoryState
from costline.rules.state import Group, Measure, ResourceSamples
from tests.unit.rulefiles.builders import DAY, HOUR, T0, rule, state, usage

GROWTH: dict[str, Any] = {
    "kind": "growth",
    "group_by": ["project"],
    "window": "1h",
    "baseline": "1d",
    "ratio": 3,
}


class WithoutHistory:
    """A StateView that cannot say how far back its data goes."""

    def __init__(self, inner: InMemoryState) -> None:
        self.inner = inner

    def totals(
        self,
        measure: Measure,
        match: Mapping[str, str],
        group_by: Sequence[str],
        start: float,
        end: float,
    ) -> dict[Group, int]:
        return self.inner.totals(measure, match, group_by, start, end)

    def samples(self, metric: str, match: Mapping[str, str], since: float) -> list[ResourceSamples]:
        return self.inner.samples(metric, match, since)


def hourly(hours: int, quantity: float, end: float = T0, **tags: str) -> list[object]:
    """One usage per hour for ``hours`` hours before ``end``."""
    return [usage(end - (h + 1) * HOUR, quantity, **tags) for h in range(hours)]


def test_a_window_three_times_the_baseline_average_fires() -> None:
    found = state(*hourly(25, 10, T0 - HOUR, project="llm"), usage(T0 - HOUR, 30, project="llm"))
    growth = rule(**GROWTH)
    [finding] = growth.evaluate(found, T0)
    assert finding.group == {"project": "llm"}
    assert finding.value == 75_000_000
    assert [(line.name, line.value) for line in finding.lines] == [
        ("baseline", 25_000_000),
        ("growth", 75_000_000),
    ]
    assert finding.rate_per_hour == 75_000_000
    assert finding.top[0].group == {"job": ""}


def test_growth_below_the_ratio_does_not_fire() -> None:
    found = state(*hourly(25, 10, T0 - HOUR, project="llm"), usage(T0 - HOUR, 29, project="llm"))
    assert rule(**GROWTH).evaluate(found, T0) == []


def test_a_baseline_below_min_baseline_never_fires() -> None:
    found = state(*hourly(25, 1, T0 - HOUR, project="llm"), usage(T0 - HOUR, 100, project="llm"))
    assert rule(**GROWTH, min_baseline=100).evaluate(found, T0) == []
    assert len(rule(**GROWTH, min_baseline=50).evaluate(found, T0)) == 1


def test_a_group_younger_than_its_baseline_does_not_fire() -> None:
    found = state(*hourly(6, 10, T0 - HOUR, project="new"), usage(T0 - HOUR, 500, project="new"))
    assert rule(**GROWTH).evaluate(found, T0) == []


def test_without_history_an_empty_first_window_means_not_yet() -> None:
    young = state(*hourly(6, 10, T0 - HOUR, project="new"), usage(T0 - HOUR, 500, project="new"))
    assert rule(**GROWTH).evaluate(WithoutHistory(young), T0) == []
    old = state(*hourly(25, 10, T0 - HOUR, project="llm"), usage(T0 - HOUR, 500, project="llm"))
    assert len(rule(**GROWTH).evaluate(WithoutHistory(old), T0)) == 1


def test_growth_on_quantity_reads_the_resource_units() -> None:
    checkpoints = {"resource_type": "storage.checkpoint", "project": "llm"}
    found = state(
        *hourly(25, 1000, T0 - HOUR, **checkpoints),
        usage(T0 - HOUR, 5000, **checkpoints),
    )
    growth = rule(
        **{**GROWTH, "metric": "quantity", "match": {"resource_type": "storage.checkpoint"}}
    )
    [finding] = growth.evaluate(found, T0)
    assert finding.value == 5_000_000_000
    assert growth.value_unit({"storage.checkpoint": "gb_hour"}) == "gb_hour"


def test_the_bucket_in_progress_is_not_compared() -> None:
    found = state(*hourly(25, 10, T0, project="llm"), usage(T0 + 60, 1000, project="llm"))
    assert rule(**GROWTH).evaluate(found, T0 + 120) == []


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"baseline": "30m"}, "baseline must be at least as long as window"),
        ({"window": "7m"}, "whole multiple of 5m"),
        ({"ratio": 1}, "greater than 1"),
    ],
)
def test_windows_must_make_sense(keys: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        rule(**{**GROWTH, **keys})


def test_summary_compares_with_the_baseline() -> None:
    found = state(*hourly(25, 10, T0 - HOUR, project="llm"), usage(T0 - HOUR, 30, project="llm"))
    growth = rule(**GROWTH)
    [finding] = growth.evaluate(found, T0 + DAY * 0)
    assert growth.summarize(finding, "USD") == (
        "project=llm used $75.00 of cost in the last 1h, 3.0x the $25.00 per 1h of the "
        "1d before (growth line 3x)."
    )
