"""How much of a namespace's input is not counted yet.

An input message is counted once intake has sent its events to the ledger (intake then commits
its offset, after the ledger has them) and every ledger record up to those is applied to
Redis (each home partition's watermark). Input is read committed, as intake reads it: a
transaction still open is not behind yet, and its markers are passed by intake's commits.
Log ends are ListOffsets' answers checked with a fetch (``costline.connectors.kafka.log_ends``):
some brokers count a record batch as one record there, and would have everything counted early.
Tests, benchmarks and operators ask this to know that what was produced is in ``costline
spend``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from costline.connectors.kafka import END_FETCH_WAIT_MS, admin, consumer, log_ends
from costline.connectors.redis_client import RedisClient
from costline.connectors.redis_keys import slot_tag, wm_key
from costline.streams.settings import Settings
from costline.streams.topics import INPUTS, LEDGER


@dataclass(frozen=True)
class Behind:
    inputs: int  # input messages intake has not committed
    ledger: int  # ledger records not applied to Redis

    @property
    def counted(self) -> bool:
        return self.inputs == 0 and self.ledger == 0


def behind(settings: Settings, redis: RedisClient) -> Behind:
    """Input first, then the ledger: a ledger end read after intake committed everything holds
    every record that input made."""
    security = settings.kafka_security()
    kafka = consumer(settings.kafka_bootstrap, security=security, enable_auto_commit=False,
                     isolation_level="read_committed", fetch_max_wait_ms=END_FETCH_WAIT_MS)
    manager = admin(settings.kafka_bootstrap, security=security)
    try:
        from kafka import TopicPartition

        inputs = [TopicPartition(settings.topic(name), p) for name in INPUTS
                  for p in kafka.partitions_for_topic(settings.topic(name)) or ()]
        ends = log_ends(kafka, inputs)
        committed = _committed(manager, settings.intake_group, inputs)
        waiting = sum(max(0, end - _offset(committed.get(tp))) for tp, end in ends.items())
        ledger = [TopicPartition(settings.topic(LEDGER), p)
                  for p in kafka.partitions_for_topic(settings.topic(LEDGER)) or ()]
        ledger_ends = log_ends(kafka, ledger)
    finally:
        kafka.close()
        manager.close()
    unapplied = 0
    for tp, end in ledger_ends.items():
        raw = redis.get(wm_key(slot_tag(settings.namespace, tp.partition)))
        applied = -1 if raw is None else int(raw)
        unapplied += max(0, end - applied - 1)
    return Behind(waiting, unapplied)


def _committed(manager: Any, group: str, partitions: list[Any]) -> dict[Any, Any]:
    """The group's committed offsets; none while its coordinator is not ready yet (a young
    broker creating or loading its offsets topic): nothing counts as committed then."""
    from kafka.errors import (
        CoordinatorLoadInProgressError,
        CoordinatorNotAvailableError,
        NotCoordinatorError,
    )

    if not partitions:
        return {}
    try:
        found: dict[Any, Any] = manager.list_group_offsets({group: partitions}).get(group, {})
    except (CoordinatorNotAvailableError, CoordinatorLoadInProgressError, NotCoordinatorError):
        return {}
    return found


def _offset(committed: object) -> int:
    """A committed offset as kafka-python gives it (an ``OffsetAndMetadata``, or nothing)."""
    offset = getattr(committed, "offset", None)
    return offset if isinstance(offset, int) and offset >= 0 else 0
