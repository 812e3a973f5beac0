"""The reclamation agent end to end without sockets: an in-memory ledger, state and connector."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

from costline.connectors.plugins import PLUGINS
from costline.connectors.reclaim import NotReclaimable, ReclaimConnector
from costline.connectors.reclaim.slurm import SlurmParams
from costline.connectors.reclaim_ledger_memory import MemoryReclaimLedger
from costline.connectors.slack_actions import ActionRequest
from costline.rules.findings import Finding, ReclaimRequest
from costline.rules.loader import load_rule_text
from costline.rules.reclaim import Outcome, Plan, unknown_outcome
from costline.rules.state import ResourceSamples, matches
from costline.streams.worker.reclaimer import ReclaimActions, Reclaimer
from tests.unit.rulefiles.builders import MIN, T0, book

RULES = """
rules:
  - name: gpu-idle
    kind: idle
    match: {resource_type: "gpu.*"}
    below: 0.05
    for: 30m
    max_gap: 5m
    exempt: {keep_alive: "true"}
    reclaim: {connector: slurm, grace: 15m, action: cancel%(extra)s}
    mode: %(mode)s
"""
PLAN_AT = T0 + 30 * MIN
DUE = PLAN_AT + 15 * MIN


@dataclass
class FakeState:
    """A ``StateView`` whose resources' tags can change (the Redis store keeps the latest)."""

    series: dict[str, tuple[dict[str, str], list[tuple[float, float]]]] = field(
        default_factory=dict)

    def report(self, resource_id: str, start: float, end: float, value: float = 0.01,
               **tags: str) -> None:
        old_tags, points = self.series.get(resource_id, ({}, []))
        t = start
        while t <= end:
            points.append((t, value))
            t += MIN
        self.series[resource_id] = ({**old_tags, **tags}, sorted(points))

    def totals(self, *args: Any) -> dict[tuple[str, ...], int]:
        return {}

    def samples(self, metric: str, match: Mapping[str, str], since: float
                ) -> list[ResourceSamples]:
        found = []
        for resource_id, (tags, points) in sorted(self.series.items()):
            recent = [p for p in points if p[0] >= since]
            if recent and matches(match, {**tags, "resource_type": "gpu.h100"}):
                found.append(ResourceSamples(resource_id, "gpu.h100", tags, recent))
        return found


@dataclass
class FakeSlurm(ReclaimConnector):
    """Answers like the Slurm connector; remembers every release it was asked for."""

    params_model = SlurmParams
    released: list[str] = field(default_factory=list)
    crash: bool = False
    gone: set[str] = field(default_factory=set)

    async def identify(self, request: ReclaimRequest) -> dict[str, str]:
        if request.resource_id in self.gone:
            raise NotReclaimable("skipped", f"no job behind {request.resource_id}")
        return {"job_id": request.resource_id.rsplit("/", 1)[1]}

    def describe(self, plan: Plan) -> str:
        return f"cancel Slurm job {plan.target['job_id']}"

    async def release(self, plan: Plan) -> Outcome:
        self.released.append(plan.resource_id)
        if self.crash:
            raise SystemExit("the worker died")
        await asyncio.sleep(0)
        return Outcome("executed", f"cancelled Slurm job {plan.target['job_id']}")


class World:
    """One rule, a few GPUs, a ledger, a reclaimer, and what reached the sink."""

    def __init__(self, extra: str = "", mode: str = "live") -> None:
        self.rules = load_rule_text(RULES % {"extra": extra, "mode": mode}, plugins=PLUGINS)
        self.state = FakeState()
        self.now = T0
        self.ledger = MemoryReclaimLedger(clock=lambda: self.now)
        self.slurm = FakeSlurm()
        self.published: list[dict[str, Any]] = []
        self.reclaimer = self.new_reclaimer()

    def new_reclaimer(self, **options: Any) -> Reclaimer:
        return Reclaimer(rules=lambda: self.rules, state=self.state, ledger=self.ledger,
                         prices=book(), sink=self.sink, connectors={"slurm": self.slurm},
                         clock=lambda: self.now, **options)

    async def sink(self, record: dict[str, Any]) -> None:
        self.published.append(record)

    def idle(self, *jobs: str, until: float = DUE, **tags: str) -> None:
        for job in jobs:
            self.state.report(f"slurm/{job}", T0, until, **tags)

    def findings(self, now: float) -> dict[str, list[Finding]]:
        return {rule.name: rule.evaluate(self.state, now) for rule in self.rules}

    async def plan(self, now: float = PLAN_AT) -> list[dict[str, Any]]:
        self.now = now
        return await self.reclaimer.submit(self.findings(now), now)

    async def tick(self, now: float = DUE) -> list[dict[str, Any]]:
        self.now = now
        return await self.reclaimer.tick(now)

    def steps(self) -> list[tuple[str, str]]:
        return [(r["resource_id"], r["step"]) for r in self.published]

    def last(self, resource_id: str) -> dict[str, Any]:
        return [r for r in self.published if r["resource_id"] == resource_id][-1]


