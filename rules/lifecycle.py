"""The checkpoint lifecycle as pure decisions: keep, move to a cold tier, delete.

Per run, in step order: the last ``keep_last`` live checkpoints stay where they are, and
every ``keep_every``-th checkpoint (counted from the run's first, deleted ones included, so
the count does not shift as older ones go) is never deleted. The others move to
``cold_tier`` once older than ``cold_after`` and are deleted once older than
``expire_after``. Whatever the policy says, a checkpoint is held back when it is the run's
latest, is pinned, carries an exempt tag, or was being read by a restore within
``restore_guard``.

The flow reuses reclamation's safety (``costline.rules.reclaim``): an action is planned,
announced, waits its grace, and is re-checked against a fresh inventory (``recheck``) before a
connector acts, at most once, within the rule's caps. Every step is an action record for the
audit log. Nothing here performs I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from costline.rules.durations import format_duration, rfc3339
from costline.rules.inventory import (
    Action,
    Checkpoint,
    Pin,
    Restore,
    hourly_storage,
    latest_of,
    storage_now,
)
from costline.rules.prices import PriceBook, format_micro
from costline.rules.reclaim import ActionRecord, Go, Hold, Plan, Skip, Verdict

DAY_H = 24


@dataclass(frozen=True)
class Retention:
    """A ``checkpoint_lifecycle`` rule's policy (durations in seconds, ``None``: never)."""

    keep_last: int = 3
    keep_every: int | None = None
    cold_after: int | None = None
    cold_tier: str | None = None
    expire_after: int | None = None
    restore_guard: int = 6 * 3600
    exempt: Mapping[str, Sequence[str]] = field(default_factory=dict)

    def is_exempt(self, tags: Mapping[str, str]) -> str | None:
        """The exempt tag a checkpoint carries (``keep=true``), or ``None``."""
        for key, values in sorted(self.exempt.items()):
            if key in tags and any(fnmatchcase(tags[key], v) for v in values):
                return f"{key}={tags[key]}"
        return None


@dataclass(frozen=True)
class LifecycleAction:
    """What the policy asks for one checkpoint now."""

    checkpoint: Checkpoint
    action: Action
    to_tier: str | None
    reason: str

    def saves_per_hour(self, prices: PriceBook) -> int:
        """Storage it stops costing per hour, micro-units."""
        now = storage_now(self.checkpoint)
        if self.action == "delete" or self.to_tier is None:
            return now
        return now - hourly_storage(prices, self.to_tier, self.checkpoint.bytes)


def _policy_action(retention: Retention, checkpoint: Checkpoint, ordinal: int, now: float
                   ) -> tuple[Action, str | None, str] | None:
    """What age alone asks of a checkpoint that is not among the last ones kept."""
    age = now - checkpoint.written_at
    kept_for_good = bool(retention.keep_every) and ordinal % (retention.keep_every or 1) == 0
    if retention.expire_after is not None and not kept_for_good and \
            age >= retention.expire_after:
        return "delete", None, f"expired: older than {format_duration(retention.expire_after)}"
    cold = retention.cold_tier
    if cold and retention.cold_after is not None and age >= retention.cold_after and \
            checkpoint.tier != cold:
        why = "kept every " + _nth(retention.keep_every) if kept_for_good else "older"
        return "move", cold, (f"{why}: older than {format_duration(retention.cold_after)}, "
                              f"moves to {cold}")
    return None


def _nth(every: int | None) -> str:
    return f"{every}th checkpoint" if every and every > 1 else "checkpoint"


def held_back(retention: Retention, checkpoint: Checkpoint, run: Sequence[Checkpoint],
              restores: Sequence[Restore], pins: Mapping[str, Pin], now: float) -> str | None:
    """Why nothing may be done to this checkpoint now, whatever the policy says."""
    if not checkpoint.live:
        return f"deleted at {rfc3339(checkpoint.deleted_at or now)}"
    latest = latest_of(run)
    if latest is not None and latest.checkpoint_id == checkpoint.checkpoint_id:
        return "it is the run's latest checkpoint"
    newest = sorted((c for c in run if c.live), key=lambda c: (c.step, c.written_at))
    if checkpoint in newest[-retention.keep_last:]:
        return f"among the run's last {retention.keep_last}"
    pin = pins.get(checkpoint.checkpoint_id)
    if pin is not None and pin.until > now:
        why = f" ({pin.reason})" if pin.reason else ""
        return f"pinned by {pin.by} until {rfc3339(pin.until)}{why}"
    exempt = retention.is_exempt(checkpoint.tags)
    if exempt is not None:
        return f"exempt tag {exempt}"
    read = [r for r in restores if r.checkpoint_id == checkpoint.checkpoint_id
            and now - retention.restore_guard <= r.ts <= now]
    if read:
        return f"being read by a restore since {rfc3339(max(r.ts for r in read))}"
    return None


def plan_run(retention: Retention, run: Sequence[Checkpoint], restores: Sequence[Restore],
             pins: Mapping[str, Pin], now: float) -> list[LifecycleAction]:
    """The actions the policy asks for one run's checkpoints (given in step order)."""
    found = []
    for ordinal, checkpoint in enumerate(run, start=1):
        wanted = _policy_action(retention, checkpoint, ordinal, now)
        if wanted is None or held_back(retention, checkpoint, run, restores, pins, now):
            continue
        action, to_tier, reason = wanted
        found.append(LifecycleAction(checkpoint, action, to_tier, reason))
    return found


def ordinal_of(run: Sequence[Checkpoint], checkpoint_id: str) -> int | None:
    for ordinal, checkpoint in enumerate(run, start=1):
        if checkpoint.checkpoint_id == checkpoint_id:
            return ordinal
    return None


# ── plans and their re-check ──────────────────────────────────────────────────────────────


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
    wanted = _policy_action(retention, checkpoint, ordinal_of(run, checkpoint.checkpoint_id)
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
            "run": target.get("run"), "step": target.get("step"),
            "location": target.get("location"), **_saving(plan)}


def planned_record(plan: Plan, reason: str) -> ActionRecord:
    how = "planned only (dry run)" if plan.mode == "dry_run" else "live"
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
