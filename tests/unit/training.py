"""Events and a price book for the training economics tests: round prices, a hot and a cold
checkpoint tier, so every figure can be worked out by hand."""

from __future__ import annotations

import itertools
from typing import Any

from costline.connectors.plugins import PLUGINS
from costline.rules.events import (
    CheckpointEvent,
    FaultEvent,
    FaultType,
    ProgressEvent,
    RestoreEvent,
    RunEndEvent,
    RunStatus,
    UsageEvent,
)
from costline.rules.kinds import KINDS, Rule
from costline.rules.memory_state import InMemoryState
from costline.rules.plugins import CONTEXT_KEY
from costline.rules.prices import PriceBook, PriceBookModel

_ids = itertools.count()
HOUR, DAY = 3600, 86400
T0 = 1_796_000_400.0  # 2026-11-30T01:00:00Z
TB = 10**12

PRICES = PriceBook(PriceBookModel.model_validate({
    "currency": "USD",
    "prices": {
        "gpu.h100": {"unit": "gpu_hour", "price": 2.5, "category": "compute"},
        "storage.hot": {"unit": "gb_hour", "price": 0.0004, "category": "storage",
                        "billing": "fixed"},
        "storage.cold": {"unit": "gb_hour", "price": 0.00001, "category": "storage"},
        "logs.ingest": {"unit": "gb", "price": 0.5, "category": "observability"},
    },
}))


def run_tags(run: str = "run-42", **tags: str) -> dict[str, str]:
    return {"project": "llm-70b", "stage": "pretrain", "job": run, **tags}


def gpus(ts: float, hours: float, units: int = 512, run: str = "run-42",
         **tags: str) -> UsageEvent:
    return UsageEvent(event_id=f"u-{next(_ids)}", kind="usage", ts=ts,
                      resource_id="cluster-a/pool", resource_type="gpu.h100",
                      quantity=float(units * hours), unit="gpu_hour", tags=run_tags(run, **tags))


def progress(ts: float, step: int, tokens: int, steps: int = 1, run: str = "run-42",
             samples: int | None = None, **tags: str) -> ProgressEvent:
    return ProgressEvent(event_id=f"p-{next(_ids)}", kind="progress", ts=ts, step=step,
                         tokens=tokens, steps=steps, samples=samples, tags=run_tags(run, **tags))


def checkpoint(ts: float, step: int, size: int = TB, tier: str = "storage.hot",
               run: str = "run-42", write_seconds: float = 60.0, **tags: str
               ) -> CheckpointEvent:
    return CheckpointEvent(event_id=f"c-{run}-{step}-{next(_ids)}", kind="checkpoint", ts=ts,
                           location=f"/ckpt/{run}/step-{step}", step=step, bytes=size,
                           tier=tier, write_seconds=write_seconds, tags=run_tags(run, **tags))


def restore(ts: float, step: int, run: str = "run-42") -> RestoreEvent:
    return RestoreEvent(event_id=f"r-{next(_ids)}", kind="restore", ts=ts,
                        location=f"/ckpt/{run}/step-{step}", tags=run_tags(run))


def run_end(ts: float, status: str, run: str = "run-42") -> RunEndEvent:
    return RunEndEvent(event_id=f"e-{next(_ids)}", kind="run_end", ts=ts,
                       status=RunStatus(status), tags=run_tags(run))


def fault(ts: float, units: int = 512, lost: float = 1800, recovery: float = 600,
          run: str = "run-42", kind: str = "node_failure") -> FaultEvent:
    return FaultEvent(event_id=f"f-{next(_ids)}", kind="fault", ts=ts, fault=FaultType(kind),
                      resource_type="gpu.h100", units=units, lost_seconds=lost,
                      recovery_seconds=recovery, tags=run_tags(run))


def state(*events: Any) -> InMemoryState:
    found = InMemoryState(PRICES)
    found.add_all(events)
    return found


def rule(**keys: Any) -> Rule:
    """A validated rule of any kind from keyword keys."""
    keys.setdefault("name", f"test-{keys['kind'].replace('_', '-')}")
    return KINDS[keys["kind"]].model_validate(keys, context={"timezone": "UTC",
                                                             CONTEXT_KEY: PLUGINS})