async def test_an_idle_job_is_planned_warned_and_released_after_its_grace() -> None:
    world = World()
    world.idle("4211")
    assert [r["step"] for r in await world.plan()] == ["planned", "warned"]
    assert await world.tick(DUE - 1) == []
    assert world.slurm.released == []
    [executed] = await world.tick(DUE)
    assert world.slurm.released == ["slurm/4211"]
    assert {k: executed[k] for k in ("step", "reason", "rule", "resource_id", "connector",
                                     "mode", "at", "saved", "currency")} == {
        "step": "executed", "reason": "cancelled Slurm job 4211", "rule": "gpu-idle",
        "resource_id": "slurm/4211", "connector": "slurm", "mode": "live",
        "at": "2026-11-30T08:45:00Z", "saved": "0.625000", "currency": "USD"}
    assert executed["action_id"] == f"{executed['plan_id']}:executed"
    # Monday 08:45 → 09:00 is a quarter hour at 2.50 an hour.


async def test_the_same_idle_resource_reported_at_every_evaluation_is_planned_once() -> None:
    world = World()
    world.idle("4211")
    await world.plan(PLAN_AT)
    assert await world.plan(PLAN_AT + MIN) == []
    assert await world.plan(PLAN_AT + 2 * MIN) == []
    assert world.steps() == [("slurm/4211", "planned"), ("slurm/4211", "warned")]


async def test_a_dry_run_rule_plans_and_never_releases() -> None:
    world = World(mode="dry_run")
    world.idle("4211")
    await world.plan()
    [record] = await world.tick(DUE)
    assert world.slurm.released == []
    assert (record["step"], record["mode"], record["saved"]) == ("skipped", "dry_run",
                                                                "0.000000")
    assert record["reason"] == "dry run: would cancel Slurm job 4211; nothing was touched"
    assert record["would_save"] == "0.625000"


async def test_switching_a_rule_to_dry_run_stops_its_planned_releases() -> None:
    world = World()
    world.idle("4211")
    await world.plan()
    world.rules = load_rule_text(RULES % {"extra": "", "mode": "dry_run"}, plugins=PLUGINS)
    await world.tick(DUE)
    assert world.slurm.released == [] and world.last("slurm/4211")["step"] == "skipped"


async def test_an_exempt_resource_is_never_planned() -> None:
    world = World()
    world.idle("4211", keep_alive="true")
    assert await world.plan() == []
    assert await world.ledger.plans() == []


async def test_an_exempt_tag_added_during_the_grace_wins() -> None:
    world = World()
    world.idle("4211")
    await world.plan()
    world.state.report("slurm/4211", DUE, DUE, keep_alive="true")
    [record] = await world.tick(DUE)
    assert (record["step"], record["reason"]) == ("skipped", "exempt tag now set "
                                                  "(keep_alive=true)")
    assert world.slurm.released == []


async def test_a_job_that_became_busy_is_skipped() -> None:
    world = World()
    world.idle("4211")
    world.state.report("slurm/4211", PLAN_AT + 5 * MIN, PLAN_AT + 5 * MIN, value=0.9)
    await world.plan()
    [record] = await world.tick(DUE)
    assert record["step"] == "skipped" and record["reason"].startswith("busy again: gpu_util")
    assert world.slurm.released == []


