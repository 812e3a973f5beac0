"""Budget enforcement: stopping a group's spend at a line, as pure decisions.

A budget rule with an ``enforce:`` block turns a group that crossed its trigger line into an
**enforcement plan**: the connector records what it will act on (a Slurm account, a user), the
owners are **warned**, and after the **grace** the group is checked again against the rule as
loaded then. Still over the line, not exempt, not lifted by someone, approved when approval
is manual, and within the rule's hourly cap, it is **enforced**: the connector first records
the values it is about to change (``before``), then changes them. It stays enforced until the
budget period ends, the budget line is raised above the spend, the rule stops enforcing, or
someone lifts it; **lifting** restores the recorded values exactly.

This is the reclamation's flow (``rules/reclaim.py``: mark, wait, re-check, act) with a second
act, the lift, which is why a plan here has two more states (``enforced``, ``lifting``). The
steps share the reclamation's ledger, claims, caps and audit log. Nothing here performs I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from costline.rules.durations import format_duration, rfc3339
from costline.rules.enforce_params import DEFAULT_MAX_PER_HOUR, FORECAST
from costline.rules.findings import Finding, fraction_of, money_text
from costline.rules.reclaim import Go, Hold, Keep, Outcome, Skip, Verdict, grace_end

if TYPE_CHECKING:
    from costline.rules.kinds.budget import BudgetRule

EnforceState = Literal["planned", "warned", "executing", "enforced", "lifting", "closed"]
EnforceStep = Literal["planned", "warned", "executed", "skipped", "failed", "lifted"]
AUTOMATION = "enforce"
"""What an action record of enforcement says in its ``automation`` key (reclamation's say
nothing)."""

__all__ = ["Go", "Hold", "Keep", "Outcome", "Skip", "Verdict"]


def group_key(group: Mapping[str, str]) -> str:
    """``team=pretrain`` (keys in the rule's ``group_by`` order); ``*`` for an ungrouped rule.

    A value's ``%``, ``,`` and ``=`` are written ``%25``, ``%2C`` and ``%3D``: tag values may
    hold any character, and two groups must never share a key (the plan, its slot in the
    ledger, a lift by hand all go by it)."""
    return ",".join(f"{key}={_escaped(value)}" for key, value in group.items()) or "*"


def _escaped(value: str) -> str:
    return value.replace("%", "%25").replace(",", "%2C").replace("=", "%3D")


def keep_key(rule: str, group: Mapping[str, str]) -> str:
    """What a manual lift keeps from being enforced again: this rule's group."""
    return f"{rule}/{group_key(group)}"


@dataclass(frozen=True)
class EnforcePlan:
    """One intended enforcement: which group, by which connector, triggered by which line."""

    plan_id: str
    rule: str
    group: Mapping[str, str]
    connector: str
    params: Mapping[str, Any]
    mode: str
    grace: int
    line: str
    """The trigger: ``limit``, a warning line (``warn_80``) or ``forecast``."""
    threshold: int
    limit: int
    """The rule's budget line when the plan was made: raising it above the spend lifts."""
    spent: int
    period_start: float
    period_end: float
    planned_at: float
    execute_at: float
    target: Mapping[str, str]
    currency: str

    @property
    def subject(self) -> str:
        """What the ledger holds one open plan per rule for: the group."""
        return group_key(self.group)

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan_id": self.plan_id, "rule": self.rule, "group": dict(self.group),
            "connector": self.connector, "params": dict(self.params), "mode": self.mode,
            "grace": self.grace, "line": self.line, "threshold": self.threshold,
            "limit": self.limit, "spent": self.spent, "period_start": self.period_start,
            "period_end": self.period_end, "planned_at": self.planned_at,
            "execute_at": self.execute_at, "target": dict(self.target),
            "currency": self.currency,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EnforcePlan:
        return cls(
            plan_id=str(data["plan_id"]), rule=str(data["rule"]), group=dict(data["group"]),
            connector=str(data["connector"]), params=dict(data["params"]),
            mode=str(data["mode"]), grace=int(data["grace"]), line=str(data["line"]),
            threshold=int(data["threshold"]), limit=int(data["limit"]),
            spent=int(data["spent"]), period_start=float(data["period_start"]),
            period_end=float(data["period_end"]), planned_at=float(data["planned_at"]),
            execute_at=float(data["execute_at"]), target=dict(data["target"]),
            currency=str(data["currency"]),
        )


@dataclass(frozen=True)
class Enforcement:
    """A plan as the ledger holds it, with the values it changed (``before``)."""

    plan: EnforcePlan
    state: EnforceState
    approved_by: str | None = None
    claimed_at: float | None = None
    warned_at: float | None = None
    enforced_at: float | None = None
    before: Mapping[str, Any] = field(default_factory=dict)
    """What the connector recorded before each change, by item (``assoc``, ``job:4211``)."""

    @property
    def due_at(self) -> float:
        """When it may be enforced: a full grace after a warning that went out late too."""
        return grace_end(self.plan, self.warned_at)


@dataclass(frozen=True)
class EnforceRecord:
    """One step of one enforcement, as published to ``NS.actions.v1``.

    ``serial`` tells apart the repeated steps of one plan: the pending jobs a sweep held
    after the first hold.
    """

    plan: EnforcePlan
    step: EnforceStep
    reason: str
    at: float
    detail: Mapping[str, Any] = field(default_factory=dict)
    serial: str = ""

    @property
    def action_id(self) -> str:
        suffix = f":{self.serial}" if self.serial else ""
        return f"{self.plan.plan_id}:{self.step}{suffix}"

    def to_dict(self) -> dict[str, Any]:
        plan = self.plan
        return {
            "action_id": self.action_id, "plan_id": plan.plan_id, "automation": AUTOMATION,
            "step": self.step, "reason": self.reason, "rule": plan.rule,
            "group": dict(plan.group), "resource_id": plan.subject,
            "connector": plan.connector, "mode": plan.mode, "at": rfc3339(self.at),
            "line": plan.line, "threshold": _amount(plan.threshold),
            "spent": _amount(plan.spent), "currency": plan.currency,
            "execute_at": rfc3339(plan.execute_at), "period_end": rfc3339(plan.period_end),
            "target": dict(plan.target), **self.detail,
        }


def _amount(micro: int) -> str:
    from costline.rules.prices import format_micro

    return format_micro(micro)


# ── triggers ──────────────────────────────────────────────────────────────────────────────


def trigger_line(rule: BudgetRule) -> tuple[str, int]:
    """The name and amount of the line that triggers the rule's enforcement."""
    assert rule.enforce is not None
    at = rule.enforce.at
    if isinstance(at, str):
        return at, rule.limit
    percent = at * 100
    name = str(int(percent)) if percent == percent.to_integral_value() else f"{percent:f}"
    return f"warn_{name}", fraction_of(rule.limit, at)


def triggers(rule: BudgetRule, finding: Finding, now: float) -> bool:
    """Whether a finding of the rule calls for enforcement now."""
    if rule.enforce is None:
        return False
    name, threshold = trigger_line(rule)
    if finding.value >= threshold:
        return True
    forecast = finding.forecast
    if name != FORECAST or forecast is None or forecast.crosses_at is None:
        return False
    within = rule.enforce.within
    return within is None or forecast.crosses_at <= now + within


def plan_id_for(rule: str, subject: str, planned_at: float) -> str:
    """Stable for the same rule, group and moment: two workers planning it agree."""
    text = f"enforce\t{rule}\t{subject}\t{planned_at!r}"
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def make_plan(rule: BudgetRule, finding: Finding, target: Mapping[str, str], currency: str,
              now: float) -> EnforcePlan:
    assert rule.enforce is not None
    line, threshold = trigger_line(rule)
    group = dict(finding.group)
    return EnforcePlan(
        plan_id=plan_id_for(rule.name, group_key(group), now), rule=rule.name, group=group,
        connector=rule.enforce.connector, params=rule.enforce.params, mode=rule.mode,
        grace=rule.enforce.grace, line=line, threshold=threshold, limit=rule.limit,
        spent=finding.value, period_start=finding.period[0], period_end=finding.period[1],
        planned_at=now, execute_at=now + rule.enforce.grace, target=dict(target),
        currency=currency,
    )


def refusal(rule: BudgetRule | None, group: Mapping[str, str], *, paused: bool,
            keep: Keep | None, now: float) -> str | None:
    """Why a group over its line is not planned at all (nothing is recorded), or ``None``."""
    if rule is None or rule.enforce is None:
        return "the rule no longer enforces"
    if rule.enforce.is_exempt(group):
        return "an exempt tag is set"
    if paused:
        return "enforcement is paused"
    if keep is not None and keep.until > now:
        return f"lifted by {keep.by} until {rfc3339(keep.until)}"
    return None


# ── records ───────────────────────────────────────────────────────────────────────────────


def planned(plan: EnforcePlan, action: str) -> EnforceRecord:
    how = "planned only (dry run)" if plan.mode == "dry_run" else "live"
    crossed = ("the forecast crosses the budget line" if plan.line == FORECAST else
               f"spend {money_text(plan.spent, plan.currency)} crossed {plan.line} "
               f"({money_text(plan.threshold, plan.currency)})")
    reason = (f"{crossed}; {action} at {rfc3339(plan.execute_at)} unless it is back under "
              f"the line, exempt or lifted ({how})")
    return EnforceRecord(plan, "planned", reason, plan.planned_at)


def unplanned(plan: EnforcePlan, problem: Outcome) -> EnforceRecord:
    """The one record of a plan whose target cannot be found (no such Slurm account)."""
    if plan.mode == "dry_run":
        return EnforceRecord(plan, "skipped", f"dry run, not planned: a live run could not "
                             f"enforce it: {problem.reason}", plan.planned_at)
    step: EnforceStep = "failed" if problem.step == "failed" else "skipped"
    return EnforceRecord(plan, step, f"not planned: {problem.reason}", plan.planned_at)


def warned(plan: EnforcePlan, now: float, action: str) -> EnforceRecord:
    due = Enforcement(plan, "warned", warned_at=now).due_at
    reason = (f"owners warned: {action} after {format_duration(plan.grace)} grace, at "
              f"{rfc3339(due)}, until the period ends at {rfc3339(plan.period_end)}")
    return EnforceRecord(plan, "warned", reason, now, {"execute_at": rfc3339(due)})


def dry_run_record(plan: EnforcePlan, action: str, now: float) -> EnforceRecord:
    return EnforceRecord(plan, "skipped", f"dry run: would {action}; nothing was touched", now)


# ── re-check ──────────────────────────────────────────────────────────────────────────────


def effective_mode(plan: EnforcePlan, rule: BudgetRule | None) -> str:
    """Dry run if either the plan or the rule as loaded now says so."""
    if plan.mode == "dry_run" or (rule is not None and rule.mode == "dry_run"):
        return "dry_run"
    return "live"


def interrupted_refusal(tracked: Enforcement, rule: BudgetRule | None, *, paused: bool,
                        now: float) -> str | None:
    """Why an enforcement a worker stopped in the middle of is not finished now, or ``None``:
    what changed since it started (a pause, a dry run, an exemption, the period's end) counts
    as it would have before it started."""
    refused = refusal(rule, tracked.plan.group, paused=paused, keep=None, now=now)
    if refused is not None:
        return refused
    if effective_mode(tracked.plan, rule) != "live":
        return f"rule {tracked.plan.rule} is in dry run now"
    if now >= tracked.plan.period_end:
        return f"the budget period ended at {rfc3339(tracked.plan.period_end)}"
    return None


def due_time(tracked: Enforcement, rule: BudgetRule | None) -> float:
    """When the plan's grace ends under the rule as loaded now (``reclaim.grace_end``)."""
    enforce = rule.enforce if rule is not None else None
    return grace_end(tracked.plan, tracked.warned_at,
                     enforce.grace if enforce is not None else None)


def verdict(tracked: Enforcement, rule: BudgetRule | None, finding: Finding | None,
            known: bool, now: float, *, paused: bool, keep: Keep | None) -> Verdict:
    """Whether a plan whose grace may have ended is enforced now, later, or never.

    ``finding`` is the group's latest finding of the rule and ``known`` whether the rule was
    evaluated since the worker started: without an evaluation the answer is "not yet".
    """
    plan = tracked.plan
    if now >= plan.period_end:  # a grace that outlasts the period ends with it
        return Skip(f"the budget period ended at {rfc3339(plan.period_end)}")
    due = due_time(tracked, rule)
    if now < due:
        return Hold(f"grace runs until {rfc3339(due)}")
    refused = refusal(rule, plan.group, paused=paused, keep=keep, now=now)
    if refused is not None:
        return Skip(refused)
    assert rule is not None and rule.enforce is not None
    if not known:
        return Hold("waiting for the rule's next evaluation")
    if finding is None or not triggers(rule, finding, now):
        return Skip(f"{plan.subject} is no longer over {trigger_line(rule)[0]}")
    if rule.enforce.params.get("approval") == "manual" and tracked.approved_by is None:
        return Hold("waiting for approval")
    return Go()


def lift_reason(tracked: Enforcement, rule: BudgetRule | None, finding: Finding | None,
                known: bool, now: float) -> str | None:
    """Why an enforced plan is lifted now, or ``None`` to keep it.

    Only the period's end, a rule that stopped enforcing (removed, or the group made exempt),
    or a budget line raised above the spend lift it. A forecast that no longer crosses does
    not: the enforcement itself slowed the spend, and lifting on it would let the group flap in
    and out. Nor does a rule put in dry run: it stops acting, and what it did stays until lifted.
    """
    plan = tracked.plan
    if now >= plan.period_end:
        return f"the budget period ended at {rfc3339(plan.period_end)}"
    if rule is None or rule.enforce is None:
        return f"rule {plan.rule} no longer enforces"
    if rule.enforce.is_exempt(plan.group):
        return f"{plan.subject} is exempt now"
    if rule.limit > plan.limit and known and (finding is None or not triggers(rule, finding,
                                                                               now)):
        return (f"the budget line was raised from {money_text(plan.limit, plan.currency)} "
                f"to {money_text(rule.limit, plan.currency)}, above the spend")
    return None


def cap_breach(max_per_hour: int | None, enforcing: int, last_hour: int) -> str | None:
    """Why enforcing ``enforcing`` groups in one round would break the hourly cap, or ``None``.

    A breach stops the whole round: a rule that suddenly finds many groups over budget is
    more likely fed wrong data (a price typo) than right.
    """
    cap = max_per_hour or DEFAULT_MAX_PER_HOUR
    if last_hour + enforcing > cap:
        return (f"aborted: enforcing {enforcing} groups would make {last_hour + enforcing} in "
                f"the last hour, over max_per_hour {cap}")
    return None


def latest_findings(findings: Sequence[Finding]) -> dict[str, Finding]:
    """A rule's findings by group key."""
    return {group_key(finding.group): finding for finding in findings}
