"""What the checkpoint lifecycle did, and the pins people set: the inventory's own state.

Checkpoint events come through the ledger (``S:rec:checkpoints``); what the lifecycle does to a
checkpoint afterwards — moved it to a cold tier, deleted it — and who pinned which checkpoint
are kept here, beside the lifecycle's plans (``connectors.reclaim_ledger`` under the same hash
tag), so that every key is in one Redis Cluster slot:

| key (``P`` = ``{NS:checkpoints}``) | type | holds |
|---|---|---|
| ``P:changes`` | sorted set | each move or deletion as JSON, by when it happened (400 days) |
| ``P:pins`` | hash | checkpoint id → who pinned it, until when, why (JSON) |
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from costline.connectors.redis_client import RedisClient
from costline.connectors.redis_keys import decoded
from costline.rules.inventory import Change, Pin

CHANGES_KEPT_S = 400 * 86400


def lifecycle_prefix(namespace: str) -> str:
    """The hash tag of every key of the checkpoint lifecycle."""
    return f"{{{namespace}:checkpoints}}"


class CheckpointStore:
    """The lifecycle's changes and the pins of one namespace (a synchronous client)."""

    def __init__(self, redis: RedisClient, namespace: str) -> None:
        self.redis = redis
        self._p = lifecycle_prefix(namespace)

    @property
    def _changes(self) -> str:
        return f"{self._p}:changes"

    @property
    def _pins(self) -> str:
        return f"{self._p}:pins"

    def record_change(self, change: Change) -> None:
        """Remember a move or a deletion (idempotent: the same change is kept once)."""
        member = json.dumps(asdict(change), sort_keys=True, separators=(",", ":"))
        pipe = self.redis.pipeline(transaction=False)
        pipe.zadd(self._changes, {member: change.at})
        pipe.zremrangebyscore(self._changes, "-inf", f"({change.at - CHANGES_KEPT_S}")
        pipe.execute()

    def changes(self) -> dict[str, list[Change]]:
        """Every change kept, by checkpoint id, oldest first."""
        found: dict[str, list[Change]] = {}
        raws: list[Any] = self.redis.zrange(self._changes, 0, -1)
        for raw in raws:
            change = Change(**json.loads(decoded(raw)))
            found.setdefault(change.checkpoint_id, []).append(change)
        return found

    def pin(self, checkpoint_id: str, pin: Pin) -> None:
        self.redis.hset(self._pins, checkpoint_id, json.dumps(asdict(pin)))

    def unpin(self, checkpoint_id: str) -> bool:
        return bool(self.redis.hdel(self._pins, checkpoint_id))

    def pins(self) -> dict[str, Pin]:
        raw: Mapping[Any, Any] = self.redis.hgetall(self._pins)
        return {decoded(key): Pin(**json.loads(decoded(value))) for key, value in raw.items()}
