"""The ledger of automatic actions in one process: what ``costline.connectors.reclaim_ledger``
keeps in Redis, kept in dicts, for unit tests and a single worker without Redis. It answers
the same protocol with the same compare-and-set steps, and stores a plan as the same fields,
decoded by the same function.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic

from costline.connectors.reclaim_ledger import (
    BEFORE_PREFIX,
    HOUR_S,
    LOG_MAX,
    ClaimResult,
    LedgerPlan,
    Pause,
    T,
    record_json,
    tracked_of,
)
from costline.rules.reclaim import Keep, Tracked


class MemoryPlanLedger(Generic[T]):
    """One area's ledger in one process."""

    def __init__(self, decode: Callable[[Mapping[str, str]], T | None],
                 clock: Callable[[], float] = time.time) -> None:
        self._decode = decode
        self._clock = clock
        self._plans: dict[str, dict[str, str]] = {}
        self._open: set[str] = set()
        self._slots: dict[tuple[str, str], tuple[str, float | None]] = {}
        self._claims: set[tuple[str, str]] = set()
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
        return None if entry is None else entry["state"]

    async def holder(self, rule: str, subject: str) -> str | None:
        held = self._slots.get((rule, subject))
        if held is None:
            return None
        plan_id, until = held
        return plan_id if until is None or until > self._clock() else None

    async def open(self, plan: LedgerPlan, record: dict[str, Any]) -> bool:
        if await self.holder(plan.rule, plan.subject) is not None:
            return False
        self._slots[(plan.rule, plan.subject)] = (plan.plan_id, None)
        self._plans[plan.plan_id] = {"data": json.dumps(plan.to_dict()), "state": "planned",
                                     "rule": plan.rule, "subject": plan.subject}
        self._open.add(plan.plan_id)
        self._push(record)
        return True

    async def close_unplanned(self, plan: LedgerPlan, record: dict[str, Any],
                              cooldown_s: int) -> bool:
        if await self.holder(plan.rule, plan.subject) is not None:
            return False
        if cooldown_s > 0:
            self._slots[(plan.rule, plan.subject)] = (plan.plan_id, self._clock() + cooldown_s)
        self._push(record)
        return True

    async def plans(self) -> list[T]:
        found = [await self.get(plan_id) for plan_id in sorted(self._open)]
        return [tracked for tracked in found if tracked is not None]

    async def get(self, plan_id: str) -> T | None:
        entry = self._plans.get(plan_id)
        return None if entry is None else self._decode(dict(entry))

    async def advance(self, plan_id: str, seen: str, to: str, record: dict[str, Any],
                      at: float) -> bool:
        if self._state(plan_id) != seen:
            return False
        self._plans[plan_id].update({"state": to, f"{to}_at": repr(at)})
        self._push(record)
        return True

    async def claim(self, plan_id: str, worker: str, now: float, *, seen: str = "warned",
                    to: str = "executing", name: str = "", check_pause: bool = True
                    ) -> ClaimResult:
        if check_pause and self._pause is not None:
            return "paused"
        if self._state(plan_id) != seen or (plan_id, name) in self._claims:
            return "taken"
        self._claims.add((plan_id, name))
        self._plans[plan_id].update(state=to, claimed_at=repr(now), claimed_by=worker)
        return "claimed"

    async def note(self, plan_id: str, seen: str, values: Mapping[str, Any]) -> bool:
        if self._state(plan_id) != seen:
            return False
        entry = self._plans[plan_id]
        for key, value in values.items():
            entry.setdefault(BEFORE_PREFIX + key, json.dumps(value, sort_keys=True))
        return True

    async def close(self, plan_id: str, seen: str, record: dict[str, Any],
                    cooldown_s: int) -> bool:
        if self._state(plan_id) != seen:
            return False
        entry = self._plans[plan_id]
        entry["state"] = "closed"
        self._open.discard(plan_id)
        slot = (entry["rule"], entry["subject"])
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

    async def keep(self, subject: str, keep: Keep) -> None:
        self._keeps[subject] = keep

    async def kept(self, subject: str, now: float) -> Keep | None:
        keep = self._keeps.get(subject)
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


class MemoryReclaimLedger(MemoryPlanLedger[Tracked]):
    """The reclamation's ledger in one process: for unit tests and a single worker."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        super().__init__(tracked_of, clock)
