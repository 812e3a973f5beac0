"""The checkpoint inventory: every run's checkpoints, where they are, and what keeping them costs.

It is made of two sources. ``checkpoint`` events say a checkpoint was written (its first
event: when, how big, how long training stalled) and where it is kept (its latest event: a
tool that moved it sends it again with the new tier and location). The checkpoint lifecycle
records what it did itself — moved to a cold tier, deleted — as ``Change``\\ s. A checkpoint's
storage cost follows its tiers over time: bytes × the tier's price per GB-hour × the hours it
spent there (a GB is 10^9 bytes). Each stay is priced when it is recorded, as usage is priced
when it is counted: intake prices a checkpoint event's tier, the lifecycle the tier it moves
one to.

This storage cost is an allocation, not spend: the storage's own usage events (the bill, a
scraper) carry what the storage costs, and the inventory says which checkpoints that was for.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Literal, Protocol, runtime_checkable

from pydantic import ValidationError

from costline.rules.events import RUN_TAG, CheckpointEvent, RestoreEvent
from costline.rules.prices import PriceBook, PricingError, to_micro

GB = Decimal(10**9)
HOUR_S = 3600

Action = Literal["move", "delete"]


@dataclass(frozen=True)
class Stay:
    """A span of a checkpoint on one tier, from ``since`` until the next stay (or now), and
    what it costs there per hour (micro-units)."""

    since: float
    tier: str
    location: str
    hourly: int


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint of one run, as the inventory holds it now."""

    checkpoint_id: str
    run: str
    step: int
    bytes: int
    written_at: float
    write_seconds: float
    tags: Mapping[str, str]
    stays: tuple[Stay, ...]
    deleted_at: float | None = None

    @property
    def live(self) -> bool:
        return self.deleted_at is None

    @property
    def tier(self) -> str:
        return self.stays[-1].tier

    @property
    def location(self) -> str:
        return self.stays[-1].location


@dataclass(frozen=True)
class Change:
    """What the lifecycle did to a checkpoint: moved it (to ``tier`` at ``location``) or
    deleted it, at ``at``."""

    checkpoint_id: str
    action: Action
    at: float
    tier: str = ""
    location: str = ""
    hourly: int = 0


@dataclass(frozen=True)
class Pin:
    """Someone pinned a checkpoint: the lifecycle leaves it alone until ``until``."""

    by: str
    until: float
    reason: str = ""


@dataclass(frozen=True)
class Restore:
    """A run began reading a checkpoint back at ``ts``."""

    checkpoint_id: str
    run: str
    ts: float
    read_seconds: float | None = None


@runtime_checkable
class CheckpointInventory(Protocol):
    """Optional part of a state: the checkpoints, restores and pins (``checkpoint_*`` rules)."""

    def checkpoints(self) -> list[Checkpoint]:
        """Every checkpoint known, deleted ones included (``keep_every`` counts them)."""
        ...

    def restores(self, since: float) -> list[Restore]:
        """Restores that began at or after ``since``."""
        ...

    def pins(self) -> dict[str, Pin]:
        """Pins by checkpoint id (expired ones may be included)."""
        ...


# ── building the inventory ────────────────────────────────────────────────────────────────


Written = tuple[CheckpointEvent, int]
"""A checkpoint event and what its tier costs per hour for its bytes (micro-units)."""


def checkpoint_record(event: CheckpointEvent, hourly: int) -> str:
    """How a priced checkpoint event is stored: ``<hourly micro>|<event JSON>``."""
    return f"{hourly}|{event.model_dump_json(exclude_none=True)}"


def written_of(raw: bytes | str) -> Written | None:
    """A stored checkpoint record → the event and its hourly storage cost."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    hourly, _, event = text.partition("|")
    try:
        return CheckpointEvent.model_validate_json(event), int(hourly)
    except (ValidationError, ValueError):
        return None


def restore_of(raw: bytes | str) -> Restore | None:
    try:
        event = RestoreEvent.model_validate_json(raw)
    except ValidationError:
        return None
    return Restore(event.identity, event.tags[RUN_TAG], event.unix_ts, event.read_seconds)


def build_inventory(written: Iterable[Written],
                    changes: Mapping[str, Sequence[Change]] | None = None) -> list[Checkpoint]:
    """Checkpoints from their events and the lifecycle's changes, sorted by run and step."""
    by_id: dict[str, list[Written]] = {}
    for event, hourly in written:
        by_id.setdefault(event.identity, []).append((event, hourly))
    found = []
    for identity, seen in by_id.items():
        seen.sort(key=lambda w: w[0].unix_ts)
        found.append(_checkpoint(identity, seen, (changes or {}).get(identity, ())))
    return sorted(found, key=lambda c: (c.run, c.step, c.written_at, c.checkpoint_id))


