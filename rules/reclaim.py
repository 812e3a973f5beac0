"""Safe reclamation of idle resources: the flow as pure decisions.

An idle finding's reclaim request becomes a **plan** that records who the target is (the
Slurm job behind the resource, the Kubernetes object and its UID). The plan is announced
(**warned**), waits its **grace**, and is then **re-verified** from fresh samples: a resource
that became busy, went quiet (unknown is busy), gained an exempt tag or was kept by someone is
**skipped**. What is still idle is checked against the rule's caps and executed once, as
Cloud Custodian does it: mark, wait, re-check, act. Every step is an action record for the
audit log.

Nothing here performs I/O: the reclamation agent reads the ledger, the samples and the
connectors and asks these functions what to do next.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, time, timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any, Literal, Protocol
from zoneinfo import ZoneInfo

from costline.rules.durations import format_duration, rfc3339
from costline.rules.findings import ReclaimRequest
from costline.rules.kinds.idle import IdleRule
from costline.rules.prices import PriceBook, exact, format_micro, to_micro
from costline.rules.reclaim_params import DEFAULT_MAX_PER_HOUR, DEFAULT_MAX_PERCENT, Approval
from costline.rules.state import ResourceSamples

Step = Literal["planned", "warned", "executed", "skipped", "failed"]
PlanState = Literal["planned", "warned", "executing", "closed"]
Mode = Literal["live", "dry_run"]

BUSINESS_DAY_STARTS = time(9, 0)
UNITS_TAG = "units"
HOUR_S = 3600


@dataclass(frozen=True)
class Safety:
    """The safety settings of one rule, defaults filled in."""

    approval: Approval = "auto"
    max_per_hour: int = DEFAULT_MAX_PER_HOUR
    max_percent: float = DEFAULT_MAX_PERCENT
    timezone: str | None = None

    @classmethod
    def of(cls, params: Mapping[str, Any]) -> Safety:
        """Read from a reclaim request's (already validated) parameters."""
        approval: Approval = "manual" if params.get("approval") == "manual" else "auto"
        percent = params.get("max_percent")
        return cls(
            approval=approval,
            max_per_hour=int(params.get("max_per_hour") or DEFAULT_MAX_PER_HOUR),
            max_percent=DEFAULT_MAX_PERCENT if percent is None else float(percent),
            timezone=params.get("timezone"),
        )


@dataclass(frozen=True)
class Plan:
    """One intended release: what, where, by which connector, and who the target is."""

    plan_id: str
    rule: str
    resource_id: str
    resource_type: str
    tags: Mapping[str, str]
    connector: str
    params: Mapping[str, Any]
    mode: str
    grace: int
    idle_since: float
    planned_at: float
    execute_at: float
    target: Mapping[str, str]
    hourly: int
    """What the resource costs per hour, micro-units (0 when the price book cannot say)."""
    currency: str

    @property
    def subject(self) -> str:
        """What the ledger holds one open plan per rule for: the resource."""
        return self.resource_id

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan_id": self.plan_id, "rule": self.rule, "resource_id": self.resource_id,
            "resource_type": self.resource_type, "tags": dict(self.tags),
            "connector": self.connector, "params": dict(self.params), "mode": self.mode,
            "grace": self.grace, "idle_since": self.idle_since, "planned_at": self.planned_at,
            "execute_at": self.execute_at, "target": dict(self.target), "hourly": self.hourly,
            "currency": self.currency,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        return cls(
            plan_id=str(data["plan_id"]), rule=str(data["rule"]),
            resource_id=str(data["resource_id"]), resource_type=str(data["resource_type"]),
            tags=dict(data["tags"]), connector=str(data["connector"]),
            params=dict(data["params"]), mode=str(data["mode"]), grace=int(data["grace"]),
            idle_since=float(data["idle_since"]), planned_at=float(data["planned_at"]),
            execute_at=float(data["execute_at"]), target=dict(data["target"]),
            hourly=int(data["hourly"]), currency=str(data["currency"]),
        )


@dataclass(frozen=True)
class Tracked:
    """A plan as the ledger holds it: its state, when the owners were warned, who approved."""

    plan: Plan
    state: PlanState
    approved_by: str | None = None
    claimed_at: float | None = None
    warned_at: float | None = None

    @property
    def due_at(self) -> float:
        """The plan's release time, or a full grace after a warning that went out late."""
        return grace_end(self.plan, self.warned_at)


