"""The aggregation shell: windows, writes and seeks of the ledger's partitions, against a
watermark store that can lose writes and a consumer that records its seeks."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiokafka import TopicPartition
from redis.exceptions import ReadOnlyError

from costline.connectors.redis_apply import Applied, Duplicates, Mismatch, Outcome
from costline.connectors.redis_keys import slot_tag
from costline.rules.events import parse_message
from costline.rules.ledger import Intake, Record
from costline.rules.prices import PriceBook
from costline.rules.tally import Tally
from costline.streams.settings import DEFAULT_PRICES
from costline.streams.worker.aggregation import Aggregation
from costline.streams.worker.health import Health
from costline.streams.worker.metrics import Metrics

TOPIC = "t.ledger.v1"
H100 = 2_490_000
INTAKE = Intake(PriceBook.load(DEFAULT_PRICES), 1)  # one home: every event on partition 0


def slot(partition: int) -> str:
    return slot_tag("t", partition)


@dataclass
class Msg:
    offset: int
    value: bytes


def record(*ids: str) -> bytes:
    events = []
    for event_id in ids:
        raw = json.dumps({"event_id": event_id, "kind": "usage", "ts": 1_700_000_000,
                          "resource_id": "n", "resource_type": "gpu.h100", "quantity": 1,
                          "unit": "gpu_hour", "tags": {"team": "a"}}).encode()
        events += parse_message(raw).events  # type: ignore[union-attr]
    return INTAKE.records(events)[0].encode()


def msgs(*spec: tuple[int, str]) -> list[Msg]:
    """Ledger records at offsets, one event each."""
    return [Msg(offset, record(event_id)) for offset, event_id in spec]


class MemoryWriter:
    """Watermark, gross spend and dedup memory per slot, with the script's compare-and-set."""

    def __init__(self) -> None:
        self.wm: dict[str, int] = {}
        self.cost: dict[str, int] = {}
        self.seen: set[int] = set()
        self.sizes: list[int] = []
        self.forgotten: list[str] = []
        self.known_tagsets = 0

    def forget(self, slot: str) -> None:
        self.forgotten.append(slot)

    async def watermark(self, slot: str) -> int:
        return self.wm.get(slot, -1)

    async def register_slots(self, slots: list[str]) -> None:
        pass

    async def apply(self, slot: str, expected: int, new_wm: int, tally: Tally) -> Outcome:
        if self.wm.get(slot, -1) != expected:
            return Mismatch(self.wm.get(slot, -1))
        dups = frozenset(d for ds in tally.digests.values() for d in ds if d in self.seen)
        if dups:
            return Duplicates(dups)
        self.sizes.append(tally.events)
        self.seen.update(tally.seen)
        self.cost[slot] = self.cost.get(slot, 0) + sum(c.gross for c in tally.usage.values())
        self.wm[slot] = new_wm
        return Applied()


