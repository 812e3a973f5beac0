"""The aggregator's offset bookkeeping, against a watermark store that can lose writes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from dataclasses import dataclass

import pytest
from redis.exceptions import ReadOnlyError

from costline.connectors.redis_apply import Applied, Duplicates, Mismatch, Outcome
from costline.rules.prices import PriceBook
from costline.rules.tally import Folder, Tally, event_digest
from costline.streams.settings import DEFAULT_PRICES
from costline.streams.worker.aggregator import Aggregator
from costline.streams.worker.folding import FoldingPool, ProcessFolding
from costline.streams.worker.health import Health
from costline.streams.worker.metrics import Metrics

TOPIC = "t.usage.v1"


@dataclass
class Msg:
    topic: str
    partition: int
    offset: int
    value: bytes


class MemoryWriter:
    """Watermark and sums per slot, with the script's compare-and-set semantics."""

    def __init__(self) -> None:
        self.wm: dict[str, int] = {}
        self.cost: dict[str, int] = {}
        self.seen: set[bytes] = set()
        self.calls = 0
        self.forgotten: list[str] = []

    def forget(self, slot: str) -> None:
        self.forgotten.append(slot)

    async def watermark(self, slot: str) -> int:
        return self.wm.get(slot, -1)

    async def register_slots(self, slots: list[str]) -> None:
        pass

    async def apply(self, slot: str, expected: int, new_wm: int, tally: Tally) -> Outcome:
        self.calls += 1
        if self.wm.get(slot, -1) != expected:
            return Mismatch(self.wm.get(slot, -1))
        dups = frozenset(d for ds in tally.digests.values() for d in ds if d in self.seen)
        if dups:
            return Duplicates(dups)
        self.seen.update(d for ds in tally.digests.values() for d in ds)
        self.cost[slot] = self.cost.get(slot, 0) + sum(
            cell.get("c", 0) for cell in tally.sums.values())
        self.wm[slot] = new_wm
        return Applied()


def usage(i: int, event_id: str | None = None) -> bytes:
    return json.dumps({"event_id": event_id or f"e{i}", "kind": "usage", "ts": 1_700_000_000,
                       "resource_id": "n", "resource_type": "gpu.h100", "quantity": 1,
                       "unit": "gpu_hour", "tags": {"team": "a"}}).encode()


PRICES = PriceBook.load(DEFAULT_PRICES)
CHILDREN: list[ProcessFolding | FoldingPool] = []


@pytest.fixture(autouse=True)
def _stop_children():
    yield
    while CHILDREN:
        CHILDREN.pop().close()


# The semantics hold whether the worker folds in its own process, in a child process or in
# two (the second taking what the first has no room for).
every_folding = pytest.mark.parametrize("folding", ["inline", "process", "pool"])


def make(folding: str = "inline"
         ) -> tuple[Aggregator, MemoryWriter, list[tuple[str, int, int]], list[bytes]]:
    writer = MemoryWriter()
    seeks: list[tuple[str, int, int]] = []
    letters: list[bytes] = []

    async def seek(topic: str, partition: int, offset: int) -> None:
        seeks.append((topic, partition, offset))

    async def dead(key: bytes, value: bytes) -> None:
        letters.append(key)

    child: ProcessFolding | FoldingPool | None = None
    if folding == "process":
        child = ProcessFolding(PRICES)
    elif folding == "pool":
        child = FoldingPool([ProcessFolding(PRICES), ProcessFolding(PRICES)], depth=4)
    if child is not None:
        CHILDREN.append(child)
    agg = Aggregator(namespace="t", sources={TOPIC: "usage"}, writer=writer,  # type: ignore[arg-type]
                     folder=Folder(PRICES), send_dead_letter=dead,
                     seek=seek, metrics=Metrics(), health=Health(), folding=child)
    return agg, writer, seeks, letters


H100 = 2_490_000


async def handled(agg: Aggregator, batch: list[Msg]) -> None:
    """One take, written: ``handle`` returns once it is folded, ``flush`` once it is in Redis."""
    await agg.handle(batch)
    await agg.flush()


@every_folding
async def test_a_replayed_batch_changes_nothing(folding):
    agg, writer, _, _ = make(folding)
    batch = [Msg(TOPIC, 0, i, usage(i)) for i in range(10)]
    await handled(agg, batch)
    await handled(agg, batch)
    assert writer.cost["{t:usage:0}"] == 10 * H100
    assert writer.wm["{t:usage:0}"] == 9


