"""Fault waste rules: money lost to faults, absolute or as a share of spend."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from costline.rules.kinds.fault_waste import FaultWasteRule
from tests.unit.rulefiles.builders import HOUR, T0, fault, rule, state, usage

WASTE: dict[str, Any] = {"kind": "fault_waste", "group_by": ["project"], "period": "day"}
TAGS: dict[str, Any] = {"project": "llm-70b", "stage": "pretrain"}


def day_of_training() -> list[object]:
    """1,000 USD of spend and 100 + 25 + 12.5 USD of waste on three jobs."""
    return [
        usage(T0 - 2 * HOUR, 400, **TAGS, job="run-42"),
        fault(T0 - HOUR, units=40, lost_seconds=3600, job="run-42", recovery_seconds=0, **TAGS),
        fault(
            T0 - HOUR,
            units=10,
            lost_seconds=3600,
            job="run-43",
            recovery_seconds=0,
            kind="oom",
            **TAGS,
        ),
        fault(T0 - HOUR, units=5, lost_seconds=3600, job="run-44", recovery_seconds=0, **TAGS),
    ]


def test_waste_past_max_waste_names_fault_types_and_jobs() -> None:
    [finding] = rule(**WASTE, max_waste=100).evaluate(state(*day_of_training()), T0)
    assert (finding.line, finding.value, finding.threshold) == (
        "max_waste",
        137_500_000,
        100_000_000,
    )
    assert finding.faults == {"node_failure": 112_500_000, "oom": 25_000_000}
    assert [c.group["job"] for c in finding.top] == ["run-42", "run-43", "run-44"]


def test_waste_past_its_share_of_spend_fires() -> None:
    waste = rule(**WASTE, max_share=0.1)
    [finding] = waste.evaluate(state(*day_of_training()), T0)
    assert (finding.line, finding.threshold, finding.basis) == (
        "max_share",
        100_000_000,
        1_000_000_000,
    )
    assert waste.summarize(finding, "USD") == (
        "project=llm-70b lost $137.50 to faults this day (13.8% of spend), past the "
        "max_share line of $100.00; faults: node_failure, oom; "
        "most wasteful: run-42, run-43, run-44."
    )


def test_the_waste_line_outranks_the_share_line() -> None:
    both = rule(**WASTE, max_share=0.1, max_waste=120)
    [finding] = both.evaluate(state(*day_of_training()), T0)
    assert (finding.line, finding.rank) == ("max_waste", 1)
    share_only = rule(**WASTE, max_share=0.1, max_waste=500)
    [finding] = share_only.evaluate(state(*day_of_training()), T0)
    assert (finding.line, finding.rank) == ("max_share", 0)


def test_waste_under_both_lines_is_quiet() -> None:
    assert rule(**WASTE, max_share=0.5, max_waste=500).evaluate(state(*day_of_training()), T0) == []


def test_match_on_fault_type_still_compares_with_all_spend() -> None:
    waste = rule(**WASTE, match={"fault": "oom"}, max_share=0.02)
    assert isinstance(waste, FaultWasteRule)
    [finding] = waste.evaluate(state(*day_of_training()), T0)
    assert (finding.value, finding.basis) == (25_000_000, 1_000_000_000)


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({}, "set max_waste, max_share, or both"),
        ({"max_share": 0.1, "group_by": ["fault"]}, "do not group_by fault"),
        ({"max_share": 1.5}, "less than or equal to 1"),
    ],
)
def test_lines_must_make_sense(keys: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        rule(**{**WASTE, **keys})
