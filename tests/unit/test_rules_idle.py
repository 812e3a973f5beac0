"""Idle rules: every fresh sample below the line for ``for``; unknown is busy."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from costline.connectors.plugins import PLUGINS
from costline.rules.durations import rfc3339
from costline.rules.kinds.idle import IdleRule
from costline.rules.loader import RulesInvalid, load_rule_text
from costline.rules.plugins import Plugins
from costline.rules.reclaim_params import ReclaimParams
from tests.unit.rulefiles.builders import MIN, T0, rule, sample, state

IDLE: dict[str, Any] = {
    "kind": "idle",
    "group_by": ["team"],
    "metric": "gpu_util",
    "below": 0.05,
    "for": "30m",
    "reclaim": {"connector": "slurm", "grace": "15m", "action": "cancel"},
    "mode": "dry_run",
}
TAGS: dict[str, Any] = {"team": "pretrain", "job": "run-42", "owner": "alice"}


def minutely(values: list[float], start: float = T0, **tags: str) -> list[object]:
    return [sample(start + i * MIN, v, **{**TAGS, **tags}) for i, v in enumerate(values)]


def test_a_gpu_below_the_line_for_the_whole_time_is_idle() -> None:
    found = state(*minutely([0.9] + [0.01] * 40))
    idle = rule(**IDLE)
    [finding] = idle.evaluate(found, T0 + 40 * MIN)
    assert finding.group == {"team": "pretrain", "resource_id": "cluster-a/node-017"}
    assert (finding.line, finding.value, finding.threshold) == ("idle", 10_000, 50_000)
    assert rfc3339(finding.period[0]) == "2026-11-30T08:05:00Z"
    assert idle.summarize(finding, "USD") == (
        "cluster-a/node-017 (job run-42) has had gpu_util below 0.05 for at least 35m "
        "(peak 0.01); reclaim via slurm after 15m grace (planned only, dry run)."
    )
    assert finding.subject["job"] == "run-42"


def test_the_finding_carries_a_reclaim_request() -> None:
    found = state(*minutely([0.01] * 36))
    [finding] = rule(**IDLE).evaluate(found, T0 + 35 * MIN)
    assert finding.reclaim is not None
    assert finding.reclaim.to_dict() == {
        "resource_id": "cluster-a/node-017",
        "resource_type": "gpu.h100",
        "tags": TAGS,
        "connector": "slurm",
        "params": {"action": "cancel"},
        "approval": "auto",
        "grace": 900,
        "mode": "dry_run",
        "idle_since": "2026-11-30T08:00:00Z",
        "execute_at": "2026-11-30T08:50:00Z",
    }


def test_not_idle_until_for_has_passed() -> None:
    found = state(*minutely([0.9] + [0.01] * 25))
    assert rule(**IDLE).evaluate(found, T0 + 25 * MIN) == []


def test_one_busy_sample_restarts_the_clock() -> None:
    found = state(*minutely([0.01] * 20 + [0.5] + [0.01] * 30))
    assert rule(**IDLE).evaluate(found, T0 + 50 * MIN) == []
    assert rule(**IDLE).evaluate(found, T0 + 51 * MIN) != []


def test_a_resource_that_stopped_reporting_is_never_idle() -> None:
    found = state(*minutely([0.01] * 35))
    assert rule(**IDLE).evaluate(found, T0 + 34 * MIN) != []
    assert rule(**IDLE).evaluate(found, T0 + 45 * MIN) == []


def test_a_gap_longer_than_max_gap_counts_as_busy() -> None:
    found = state(*minutely([0.01] * 10), *minutely([0.01] * 25, start=T0 + 16 * MIN))
    assert rule(**IDLE).evaluate(found, T0 + 40 * MIN) == []
    assert rule(**IDLE, max_gap="10m").evaluate(found, T0 + 40 * MIN) != []


def test_exempt_tags_are_never_idle() -> None:
    found = state(*minutely([0.01] * 41, keep_alive="true"))
    assert rule(**IDLE, exempt={"keep_alive": "true"}).evaluate(found, T0 + 40 * MIN) == []
    assert rule(**IDLE, exempt={"stage": ["eval", "dev"]}).evaluate(found, T0 + 40 * MIN) != []


def test_samples_after_now_are_ignored() -> None:
    found = state(*minutely([0.01] * 20 + [0.9] * 30))
    assert rule(**IDLE, for_="15m").evaluate(found, T0 + 19 * MIN) != []


def test_idle_fires_without_a_second_wait() -> None:
    assert rule(**IDLE).pending_for == 0


def test_an_unknown_connector_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValidationError, match="unknown connector 'ssh'"):
        rule(**{**IDLE, "reclaim": {"connector": "ssh"}})


def test_connector_parameters_are_checked_where_they_are_written() -> None:
    text = (
        "rules:\n"
        "  - name: gpu-idle\n"
        "    kind: idle\n"
        "    below: 0.05\n"
        "    for: 30m\n"
        "    reclaim: {connector: slurm, action: reboot, nodes: 3}\n"
    )
    with pytest.raises(RulesInvalid) as caught:
        load_rule_text(text, file="idle.yaml", plugins=PLUGINS)
    assert [str(e) for e in caught.value.errors] == [
        "idle.yaml:6:33: rules.0.reclaim.action: Input should be 'cancel', 'requeue' or 'hold'",
        "idle.yaml:6:49: rules.0.reclaim.nodes: Extra inputs are not permitted",
    ]


IPMI_RULE = (
    "rules:\n"
    "  - name: gpu-idle\n"
    "    kind: idle\n"
    "    below: 0.05\n"
    "    for: 30m\n"
    "    reclaim: {connector: %s, power: cycle}\n"
)


class IpmiParams(ReclaimParams):
    power: str = "off"


class Ipmi:
    """A connector the loader is given, as the project's own connectors are."""

    params_model = IpmiParams


def test_the_connectors_are_the_ones_the_loader_is_given() -> None:
    [found] = load_rule_text(IPMI_RULE % "ipmi", plugins=Plugins(reclaimers={"ipmi": Ipmi}))
    assert isinstance(found, IdleRule) and found.reclaim is not None
    assert found.reclaim.params == {"power": "cycle"}
    with pytest.raises(RulesInvalid, match=r"unknown connector 'ipmi' \(known: dry_run, "
                       r"kubernetes, slurm, webhook\)"):
        load_rule_text(IPMI_RULE % "ipmi", plugins=PLUGINS)


def test_a_loader_given_no_connectors_knows_none() -> None:
    with pytest.raises(RulesInvalid, match=r"unknown connector 'slurm' \(known: none\)"):
        load_rule_text((IPMI_RULE % "slurm").replace("power: cycle", "action: cancel"))


def test_an_exempt_key_a_resource_cannot_carry_is_refused() -> None:
    """``exempt`` reads a resource's tags: a pseudo-tag would exempt nothing, silently."""
    with pytest.raises(RulesInvalid, match="exempt: resource_type is not a tag of a resource"):
        load_rule_text("rules:\n  - {name: gpu-idle, kind: idle, below: 0.05, for: 30m,"
                       " exempt: {resource_type: gpu.h100}}\n", plugins=PLUGINS)
