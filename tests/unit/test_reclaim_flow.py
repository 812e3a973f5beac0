"""The pure reclamation flow: planning, re-verification, caps, savings, parameters."""

from __future__ import annotations

from typing import Any

import pytest

from costline.connectors.plugins import PLUGINS
from costline.rules.findings import ReclaimRequest
from costline.rules.kinds.idle import IdleRule
from costline.rules.loader import RulesInvalid, load_rule_text
from costline.rules.reclaim import (
    Go,
    Hold,
    Keep,
    Safety,
    Skip,
    Tracked,
    busy_reason,
    cap_breach,
    hourly_cost,
    make_plan,
    next_business_morning,
    planned,
    refusal,
    saving,
    target_change,
    verdict,
)
from costline.rules.reclaim_params import ReclaimParams
from costline.rules.state import ResourceSamples
from tests.unit.rulefiles.builders import MIN, T0, at, book

RULE = """
rules:
  - name: gpu-idle
    kind: idle
    match: {resource_type: "gpu.*"}
    below: 0.05
    for: 30m
    max_gap: 5m
    exempt: {keep_alive: "true"}
    reclaim: {connector: slurm, grace: 15m, action: cancel%s}
"""


def idle_rule(extra: str = "") -> IdleRule:
    found = load_rule_text(RULE % extra, plugins=PLUGINS).get("gpu-idle")
    assert isinstance(found, IdleRule)
    return found


def request(resource_id: str = "slurm/4211", grace: int = 900, mode: str = "live",
            **tags: str) -> ReclaimRequest:
    return ReclaimRequest(resource_id=resource_id, resource_type="gpu.h100",
                          tags={"team": "pretrain", **tags}, connector="slurm",
                          params={"action": "cancel"}, grace=grace, mode=mode,
                          idle_since=T0, requested_at=T0 + 30 * MIN)


PLANNED_AT = T0 + 30 * MIN
TARGET = {"job_id": "4211", "name": "run-42", "user": "alice",
          "submit_time": "2026-11-30T07:00:00", "start_time": "2026-11-30T07:01:00"}


def tracked(state: str = "warned", approved_by: str | None = None) -> Tracked:
    plan = make_plan(request(), "gpu-idle", TARGET, 2_500_000, "USD", PLANNED_AT)
    return Tracked(plan, state, approved_by)  # type: ignore[arg-type]


def samples(values: list[float], start: float = T0, step: float = MIN,
            **tags: str) -> ResourceSamples:
    points = [(start + i * step, v) for i, v in enumerate(values)]
    return ResourceSamples("slurm/4211", "gpu.h100", {"team": "pretrain", **tags}, points)


DUE = PLANNED_AT + 15 * MIN  # 08:45


def test_a_plan_records_the_target_and_runs_after_its_grace() -> None:
    plan = tracked().plan
    assert plan.execute_at == DUE and plan.target == TARGET and plan.hourly == 2_500_000
    record = planned(plan, 1_000_000).to_dict()
    assert {key: record[key] for key in ("action_id", "step", "rule", "resource_id",
                                         "connector", "mode", "saved", "execute_at")} == {
        "action_id": f"{plan.plan_id}:planned", "step": "planned", "rule": "gpu-idle",
        "resource_id": "slurm/4211", "connector": "slurm", "mode": "live",
        "saved": "0.000000", "execute_at": "2026-11-30T08:45:00Z"}
    assert record["estimated_saving"] == "1.000000"


def test_two_workers_planning_the_same_moment_agree_on_the_plan_id() -> None:
    first = make_plan(request(), "gpu-idle", TARGET, 0, "USD", PLANNED_AT)
    again = make_plan(request(), "gpu-idle", TARGET, 0, "USD", PLANNED_AT)
    later = make_plan(request(), "gpu-idle", TARGET, 0, "USD", PLANNED_AT + 1)
    assert first.plan_id == again.plan_id != later.plan_id


@pytest.mark.parametrize(("why", "kwargs", "expected"), [
    ("exempt", {"tags": {"keep_alive": "true"}}, "an exempt tag is set"),
    ("paused", {"paused": True}, "reclamation is paused"),
    ("kept", {"keep": Keep("ada", T0 + 3600)}, "kept by ada until 2026-11-30T09:00:00Z"),
])
def test_a_request_is_not_planned_when(why: str, kwargs: dict[str, Any], expected: str) -> None:
    found = request(**kwargs.pop("tags", {}))
    args = {"paused": False, "keep": None, **kwargs}
    assert refusal(found, idle_rule(), now=PLANNED_AT, **args) == expected