def _checkpoint(identity: str, seen: list[Written], changes: Sequence[Change]) -> Checkpoint:
    first, latest = seen[0][0], seen[-1][0]
    steps: list[tuple[float, int, Stay | None]] = [
        (e.unix_ts, 0, Stay(e.unix_ts, e.tier, e.location, hourly)) for e, hourly in seen]
    steps += [(c.at, 1, Stay(c.at, c.tier, c.location, c.hourly) if c.action == "move"
               else None) for c in changes]
    steps.sort(key=lambda s: (s[0], s[1]))
    stays: list[Stay] = []
    deleted_at = None
    for at, _, stay in steps:
        if stay is None:
            deleted_at = at if deleted_at is None else deleted_at
        elif deleted_at is None and (not stays or (stays[-1].tier, stays[-1].location)
                                     != (stay.tier, stay.location)):
            stays.append(stay)
    return Checkpoint(identity, first.tags[RUN_TAG], latest.step, latest.bytes, first.unix_ts,
                      first.write_seconds, dict(latest.tags), tuple(stays), deleted_at)


def by_run(checkpoints: Iterable[Checkpoint]) -> dict[str, list[Checkpoint]]:
    """Each run's checkpoints in step order."""
    runs: dict[str, list[Checkpoint]] = {}
    for checkpoint in checkpoints:
        runs.setdefault(checkpoint.run, []).append(checkpoint)
    for found in runs.values():
        found.sort(key=lambda c: (c.step, c.written_at, c.checkpoint_id))
    return runs


def latest_of(checkpoints: Iterable[Checkpoint]) -> Checkpoint | None:
    """The run's latest live checkpoint: the one a restart would read."""
    live = [c for c in checkpoints if c.live]
    return max(live, key=lambda c: (c.step, c.written_at)) if live else None


# ── storage cost ──────────────────────────────────────────────────────────────────────────


def hourly_storage(prices: PriceBook, tier: str, size: int) -> int:
    """What keeping ``size`` bytes on ``tier`` costs per hour, micro-units (0 for a tier the
    book does not price per GB-hour)."""
    try:
        price = prices.storage_price(tier).price
    except PricingError:
        return 0
    return to_micro(Decimal(size) / GB * price)


def storage_now(checkpoint: Checkpoint) -> int:
    """Per hour, where it is kept now (0 once deleted), micro-units."""
    return checkpoint.stays[-1].hourly if checkpoint.live else 0


def storage_so_far(checkpoint: Checkpoint, now: float) -> int:
    """What keeping it has cost since it was written, tier by tier, micro-units."""
    end = min(now, checkpoint.deleted_at) if checkpoint.deleted_at is not None else now
    total = Decimal(0)
    stays = checkpoint.stays
    for index, stay in enumerate(stays):
        until = stays[index + 1].since if index + 1 < len(stays) else end
        seconds = Decimal(str(max(0.0, min(until, end) - stay.since)))
        total += Decimal(stay.hourly) * seconds / HOUR_S
    return int(total.to_integral_value(ROUND_HALF_EVEN))


@dataclass
class TierTotal:
    """One tier's live checkpoints: how many, their bytes, their cost per hour (micro)."""

    count: int = 0
    bytes: int = 0
    hourly: int = 0
    so_far: int = 0
    runs: set[str] = field(default_factory=set)


def by_tier(checkpoints: Iterable[Checkpoint], now: float) -> dict[str, TierTotal]:
    """Live checkpoints per tier, with what they cost per hour and have cost so far."""
    tiers: dict[str, TierTotal] = {}
    for checkpoint in checkpoints:
        if not checkpoint.live:
            continue
        total = tiers.setdefault(checkpoint.tier, TierTotal())
        total.count += 1
        total.bytes += checkpoint.bytes
        total.hourly += storage_now(checkpoint)
        total.so_far += storage_so_far(checkpoint, now)
        total.runs.add(checkpoint.run)
    return dict(sorted(tiers.items()))
