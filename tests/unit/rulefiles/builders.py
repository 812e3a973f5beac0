"""Events, price book and states for the rule tests: round prices so the figures read easily."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from typing import Any

from costline.connectors.plugins import PLUGINS
from costline.rules.events import FaultEvent, FaultType, UsageEvent, UtilizationEvent
from costline.rules.kinds import KINDS, Rule
from costline.rules.memory_state import InMemoryState
from costline.rules.plugins import CONTEXT_KEY
from costline.rules.prices import Price, PriceBook, PriceBookModel

_ids = itertools.count()

PRICES = PriceBookModel.model_validate(
    {
        "currency": "USD",
        "prices": {
            "gpu.h100": {"unit": "gpu_hour", "price": 2.5, "category": "compute"},
            "gpu.reserved": {
                "unit": "gpu_hour",
                "price": 2,
                "category": "compute",
                "billing": "fixed",
            },
            "storage.checkpoint": {"unit": "gb_hour", "price": 0.0001, "category": "storage"},
            "logs.ingest": {"unit": "gb", "price": 0.5, "category": "observability"},
        },
    }
)


def book() -> PriceBook:
    return PriceBook(PRICES)


def at(text: str) -> float:
    """``"2026-11-30T08:00"`` (UTC) → Unix seconds."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


T0 = at("2026-11-30T08:00")
MIN = 60
HOUR = 3600
DAY = 86400


def _unit(resource_type: str) -> str:
    price: Price = PRICES.prices[resource_type]
    return price.unit


def usage(ts: float, quantity: float, resource_type: str = "gpu.h100", **tags: str) -> UsageEvent:
    return UsageEvent(
        event_id=f"u-{next(_ids)}",
        kind="usage",
        ts=ts,
        resource_id=tags.pop("resource_id", "cluster-a/pool-1"),
        resource_type=resource_type,
        quantity=float(quantity),
        unit=_unit(resource_type),
        tags=tags,
    )


def sample(
    ts: float, value: float, resource_id: str = "cluster-a/node-017", **tags: str
) -> UtilizationEvent:
    return UtilizationEvent(
        event_id=f"m-{next(_ids)}",
        kind="utilization",
        ts=ts,
        resource_id=resource_id,
        resource_type=tags.pop("resource_type", "gpu.h100"),
        metric=tags.pop("metric", "gpu_util"),
        value=value,
        tags=tags,
    )


def fault(
    ts: float,
    units: int = 8,
    lost_seconds: float = 3600,
    recovery_seconds: float = 900,
    kind: str = "node_failure",
    **tags: str,
) -> FaultEvent:
    return FaultEvent(
        event_id=f"f-{next(_ids)}",
        kind="fault",
        ts=ts,
        fault=FaultType(kind),
        resource_type="gpu.h100",
        units=units,
        lost_seconds=lost_seconds,
        recovery_seconds=recovery_seconds,
        tags=tags,
    )


def state(*events: Any) -> InMemoryState:
    found = InMemoryState(book())
    found.add_all(events)
    return found


def rule(default_zone: str = "UTC", **keys: Any) -> Rule:
    """A validated rule from keyword keys (``for_`` stands for ``for``); ``default_zone`` is
    the configured time zone. ``reclaim`` may name any of the project's connectors."""
    if "for_" in keys:
        keys["for"] = keys.pop("for_")
    keys.setdefault("name", f"test-{keys['kind'].replace('_', '-')}")
    context = {"timezone": default_zone, CONTEXT_KEY: PLUGINS}
    return KINDS[keys["kind"]].model_validate(keys, context=context)
