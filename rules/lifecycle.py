"""The checkpoint lifecycle as pure decisions: keep, move to a cold tier, delete.

Per run, in step order: the last ``keep_last`` live checkpoints stay where they are, and
every ``keep_every``-th checkpoint (counted from the run's first, deleted ones included, so
the count does not shift as older ones go) is never deleted. The others move to
``cold_tier`` once older than ``cold_after`` and are deleted once older than
``expire_after``. Whatever the policy says, a checkpoint is held back when it is the run's
latest, is pinned, carries an exempt tag, or was being read by a restore within
``restore_guard``.

What happens to an action the policy asks for — planned, announced, re-checked, carried out —
is ``costline.rules.lifecycle_flow``. Nothing here performs I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from costline.rules.durations import format_duration, rfc3339
from costline.rules.globs import glob_match
from costline.rules.inventory import (
    Action,
    Checkpoint,
    Pin,
    Restore,
    hourly_storage,
    latest_of,
    storage_now,
)
from costline.rules.prices import PriceBook


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
            if key in tags and any(glob_match(tags[key], v) for v in values):
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


def policy_action(retention: Retention, checkpoint: Checkpoint, ordinal: int, now: float
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
        wanted = policy_action(retention, checkpoint, ordinal, now)
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
