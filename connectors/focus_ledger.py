"""What FOCUS imports have counted of each bill row, kept in Redis, so a later export of the
same rows sends only what changed (``focus_revision``), at any time after the first.

One hash per month of the rows' ChargePeriodStart (UTC), ``{NS:focus}:rows:YYYY-MM``: row id ->
``<cost basis>:<micro-units counted>`` (``effective:10250000``), in the book's currency, kept
400 days after its last write (as the daily buckets are). The keys share a hash tag, so a
cluster keeps them on one node. Rows are recorded a chunk at a time, once Kafka has
acknowledged every event of the chunk: a chunk that failed is not recorded, and the import run
again sends the same ids, which the worker counts once.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from costline.connectors.redis_client import RedisClient

KEEP_S = 400 * 86400


def rows_key(namespace: str, month: str) -> str:
    return f"{{{namespace}:focus}}:rows:{month}"


@dataclass(frozen=True)
class Counted:
    """What an earlier import counted of a row: its amount, on which cost basis."""

    basis: str
    micro: int


class RowLedger:
    """The amounts counted of bill rows, by (month, row id)."""

    def __init__(self, redis: RedisClient, namespace: str) -> None:
        self.redis, self.namespace = redis, namespace

    def counted(self, rows: Sequence[tuple[str, str]]) -> list[Counted | None]:
        """For each (month, row id): what was counted, or ``None`` if never."""
        with self.redis.pipeline(transaction=False) as pipe:
            for month, row_id in rows:
                pipe.hget(rows_key(self.namespace, month), row_id)
            found = pipe.execute()
        return [None if value is None else _counted(value) for value in found]

    def record(self, basis: str, rows: Iterable[tuple[str, str, int]]) -> None:
        """(month, row id, micro-units now counted) of rows Kafka has every event of."""
        by_month: dict[str, dict[str, str]] = defaultdict(dict)
        for month, row_id, micro in rows:
            by_month[month][row_id] = f"{basis}:{micro}"
        with self.redis.pipeline(transaction=False) as pipe:
            for month, amounts in by_month.items():
                key = rows_key(self.namespace, month)
                pipe.hset(key, mapping=amounts)  # type: ignore[arg-type]
                pipe.expire(key, KEEP_S)
            pipe.execute()


def _counted(value: bytes | str) -> Counted:
    text = value.decode() if isinstance(value, bytes) else value
    basis, _, micro = text.partition(":")
    return Counted(basis, int(micro))
