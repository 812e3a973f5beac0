"""A message whose sums Redis cannot hold becomes a dead letter; the partition goes on."""

from __future__ import annotations

import json

import pytest

from costline.connectors.redis_apply import BatchWriter
from costline.connectors.redis_keys import bucket_key, slot_tag
from costline.rules.prices import PriceBook
from costline.rules.tally import Folder
from costline.streams.settings import DEFAULT_PRICES
from costline.streams.worker.aggregator import Aggregator
from costline.streams.worker.health import Health
from costline.streams.worker.metrics import Metrics
from tests.integration.redis_writer import Writer

pytestmark = pytest.mark.integration

TOPIC = "t.usage.v1"
TS = 1_767_225_600  # 2026-01-01T00:00:00Z


class Msg:
    def __init__(self, offset: int, value: bytes) -> None:
        self.topic, self.partition, self.offset, self.value = TOPIC, 0, offset, value


def usage(event_id: str, cost: float, team: str) -> dict[str, object]:
    return {"event_id": event_id, "kind": "usage", "ts": TS, "resource_id": "n",
            "resource_type": "gpu.h100", "quantity": 1, "unit": "gpu_hour", "cost": cost,
            "tags": {"team": team}}


def aggregator(writer: BatchWriter, namespace: str, letters: list[dict[str, object]]
               ) -> Aggregator:
    async def dead(key: bytes, value: bytes) -> None:
        letters.append(json.loads(value))

    async def seek(topic: str, partition: int, offset: int) -> None:
        raise AssertionError("no seek expected")

    return Aggregator(namespace=namespace, sources={TOPIC: "usage"}, writer=writer,
                      folder=Folder(PriceBook.load(DEFAULT_PRICES)), send_dead_letter=dead,
                      seek=seek, metrics=Metrics(), health=Health())


async def day_costs(writer: BatchWriter, slot: str) -> list[int]:
    day = await writer.redis.hgetall(bucket_key(slot, "1d", "2026-01-01"))
    return sorted(int(value.split()[0]) for field, value in day.items() if field.endswith(b":u"))


async def test_a_message_past_what_a_sum_holds_is_refused_and_the_rest_counted(
        redis_writer: Writer, namespace: str) -> None:
    writer: BatchWriter = redis_writer.writer
    letters: list[dict[str, object]] = []
    agg = aggregator(writer, namespace, letters)
    # 10,000 events at the most one event may cost (10^9 each, 10^15 micro-units): their sum,
    # 10^19 micro-units, is more than Redis's integers hold.
    huge = json.dumps([usage(f"h{i}", 1e9, "big") for i in range(10_000)]).encode()
    small = json.dumps(usage("s1", 2.5, "small")).encode()
    await agg.handle([Msg(0, small), Msg(1, huge), Msg(2, json.dumps(usage("s2", 1.5, "small"))
                                                    .encode())])
    await agg.flush()

    slot = slot_tag(namespace, "usage", 0)
    assert await writer.watermark(slot) == 2
    assert [(letter["offset"], letter["code"]) for letter in letters] == [(1, "out_of_range")]
    assert "spend of" in str(letters[0]["reason"]) and '"team":"big"' in str(letters[0]["reason"])
    assert await day_costs(writer, slot) == [4_000_000]  # only the two small events
    assert agg.health.ok


@pytest.mark.parametrize("takes", [[[0, 1, 2]], [[0], [1], [2]]], ids=["one-take", "three"])
async def test_the_message_that_would_pass_the_limit_is_refused_however_they_are_taken(
        redis_writer: Writer, namespace: str, takes: list[list[int]]) -> None:
    writer: BatchWriter = redis_writer.writer
    letters: list[dict[str, object]] = []
    agg = aggregator(writer, namespace, letters)
    # 9,199 × 10^15 micro-units, then two messages of 5 × 10^14: the first still fits under
    # the limit (9.2 × 10^18), the second would reach it.
    messages = [json.dumps([usage(f"f{i}", 1e9, "big") for i in range(9_199)]).encode(),
                json.dumps(usage("m1", 5e8, "big")).encode(),
                json.dumps(usage("m2", 5e8, "big")).encode()]
    for take in takes:
        await agg.handle([Msg(offset, messages[offset]) for offset in take])
        await agg.flush()

    slot = slot_tag(namespace, "usage", 0)
    assert await writer.watermark(slot) == 2
    assert [letter["offset"] for letter in letters] == [2]
    assert await day_costs(writer, slot) == [9_199 * 10**15 + 5 * 10**14]


async def test_a_resend_of_a_counted_message_is_not_refused_as_passing_the_limit(
        redis_writer: Writer, namespace: str) -> None:
    writer: BatchWriter = redis_writer.writer
    letters: list[dict[str, object]] = []
    agg = aggregator(writer, namespace, letters)
    # As above, with m1 sent twice: its resend adds nothing, so it fits where m2 does not.
    m1 = json.dumps(usage("m1", 5e8, "big")).encode()
    messages = [json.dumps([usage(f"f{i}", 1e9, "big") for i in range(9_199)]).encode(),
                m1, m1, json.dumps(usage("m2", 5e8, "big")).encode()]
    await agg.handle([Msg(offset, value) for offset, value in enumerate(messages)])
    await agg.flush()

    slot = slot_tag(namespace, "usage", 0)
    assert await writer.watermark(slot) == 3
    assert [letter["offset"] for letter in letters] == [3]
    assert await day_costs(writer, slot) == [9_199 * 10**15 + 5 * 10**14]
