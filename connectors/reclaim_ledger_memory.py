"""The reclamation ledger in one process: what ``costline.connectors.reclaim_ledger`` keeps in
Redis, kept in dicts, for unit tests and a single worker without Redis. It answers the same
``ReclaimLedger`` protocol with the same compare-and-set steps.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from costline.connectors.reclaim_ledger import (
    HOUR_S,
    LOG_MAX,
    ClaimResult,
    Pause,
    record_json,
)
from costline.rules.reclaim import Keep, Plan, PlanState, Tracked


class MemoryReclaimLedger:
    """The same ledger in one process: for unit tests and a single worker without Redis."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._plans: dict[str, dict[str, Any]] = {}
        self._open: set[str] = set()
        self._slots: dict[tuple[str, str], tuple[str, float | None]] = {}
        self._claims: dict[str, str] = {}
        self._released: dict[str, dict[str, float]] = {}
        self._keeps: dict[str, Keep] = {}
        self._pause: Pause | None = None
        self._outbox: list[str] = []
        self._log: list[str] = []

    def _push(self, record: dict[str, Any]) -> None:
        item = record_json(record)
        self._outbox.append(item)
        self._log.insert(0, item)
        del self._log[LOG_MAX:]

    def _state(self, plan_id: str) -> str | None:
        entry = self._plans.get(plan_id)
        return None if entry is None else str(entry["state"])

    async def holder(self, rule: str, resource_id: str) -> str | None:
        held = self._slots.get((rule, resource_id))
        if held is None:
            return None
        plan_id, until = held
        return plan_id if until is None or until > self._clock() else None

    async def open(self, plan: Plan, record: dict[str, Any]) -> bool:
        if await self.holder(plan.rule, plan.resource_id) is not None:
            return False
        self._slots[(plan.rule, plan.resource_id)] = (plan.plan_id, None)
        self._plans[plan.plan_id] = {"plan": plan, "state": "planned", "approved_by": None,
                                     "claimed_at": None, "warned_at": None}
        self._open.add(plan.plan_id)
        self._push(record)
        return True

    async def close_unplanned(self, plan: Plan, record: dict[str, Any],
                              cooldown_s: int) -> bool:
        if await self.holder(plan.rule, plan.resource_id) is not None:
            return False
        if cooldown_s > 0:
            self._slots[(plan.rule, plan.resource_id)] = (plan.plan_id,
                                                          self._clock() + cooldown_s)
        self._push(record)
        return True

    async def plans(self) -> list[Tracked]:
        found = [await self.get(plan_id) for plan_id in sorted(self._open)]
        return [tracked for tracked in found if tracked is not None]

    async def get(self, plan_id: str) -> Tracked | None:
        entry = self._plans.get(plan_id)
        if entry is None:
            return None
        return Tracked(entry["plan"], entry["state"], entry["approved_by"], entry["claimed_at"],
                       entry["warned_at"])

    async def advance(self, plan_id: str, seen: PlanState, to: PlanState,
                      record: dict[str, Any], at: float) -> bool:
        if self._state(plan_id) != seen:
            return False
        self._plans[plan_id].update({"state": to, f"{to}_at": at})
        self._push(record)
        return True

    async def claim(self, plan_id: str, worker: str, now: float) -> ClaimResult:
        if self._pause is not None:
            return "paused"
        if self._state(plan_id) != "warned" or plan_id in self._claims:
            return "taken"
        self._claims[plan_id] = worker
        self._plans[plan_id].update(state="executing", claimed_at=now)
        return "claimed"

    async def close(self, plan_id: str, seen: PlanState, record: dict[str, Any],
                    cooldown_s: int) -> bool:
        if self._state(plan_id) != seen:
            return False
        entry = self._plans[plan_id]
        entry["state"] = "closed"
        self._open.discard(plan_id)
        plan: Plan = entry["plan"]
        slot = (plan.rule, plan.resource_id)
        if self._slots.get(slot, ("", None))[0] == plan_id:
            if cooldown_s > 0:
                self._slots[slot] = (plan_id, self._clock() + cooldown_s)
            else:
                del self._slots[slot]
        self._push(record)
        return True

    async def approve(self, plan_id: str, by: str) -> bool:
        if self._state(plan_id) not in ("planned", "warned"):
            return False
        self._plans[plan_id]["approved_by"] = by
        return True

    async def keep(self, resource_id: str, keep: Keep) -> None:
        self._keeps[resource_id] = keep

    async def kept(self, resource_id: str, now: float) -> Keep | None:
        keep = self._keeps.get(resource_id)
        return keep if keep is not None and keep.until > now else None

    async def released(self, rule: str, now: float, excluding: Sequence[str] = ()) -> int:
        recent = self._released.get(rule, {})
        return sum(1 for plan_id, at in recent.items()
                   if at >= now - HOUR_S and plan_id not in excluding)

    async def reserve(self, rule: str, plan_ids: Sequence[str], now: float,
                      limit: int) -> int | None:
        recent = {p: at for p, at in self._released.get(rule, {}).items() if at >= now - HOUR_S}
        new = [plan_id for plan_id in plan_ids if plan_id not in recent]
        if len(recent) + len(new) > limit:
            return len(set(recent) - set(plan_ids))
        recent.update(dict.fromkeys(new, now))
        self._released[rule] = recent
        return None

    async def pause(self, pause: Pause) -> None:
        self._pause = pause

    async def resume(self) -> bool:
        was, self._pause = self._pause, None
        return was is not None

    async def paused(self) -> Pause | None:
        return self._pause

    async def outbox(self, limit: int = 500) -> list[str]:
        return self._outbox[:limit]

    async def sent(self, item: str) -> None:
        if item in self._outbox:
            self._outbox.remove(item)

    async def history(self, limit: int = 100) -> list[dict[str, Any]]:
        return [json.loads(item) for item in self._log[:limit]]