@every_folding
async def test_a_resend_in_a_later_message_counts_once(folding):
    agg, writer, _, _ = make(folding)
    await handled(agg, [Msg(TOPIC, 0, 0, usage(0)), Msg(TOPIC, 0, 1, usage(1))])
    await handled(agg, [Msg(TOPIC, 0, 2, usage(2)), Msg(TOPIC, 0, 3, usage(0, "e1"))])
    assert writer.cost["{t:usage:0}"] == 3 * H100
    assert writer.wm["{t:usage:0}"] == 3


@every_folding
async def test_refused_messages_become_dead_letters_and_move_the_watermark(folding):
    agg, writer, _, letters = make(folding)
    await handled(agg, [Msg(TOPIC, 0, 0, b"nope"), Msg(TOPIC, 0, 1, usage(1))])
    assert letters == [f"{TOPIC}:0:0".encode()]
    assert writer.wm["{t:usage:0}"] == 1
    assert writer.cost["{t:usage:0}"] == H100


@every_folding
async def test_lost_redis_writes_seek_back_and_stale_messages_are_dropped(folding):
    agg, writer, seeks, _ = make(folding)
    await handled(agg, [Msg(TOPIC, 0, i, usage(i)) for i in range(5)])
    # Redis restarts from an older snapshot: offsets 3..4 and their sums are gone.
    writer.wm["{t:usage:0}"] = 2
    writer.cost["{t:usage:0}"] = 3 * H100
    writer.seen -= {event_digest("e3"), event_digest("e4")}  # their dedup memory too
    await handled(agg, [Msg(TOPIC, 0, 5, usage(5)), Msg(TOPIC, 0, 6, usage(6))])
    assert seeks == [(TOPIC, 0, 3)]
    # Messages fetched before the seek arrive first and are stale; then the re-read ones.
    await handled(agg, [Msg(TOPIC, 0, 7, usage(7))])
    await handled(agg, [Msg(TOPIC, 0, i, usage(i)) for i in range(3, 8)])
    assert writer.wm["{t:usage:0}"] == 7
    assert writer.cost["{t:usage:0}"] == 8 * H100


@every_folding
async def test_a_watermark_advanced_by_another_worker_is_adopted(folding):
    agg, writer, seeks, _ = make(folding)
    await handled(agg, [Msg(TOPIC, 0, 0, usage(0))])
    writer.wm["{t:usage:0}"] = 4  # another owner applied 1..4 meanwhile
    await handled(agg, [Msg(TOPIC, 0, i, usage(i)) for i in range(1, 7)])
    assert seeks == []
    assert writer.wm["{t:usage:0}"] == 6
    assert writer.cost["{t:usage:0}"] == 3 * H100  # e0, e5, e6: 1..4 were the other's


async def test_partitions_resume_after_their_watermarks():
    agg, writer, _, _ = make()
    writer.wm["{t:usage:1}"] = 41
    resume = await agg.on_assigned([(TOPIC, 1), ("other.topic", 0)])
    assert resume == {(TOPIC, 1): 42}


async def test_a_revoked_partition_is_forgotten_by_the_writer():
    # What the writer remembers of a partition's tag sets would otherwise keep its share of
    # the worker's budget after another worker took the partition.
    agg, writer, _, _ = make()
    await agg.on_assigned([(TOPIC, 1), (TOPIC, 2)])
    agg.on_revoked([(TOPIC, 1), ("other.topic", 0)])
    assert writer.forgotten == ["{t:usage:1}"]
    assert list(agg.partitions) == [(TOPIC, 2)]


