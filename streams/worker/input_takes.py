"""The input topics, read committed, in takes; their offsets committed once delivered.

Producers may write in Kafka transactions (Kafka Connect and Flink sinks with exactly-once on,
any client with a ``transactional.id``). What such a producer aborts stays in the log, and a
consumer reading uncommitted records counts it; a transaction still open may yet be aborted.
So intake reads with ``isolation_level="read_committed"``: it gets a transaction's records once
it commits, never an aborted one. Faust sets that isolation level only for its own
exactly-once processing, which makes every send of the app transactional; intake is therefore
a plain aiokafka consumer in a group of its own (``Settings.intake_group``), run as a service
of the Faust app, as the aggregation's ledger consumer is.

A take is what one fetch returns, at most ``batch_messages`` messages. Offsets are committed
every ``commit_every_s`` seconds, each partition's at its position after the last take that is
delivered with every take before it (``costline.rules.input_offsets``), so a crash repeats
messages and never loses one.

A partition assigned to the worker waits, paused, until the loop has read where the group
committed it; one the group never committed starts where the group of the worker's Faust app
committed it, if that group has: workers before this one took input in a Faust agent of that
group, and an upgraded worker goes on from there instead of reading the input again from its
start. The rebalance listener only pauses (as the aggregation's does), so a broker slow to
answer holds up those partitions, never the group, and nothing of them is fetched, or
committed, from the wrong place meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import IllegalStateError, KafkaError

from costline.rules import watermarks
from costline.rules.input_offsets import Fetched, InputOffsets
from costline.streams.worker.metrics import Metrics

log = logging.getLogger("costline.input")

# How long a stopping worker waits for the takes in flight to be delivered before its last
# commit (what is not delivered by then is read again by the next owner).
DRAIN_S = 5.0
# Between two tries at reading where new partitions start, while Kafka does not answer.
RESOLVE_RETRY_S = 1.0


@dataclass(eq=False)
class Take:
    """Input messages fetched together (aiokafka's ``ConsumerRecord``), and their offsets."""

    messages: list[Any]
    offsets: Fetched


class InputTakes(ConsumerRebalanceListener):  # type: ignore[misc]
    """Yields takes of the input topics (``takes``) until stopped; ``delivered`` says a take
    is in Kafka's hands, and its offsets may be committed."""

    def __init__(self, *, consumer: Callable[[str], AIOKafkaConsumer], group: str,
                 earlier_group: str, topics: list[str], batch_messages: int,
                 within_s: float, commit_every_s: float, metrics: Metrics | None = None
                 ) -> None:
        self.make_consumer = consumer
        self.metrics = metrics or Metrics()
        self.group, self.earlier_group = group, earlier_group
        self.topics = topics
        self.batch_messages, self.within_s = batch_messages, within_s
        self.commit_every_s = commit_every_s
        self.offsets = InputOffsets()
        self.consumer: AIOKafkaConsumer | None = None
        self._unresolved: set[TopicPartition] = set()  # assigned, paused, start not known
        self._seen: dict[TopicPartition, int] = {}
        self._committed_at = 0.0
        self._stopping = False
        self._stopped = asyncio.Event()

    async def takes(self) -> AsyncGenerator[Take, None]:
        consumer = self.consumer = self.make_consumer(self.group)
        consumer.subscribe(self.topics, listener=self)
        await consumer.start()
        try:
            while not self._stopping:
                if self._unresolved:
                    await self._resolve(consumer)
                batches = await consumer.getmany(timeout_ms=int(self.within_s * 1000),
                                                 max_records=self.batch_messages)
                messages = [message for part in batches.values() for message in part]
                moved = await self._moved(consumer)
                if messages or moved:
                    yield Take(messages, self.offsets.fetched(moved))
                await self.commit(force=False)
            await self._drain()
        finally:
            await self.commit(force=True)
            self.consumer = None
            await consumer.stop()
            self._stopped.set()

    def delivered(self, take: Take) -> None:
        self.offsets.delivered(take.offsets)

    async def stop(self, timeout_s: float) -> None:
        """Stop after the fetch in progress; returns once the takes in flight are delivered
        (up to ``DRAIN_S``), what is delivered is committed and the group is left, or after
        ``timeout_s``."""
        self._stopping = True
        if self.consumer is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stopped.wait(), timeout_s)

    async def _drain(self) -> None:
        deadline = time.monotonic() + DRAIN_S
        while self.offsets.pending and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def _moved(self, consumer: AIOKafkaConsumer) -> dict[TopicPartition, int]:
        """Positions that moved since the last take: past messages, and past the markers
        and aborted records the consumer skipped (never of a partition not resolved yet)."""
        moved = {}
        for tp in consumer.assignment() - self._unresolved:
            try:
                position = await consumer.position(tp)
            except IllegalStateError:
                continue  # revoked while its position was being reset
            if tp in self._unresolved:
                continue  # revoked and assigned again meanwhile
            if self._seen.get(tp) != position:
                moved[tp] = self._seen[tp] = position
        return moved

    async def commit(self, *, force: bool) -> None:
        now = time.monotonic()
        consumer = self.consumer
        if consumer is None or (not force and now - self._committed_at < self.commit_every_s):
            return
        self._committed_at = now
        offsets = self.offsets.to_commit(frozenset(consumer.assignment() - self._unresolved))
        if not offsets:
            return
        try:
            await consumer.commit(offsets)
        except KafkaError as exc:  # CommitFailedError among them
            # A rebalance in progress: the next owner starts from the last commit that took.
            log.info("committing input offsets failed, they are committed later: %s", exc)
        else:
            self.offsets.was_committed(offsets)

    def lag(self) -> dict[TopicPartition, int]:
        """Committed input not yet delivered, per owned partition (for /metrics)."""
        consumer = self.consumer
        if consumer is None:
            return {}
        out = {}
        for tp in consumer.assignment():
            stable = consumer.last_stable_offset(tp)
            done = self.offsets.safe.get(tp)  # what is committed is safe too
            if stable is not None and done is not None:
                out[tp] = max(0, stable - done)
        return out

    # -- partitions coming and going -------------------------------------------------------

    async def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        """Commit what is delivered; takes still in flight are read again by the next owner
        (their events meet their first copies in the ledger's dedup memory)."""
        await self.commit(force=True)
        self.offsets.rebalanced()
        self._seen.clear()
        self._unresolved.clear()

    async def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        """New partitions wait, paused, until the loop has read where they start."""
        assigned = set(assigned)
        if self.consumer is not None and assigned:
            self.consumer.pause(*assigned)
            self._unresolved = assigned

    async def _resolve(self, consumer: AIOKafkaConsumer) -> None:
        """Seek the partitions this group never committed to where the Faust app's group
        committed them, then let every new partition go. Kafka not answering, they stay
        paused and the next round tries again."""
        partitions = sorted(self._unresolved)
        generation = self.offsets.generation
        try:
            committed = await asyncio.gather(*(consumer.committed(tp) for tp in partitions))
            fresh = [tp for tp, offset in zip(partitions, committed, strict=True)
                     if offset is None]
            earlier = await self._earlier_offsets(fresh) if fresh else {}
            starts = {tp: offset for tp, offset in zip(partitions, committed, strict=True)
                      if offset is not None} | earlier
            kept = await consumer.beginning_offsets(list(starts)) if starts else {}
        except KafkaError as exc:
            log.warning("reading where %d new input partitions start failed, trying again: "
                        "%s", len(partitions), exc)
            await asyncio.sleep(RESOLVE_RETRY_S)
            return
        if self.offsets.generation != generation:
            return  # partitions moved meanwhile: the new ones are resolved next round
        for tp, offset in earlier.items():
            consumer.seek(tp, offset)
        for tp, start in starts.items():
            self._expired_before(tp, start, kept.get(tp))
        consumer.resume(*partitions)
        self._unresolved.difference_update(partitions)
        if earlier:
            log.info("starting %d input partitions where %s committed them", len(earlier),
                     self.earlier_group)

    def _expired_before(self, tp: TopicPartition, start: int, kept_from: int | None) -> None:
        """Say so when the topic no longer holds messages the group is to read from (intake
        down for longer than the input topics keep messages): Kafka then starts at the
        first kept one, and the events of those removed are not counted."""
        lost = 0 if kept_from is None else watermarks.expired(start, kept_from)
        if not lost:
            return
        self.metrics.inc("input_messages_expired_total", lost, topic=tp.topic,
                         partition=str(tp.partition))
        log.error("%s[%d]: messages %d to %d were removed by the topic's retention before "
                  "intake priced them; their events are not counted unless producers send "
                  "them again (each is counted once)", tp.topic, tp.partition, start,
                  start + lost - 1)

    async def _earlier_offsets(self, partitions: list[TopicPartition]
                               ) -> dict[TopicPartition, int]:
        """What the Faust app's group committed of these partitions (none on a new
        deployment)."""
        earlier = self.make_consumer(self.earlier_group)
        try:
            await earlier.start()
            offsets = await asyncio.gather(*(earlier.committed(tp) for tp in partitions))
        finally:
            await earlier.stop()
        return {tp: offset for tp, offset in zip(partitions, offsets, strict=True)
                if offset is not None}