async def test_a_job_that_stopped_reporting_counts_as_busy() -> None:
    world = World()
    world.idle("4211", until=PLAN_AT + 5 * MIN)
    await world.plan()
    [record] = await world.tick(DUE)
    assert record["step"] == "skipped" and "stale counts as busy" in record["reason"]
    assert world.slurm.released == []


async def test_keep_stops_a_planned_release_and_later_plans() -> None:
    world = World()
    world.idle("4211", until=DUE + 120 * MIN)
    await world.plan()
    actions = ReclaimActions(world.reclaimer)
    press = ActionRequest("keep", "gpu-idle/x", "gpu-idle", "slurm/4211", 3600, "U1", "ada",
                          "C1", "1.0")
    world.now = PLAN_AT + MIN
    assert await actions.keep(press, timedelta(hours=1)) == "until 2026-11-30 09:31 UTC"
    assert world.last("slurm/4211")["reason"] == "kept by ada until 2026-11-30T09:31:00Z"
    await world.tick(DUE)
    assert await world.plan(DUE + MIN) == []
    assert world.slurm.released == []
    assert [r["step"] for r in await world.plan(PLAN_AT + 62 * MIN)] == ["planned", "warned"]


async def test_manual_approval_waits_for_approve() -> None:
    world = World(", approval: manual")
    world.idle("4211", until=DUE + 10 * MIN)
    await world.plan()
    assert await world.tick(DUE) == []
    assert await world.tick(DUE + MIN) == []
    press = ActionRequest("approve", "gpu-idle/x", "gpu-idle", "slurm/4211", None, "U1",
                          "ada", "C1", "1.0")
    world.now = DUE + 2 * MIN
    assert await ReclaimActions(world.reclaimer).approve(press) == "released shortly"
    [record] = await world.tick(DUE + 3 * MIN)
    assert (record["step"], record["approved_by"]) == ("executed", "ada")
    assert world.slurm.released == ["slurm/4211"]


async def test_approving_nothing_planned_is_an_error() -> None:
    world = World(", approval: manual")
    with pytest.raises(LookupError, match="no planned release of slurm/1 for rule gpu-idle"):
        await world.reclaimer.approve("gpu-idle", "slurm/1", "ada")


async def test_snooze_is_left_to_the_alert_silences() -> None:
    world = World()
    press = ActionRequest("snooze", "gpu-idle/x", "gpu-idle", None, 3600, "U1", "ada", None,
                          None)
    with pytest.raises(NotImplementedError):
        await ReclaimActions(world.reclaimer).snooze(press, timedelta(hours=1))


async def test_max_per_hour_aborts_the_whole_evaluation() -> None:
    world = World(", max_per_hour: 2, max_percent: 100")
    world.idle("1", "2", "3")
    await world.plan()
    records = await world.tick(DUE)
    assert [(r["step"], r["aborted"]) for r in records] == [("failed", True)] * 3
    assert records[0]["reason"] == (
        "aborted: 3 releases would make 3 in the last hour, over max_per_hour 2")
    assert world.slurm.released == []


async def test_max_per_hour_counts_the_earlier_releases_of_the_hour() -> None:
    world = World(", max_per_hour: 2, max_percent: 100")
    world.idle("1", "2", until=DUE + 30 * MIN)
    await world.plan()
    await world.tick(DUE)
    assert sorted(world.slurm.released) == ["slurm/1", "slurm/2"]
    world.state.report("slurm/3", T0 + 10 * MIN, DUE + 30 * MIN)
    await world.plan(DUE + 10 * MIN)
    [record] = await world.tick(DUE + 25 * MIN)
    assert record["reason"] == (
        "aborted: 1 releases would make 3 in the last hour, over max_per_hour 2")


async def test_max_percent_stops_a_mass_release() -> None:
    world = World(", max_percent: 50")
    world.idle("1", "2", "3")
    world.state.report("slurm/4", T0, DUE, value=0.7)
    await world.plan()
    records = await world.tick(DUE)
    assert {r["step"] for r in records} == {"failed"}
    assert records[0]["reason"] == (
        "aborted: 3 releases would make 3 in the last hour of the 4 resources the rule "
        "matches (75%), over max_percent 50")
    assert world.slurm.released == []