def test_an_expired_keep_does_not_stop_planning() -> None:
    assert refusal(request(), idle_rule(), paused=False, keep=Keep("ada", T0),
                   now=PLANNED_AT) is None


def test_still_idle_after_grace_goes() -> None:
    fresh = samples([0.01] * 46)  # 08:00 … 08:45
    assert verdict(tracked(), idle_rule(), fresh, DUE, paused=False, keep=None) == Go()


def test_nothing_happens_before_the_grace_ends() -> None:
    fresh = samples([0.01] * 46)
    found = verdict(tracked(), idle_rule(), fresh, DUE - 1, paused=False, keep=None)
    assert found == Hold("grace runs until 2026-11-30T08:45:00Z")


def test_a_grace_lengthened_since_the_plan_applies_and_a_shortened_one_does_not() -> None:
    """The owners were told 08:45: a rule whose grace became 45m waits until 09:15, one whose
    grace became 5m still waits until 08:45."""
    fresh = samples([0.01] * 76)  # 08:00 … 09:15

    def with_grace(grace: str) -> IdleRule:
        found = load_rule_text(RULE.replace("grace: 15m", f"grace: {grace}") % "",
                               plugins=PLUGINS).get("gpu-idle")
        assert isinstance(found, IdleRule)
        return found

    longer = with_grace("45m")
    assert verdict(tracked(), longer, fresh, DUE, paused=False, keep=None) == \
        Hold("grace runs until 2026-11-30T09:15:00Z")
    assert verdict(tracked(), longer, fresh, PLANNED_AT + 45 * MIN, paused=False,
                   keep=None) == Go()
    assert verdict(tracked(), with_grace("5m"), fresh, DUE - 1, paused=False, keep=None) == \
        Hold("grace runs until 2026-11-30T08:45:00Z")


def test_missing_samples_count_as_busy() -> None:
    found = verdict(tracked(), idle_rule(), None, DUE, paused=False, keep=None)
    assert found == Skip("no fresh gpu_util samples: unknown counts as busy")


def test_stale_samples_count_as_busy() -> None:
    stale = samples([0.01] * 38)  # the last one at 08:37, 8 minutes before the check
    found = verdict(tracked(), idle_rule(), stale, DUE, paused=False, keep=None)
    assert found == Skip("last gpu_util sample is 8m old (more than max_gap 5m): stale counts "
                         "as busy")


def test_a_resource_busy_during_the_grace_is_skipped_even_if_idle_again() -> None:
    values = [0.01] * 46
    values[35] = 0.8  # 08:35, during the grace
    found = verdict(tracked(), idle_rule(), samples(values), DUE, paused=False, keep=None)
    assert found == Skip("busy again: gpu_util 0.8 at 2026-11-30T08:35:00Z")


def test_an_exempt_tag_added_during_the_grace_wins() -> None:
    fresh = samples([0.01] * 46, keep_alive="true")
    found = verdict(tracked(), idle_rule(), fresh, DUE, paused=False, keep=None)
    assert found == Skip("exempt tag now set (keep_alive=true)")


def test_keep_wins_over_idle() -> None:
    found = verdict(tracked(), idle_rule(), samples([0.01] * 46), DUE, paused=False,
                    keep=Keep("ada", DUE + 3600))
    assert found == Skip("kept by ada until 2026-11-30T09:45:00Z")


def test_pause_skips_a_due_plan() -> None:
    found = verdict(tracked(), idle_rule(), samples([0.01] * 46), DUE, paused=True, keep=None)
    assert found == Skip("reclamation is paused")


def test_a_removed_rule_releases_nothing() -> None:
    found = verdict(tracked(), None, samples([0.01] * 46), DUE, paused=False, keep=None)
    assert found == Skip("rule gpu-idle no longer reclaims")


def test_manual_approval_holds_until_approved() -> None:
    rule = idle_rule(", approval: manual")
    fresh = samples([0.01] * 46)
    assert verdict(tracked(), rule, fresh, DUE, paused=False, keep=None) == Hold(
        "waiting for approval")
    assert verdict(tracked(approved_by="ada"), rule, fresh, DUE, paused=False,
                   keep=None) == Go()


def test_waiting_for_approval_still_skips_a_resource_that_became_busy() -> None:
    rule = idle_rule(", approval: manual")
    values = [0.01] * 46 + [0.9]
    found = verdict(tracked(), rule, samples(values), DUE + MIN, paused=False, keep=None)
    assert isinstance(found, Skip) and found.reason.startswith("busy again")


