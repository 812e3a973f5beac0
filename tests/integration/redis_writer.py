"""Writes events into a namespace's Redis state the way the worker does (its zone recorded
first, then each event on its home partition, one script call per batch), for tests of what
reads that state."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis import Redis
from redis.asyncio import Redis as AsyncRedis

from costline.connectors import bucket_zone
from costline.connectors.redis_apply import Applied, BatchWriter
from costline.connectors.redis_keys import Calendar, slot_tag
from costline.rules.events import AnyEvent
from costline.rules.ledger import Intake
from costline.rules.prices import PriceBook
from costline.rules.tally import tally_of
from costline.streams.settings import DEFAULT_PRICES
from tests.conftest import forget_redis_keys

ZONE = "UTC"  # the worker's COSTLINE_TIMEZONE


PARTITIONS = 1  # one home partition: tests of the read side find every key in one slot


class Writer:
    def __init__(self, writer: BatchWriter, namespace: str) -> None:
        self.writer, self.namespace = writer, namespace
        self.intake = Intake(PriceBook.load(DEFAULT_PRICES), PARTITIONS)
        self.marks: dict[str, int] = {}

    async def write(self, events: list[AnyEvent]) -> None:
        for home, record in self.intake.records(events).items():
            slot = slot_tag(self.namespace, home)
            await self.writer.register_slots([slot])
            mark = self.marks.get(slot, -1)
            assert await self.writer.apply(slot, mark, mark + 1, tally_of([record])) == Applied()
            self.marks[slot] = mark + 1


@pytest.fixture
async def redis_writer(redis_url: str, namespace: str) -> AsyncIterator[Writer]:
    with Redis.from_url(redis_url) as sync:
        bucket_zone.claim(sync, namespace, ZONE)
    client = AsyncRedis.from_url(redis_url)
    yield Writer(BatchWriter(client, namespace, Calendar(ZONE), dedup_ttl=30 * 86400),
                 namespace)
    await client.aclose()
    forget_redis_keys(redis_url, namespace)
