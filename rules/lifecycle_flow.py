"""The checkpoint lifecycle's actions as plans: announced, re-checked, carried out, audited.

The flow reuses reclamation's safety (``costline.rules.reclaim``): an action the policy asks
for (``costline.rules.lifecycle``) is planned, announced, waits its grace, and is re-checked
against a fresh inventory (``recheck``) before a connector acts, at most once, within the
rule's caps. Every step is an action record for the audit log. Nothing here performs I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from costline.rules.durations import format_duration, rfc3339
from costline.rules.inventory import Checkpoint, Pin, Restore
from costline.rules.lifecycle import (
    LifecycleAction,
    Retention,
    held_back,
    ordinal_of,
    policy_action,
)
from costline.rules.prices import format_micro
from costline.rules.reclaim import ActionRecord, Go, Hold, Plan, Skip, Verdict

DAY_H = 24


def target_of(action: LifecycleAction, identity: Mapping[str, str]) -> dict[str, str]:
    """What a plan records of its checkpoint: the action, where it is and the connector's
    identity of it (a file's size and modification time), re-checked before acting."""
    checkpoint = action.checkpoint
    return {"action": action.action, "to_tier": action.to_tier or "",
            "run": checkpoint.run, "step": str(checkpoint.step), "tier": checkpoint.tier,
            "location": checkpoint.location, "bytes": str(checkpoint.bytes), **identity}


def recheck(retention: Retention | None, plan: Plan, due_at: float, run: Sequence[Checkpoint],
            restores: Sequence[Restore], pins: Mapping[str, Pin], now: float, *,
            paused: bool, approved: bool, manual: bool) -> Verdict:
    """Whether a planned action is taken now, later, or never, from a fresh inventory."""
    if now < due_at:
        return Hold(f"grace runs until {rfc3339(due_at)}")
    if retention is None:
        return Skip(f"rule {plan.rule} no longer manages checkpoints")
    if paused:
        return Skip("the checkpoint lifecycle is paused")
    checkpoint = next((c for c in run if c.checkpoint_id == plan.resource_id), None)
    if checkpoint is None:
        return Skip("no longer in the inventory")
    target = plan.target
    if (checkpoint.tier, checkpoint.location) != (target.get("tier"), target.get("location")):
        return Skip(f"moved since it was planned: now {checkpoint.tier} at "
                    f"{checkpoint.location}")
    why = held_back(retention, checkpoint, run, restores, pins, now)
    if why is not None:
        return Skip(why)
    wanted = policy_action(retention, checkpoint, ordinal_of(run, checkpoint.checkpoint_id)
                            or 0, now)
    if wanted is None or wanted[0] != target.get("action") or \
            (wanted[1] or "") != target.get("to_tier", ""):
        return Skip("the rule no longer asks for it")
    if manual and not approved:
        return Hold("waiting for approval")
    return Go()


def describe(plan: Plan) -> str:
    """``delete /ckpt/run-42/step-1000`` or ``move … to storage.archive``."""
    target = plan.target
    if target.get("action") == "delete":
        return f"delete {target.get('location', plan.resource_id)}"
    return f"move {target.get('location', plan.resource_id)} to {target.get('to_tier')}"


def _saving(plan: Plan) -> dict[str, str]:
    return {"saves_per_day": format_micro(plan.hourly * DAY_H)}


def _detail(plan: Plan) -> dict[str, Any]:
    target = plan.target
    return {"action": target.get("action"), "to_tier": target.get("to_tier") or None,
            "run": target.get("run"), "checkpoint_step": target.get("step"),
            "location": target.get("location"), **_saving(plan)}


def planned_record(plan: Plan, reason: str) -> ActionRecord:
    how = "a dry run: nothing will be touched" if plan.mode == "dry_run" else "live"
    text = (f"{reason}; {describe(plan)} via {plan.connector} at {rfc3339(plan.execute_at)} "
            f"unless it is then the latest, pinned, exempt or being restored ({how})")
    return ActionRecord(plan, "planned", text, plan.planned_at, detail=_detail(plan))


def warned_record(plan: Plan, now: float, due: float) -> ActionRecord:
    text = (f"announced: {describe(plan)} after {format_duration(plan.grace)} grace, at "
            f"{rfc3339(due)}")
    return ActionRecord(plan, "warned", text, now, detail={**_detail(plan),
                                                           "execute_at": rfc3339(due)})


def dry_run_record(plan: Plan, now: float) -> ActionRecord:
    return ActionRecord(plan, "skipped", f"dry run: would {describe(plan)}; nothing was touched",
                        now, detail={**_detail(plan), "dry_run": True})


def closed_record(plan: Plan, step: str, reason: str, now: float,
                  detail: Mapping[str, Any] | None = None) -> ActionRecord:
    return ActionRecord(plan, step, reason, now,  # type: ignore[arg-type]
                        detail={**_detail(plan), **(detail or {})})