def test_samples_with_a_gap_do_not_prove_idleness() -> None:
    values = [0.01] * 20
    gap = samples(values).points + [(T0 + 30 * MIN + i * MIN, 0.01) for i in range(16)]
    resource = ResourceSamples("slurm/4211", "gpu.h100", {}, gap)
    assert busy_reason(tracked().plan, idle_rule(), resource, DUE) == (
        "gpu_util samples do not cover the grace period without gaps")


def test_caps_per_hour_and_per_share() -> None:
    safety = Safety(max_per_hour=5, max_percent=50.0)
    assert cap_breach(safety, 2, 10, 3) is None
    assert cap_breach(safety, 3, 10, 3) == (
        "aborted: 3 releases would make 6 in the last hour, over max_per_hour 5")
    assert cap_breach(safety, 3, 4, 0) == (
        "aborted: 3 releases would make 3 in the last hour of the 4 resources the rule "
        "matches (75%), over max_percent 50")
    assert cap_breach(safety, 2, 4, 0) is None
    # Due one at a time (resources turned idle seconds apart): the hour still counts them.
    assert cap_breach(safety, 1, 4, 2) == (
        "aborted: 1 releases would make 3 in the last hour of the 4 resources the rule "
        "matches (75%), over max_percent 50")


def test_safety_defaults_and_the_written_parameters() -> None:
    assert Safety.of({"action": "cancel"}) == Safety("auto", 20, 100.0, None)
    rule = idle_rule(", approval: manual, max_per_hour: 3, max_percent: 12.5, "
                     "timezone: Europe/Berlin")
    assert rule.reclaim is not None
    assert Safety.of(rule.reclaim.params) == Safety("manual", 3, 12.5, "Europe/Berlin")


def test_unwritten_optional_parameters_stay_out_of_the_request() -> None:
    rule = idle_rule()
    assert rule.reclaim is not None and rule.reclaim.params == {"action": "cancel"}
    assert ReclaimParams().model_dump() == {}


@pytest.mark.parametrize("extra", [
    ", max_percent: 0", ", max_percent: 101", ", max_per_hour: 0", ", approval: maybe",
    ", timezone: Mars/Olympus", ", job_id_tag: Bad-Tag", ", secret: x",
])
def test_bad_reclaim_parameters_are_rule_file_errors(extra: str) -> None:
    with pytest.raises(RulesInvalid):
        idle_rule(extra)


def test_the_next_business_morning() -> None:
    assert next_business_morning(at("2026-11-30T08:00"), "UTC") == at("2026-11-30T09:00")
    assert next_business_morning(at("2026-11-30T09:00"), "UTC") == at("2026-12-01T09:00")
    assert next_business_morning(at("2026-12-04T18:00"), "UTC") == at("2026-12-07T09:00")
    assert next_business_morning(at("2026-12-05T12:00"), "UTC") == at("2026-12-07T09:00")
    # 09:00 in Berlin is 08:00 UTC in winter.
    assert next_business_morning(at("2026-12-01T07:00"), "Europe/Berlin") == at(
        "2026-12-01T08:00")


def test_the_saving_counts_the_hours_until_someone_would_have_noticed() -> None:
    plan = make_plan(request(), "gpu-idle", TARGET, 2_500_000, "USD", at("2026-12-04T16:00"))
    # Friday 17:00 UTC → Monday 09:00 UTC is 64 hours at 2.50 an hour.
    assert saving(plan, at("2026-12-04T17:00"), "UTC") == 160_000_000
    berlin = make_plan(ReclaimRequest(**{**request().__dict__,
                                         "params": {"action": "cancel",
                                                    "timezone": "Europe/Berlin"}}),
                       "gpu-idle", TARGET, 2_500_000, "USD", at("2026-12-04T16:00"))
    assert saving(berlin, at("2026-12-04T17:00"), "UTC") == 157_500_000


def test_the_hourly_cost_comes_from_the_price_book_and_the_units_tag() -> None:
    prices = book()
    assert hourly_cost(prices, "gpu.h100", {}) == 2_500_000
    assert hourly_cost(prices, "gpu.h100", {"units": "8"}) == 20_000_000
    assert hourly_cost(prices, "gpu.h100", {"units": "lots"}) == 2_500_000
    assert hourly_cost(prices, "logs.ingest", {}) == 0
    assert hourly_cost(prices, "gpu.unknown", {}) == 0


def test_a_reused_job_id_is_told_apart_by_its_recorded_identity() -> None:
    assert target_change(TARGET, dict(TARGET)) is None
    reused = {**TARGET, "start_time": "2026-11-30T09:00:00", "name": "other"}
    assert target_change(TARGET, reused) == (
        "name was 'run-42', now 'other'; start_time was '2026-11-30T07:01:00', "
        "now '2026-11-30T09:00:00'")