@dataclass(frozen=True)
class Keep:
    """Someone pressed Keep: the resource is not released before ``until``."""

    by: str
    until: float


@dataclass(frozen=True)
class Outcome:
    """What a connector reports after it was asked to act."""

    step: Literal["executed", "skipped", "failed"]
    reason: str
    detail: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ActionRecord:
    """One step of one plan, as published to ``NS.actions.v1`` and shown by the CLI."""

    plan: Plan
    step: Step
    reason: str
    at: float
    saved: int = 0
    detail: Mapping[str, Any] = field(default_factory=dict)

    @property
    def action_id(self) -> str:
        """Each plan takes each step at most once, so this names the record for consumers
        that deduplicate a re-published step."""
        return f"{self.plan.plan_id}:{self.step}"

    def to_dict(self) -> dict[str, Any]:
        plan = self.plan
        return {
            "action_id": self.action_id, "plan_id": plan.plan_id, "step": self.step,
            "reason": self.reason, "rule": plan.rule, "resource_id": plan.resource_id,
            "resource_type": plan.resource_type, "tags": dict(plan.tags),
            "connector": plan.connector, "mode": plan.mode, "at": rfc3339(self.at),
            "saved": format_micro(self.saved),
            "currency": plan.currency, "execute_at": rfc3339(plan.execute_at),
            "target": dict(plan.target), **self.detail,
        }


# ── planning ──────────────────────────────────────────────────────────────────────────────


def plan_id_for(rule: str, resource_id: str, planned_at: float) -> str:
    """Stable for the same rule, resource and moment: two workers planning it agree."""
    text = f"{rule}\t{resource_id}\t{planned_at!r}"
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def refusal(request: ReclaimRequest, rule: IdleRule | None, *, paused: bool,
            keep: Keep | None, now: float) -> str | None:
    """Why a reclaim request is not planned at all (nothing is recorded), or ``None``."""
    if rule is None or rule.reclaim is None:
        return "the rule no longer reclaims"
    if rule.is_exempt(request.tags):
        return "an exempt tag is set"
    if paused:
        return "reclamation is paused"
    if keep is not None and keep.until > now:
        return f"kept by {keep.by} until {rfc3339(keep.until)}"
    return None


def hourly_cost(prices: PriceBook, resource_type: str, tags: Mapping[str, str]) -> int:
    """Price per unit-hour × the resource's ``units`` tag (1 without it), micro-units; 0 for
    a type the book does not price by the hour."""
    price = prices.prices.get(resource_type)
    if price is None or not price.hourly:
        return 0
    return to_micro(price.price * _units(tags.get(UNITS_TAG)))


def _units(text: str | None) -> Decimal:
    try:
        units = exact(text) if text else Decimal(1)
    except ArithmeticError:
        return Decimal(1)
    return units if units.is_finite() and units > 0 else Decimal(1)


def make_plan(request: ReclaimRequest, rule: str, target: Mapping[str, str], hourly: int,
              currency: str, now: float) -> Plan:
    return Plan(
        plan_id=plan_id_for(rule, request.resource_id, now), rule=rule,
        resource_id=request.resource_id, resource_type=request.resource_type,
        tags=dict(request.tags), connector=request.connector, params=dict(request.params),
        mode=request.mode, grace=request.grace, idle_since=request.idle_since,
        planned_at=now, execute_at=now + request.grace, target=dict(target), hourly=hourly,
        currency=currency,
    )


def planned(plan: Plan, estimate: int) -> ActionRecord:
    """The first record of a plan; ``estimate`` is the saving if it is released on time."""
    how = "planned only (dry run)" if plan.mode == "dry_run" else "live"
    reason = (f"idle since {rfc3339(plan.idle_since)}; release via {plan.connector} at "
              f"{rfc3339(plan.execute_at)} unless it is busy again, exempt or kept ({how})")
    return ActionRecord(plan, "planned", reason, plan.planned_at,
                        detail={"estimated_saving": format_micro(estimate)})


def unplanned(plan: Plan, problem: Outcome) -> ActionRecord:
    """The one record of a plan whose target cannot be identified (the resource names no
    Slurm job, the job has ended): it ends as it is made, with nothing warned or waited for.

    A live plan closes as the connector says (``skipped``, ``failed``). A dry run touches
    nothing, so nothing failed: it is ``skipped``, and the reason says what a live run would
    have met.
    """
    if plan.mode == "dry_run":
        return ActionRecord(plan, "skipped", f"dry run, not planned: a live run could not "
                            f"release it: {problem.reason}", plan.planned_at,
                            detail=dict(problem.detail))
    return ActionRecord(plan, problem.step, f"not planned: {problem.reason}", plan.planned_at,
                        detail=dict(problem.detail))


