"""Silences match rules and tags until they end; a fault mutes its job's idle and growth alerts."""

from __future__ import annotations

from typing import Any

import pytest

from costline.rules.engine import Engine
from costline.rules.inhibit import inhibition_for
from costline.rules.loader import RuleSet
from costline.rules.silences import Silence, silence_for, unexpired
from costline.rules.state import FaultRecord
from tests.unit.rulefiles.builders import HOUR, MIN, T0, fault, rule, sample, state, usage


def test_a_silence_matches_rule_globs_and_tag_globs_while_active() -> None:
    silence = Silence("s1", ends_at=T0 + HOUR, rule="team-*", matchers={"team": "pre*"})
    assert silence.covers("team-monthly", {"team": "pretrain"}, T0)
    assert not silence.covers("gpu-idle", {"team": "pretrain"}, T0)
    assert not silence.covers("team-monthly", {"team": "eval"}, T0)
    assert not silence.covers("team-monthly", {"team": "pretrain"}, T0 + HOUR)


def test_of_several_silences_the_longest_wins_and_old_ones_are_dropped() -> None:
    short = Silence("short", ends_at=T0 + MIN, rule="r")
    long = Silence("long", ends_at=T0 + HOUR, matchers={"team": "a"})
    assert silence_for([short, long], "r", {"team": "a"}, T0) == long
    assert unexpired([short, long], T0 + 2 * MIN) == [long]
    assert Silence.from_dict(long.to_dict()) == long


def test_a_silence_must_say_what_it_mutes_and_must_end() -> None:
    with pytest.raises(ValueError, match="names a rule"):
        Silence("s", ends_at=T0)
    with pytest.raises(ValueError, match="ends after it starts"):
        Silence("s", ends_at=T0, starts_at=T0, rule="r")


def test_a_fault_covers_its_job_for_its_recovery_window() -> None:
    record = FaultRecord(T0, "node_failure", "gpu.h100", 8, 600, 900, {"job": "run-42"})
    assert inhibition_for([record], {"job": "run-42"}, T0 + 899) is not None
    assert inhibition_for([record], {"job": "run-42"}, T0 + 900) is None
    assert inhibition_for([record], {"job": "run-43"}, T0 + 60) is None
    assert inhibition_for([record], {}, T0 + 60) is None


IDLE: dict[str, Any] = {"kind": "idle", "name": "gpu-idle", "below": 0.05, "for": "30m"}
BUDGET: dict[str, Any] = {"kind": "budget", "name": "job-budget", "group_by": ["job"], "limit": 1}


def _engine() -> Engine:
    return Engine(RuleSet((rule(**IDLE), rule(**BUDGET))), "USD")


def test_a_fault_mutes_its_jobs_idle_alert_but_not_its_budget() -> None:
    found = state(
        *(sample(T0 + m * MIN, 0.0, job="run-42") for m in range(0, 61)),
        usage(T0, 10, job="run-42"),
        fault(T0 + 25 * MIN, recovery_seconds=20 * MIN, job="run-42"),
    )
    engine = _engine()
    first = engine.evaluate(found, T0 + 40 * MIN)
    assert sorted((c["rule"], c["state"]) for c in first.changes) == [
        ("gpu-idle", "silenced"),
        ("job-budget", "firing"),
    ]
    [idle] = [c for c in first.changes if c["rule"] == "gpu-idle"]
    assert "node_failure on job run-42" in idle["summary"]
    later = engine.evaluate(found, T0 + 50 * MIN, first.book)
    assert [(c["rule"], c["previous_state"], c["state"]) for c in later.changes] == [
        ("gpu-idle", "silenced", "firing"),
    ]


def test_faults_can_be_given_instead_of_read_from_the_state() -> None:
    found = state(*(sample(T0 + m * MIN, 0.0, job="run-42") for m in range(0, 41)))
    record = FaultRecord(T0 + 30 * MIN, "oom", "gpu.h100", 1, 0, 1800, {"job": "run-42"})
    changes = _engine().evaluate(found, T0 + 40 * MIN, faults=[record]).changes
    assert [c["state"] for c in changes] == ["silenced"]


def test_a_muted_idle_finding_is_not_handed_to_automation() -> None:
    """Reclamation acts on ``actionable``: idleness a fault explains, or one silenced, is not
    released without a word; the budget of the same job still counts."""
    found = state(
        *(sample(T0 + m * MIN, 0.0, job="run-42") for m in range(0, 61)),
        usage(T0, 10, job="run-42"),
        fault(T0 + 25 * MIN, recovery_seconds=20 * MIN, job="run-42"),
    )
    evaluation = _engine().evaluate(found, T0 + 40 * MIN)
    assert evaluation.evaluated()["gpu-idle"] and evaluation.actionable()["gpu-idle"] == []
    assert evaluation.actionable()["job-budget"] == evaluation.evaluated()["job-budget"]
    silenced = _engine().evaluate(found, T0 + 50 * MIN,
                                  silences=[Silence("s", ends_at=T0 + HOUR, rule="gpu-idle")])
    assert silenced.actionable()["gpu-idle"] == []
    assert _engine().evaluate(found, T0 + 50 * MIN).actionable()["gpu-idle"]
