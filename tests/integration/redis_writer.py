"""Writes events into a namespace's Redis state the way the worker does (its zone recorded
first, then one partition per source, one script call per batch), for tests of what reads
that state."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis import Redis
from redis.asyncio import Redis as AsyncRedis

from costline.connectors import bucket_zone
from costline.connectors.redis_apply import Applied, BatchWriter
from costline.connectors.redis_keys import Calendar, slot_tag
from costline.rules.events import AnyEvent
from costline.rules.prices import PriceBook
from costline.rules.tally import Folder, Tally
from costline.streams.settings import DEFAULT_PRICES
from tests.conftest import forget_redis_keys

ZONE = "UTC"  # the worker's COSTLINE_TIMEZONE


class Writer:
    def __init__(self, writer: BatchWriter, namespace: str) -> None:
        self.writer, self.folder = writer, Folder(PriceBook.load(DEFAULT_PRICES))
        self.slots = {source: slot_tag(namespace, source, 0) for source in ("usage", "faults")}
        self.marks = {slot: -1 for slot in self.slots.values()}

    async def write(self, events: list[AnyEvent]) -> None:
        for source, slot in self.slots.items():
            mine = [e for e in events if (e.kind == "fault") == (source == "faults")]
            if not mine:
                continue
            tally = Tally()
            self.folder.fold(tally, mine)
            await self.writer.register_slots([slot])
            mark = self.marks[slot]
            assert await self.writer.apply(slot, mark, mark + 1, tally) == Applied()
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