def warned(plan: Plan, now: float) -> ActionRecord:
    """The warning; sent late (the notifier was down), it still gives a full grace."""
    due = Tracked(plan, "warned", warned_at=now).due_at
    reason = f"owners warned: release after {format_duration(plan.grace)} grace, at {rfc3339(due)}"
    return ActionRecord(plan, "warned", reason, now, detail={"execute_at": rfc3339(due)})


# ── re-verification ───────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Go:
    """Still idle and allowed: release it (subject to the caps)."""


@dataclass(frozen=True)
class Skip:
    """Do not release; the plan is closed with this reason."""

    reason: str


@dataclass(frozen=True)
class Hold:
    """Not yet: the grace is running or an approval is awaited."""

    reason: str


Verdict = Go | Skip | Hold


def effective_mode(plan: Plan, rule: IdleRule | None) -> Mode:
    """Dry run if either the plan or the rule as loaded now says so."""
    if plan.mode == "dry_run" or (rule is not None and rule.mode == "dry_run"):
        return "dry_run"
    return "live"


class Graced(Protocol):
    """A plan with a grace: of a reclamation, an enforcement or a checkpoint's lifecycle."""

    @property
    def execute_at(self) -> float: ...

    @property
    def planned_at(self) -> float: ...

    @property
    def grace(self) -> int: ...


def grace_end(plan: Graced, warned_at: float | None, rule_grace: int | None = None) -> float:
    """When a plan's grace is over: its own time, or a full grace after a warning that went
    out late, with the grace of its rule as loaded now (``rule_grace``; ``None``: no such
    rule) when that is longer. A grace lengthened since the warning applies; a shortened one
    does not (the owners were told the later time)."""
    grace = plan.grace if rule_grace is None else max(plan.grace, rule_grace)
    return max(plan.execute_at, (warned_at or plan.planned_at) + grace)


def due_time(tracked: Tracked, rule: IdleRule | None) -> float:
    """When the plan's grace ends under the rule as loaded now."""
    reclaim = rule.reclaim if rule is not None else None
    return grace_end(tracked.plan, tracked.warned_at,
                     reclaim.grace if reclaim is not None else None)


def verdict(tracked: Tracked, rule: IdleRule | None, samples: ResourceSamples | None,
            now: float, *, paused: bool, keep: Keep | None) -> Verdict:
    """Whether a plan whose grace may have ended is released now, later, or never."""
    plan = tracked.plan
    due = due_time(tracked, rule)
    if now < due:
        return Hold(f"grace runs until {rfc3339(due)}")
    if rule is None or rule.reclaim is None:
        return Skip(f"rule {plan.rule} no longer reclaims")
    if paused:
        return Skip("reclamation is paused")
    if keep is not None and keep.until > now:
        return Skip(f"kept by {keep.by} until {rfc3339(keep.until)}")
    busy = busy_reason(plan, rule, samples, now)
    if busy is not None:
        return Skip(busy)
    if Safety.of(rule.reclaim.params).approval == "manual" and tracked.approved_by is None:
        return Hold("waiting for approval")
    return Go()


def busy_reason(plan: Plan, rule: IdleRule, samples: ResourceSamples | None,
                now: float) -> str | None:
    """Why fresh samples do not show the resource idle all through its grace, or ``None``.

    Unknown is busy: no samples, or samples older than the rule's ``max_gap``, keep the
    resource. The idle run must have started before the plan was made (and be at least the
    rule's ``for`` long), so a busy spell during the grace period also keeps it.
    """
    points = [(ts, value) for ts, value in (samples.points if samples else ()) if ts <= now]
    if samples is None or not points:
        return f"no fresh {rule.metric} samples: unknown counts as busy"
    exempt = _exempt_tags(rule, samples.tags)
    if exempt:
        return f"exempt tag now set ({exempt})"
    age = now - points[-1][0]
    if age > rule.max_gap:
        return (f"last {rule.metric} sample is {format_duration(int(age))} old (more than "
                f"max_gap {format_duration(rule.max_gap)}): stale counts as busy")
    since = rule.idle_since(points, now)
    must_start = min(plan.planned_at, now - rule.for_)
    if since is not None and since <= must_start:
        return None
    ts, value = _last_busy(points, rule.below)
    if ts is None:
        return f"{rule.metric} samples do not cover the grace period without gaps"
    return f"busy again: {rule.metric} {value:g} at {rfc3339(ts)}"


