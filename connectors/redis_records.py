"""The records the aggregation keeps as written — checkpoints, restores, runs' ends — read back
from every partition slot, and the inventory made of them (``costline.rules.inventory``).

A record set is a sorted set per slot (``S:rec:<set>``, by event time) holding each event as
it was written; the sets of all slots are read in one round trip per slot and merged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from costline.connectors.checkpoint_store import CheckpointStore
from costline.connectors.redis_client import RedisClient
from costline.connectors.redis_keys import record_key, record_writes_key
from costline.rules.inventory import (
    Checkpoint,
    Pin,
    Restore,
    Written,
    build_inventory,
    restore_of,
    written_of,
)
from costline.rules.runs import (
    CHECKPOINTS,
    RESTORES,
    RUN_ENDS,
    RunEnd,
    failed_runs,
    run_end_of,
)


class TrainingRecords:
    """Reads the record sets of every slot ``slots`` lists.

    The failed runs are asked at every evaluation (their spend is waste, and they are part of
    every hour's mark): they are kept, and read again only when a slot's count of writes to
    its run ends (``S:rec:runs:n``) moved."""

    def __init__(self, redis: RedisClient, namespace: str,
                 slots: Callable[[], list[str]]) -> None:
        self.redis = redis
        self._slots = slots
        self.store = CheckpointStore(redis, namespace)
        self._failed: tuple[tuple[tuple[str, Any], ...], frozenset[str]] | None = None
        self._parsed: dict[Any, Written] = {}

    def raw(self, name: str, since: float | str = "-inf") -> list[Any]:
        """Every member of the record set ``name`` at or after ``since``, over all slots."""
        slots = self._slots()
        pipe = self.redis.pipeline(transaction=False)
        for slot in slots:
            pipe.zrangebyscore(record_key(slot, name), since, "+inf")
        found: list[Any] = []
        for members in pipe.execute() if slots else []:
            found.extend(members)
        return found

    def run_ends(self) -> list[RunEnd]:
        return [end for end in map(run_end_of, self.raw(RUN_ENDS)) if end is not None]

    def failed_runs(self) -> frozenset[str]:
        slots = self._slots()
        pipe = self.redis.pipeline(transaction=False)
        for slot in slots:
            pipe.get(record_writes_key(slot, RUN_ENDS))
        marks = tuple(zip(slots, pipe.execute() if slots else [], strict=True))
        if self._failed is None or self._failed[0] != marks:
            self._failed = (marks, failed_runs(self.run_ends()))
        return self._failed[1]

    def checkpoints(self) -> list[Checkpoint]:
        """The inventory. Records are parsed once and kept while they are in Redis: the
        lifecycle reads the inventory every few seconds."""
        known, kept = self._parsed, {}
        for raw in self.raw(CHECKPOINTS):
            found = known[raw] if raw in known else written_of(raw)
            if found is not None:
                kept[raw] = found
        self._parsed = kept
        return build_inventory(kept.values(), self.store.changes())

    def restores(self, since: float) -> list[Restore]:
        found = [r for r in map(restore_of, self.raw(RESTORES, since)) if r is not None]
        return sorted(found, key=lambda r: r.ts)

    def pins(self) -> dict[str, Pin]:
        return self.store.pins()