class GatedWriter(MemoryWriter):
    """Holds each write until the test opens the gate: a Redis that is slower than the
    worker."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.sizes: list[int] = []

    async def apply(self, slot: str, expected: int, new_wm: int, tally: Tally) -> Outcome:
        await self.gate.wait()
        self.sizes.append(tally.events)
        return await super().apply(slot, expected, new_wm, tally)


def make_gated(window_events: int = 20_000) -> tuple[Aggregator, GatedWriter]:
    agg, _, _, _ = make()
    writer = GatedWriter()
    agg.writer = writer  # type: ignore[assignment]
    agg.window_events = window_events
    return agg, writer


async def test_takes_that_arrive_during_a_write_are_written_together():
    agg, writer = make_gated()
    await agg.handle([Msg(TOPIC, 0, 0, usage(0))])
    await asyncio.sleep(0)  # its write starts, and waits at the gate
    for i in range(1, 4):
        await agg.handle([Msg(TOPIC, 0, i, usage(i))])
    writer.gate.set()
    await agg.flush()
    assert writer.sizes == [1, 3]
    assert writer.wm["{t:usage:0}"] == 3
    assert writer.cost["{t:usage:0}"] == 4 * H100


async def test_a_full_window_waits_for_the_write_before_it():
    agg, writer = make_gated(window_events=2)
    await agg.handle([Msg(TOPIC, 0, 0, usage(0))])
    await asyncio.sleep(0)
    await agg.handle([Msg(TOPIC, 0, 1, usage(1))])  # below the limit: returns at once
    full = asyncio.ensure_future(agg.handle([Msg(TOPIC, 0, 2, usage(2))]))
    await asyncio.sleep(0.05)
    assert not full.done()  # the window holds 2 events and the write before it is pending
    writer.gate.set()
    await full
    await agg.flush()
    assert writer.wm["{t:usage:0}"] == 2
    assert writer.cost["{t:usage:0}"] == 3 * H100


async def test_a_worker_holds_at_most_its_unwritten_events_over_all_its_partitions():
    """Each partition stays below its window's bound, but together they pass the worker's."""
    agg, writer = make_gated(window_events=10)
    agg.unwritten_events = 3
    for p in range(3):  # one event on each of three partitions: their writes wait
        await agg.handle([Msg(TOPIC, p, 0, usage(p))])
    await asyncio.sleep(0)
    assert agg.unwritten() == 3
    fourth = asyncio.ensure_future(agg.handle([Msg(TOPIC, 3, 0, usage(3))]))
    await asyncio.sleep(0.05)
    assert not fourth.done()  # folded into its window (the bound passed by one take), waiting
    assert agg.unwritten() == 4
    writer.gate.set()
    await fourth
    await agg.flush()
    assert agg.unwritten() == 0
    assert [writer.cost[f"{{t:usage:{p}}}"] for p in range(4)] == [H100] * 4


async def test_a_watermark_moved_past_everything_folded_is_never_moved_back():
    agg, writer = make_gated()
    await agg.handle([Msg(TOPIC, 0, 0, usage(0))])
    await asyncio.sleep(0)
    await agg.handle([Msg(TOPIC, 0, 1, usage(1))])  # pending behind the first write
    writer.wm["{t:usage:0}"] = 9  # another owner applied up to 9 meanwhile
    writer.gate.set()
    await agg.flush()
    assert writer.wm["{t:usage:0}"] == 9
    assert writer.cost.get("{t:usage:0}", 0) == 0
    await handled(agg, [Msg(TOPIC, 0, i, usage(i)) for i in range(5, 11)])
    assert writer.wm["{t:usage:0}"] == 10
    assert writer.cost["{t:usage:0}"] == H100  # only offset 10 was this worker's to count


async def test_lost_writes_drop_the_window_filling_behind_them():
    agg, writer, seeks, _ = make()
    await handled(agg, [Msg(TOPIC, 0, i, usage(i)) for i in range(3)])
    gated = GatedWriter()
    gated.wm, gated.cost, gated.seen = {"{t:usage:0}": 0}, {"{t:usage:0}": H100}, {
        event_digest("e0")}  # Redis restarted from a snapshot taken after offset 0
    agg.writer = gated  # type: ignore[assignment]
    await agg.handle([Msg(TOPIC, 0, 3, usage(3))])
    await asyncio.sleep(0)
    await agg.handle([Msg(TOPIC, 0, 4, usage(4))])  # fills behind the doomed write
    gated.gate.set()
    await agg.flush()
    assert seeks == [(TOPIC, 0, 1)]
    await handled(agg, [Msg(TOPIC, 0, 5, usage(5))])  # fetched before the seek: stale
    await handled(agg, [Msg(TOPIC, 0, i, usage(i)) for i in range(1, 6)])
    assert gated.wm["{t:usage:0}"] == 5
    assert gated.cost["{t:usage:0}"] == 6 * H100


async def test_a_lingering_window_takes_the_messages_that_arrive_meanwhile():
    agg, writer, _, _ = make()
    agg.window_linger_s = 0.2
    for i in range(5):  # five takes, 20 ms apart: all within the first window's linger
        await agg.handle([Msg(TOPIC, 0, i, usage(i))])
        await asyncio.sleep(0.02)
    assert writer.calls == 0  # still lingering
    await agg.flush()
    assert writer.calls == 1
    assert writer.wm["{t:usage:0}"] == 4 and writer.cost["{t:usage:0}"] == 5 * H100


async def test_a_full_window_does_not_linger():
    agg, writer, _, _ = make()
    agg.window_linger_s, agg.window_events = 30.0, 3
    await agg.handle([Msg(TOPIC, 0, i, usage(i)) for i in range(3)])
    await asyncio.wait_for(agg.flush(), timeout=5)
    assert writer.wm["{t:usage:0}"] == 2


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
    agg, _, _, _ = make()
    agg.writer = writer = RefusingWriter(refusals=2)  # type: ignore[assignment]
    await agg.handle([Msg(TOPIC, 0, i, usage(i)) for i in range(3)])
    await asyncio.sleep(0.01)
    assert "redis_writes" in agg.health.problems  # PING still answers: this is what shows it
    assert "ReadOnlyError" in agg.health.problems["redis_writes"][0]
    await agg.flush()
    assert writer.cost["{t:usage:0}"] == 3 * H100
    assert writer.wm["{t:usage:0}"] == 2
    assert agg.health.ok
    # The partition goes on: the next take is written too.
    await handled(agg, [Msg(TOPIC, 0, 3, usage(3))])
    assert writer.wm["{t:usage:0}"] == 3


@every_folding
async def test_an_idle_partition_whose_watermark_redis_lost_is_read_again(folding):
    agg, writer, seeks, _ = make(folding)
    await handled(agg, [Msg(TOPIC, 0, i, usage(i)) for i in range(5)])
    await agg.verify_watermarks()
    assert seeks == []  # Redis holds what was written
    # Redis restarts from an older snapshot, and no new message arrives for the partition.
    writer.wm["{t:usage:0}"] = 2
    writer.cost["{t:usage:0}"] = 3 * H100
    writer.seen -= {event_digest("e3"), event_digest("e4")}
    await agg.verify_watermarks()
    assert seeks == [(TOPIC, 0, 3)]
    await handled(agg, [Msg(TOPIC, 0, i, usage(i)) for i in range(3, 5)])
    assert writer.wm["{t:usage:0}"] == 4
    assert writer.cost["{t:usage:0}"] == 5 * H100


async def test_a_take_folded_in_a_child_lets_the_worker_take_the_next_meanwhile():
    agg, writer, _, _ = make("process")
    await agg.handle([Msg(TOPIC, 0, i, usage(i)) for i in range(3)])
    assert writer.calls == 0  # handle returned while the child folds (it is still starting)
    await agg.handle([Msg(TOPIC, 0, i, usage(i)) for i in range(3, 6)])
    await agg.flush()
    assert writer.wm["{t:usage:0}"] == 5
    assert writer.cost["{t:usage:0}"] == 6 * H100


async def test_a_folding_child_that_dies_is_replaced_and_loses_no_take():
    agg, writer, _, _ = make("process")
    await handled(agg, [Msg(TOPIC, 0, 0, usage(0))])
    child = agg.folding
    first = child.pid  # type: ignore[attr-defined]
    os.kill(first, signal.SIGKILL)
    await agg.handle([Msg(TOPIC, 0, i, usage(i)) for i in range(1, 4)])
    await agg.handle([Msg(TOPIC, 0, i, usage(i)) for i in range(4, 6)])
    await asyncio.wait_for(agg.flush(), timeout=30)
    assert child.pid not in (None, first)  # type: ignore[attr-defined]
    assert writer.wm["{t:usage:0}"] == 5
    assert writer.cost["{t:usage:0}"] == 6 * H100


@every_folding
async def test_a_resend_into_the_same_window_counts_once(folding):
    agg, writer, _, _ = make(folding)
    agg.window_linger_s = 0.5  # both takes land in one window
    await agg.handle([Msg(TOPIC, 0, 0, usage(0)), Msg(TOPIC, 0, 1, usage(1))])
    await agg.handle([Msg(TOPIC, 0, 2, usage(2)), Msg(TOPIC, 0, 3, usage(3, "e0"))])
    await agg.flush()
    assert writer.calls == 1
    assert writer.cost["{t:usage:0}"] == 3 * H100
    assert writer.wm["{t:usage:0}"] == 3