class GatedWriter(MemoryWriter):
    """Writes wait at a gate until the test opens it."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()

    async def apply(self, slot: str, expected: int, new_wm: int, tally: Tally) -> Outcome:
        await self.gate.wait()
        return await super().apply(slot, expected, new_wm, tally)


@dataclass
class FakeConsumer:
    seeks: list[tuple[int, int]] = field(default_factory=list)
    paused: set[int] = field(default_factory=set)
    kept_from: dict[int, int] = field(default_factory=dict)  # where each partition begins

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append((tp.partition, offset))

    def pause(self, *tps: TopicPartition) -> None:
        self.paused |= {tp.partition for tp in tps}

    def resume(self, *tps: TopicPartition) -> None:
        self.paused -= {tp.partition for tp in tps}

    def highwater(self, tp: TopicPartition) -> int:
        return 100

    async def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.kept_from.get(tp.partition, 0) for tp in tps}


async def make(writer: MemoryWriter | None = None, partitions: int = 1,
               **options: Any) -> tuple[Aggregation, MemoryWriter, FakeConsumer]:
    writer = writer or MemoryWriter()
    consumer = FakeConsumer()
    settings = dict(window_events=10_000, window_linger_s=0.0, unwritten_events=50_000)
    settings.update(options)
    agg = Aggregation(consumer=lambda: consumer, topic=TOPIC, namespace="t",  # type: ignore[arg-type, return-value]
                      writer=writer, metrics=Metrics(), health=Health(), **settings)  # type: ignore[arg-type]
    agg.consumer = consumer  # type: ignore[assignment]
    await agg.on_partitions_assigned([TopicPartition(TOPIC, p) for p in range(partitions)])
    await agg._resolve_new_homes()
    consumer.seeks.clear()
    return agg, writer, consumer


async def folded(agg: Aggregation, partition: int, batch: list[Msg]) -> None:
    await agg._fold(partition, batch)
    await agg.flush()


async def test_a_new_partition_waits_paused_until_it_resumes_after_its_watermark():
    writer = MemoryWriter()
    writer.wm[slot(2)] = 41
    consumer = FakeConsumer()
    agg = Aggregation(consumer=lambda: consumer, topic=TOPIC, namespace="t",  # type: ignore[arg-type, return-value]
                      writer=writer, metrics=Metrics(), health=Health(),  # type: ignore[arg-type]
                      window_events=10, window_linger_s=0, unwritten_events=10)
    agg.consumer = consumer  # type: ignore[assignment]
    await agg.on_partitions_assigned([TopicPartition(TOPIC, 2), TopicPartition(TOPIC, 3)])
    assert consumer.paused == {2, 3}
    await agg._resolve_new_homes()
    assert sorted(consumer.seeks) == [(2, 42), (3, 0)] and consumer.paused == set()


async def test_records_removed_before_they_were_counted_are_reported(
        caplog: pytest.LogCaptureFixture) -> None:
    writer = MemoryWriter()
    writer.wm[slot(2)] = 41
    consumer = FakeConsumer(kept_from={2: 50, 3: 0})
    agg = Aggregation(consumer=lambda: consumer, topic=TOPIC, namespace="t",  # type: ignore[arg-type, return-value]
                      writer=writer, metrics=Metrics(), health=Health(),  # type: ignore[arg-type]
                      window_events=10, window_linger_s=0, unwritten_events=10)
    agg.consumer = consumer  # type: ignore[assignment]
    await agg.on_partitions_assigned([TopicPartition(TOPIC, 2), TopicPartition(TOPIC, 3)])
    with caplog.at_level(logging.ERROR, logger="costline"):
        await agg._resolve_new_homes()
    assert agg.metrics.value("ledger_records_expired_total", partition="2") == 8
    assert agg.metrics.value("ledger_records_expired_total", partition="3") == 0
    assert "ledger[2]: records 42 to 49 were removed" in caplog.text


async def test_a_replayed_record_changes_nothing():
    agg, writer, _ = await make()
    await folded(agg, 0, msgs((0, "a"), (1, "b")))
    await folded(agg, 0, msgs((0, "a"), (1, "b"), (2, "c")))
    assert writer.wm[slot(0)] == 2 and writer.cost[slot(0)] == 3 * H100
    assert agg.metrics.value("ledger_records_replayed_total") == 2


async def test_a_resend_counted_in_an_earlier_window_counts_once():
    agg, writer, _ = await make()
    await folded(agg, 0, msgs((0, "a")))
    await folded(agg, 0, msgs((1, "b"), (2, "a")))  # "a" again, in another record
    assert writer.wm[slot(0)] == 2 and writer.cost[slot(0)] == 2 * H100
    assert agg.metrics.value("events_duplicate_total") == 1


async def test_a_resend_into_the_same_window_counts_once():
    agg, writer, _ = await make()
    await folded(agg, 0, msgs((0, "a"), (1, "a"), (2, "b")))
    assert writer.cost[slot(0)] == 2 * H100 and writer.sizes == [2]


async def test_lost_redis_writes_seek_back_and_drop_what_was_fetched_since():
    agg, writer, consumer = await make(GatedWriter())
    writer.gate.set()  # type: ignore[attr-defined]
    await folded(agg, 0, msgs((0, "a"), (1, "b"), (2, "c")))
    writer.wm[slot(0)], writer.cost[slot(0)] = 0, H100  # Redis came back from a snapshot
    writer.seen = {next(iter(Record.decode(record("a")).entries))[1]}
    writer.gate.clear()  # type: ignore[attr-defined]
    await agg._fold(0, msgs((3, "d")))
    await asyncio.sleep(0)  # its write waits at the gate
    await agg._fold(0, msgs((4, "e")))  # fills behind the doomed write
    writer.gate.set()  # type: ignore[attr-defined]
    await agg.flush()
    assert consumer.seeks == [(0, 1)]
    await folded(agg, 0, msgs((1, "b"), (2, "c"), (3, "d"), (4, "e")))  # read again
    assert writer.wm[slot(0)] == 4 and writer.cost[slot(0)] == 5 * H100


async def test_a_seek_back_drops_the_rest_of_the_batch_being_folded():
    agg, writer, consumer = await make(window_events=1)
    await folded(agg, 0, msgs((0, "a")))
    writer.wm[slot(0)] = -1  # emptied
    writer.seen.clear()
    writer.cost.clear()
    await folded(agg, 0, msgs((1, "b"), (2, "c"), (3, "d")))
    assert consumer.seeks == [(0, 0)]
    await folded(agg, 0, msgs((0, "a"), (1, "b"), (2, "c"), (3, "d")))
    assert writer.cost[slot(0)] == 4 * H100 and writer.wm[slot(0)] == 3


async def test_a_seek_back_past_what_the_ledger_keeps_is_reported():
    agg, writer, consumer = await make(window_events=1)
    await folded(agg, 0, msgs((0, "a"), (1, "b")))
    writer.wm[slot(0)] = -1  # emptied, and the ledger's retention has removed offset 0
    consumer.kept_from[0] = 1
    await folded(agg, 0, msgs((2, "c")))
    assert consumer.seeks == [(0, 0)]
    assert agg.metrics.value("ledger_records_expired_total", partition="0") == 1


async def test_a_watermark_another_worker_moved_is_adopted_and_only_later_records_written():
    agg, writer, _ = await make(GatedWriter())
    await agg._fold(0, msgs((0, "a")))
    await asyncio.sleep(0)
    await agg._fold(0, msgs((1, "b")))  # pending behind the first write
    writer.wm[slot(0)] = 9  # another owner applied up to 9 meanwhile
    writer.gate.set()  # type: ignore[attr-defined]
    await agg.flush()
    assert writer.wm[slot(0)] == 9 and writer.cost.get(slot(0), 0) == 0
    await folded(agg, 0, msgs(*[(i, f"e{i}") for i in range(5, 11)]))
    assert writer.wm[slot(0)] == 10
    assert writer.cost[slot(0)] == H100  # only offset 10 was this worker's to count


async def test_records_that_arrive_during_a_write_are_written_together():
    agg, writer, _ = await make(GatedWriter())
    await agg._fold(0, msgs((0, "a")))
    await asyncio.sleep(0)
    for i in range(1, 4):
        await agg._fold(0, msgs((i, f"e{i}")))
    writer.gate.set()  # type: ignore[attr-defined]
    await agg.flush()
    assert writer.sizes == [1, 3] and writer.wm[slot(0)] == 3


async def test_a_full_window_waits_for_the_write_before_it():
    agg, writer, _ = await make(GatedWriter(), window_events=2)
    await agg._fold(0, msgs((0, "a")))
    await asyncio.sleep(0)
    await agg._fold(0, msgs((1, "b")))
    full = asyncio.ensure_future(agg._fold(0, msgs((2, "c"))))
    await asyncio.sleep(0.05)
    assert not full.done()
    writer.gate.set()  # type: ignore[attr-defined]
    await full
    await agg.flush()
    assert writer.wm[slot(0)] == 2 and writer.cost[slot(0)] == 3 * H100


async def test_a_worker_holds_at_most_its_unwritten_events_over_all_its_partitions():
    agg, writer, _ = await make(GatedWriter(), partitions=4, unwritten_events=3,
                                window_events=10)
    for p in range(4):
        await agg._fold(p, msgs((0, f"p{p}")))
    await asyncio.sleep(0)
    assert agg.unwritten() == 4
    held = asyncio.ensure_future(agg._hold_back())
    await asyncio.sleep(0.05)
    assert not held.done()
    writer.gate.set()  # type: ignore[attr-defined]
    await held
    await agg.flush()
    assert agg.unwritten() == 0
    assert [writer.cost[slot(p)] for p in range(4)] == [H100] * 4


async def test_a_lingering_window_takes_the_records_that_arrive_meanwhile():
    agg, writer, _ = await make(window_linger_s=0.2)
    for i in range(5):
        await agg._fold(0, msgs((i, f"e{i}")))
        await asyncio.sleep(0.02)
    assert writer.sizes == []
    await agg.flush()
    assert writer.sizes == [5] and writer.wm[slot(0)] == 4


async def test_a_full_window_does_not_linger():
    agg, writer, _ = await make(window_linger_s=30.0, window_events=3)
    await agg._fold(0, msgs(*[(i, f"e{i}") for i in range(3)]))
    await asyncio.wait_for(agg.flush(), timeout=5)
    assert writer.wm[slot(0)] == 2


class RefusingWriter(MemoryWriter):
    """A Redis that answers but refuses its first writes (a replica after a failover)."""

    def __init__(self, refusals: int) -> None:
        super().__init__()
        self.refusals = refusals

    async def apply(self, slot: str, expected: int, new_wm: int, tally: Tally) -> Outcome:
        if self.refusals:
            self.refusals -= 1
            raise ReadOnlyError("You can't write against a read only replica.")
        return await super().apply(slot, expected, new_wm, tally)


async def test_a_redis_that_refuses_writes_is_waited_for_and_reported():
    agg, writer, _ = await make(RefusingWriter(refusals=2))
    await agg._fold(0, msgs((0, "a")))
    await asyncio.sleep(0.01)
    assert "ReadOnlyError" in agg.health.problems["redis_writes"][0]
    await agg.flush()
    assert "redis_writes" not in agg.health.problems
    assert writer.wm[slot(0)] == 0


async def test_an_idle_partition_whose_watermark_redis_lost_is_read_again():
    agg, writer, consumer = await make()
    await folded(agg, 0, msgs((0, "a"), (1, "b")))
    await agg.verify_watermarks()
    assert consumer.seeks == []
    writer.wm[slot(0)] = 0
    await agg.verify_watermarks()
    assert consumer.seeks == [(0, 1)]


async def test_a_revoked_partition_drops_its_window_and_is_forgotten():
    agg, writer, _ = await make(GatedWriter(), partitions=2)
    await agg._fold(1, msgs((0, "a")))
    await asyncio.sleep(0)
    await agg._fold(1, msgs((1, "b")))  # unwritten: the next owner reads it again
    writer.gate.set()  # type: ignore[attr-defined]
    await agg.on_partitions_revoked([TopicPartition(TOPIC, 1)])
    assert writer.forgotten == [slot(1)] and 1 not in agg.homes
    assert writer.wm[slot(1)] == 0  # the write in flight was let finish


async def test_a_record_that_is_not_a_ledger_record_is_skipped_and_counted():
    agg, writer, _ = await make()
    await folded(agg, 0, [Msg(0, b"\x93garbage"), *msgs((1, "a"))])
    assert writer.cost[slot(0)] == H100 and writer.wm[slot(0)] == 1
    assert agg.metrics.value("ledger_records_unreadable_total") == 1


@pytest.mark.parametrize("fresh", [False, True])
async def test_lag_is_what_the_ledger_holds_beyond_the_watermark(fresh):
    agg, _, _ = await make()
    if not fresh:
        await folded(agg, 0, msgs((0, "a"), (1, "b")))
    assert agg.lag() == {0: 100 - (-1 if fresh else 1) - 1}
