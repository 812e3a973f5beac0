"""The row memory of FOCUS imports in Redis: what each bill row's events have counted
(``focus_revision.RowState``), so a later export of the same rows sends only what changed, at
any time after the first; and the lock that keeps two imports of a namespace apart.

A row's state is a field of ``{NS:focus:YYYY-MM:SS}:rows``: the month of its ChargePeriodStart
(UTC), then one of 256 shards by the row id's digest, so a large bill spreads over a cluster
and no key grows past a few MB. Each key is kept 400 days after its last write, as the daily
buckets are. The keys have a time to live, so a Redis that evicts (docs/OPERATIONS.md) may
drop them too: keep ``noeviction``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

from costline.connectors.focus_revision import RowState
from costline.connectors.redis_client import RedisClient

KEEP_S = 400 * 86400
# An import holds the lock this long at most: one that died leaves it for this long.
LOCK_S = 3600

Row = tuple[str, str]  # (month YYYY-MM, row id)


def rows_key(namespace: str, row: Row) -> str:
    month, row_id = row
    shard = hashlib.blake2b(row_id.encode(), digest_size=1).hexdigest()
    return f"{{{namespace}:focus:{month}:{shard}}}:rows"


def lock_key(namespace: str) -> str:
    return f"{{{namespace}:focus}}:import"


class RowLedger:
    """Bill rows' states by (month, row id)."""

    def __init__(self, redis: RedisClient, namespace: str) -> None:
        self.redis, self.namespace = redis, namespace

    def states(self, rows: Sequence[Row]) -> list[RowState | None]:
        with self.redis.pipeline(transaction=False) as pipe:
            for row in rows:
                pipe.hget(rows_key(self.namespace, row), row[1])
            found = pipe.execute()
        return [None if value is None else RowState.decode(
            value.decode() if isinstance(value, bytes) else value) for value in found]

    def write(self, states: Iterable[tuple[Row, RowState]]) -> None:
        by_key: dict[str, dict[str, str]] = {}
        for row, state in states:
            by_key.setdefault(rows_key(self.namespace, row), {})[row[1]] = state.encode()
        if not by_key:
            return
        with self.redis.pipeline(transaction=False) as pipe:
            for key, fields in by_key.items():
                pipe.hset(key, mapping=fields)  # type: ignore[arg-type]
                pipe.expire(key, KEEP_S)
            pipe.execute()

    def lock(self) -> Any:
        """redis-py's lock on this namespace's imports (``acquire(blocking=False)`` is False
        while another import holds it)."""
        return self.redis.lock(lock_key(self.namespace), timeout=LOCK_S)