def samples_since(plan: Plan, rule: IdleRule, now: float) -> float:
    """How far back ``busy_reason`` needs samples for this plan."""
    return min(plan.planned_at, now - rule.for_) - rule.max_gap


def _exempt_tags(rule: IdleRule, tags: Mapping[str, str]) -> str:
    if not rule.is_exempt(tags):
        return ""
    return ", ".join(f"{key}={tags[key]}" for key in sorted(rule.exempt) if key in tags)


def _last_busy(points: Sequence[tuple[float, float]], below: float
               ) -> tuple[float | None, float]:
    for ts, value in reversed(points):
        if value >= below:
            return ts, value
    return None, 0.0


def target_change(recorded: Mapping[str, str], current: Mapping[str, str]) -> str | None:
    """How the live target differs from the one planned (a reused id), or ``None``."""
    changed = [key for key in sorted(recorded) if current.get(key) != recorded[key]]
    if not changed:
        return None
    return "; ".join(f"{key} was {recorded[key]!r}, now {current.get(key)!r}" for key in changed)


# ── caps ──────────────────────────────────────────────────────────────────────────────────


def cap_breach(safety: Safety, releasing: int, matched: int, released_last_hour: int
               ) -> str | None:
    """Why releasing ``releasing`` resources in one evaluation would break a cap, or ``None``.

    A breach aborts all of that evaluation's releases, not just the ones over the line: a
    rule that suddenly finds half the cluster idle is more likely wrong than right. Both caps
    count the rule's releases of the last hour: resources a broken exporter turns idle a few
    seconds apart come due in different evaluations, one or two at a time.
    """
    total = released_last_hour + releasing
    if total > safety.max_per_hour:
        return (f"aborted: {releasing} releases would make {total} in the last hour, over "
                f"max_per_hour {safety.max_per_hour}")
    if total * 100 > safety.max_percent * matched:
        share = total * 100 / max(matched, 1)
        return (f"aborted: {releasing} releases would make {total} in the last hour of the "
                f"{matched} resources the rule matches ({share:.0f}%), over max_percent "
                f"{safety.max_percent:g}")
    return None


# ── outcomes ──────────────────────────────────────────────────────────────────────────────


def next_business_morning(now: float, zone: str) -> float:
    """The first 09:00 after ``now`` on a Monday to Friday, local time in ``zone``.

    Public holidays are not known here: a Monday holiday counts as a business day.
    """
    tz = ZoneInfo(zone)
    local = datetime.fromtimestamp(now, tz)
    day = local.date()
    while True:
        morning = datetime.combine(day, BUSINESS_DAY_STARTS, tzinfo=tz)
        if day.weekday() < 5 and morning.timestamp() > now:
            return morning.timestamp()
        day += timedelta(days=1)


def saving(plan: Plan, now: float, default_zone: str) -> int:
    """What releasing now saves: the hourly cost until the next business morning, when
    someone would have noticed the idle resource; micro-units, rounded half to even."""
    zone = Safety.of(plan.params).timezone or default_zone
    seconds = Decimal(str(next_business_morning(now, zone) - now))
    amount = Decimal(plan.hourly) * seconds / HOUR_S
    return int(amount.to_integral_value(ROUND_HALF_EVEN))


def dry_run_record(plan: Plan, action: str, now: float, would_save: int,
                   why: str = "dry run") -> ActionRecord:
    return ActionRecord(plan, "skipped", f"{why}: would {action}; nothing was touched", now,
                        detail={"would_save": format_micro(would_save)})


def outcome_record(plan: Plan, outcome: Outcome, now: float, saved: int) -> ActionRecord:
    """The closing record of an executed plan; only an executed step counts a saving."""
    return ActionRecord(plan, outcome.step, outcome.reason, now,
                        saved=saved if outcome.step == "executed" else 0,
                        detail=dict(outcome.detail))


def unknown_outcome(tracked: Tracked, now: float) -> ActionRecord:
    """A claim without an outcome: the worker stopped mid-release. Never retried."""
    since = rfc3339(tracked.claimed_at or now)
    return ActionRecord(tracked.plan, "failed",
                        f"outcome unknown: the release was started at {since} and its worker "
                        "stopped before recording the result; it is not retried, check the "
                        "target by hand", now)
