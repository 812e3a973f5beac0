"""The input's consumer shell (``costline.streams.worker.input_takes``) on a consumer that
behaves like aiokafka's: new partitions stay paused, uncommitted and unread until the loop knows
where they start (a partition the group never committed starts where the Faust app's group
did); a stopping worker delivers what is in flight before its last commit."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiokafka import TopicPartition

from costline.streams.worker.input_takes import InputTakes

A, B = TopicPartition("t.usage.v1", 0), TopicPartition("t.usage.v1", 1)


@dataclass
class Record:
    topic: str
    partition: int
    offset: int
    value: bytes = b"{}"


@dataclass
class Consumer:
    """One group's view: committed offsets, the log's records, positions, pauses, commits."""

    group: str
    logs: dict[TopicPartition, int]  # records per partition
    committed_: dict[TopicPartition, int] = field(default_factory=dict)
    positions: dict[TopicPartition, int] = field(default_factory=dict)
    paused: set[TopicPartition] = field(default_factory=set)
    commits: list[dict[TopicPartition, int]] = field(default_factory=list)
    assigned: set[TopicPartition] = field(default_factory=set)
    listener: Any = None
    answers: asyncio.Event | None = None  # committed() waits for it, when set (Kafka slow)
    kept_from: dict[TopicPartition, int] = field(default_factory=dict)  # retention's doing

    def subscribe(self, topics: list[str], listener: Any) -> None:
        self.listener = listener

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """A rebalance: revoked, then assigned; positions reset to committed or earliest."""
        await self.listener.on_partitions_revoked(set(self.assigned))
        self.assigned = set(partitions)
        for tp in self.assigned:
            self.positions[tp] = self.committed_.get(tp, 0)
        await self.listener.on_partitions_assigned(set(self.assigned))

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    async def committed(self, tp: TopicPartition) -> int | None:
        await asyncio.sleep(0)
        if self.answers is not None:
            await self.answers.wait()
        return self.committed_.get(tp)

    async def position(self, tp: TopicPartition) -> int:
        return self.positions[tp]

    def pause(self, *tps: TopicPartition) -> None:
        self.paused.update(tps)

    def resume(self, *tps: TopicPartition) -> None:
        self.paused.difference_update(tps)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.positions[tp] = offset

    async def getmany(self, timeout_ms: int, max_records: int) -> dict[Any, list[Record]]:
        await asyncio.sleep(0.001)
        out = {}
        for tp in sorted(self.assigned - self.paused):
            start, end = self.positions[tp], self.logs.get(tp, 0)
            if start < end:
                out[tp] = [Record(tp.topic, tp.partition, o) for o in range(start, end)]
                self.positions[tp] = end
        return out

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        self.commits.append(dict(offsets))
        self.committed_.update(offsets)

    def last_stable_offset(self, tp: TopicPartition) -> int:
        return self.logs.get(tp, 0)

    async def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.kept_from.get(tp, 0) for tp in tps}


def source(intake: Consumer, earlier: Consumer) -> InputTakes:
    groups = {intake.group: intake, earlier.group: earlier}
    return InputTakes(consumer=lambda group: groups[group], group=intake.group,
                      earlier_group=earlier.group, topics=["t.usage.v1"], batch_messages=100,
                      within_s=0.01, commit_every_s=0.0)


async def collect(takes: InputTakes, intake: Consumer, partitions: list[TopicPartition],
                  messages: int) -> list[tuple[int, int]]:
    """Run the loop, assign ``partitions``, deliver every take until ``messages`` came."""
    seen: list[tuple[int, int]] = []
    stream = takes.takes()
    first = asyncio.ensure_future(stream.__anext__())
    await asyncio.sleep(0.01)  # the loop has started the consumer and waits for partitions
    await intake.assign(partitions)
    take = await asyncio.wait_for(first, 2)
    while True:
        seen += [(m.partition, m.offset) for m in take.messages]
        takes.delivered(take)
        if len(seen) >= messages:
            break
        take = await asyncio.wait_for(stream.__anext__(), 2)
    await takes.commit(force=True)
    await stream.aclose()
    return seen


async def test_a_partition_never_committed_starts_where_the_faust_app_s_group_did() -> None:
    logs = {A: 10, B: 4}
    intake = Consumer("ns-intake", logs, committed_={B: 1})
    earlier = Consumer("ns-aggregator", logs, committed_={A: 7, B: 3})
    seen = await collect(source(intake, earlier), intake, [A, B], 6)
    # A from the Faust app's 7, B from its own commit, 1 (not the Faust app's 3)
    assert sorted(seen) == [(0, 7), (0, 8), (0, 9), (1, 1), (1, 2), (1, 3)]
    assert intake.committed_ == {A: 10, B: 4}
    assert all(offset != 0 for commit in intake.commits for tp, offset in commit.items()
               if tp == A), "A was never committed at its reset position"


async def test_messages_removed_before_intake_priced_them_are_reported(
        caplog: pytest.LogCaptureFixture) -> None:
    logs = {A: 10, B: 4}
    # A committed at 2 but kept from 6 (4 removed); B never committed by either group: it
    # starts at the beginning, whatever that is
    intake = Consumer("ns-intake", logs, committed_={A: 2}, kept_from={A: 6, B: 3})
    earlier = Consumer("ns-aggregator", logs)
    takes = source(intake, earlier)
    with caplog.at_level(logging.ERROR, logger="costline"):
        await collect(takes, intake, [A, B], 12)
    assert takes.metrics.value("input_messages_expired_total", topic=A.topic,
                               partition="0") == 4
    assert takes.metrics.value("input_messages_expired_total", topic=B.topic,
                               partition="1") == 0
    assert "t.usage.v1[0]: messages 2 to 5 were removed by the topic's retention" in caplog.text


async def test_nothing_of_a_partition_is_fetched_or_committed_before_its_start_is_known(
) -> None:
    logs = {A: 10}
    intake = Consumer("ns-intake", logs)
    earlier = Consumer("ns-aggregator", logs, committed_={A: 7}, answers=asyncio.Event())
    takes = source(intake, earlier)
    stream = takes.takes()
    first = asyncio.ensure_future(stream.__anext__())
    await asyncio.sleep(0.01)
    await intake.assign([A])  # reset to earliest, 0, while the Faust app's group is slow
    await asyncio.sleep(0.1)  # many rounds of the loop
    assert not first.done() and intake.commits == [] and intake.paused == {A}
    earlier.answers.set()
    take = await asyncio.wait_for(first, 2)
    assert [m.offset for m in take.messages] == [7, 8, 9]
    takes.delivered(take)
    await takes.commit(force=True)
    assert intake.commits == [{A: 10}]
    await stream.aclose()


async def test_a_stopping_worker_delivers_what_is_in_flight_before_its_last_commit() -> None:
    logs = {A: 5}
    intake = Consumer("ns-intake", logs, committed_={A: 0})
    takes = source(intake, Consumer("ns-aggregator", logs))
    stream = takes.takes()
    first = asyncio.ensure_future(stream.__anext__())
    await asyncio.sleep(0.01)
    await intake.assign([A])
    take = await asyncio.wait_for(first, 2)
    while not take.messages:
        takes.delivered(take)
        take = await asyncio.wait_for(stream.__anext__(), 2)
    stopping = asyncio.ensure_future(takes.stop(timeout_s=2.0))
    closing = asyncio.ensure_future(stream.__anext__())  # the loop ends, drains, commits
    await asyncio.sleep(0.05)
    assert not stopping.done()  # waits for the take in flight
    takes.delivered(take)
    await asyncio.wait_for(stopping, 2)
    assert intake.committed_ == {A: 5}
    assert closing.done()