async def test_within_max_percent_the_releases_happen() -> None:
    world = World(", max_percent: 50")
    world.idle("1", "2")
    world.state.report("slurm/3", T0, DUE, value=0.7)
    world.state.report("slurm/4", T0, DUE, value=0.7)
    await world.plan()
    await world.tick(DUE)
    assert sorted(world.slurm.released) == ["slurm/1", "slurm/2"]


async def test_pause_stops_planning_and_due_releases_until_resumed() -> None:
    world = World()
    world.idle("1", until=DUE + 60 * MIN)
    await world.plan()
    await world.reclaimer.pause("ada", "maintenance")
    world.state.report("slurm/2", T0, DUE + 60 * MIN)
    assert await world.plan(PLAN_AT + MIN) == []
    [record] = await world.tick(DUE)
    assert (record["resource_id"], record["step"], record["reason"]) == (
        "slurm/1", "skipped", "reclamation is paused")
    assert await world.reclaimer.resume() is True
    planned = await world.plan(DUE + MIN)
    assert [(r["resource_id"], r["step"]) for r in planned] == [("slurm/2", "planned"),
                                                                 ("slurm/2", "warned")]
    assert world.slurm.released == []


async def test_a_target_that_cannot_be_identified_is_one_record_not_a_plan() -> None:
    world = World()
    world.idle("4211")
    world.slurm.gone.add("slurm/4211")
    records = await world.plan()
    assert [(r["step"], r["reason"]) for r in records] == [
        ("skipped", "not planned: no job behind slurm/4211")]
    assert await world.ledger.plans() == []
    assert await world.plan(PLAN_AT + MIN) == []


async def test_a_dry_run_that_cannot_identify_its_target_is_skipped_not_failed() -> None:
    """``planned`` then ``failed`` in the same second read as a release that broke; a dry run
    touches nothing, so it is one ``skipped`` record saying what a live run would meet."""
    world = World(mode="dry_run")
    world.idle("4211")
    world.slurm.gone.add("slurm/4211")
    records = await world.plan()
    assert [(r["step"], r["mode"], r["reason"]) for r in records] == [
        ("skipped", "dry_run", "dry run, not planned: a live run could not release it: no job "
         "behind slurm/4211")]


async def test_a_closed_plan_keeps_its_resource_for_the_cooldown() -> None:
    world = World()
    world.idle("4211", until=DUE + 120 * MIN)
    world.slurm.gone.add("slurm/4211")
    await world.plan()
    world.slurm.gone.clear()
    assert await world.plan(PLAN_AT + 59 * MIN) == []
    assert [r["step"] for r in await world.plan(PLAN_AT + 61 * MIN)] == ["planned", "warned"]


async def test_a_crash_between_claim_and_outcome_never_releases_twice() -> None:
    world = World()
    world.idle("4211", until=DUE + 30 * MIN)
    await world.plan()
    world.slurm.crash = True
    with pytest.raises(SystemExit):
        await world.tick(DUE)
    assert world.slurm.released == ["slurm/4211"]
    world.slurm.crash = False
    world.reclaimer = world.new_reclaimer(claim_timeout_s=600)
    assert await world.tick(DUE + MIN) == []
    [record] = await world.tick(DUE + 11 * MIN)
    assert record["step"] == "failed" and record["reason"].startswith("outcome unknown")
    assert await world.tick(DUE + 20 * MIN) == []
    assert world.slurm.released == ["slurm/4211"]


async def test_two_reclaimers_racing_release_once() -> None:
    world = World()
    world.idle("4211")
    other = world.new_reclaimer()
    findings = world.findings(PLAN_AT)
    world.now = PLAN_AT
    await asyncio.gather(world.reclaimer.submit(findings, PLAN_AT),
                         other.submit(findings, PLAN_AT))
    world.now = DUE
    await asyncio.gather(world.reclaimer.tick(DUE), other.tick(DUE))
    assert world.slurm.released == ["slurm/4211"]
    steps = [r["step"] for r in await world.ledger.history()]
    assert sorted(steps) == ["executed", "planned", "warned"]


