"""Budget enforcement's ledger: the reclamation's (``costline.connectors.reclaim_ledger``) in
an area of its own, ``{NS:enforce}``, holding ``Enforcement`` plans.

Besides the reclamation's fields a plan hash holds ``enforced_at`` and the ``before:<item>``
fields ``note`` wrote: the values the connector was about to change, recorded before it
changed them, which a lift restores and a restarted worker reconciles from.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from costline.connectors.reclaim_ledger import BEFORE_PREFIX, RedisPlanLedger
from costline.connectors.reclaim_ledger_memory import MemoryPlanLedger
from costline.connectors.redis_client import AsyncRedisClient
from costline.rules.enforce import Enforcement, EnforcePlan

AREA = "enforce"

EnforceLedger = RedisPlanLedger[Enforcement] | MemoryPlanLedger[Enforcement]


def enforcement_of(data: Mapping[str, str]) -> Enforcement | None:
    """An enforcement plan from its stored fields."""
    if not data.get("data"):
        return None
    before: dict[str, Any] = {key.removeprefix(BEFORE_PREFIX): json.loads(value)
                              for key, value in data.items() if key.startswith(BEFORE_PREFIX)}
    return Enforcement(
        EnforcePlan.from_dict(json.loads(data["data"])),
        state=data.get("state") or "planned",  # type: ignore[arg-type]
        approved_by=data.get("approved_by") or None,
        claimed_at=_moment(data.get("claimed_at")), warned_at=_moment(data.get("warned_at")),
        enforced_at=_moment(data.get("enforced_at")), before=before)


def _moment(text: str | None) -> float | None:
    return float(text) if text else None


def redis_enforce_ledger(redis: AsyncRedisClient, namespace: str = "costline"
                         ) -> RedisPlanLedger[Enforcement]:
    return RedisPlanLedger(redis, namespace, AREA, enforcement_of)


def memory_enforce_ledger(clock: Callable[[], float] = time.time
                          ) -> MemoryPlanLedger[Enforcement]:
    return MemoryPlanLedger(enforcement_of, clock)
