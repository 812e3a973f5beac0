"""Budget enforcement without sockets: the pure decisions, and the agent with an in-memory
ledger and a connector that keeps an association's limits in a dict."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from costline.connectors.enforce import EnforceConnector, NotEnforceable
from costline.connectors.enforce.slurm import SlurmEnforceParams
from costline.connectors.enforce_ledger import memory_enforce_ledger
from costline.connectors.plugins import PLUGINS
from costline.rules.durations import period_bounds
from costline.rules.enforce import EnforcePlan, group_key, triggers
from costline.rules.findings import Finding, Forecast
from costline.rules.kinds.budget import BudgetRule
from costline.rules.loader import RulesInvalid, load_rule_text
from costline.rules.reclaim import Outcome
from costline.streams.worker.enforcer import Enforcer
from tests.unit.rulefiles.builders import HOUR, MIN, T0

RULES = """
rules:
  - name: team-daily
    kind: budget
    group_by: [team]
    period: day
    limit: %(limit)s
    warn_at: [0.8]
    forecast: true
    enforce:
      connector: slurm
      action: limit
      account_tag: team
      grp_tres: {cpu: 0}
      grace: 10m
      exempt: {team: infra}%(extra)s
    mode: %(mode)s
"""
USD = 1_000_000


def rules(limit: int = 100, extra: str = "", mode: str = "live") -> Any:
    return load_rule_text(RULES % {"limit": limit, "extra": extra, "mode": mode},
                          plugins=PLUGINS)


def exempting_pretrain() -> Any:
    """The rules, reloaded with pretrain exempt too."""
    text = RULES.replace("{team: infra}", "{team: [infra, pretrain]}")
    return load_rule_text(text % {"limit": 100, "extra": "", "mode": "live"}, plugins=PLUGINS)


def finding(team: str, spent: float, now: float = T0,
            forecast: Forecast | None = None) -> Finding:
    start, end = period_bounds(now, "day", "UTC")
    return Finding(group={"team": team}, value=int(spent * USD), line="limit",
                   threshold=100 * USD, rank=1, lines=(), period=(start, end),
                   forecast=forecast)


@dataclass
class FakeSlurm(EnforceConnector):
    """An association per account, as a dict of its limits."""

    params_model = SlurmEnforceParams
    assoc: dict[str, dict[str, str]] = field(default_factory=dict)
    crash_after_apply: bool = False
    fail_apply: bool = False
    fail_lifts: int = 0
    applied: list[str] = field(default_factory=list)

    async def identify(self, plan: EnforcePlan) -> dict[str, str]:
        account = plan.group["team"]
        if account not in self.assoc:
            raise NotEnforceable("failed", f"no Slurm account {account}")
        return {"account": account}

    def describe(self, plan: EnforcePlan) -> str:
        return f"set GrpTRES=cpu=0 on {plan.target['account']}"

    async def snapshot(self, plan: EnforcePlan, before: Mapping[str, Any]) -> dict[str, Any]:
        if "assoc" in before:
            return {}
        return {"assoc": {"GrpTRES": self.assoc[plan.target["account"]]["GrpTRES"]}}

    async def apply(self, plan: EnforcePlan, before: Mapping[str, Any]) -> Outcome:
        self.assoc[plan.target["account"]]["GrpTRES"] = "cpu=0"
        self.applied.append(plan.target["account"])
        if self.crash_after_apply:
            raise SystemExit("the worker died")
        if self.fail_apply:
            raise RuntimeError("sacctmgr: connection refused")
        await asyncio.sleep(0)
        return Outcome("executed", f"set GrpTRES=cpu=0 on {plan.target['account']}")

    async def lift(self, plan: EnforcePlan, before: Mapping[str, Any]) -> Outcome:
        if self.fail_lifts:
            self.fail_lifts -= 1
            raise RuntimeError("sacctmgr: connection refused")
        current = self.assoc[plan.target["account"]]
        if current["GrpTRES"] != "cpu=0":
            return Outcome("executed", "left GrpTRES as someone changed it since")
        current["GrpTRES"] = before["assoc"]["GrpTRES"]
        return Outcome("executed", f"restored GrpTRES={current['GrpTRES']}")


class World:
    def __init__(self, **rule: Any) -> None:
        self.rules = rules(**rule)
        self.now = T0
        self.slurm = FakeSlurm(assoc={"pretrain": {"GrpTRES": "cpu=64"},
                                      "eval": {"GrpTRES": ""}, "infra": {"GrpTRES": ""}})
        self.ledger = memory_enforce_ledger(clock=lambda: self.now)
        self.sent: list[dict[str, Any]] = []
        self.enforcer = self.make()

    def make(self) -> Enforcer:
        async def sink(record: dict[str, Any]) -> None:
            self.sent.append(record)

        return Enforcer(rules=lambda: self.rules, ledger=self.ledger, sink=sink,
                        connectors={"slurm": self.slurm}, clock=lambda: self.now)

    def run(self, *findings: Finding, at: float | None = None) -> None:
        self.now = self.now if at is None else at
        asyncio.run(self.enforcer.submit({"team-daily": list(findings)}, self.now))
        asyncio.run(self.enforcer.tick(self.now))

    def steps(self) -> list[tuple[str, str]]:
        return [(r["resource_id"], r["step"]) for r in self.sent]


# ── pure decisions ────────────────────────────────────────────────────────────────────────


def test_the_trigger_is_the_budget_line_a_warning_line_or_the_forecast() -> None:
    [rule] = rules()
    assert isinstance(rule, BudgetRule)
    assert not triggers(rule, finding("pretrain", 99.99), T0)
    assert triggers(rule, finding("pretrain", 100), T0)
    [warn] = rules(extra="\n      at: 0.8")
    assert triggers(warn, finding("pretrain", 80), T0)  # type: ignore[arg-type]
    [ahead] = rules(extra="\n      at: forecast\n      within: 2h")
    soon, late = Forecast(150 * USD, T0 + HOUR), Forecast(150 * USD, T0 + 3 * HOUR)
    assert triggers(ahead, finding("pretrain", 50, forecast=soon), T0)  # type: ignore[arg-type]
    assert not triggers(ahead, finding("pretrain", 50, forecast=late), T0)  # type: ignore[arg-type]


@pytest.mark.parametrize(("extra", "problem"), [
    ("\n      at: 0.5", "enforce at: 0.5 is not one of warn_at"),
    ("\n      within: 2h", "within applies to at: forecast only"),
    ("\n      max_submit_jobs: -1", "greater than or equal to 0"),
])
def test_an_enforce_block_that_cannot_work_is_refused(extra: str, problem: str) -> None:
    with pytest.raises(RulesInvalid, match=problem):
        rules(extra=extra)


def test_an_exempt_key_outside_group_by_is_refused() -> None:
    """The group has only its team: a project would exempt nothing, silently."""
    text = RULES.replace("{team: infra}", "{project: infra}")
    with pytest.raises(RulesInvalid, match="enforce exempt: project not in group_by"):
        load_rule_text(text % {"limit": 100, "extra": "", "mode": "live"}, plugins=PLUGINS)


# ── the agent ─────────────────────────────────────────────────────────────────────────────


def test_a_group_over_its_line_is_warned_then_enforced_after_the_grace() -> None:
    world = World()
    world.run(finding("pretrain", 120), finding("eval", 10))
    assert world.steps() == [("team=pretrain", "planned"), ("team=pretrain", "warned")]
    assert world.slurm.applied == []
    world.run(finding("pretrain", 125), at=T0 + 10 * MIN)
    assert world.steps()[-1] == ("team=pretrain", "executed")
    assert world.slurm.assoc["pretrain"]["GrpTRES"] == "cpu=0"
    [record] = [r for r in world.sent if r["step"] == "executed"]
    assert record["automation"] == "enforce" and record["group"] == {"team": "pretrain"}


def test_a_grace_lengthened_after_the_warning_is_waited_for() -> None:
    world = World()
    world.run(finding("pretrain", 120))
    world.rules = load_rule_text(
        RULES.replace("grace: 10m", "grace: 30m") % {"limit": 100, "extra": "", "mode": "live"},
        plugins=PLUGINS)
    world.run(finding("pretrain", 125), at=T0 + 10 * MIN)
    assert world.slurm.applied == []  # the rule's grace now runs until 08:30
    world.now = T0 + 31 * MIN
    asyncio.run(world.enforcer.tick(world.now))  # no evaluation since 08:30: not yet
    assert world.slurm.applied == []
    world.run(finding("pretrain", 125), at=T0 + 31 * MIN)
    assert world.slurm.applied == ["pretrain"]


def test_a_grace_that_outlasts_the_budget_period_ends_with_it() -> None:
    world = World()
    world.rules = load_rule_text(
        RULES.replace("grace: 10m", "grace: 2d") % {"limit": 100, "extra": "", "mode": "live"},
        plugins=PLUGINS)
    world.run(finding("pretrain", 120))
    assert world.steps() == [("team=pretrain", "planned"), ("team=pretrain", "warned")]
    world.run(at=period_bounds(T0, "day", "UTC")[1] + MIN)  # the grace runs two more days
    assert world.steps()[-1] == ("team=pretrain", "skipped")
    assert "the budget period ended" in world.sent[-1]["reason"]
    assert world.slurm.applied == []


def test_the_period_rolling_over_lifts_and_restores_the_value_before() -> None:
    world = World()
    world.run(finding("pretrain", 120))
    world.run(finding("pretrain", 120), at=T0 + 10 * MIN)
    tomorrow = period_bounds(T0, "day", "UTC")[1] + MIN
    world.run(at=tomorrow)
    assert world.steps()[-1] == ("team=pretrain", "lifted")
    assert "the budget period ended" in world.sent[-1]["reason"]
    assert world.slurm.assoc["pretrain"]["GrpTRES"] == "cpu=64"


def test_raising_the_budget_line_above_the_spend_lifts() -> None:
    world = World()
    world.run(finding("pretrain", 120))
    world.run(finding("pretrain", 120), at=T0 + 10 * MIN)
    world.rules = rules(limit=150)
    world.run(finding("pretrain", 121), at=T0 + 11 * MIN)
    assert world.steps()[-1] == ("team=pretrain", "lifted")
    assert "raised from $100.00 to $150.00" in world.sent[-1]["reason"]
    assert world.slurm.assoc["pretrain"]["GrpTRES"] == "cpu=64"


def test_a_line_raised_but_still_under_the_spend_keeps_it() -> None:
    world = World()
    world.run(finding("pretrain", 120))
    world.run(finding("pretrain", 120), at=T0 + 10 * MIN)
    world.rules = rules(limit=110)
    world.run(finding("pretrain", 121), at=T0 + 11 * MIN)
    assert world.steps()[-1] == ("team=pretrain", "executed")


def test_a_lift_by_hand_restores_and_keeps_it_lifted_for_the_period() -> None:
    world = World()
    world.run(finding("pretrain", 120))
    world.run(finding("pretrain", 120), at=T0 + 10 * MIN)
    said = asyncio.run(world.enforcer.lift("team-daily", "team=pretrain", "alice"))
    assert "lifted by alice" in said
    assert world.slurm.assoc["pretrain"]["GrpTRES"] == "cpu=64"
    world.run(finding("pretrain", 130), at=T0 + 2 * HOUR)
    assert world.steps()[-1] == ("team=pretrain", "lifted")
    tomorrow = period_bounds(T0, "day", "UTC")[1] + MIN
    world.run(finding("pretrain", 130, now=tomorrow), at=tomorrow)
    assert world.steps()[-2:] == [("team=pretrain", "planned"), ("team=pretrain", "warned")]


def test_a_value_someone_changed_since_is_left_as_it_is() -> None:
    world = World()
    world.run(finding("pretrain", 120))
    world.run(finding("pretrain", 120), at=T0 + 10 * MIN)
    world.slurm.assoc["pretrain"]["GrpTRES"] = "cpu=8"
    asyncio.run(world.enforcer.lift("team-daily", "team=pretrain", "alice"))
    assert world.slurm.assoc["pretrain"]["GrpTRES"] == "cpu=8"


def test_back_under_the_line_during_the_grace_is_skipped() -> None:
    world = World()
    world.run(finding("pretrain", 120))
    world.run(at=T0 + 10 * MIN)  # a credit brought the group back under every line
    assert world.steps()[-1] == ("team=pretrain", "skipped")
    assert world.slurm.applied == []


def test_dry_run_plans_and_warns_and_touches_nothing() -> None:
    world = World(mode="dry_run")
    world.run(finding("pretrain", 120))
    world.run(finding("pretrain", 120), at=T0 + 10 * MIN)
    assert world.steps()[-1] == ("team=pretrain", "skipped")
    assert world.sent[-1]["reason"].startswith("dry run: would set GrpTRES=cpu=0 on pretrain")
    assert world.slurm.applied == []


def test_manual_approval_waits_for_approve() -> None:
    world = World(extra="\n      approval: manual")
    world.run(finding("pretrain", 120))
    world.run(finding("pretrain", 120), at=T0 + 20 * MIN)
    assert world.slurm.applied == []
    asyncio.run(world.enforcer.approve("team-daily", "team=pretrain", "bob"))
    world.run(finding("pretrain", 120), at=T0 + 21 * MIN)
    assert world.sent[-1]["step"] == "executed" and world.sent[-1]["approved_by"] == "bob"


def test_exempt_groups_and_a_pause_are_never_planned() -> None:
    world = World()
    asyncio.run(world.enforcer.pause("ops", "maintenance"))
    world.run(finding("infra", 500), finding("pretrain", 120))
    assert world.steps() == []
    asyncio.run(world.enforcer.resume())
    world.run(finding("infra", 500), finding("pretrain", 120))
    assert [s for s, _ in world.steps()] == ["team=pretrain", "team=pretrain"]


def test_a_round_over_the_hourly_cap_enforces_none() -> None:
    world = World(extra="\n      max_per_hour: 1")
    world.run(finding("pretrain", 120), finding("eval", 130))
    world.run(finding("pretrain", 120), finding("eval", 130), at=T0 + 10 * MIN)
    assert [r["step"] for r in world.sent[-2:]] == ["failed", "failed"]
    assert all(r["aborted"] for r in world.sent[-2:]) and world.slurm.applied == []


def test_a_group_that_maps_to_nothing_is_one_record() -> None:
    world = World()
    world.run(finding("nobody", 120))
    world.run(finding("nobody", 120), at=T0 + 10 * MIN)
    assert world.steps() == [("team=nobody", "failed")]


def test_a_crash_between_applying_and_recording_is_reconciled_at_start() -> None:
    world = World()
    world.run(finding("pretrain", 120))
    world.slurm.crash_after_apply = True
    with pytest.raises(SystemExit):
        world.run(finding("pretrain", 120), at=T0 + 10 * MIN)
    [tracked] = asyncio.run(world.ledger.plans())
    assert tracked.state == "executing" and tracked.before == {"assoc": {"GrpTRES": "cpu=64"}}
    world.slurm.crash_after_apply = False
    world.enforcer = world.make()  # a new worker
    world.run(at=T0 + 11 * MIN)
    assert world.steps()[-1] == ("team=pretrain", "executed")
    assert world.sent[-1]["reason"].startswith("completed after a restart")
    asyncio.run(world.enforcer.lift("team-daily", "team=pretrain", "alice"))
    assert world.slurm.assoc["pretrain"]["GrpTRES"] == "cpu=64"


def test_a_failed_change_is_rolled_back() -> None:
    world = World()
    world.slurm.fail_apply = True
    world.run(finding("pretrain", 120))
    world.run(finding("pretrain", 120), at=T0 + 10 * MIN)
    assert world.steps()[-1] == ("team=pretrain", "failed")
    assert "rolled back" in world.sent[-1]["reason"]
    assert world.slurm.assoc["pretrain"]["GrpTRES"] == "cpu=64"
    assert asyncio.run(world.ledger.plans()) == []


@pytest.mark.parametrize(("change", "why"), [
    ("pause", "enforcement is paused"),
    ("exempt", "an exempt tag is set"),
    ("dry_run", "is in dry run now"),
])
def test_an_enforcement_stopped_half_way_is_rolled_back_if_it_would_not_start_now(
        change: str, why: str) -> None:
    """What changed while no worker ran counts as it would have before the change began."""
    world = World()
    world.run(finding("pretrain", 120))
    world.slurm.crash_after_apply = True
    with pytest.raises(SystemExit):
        world.run(finding("pretrain", 120), at=T0 + 10 * MIN)
    world.slurm.crash_after_apply = False
    if change == "pause":
        asyncio.run(world.enforcer.pause("alice"))
    elif change == "exempt":
        world.rules = exempting_pretrain()
    else:
        world.rules = rules(mode="dry_run")
    world.enforcer = world.make()  # a new worker
    world.run(at=T0 + 11 * MIN)
    assert world.steps()[-1] == ("team=pretrain", "skipped")
    assert why in world.sent[-1]["reason"] and "rolled back" in world.sent[-1]["reason"]
    assert world.slurm.assoc["pretrain"]["GrpTRES"] == "cpu=64"
    assert asyncio.run(world.ledger.plans()) == []


def test_an_enforcement_stopped_before_it_changed_anything_is_closed_not_started() -> None:
    world = World()
    world.run(finding("pretrain", 120))
    [tracked] = asyncio.run(world.ledger.plans())
    assert asyncio.run(world.ledger.claim(tracked.plan.plan_id, "gone", T0 + 10 * MIN)) == \
        "claimed"  # a worker took it and stopped before it recorded anything
    asyncio.run(world.enforcer.pause("alice"))
    world.enforcer = world.make()
    world.run(at=T0 + 11 * MIN)
    assert world.steps()[-1] == ("team=pretrain", "skipped")
    assert "stopped before it changed anything" in world.sent[-1]["reason"]
    assert world.slurm.applied == [] and world.slurm.assoc["pretrain"]["GrpTRES"] == "cpu=64"


def test_an_enforced_group_made_exempt_is_lifted() -> None:
    world = World()
    world.run(finding("pretrain", 120))
    world.run(finding("pretrain", 120), at=T0 + 10 * MIN)
    assert world.slurm.assoc["pretrain"]["GrpTRES"] == "cpu=0"
    world.rules = exempting_pretrain()
    world.run(finding("pretrain", 130), at=T0 + 20 * MIN)
    assert world.steps()[-1] == ("team=pretrain", "lifted")
    assert "team=pretrain is exempt now" in world.sent[-1]["reason"]
    assert world.slurm.assoc["pretrain"]["GrpTRES"] == "cpu=64"


def test_two_groups_never_share_a_key() -> None:
    """Tag values may hold , and =: each group is enforced on its own finding."""
    one = {"team": "a", "project": "b,project=c"}
    other = {"team": "a,project=b", "project": "c"}
    assert group_key(one) != group_key(other)
    assert group_key({"team": "pretrain", "env": "prod"}) == "team=pretrain,env=prod"
    assert group_key({"team": "50%"}) == "team=50%25"


def test_a_roll_back_that_fails_is_tried_again_and_never_taken_for_an_enforcement() -> None:
    world = World()
    world.slurm.fail_apply, world.slurm.fail_lifts = True, 1
    world.run(finding("pretrain", 120))
    world.run(finding("pretrain", 120), at=T0 + 10 * MIN)
    [tracked] = asyncio.run(world.ledger.plans())
    assert tracked.state == "lifting" and world.slurm.assoc["pretrain"]["GrpTRES"] == "cpu=0"
    assert "lift failed" in world.sent[-1]["reason"]
    world.run(finding("pretrain", 120), at=T0 + 10 * MIN + 30)  # before its retry
    assert asyncio.run(world.ledger.plans())[0].state == "lifting"
    world.run(finding("pretrain", 120), at=T0 + 11 * MIN + 1)
    assert world.steps()[-1] == ("team=pretrain", "failed")
    assert "could not enforce" in world.sent[-1]["reason"] and \
        "rolled back" in world.sent[-1]["reason"]
    assert world.slurm.assoc["pretrain"]["GrpTRES"] == "cpu=64"
    assert asyncio.run(world.ledger.plans()) == []


def test_the_re_check_after_the_grace_waits_for_an_evaluation_made_after_it() -> None:
    """The finding that planned it says nothing of now: an evaluator that stopped answering
    (and a credit meanwhile) must not lead to an enforcement."""
    world = World()
    world.run(finding("pretrain", 120))
    world.now = T0 + 10 * MIN
    asyncio.run(world.enforcer.tick(world.now))  # the grace is over, no evaluation since
    assert [t.state for t in asyncio.run(world.ledger.plans())] == ["warned"]
    assert world.slurm.applied == []
    world.run(finding("pretrain", 120), at=T0 + 10 * MIN + 30)
    assert world.steps()[-1] == ("team=pretrain", "executed")


def test_a_sweep_that_fails_after_it_recorded_its_jobs_is_in_the_audit_log() -> None:
    """The hold may have taken effect before its command timed out: it is on record."""

    @dataclass
    class Sweeping(FakeSlurm):
        submitted: list[str] = field(default_factory=list)

        def sweeps(self, plan: EnforcePlan) -> bool:
            return True

        async def snapshot(self, plan: EnforcePlan, before: Mapping[str, Any]
                           ) -> dict[str, Any]:
            if "assoc" not in before:
                return await super().snapshot(plan, before)
            return {f"job:{j}": {} for j in self.submitted if f"job:{j}" not in before}

        async def apply(self, plan: EnforcePlan, before: Mapping[str, Any]) -> Outcome:
            if any(key.startswith("job:") for key in before) and self.submitted:
                raise TimeoutError("scontrol did not answer within 30s")
            return await super().apply(plan, before)

    world = World()
    world.slurm = Sweeping(assoc=world.slurm.assoc)
    world.enforcer = world.make()
    world.run(finding("pretrain", 120))
    world.run(finding("pretrain", 120), at=T0 + 10 * MIN)
    world.slurm.submitted = ["103"]
    world.run(finding("pretrain", 120), at=T0 + 11 * MIN)
    assert world.steps()[-1] == ("team=pretrain", "failed")
    assert "scontrol did not answer" in world.sent[-1]["reason"]
    assert "job:103" in world.sent[-1]["reason"]


# ── what the Slurm connector restores ─────────────────────────────────────────────────────


@pytest.mark.parametrize(("field", "before", "applied", "restore"), [
    ("GrpTRES", "mem=90000M", "cpu=0", "cpu=-1"),  # no cpu limit before: none after
    ("GrpTRES", "cpu=8,mem=90000M", "cpu=0", "cpu=8"),  # only the TRES costline set
    ("GrpTRESMins", "", "cpu=0,gres/gpu=0", "cpu=-1,gres/gpu=-1"),
    ("MaxSubmitJobs", "", "0", "-1"),
    ("MaxSubmitJobs", "40", "0", "40"),
    ("QOS", "normal,long", "held", "normal,long"),
    ("DefaultQOS", "", "held", "-1"),
])
def test_a_lift_sets_back_exactly_what_was_there(field: str, before: str, applied: str,
                                                 restore: str) -> None:
    from costline.connectors.enforce.slurm import restore_value

    assert restore_value(field, before, applied) == restore


def test_a_value_is_costlines_only_while_it_holds_what_costline_set() -> None:
    from costline.connectors.enforce.slurm import still_applied

    assert still_applied("GrpTRES", "mem=90000M,cpu=0", "cpu=0")
    assert not still_applied("GrpTRES", "cpu=4", "cpu=0")
    assert still_applied("QOS", "b,a", "a,b")
    assert not still_applied("MaxSubmitJobs", "5", "0")