async def test_a_refusing_sink_keeps_the_records_for_the_next_call() -> None:
    world = World()
    world.idle("4211")
    refusals = [RuntimeError("kafka down")]

    async def flaky(record: dict[str, Any]) -> None:
        if refusals:
            raise refusals.pop()
        world.published.append(record)

    world.reclaimer = Reclaimer(rules=world.rules, state=world.state, ledger=world.ledger,
                                prices=book(), sink=flaky, connectors={"slurm": world.slurm})
    world.now = PLAN_AT
    assert await world.reclaimer.submit(world.findings(PLAN_AT), PLAN_AT) == []
    assert [r["step"] for r in await world.reclaimer.tick(PLAN_AT + MIN)] == ["planned",
                                                                              "warned"]


async def test_a_removed_rule_releases_nothing() -> None:
    world = World()
    world.idle("4211")
    await world.plan()
    world.rules = load_rule_text("rules: []")
    [record] = await world.tick(DUE)
    assert (record["step"], record["reason"]) == ("skipped", "rule gpu-idle no longer reclaims")


async def test_a_warning_hook_that_fails_is_retried_on_the_next_tick() -> None:
    world = World()
    world.idle("4211")
    calls: list[str] = []

    async def warn(plan: Plan, record: dict[str, Any]) -> None:
        calls.append(plan.resource_id)
        if len(calls) == 1:
            raise ConnectionError("slack unavailable")

    world.reclaimer = world.new_reclaimer(warn=warn)
    assert [r["step"] for r in await world.plan()] == ["planned"]
    assert [r["step"] for r in await world.tick(PLAN_AT + MIN)] == ["warned"]
    assert calls == ["slurm/4211", "slurm/4211"]


async def test_a_warning_sent_late_still_gives_the_full_grace() -> None:
    world = World()
    world.idle("4211", until=DUE + 60 * MIN)
    failures = [ConnectionError("slack unavailable")] * 2

    async def warn(plan: Plan, record: dict[str, Any]) -> None:
        if failures:
            raise failures.pop()

    world.reclaimer = world.new_reclaimer(warn=warn)
    await world.plan()
    assert await world.tick(PLAN_AT + 10 * MIN) == []
    [record] = await world.tick(PLAN_AT + 20 * MIN)
    assert record["step"] == "warned" and record["execute_at"] == "2026-11-30T09:05:00Z"
    assert await world.tick(DUE + 5 * MIN) == []
    assert world.slurm.released == []
    [executed] = await world.tick(PLAN_AT + 35 * MIN)
    assert executed["step"] == "executed"


async def test_a_resource_busy_by_the_time_a_slow_round_reaches_it_is_skipped() -> None:
    """The round read its samples before the first release, which took two minutes: the next
    resource reported busy meanwhile and is read again before its own release."""
    world = World()
    world.idle("4211", "4212")
    await world.plan()
    slow = world.slurm.release

    async def two_minutes(plan: Plan) -> Outcome:
        outcome = await slow(plan)
        world.now += 2 * MIN
        for other in {"slurm/4211", "slurm/4212"} - {plan.resource_id}:
            world.state.report(other, world.now - MIN, world.now, value=0.9)
        return outcome

    world.slurm.release = two_minutes  # type: ignore[method-assign]
    await world.tick(DUE)
    [first] = world.slurm.released
    [other] = {"slurm/4211", "slurm/4212"} - {first}
    assert world.last(other)["step"] == "skipped"
    assert world.last(other)["reason"].startswith("busy again: gpu_util")


async def test_a_release_that_outlasted_its_claim_is_still_in_the_audit_log() -> None:
    """Another worker closed the plan as outcome unknown while the release ran: what the
    release did is published all the same, and said to be late."""
    world = World()
    world.idle("4211")
    await world.plan()
    slow = world.slurm.release

    async def past_the_claim(plan: Plan) -> Outcome:
        outcome = await slow(plan)
        [tracked] = [t for t in await world.ledger.plans() if t.state == "executing"]
        await world.ledger.close(plan.plan_id, "executing",
                                 unknown_outcome(tracked, world.now).to_dict(), 0)
        return outcome

    world.slurm.release = past_the_claim  # type: ignore[method-assign]
    await world.tick(DUE)
    await world.reclaimer.flush()
    steps = {r["step"]: r["reason"] for r in world.published if r["resource_id"] == "slurm/4211"}
    assert steps["failed"].startswith("outcome unknown")
    assert steps["executed"].endswith("(after the plan was closed as outcome unknown: the "
                                      "release outlasted the claim timeout)")
