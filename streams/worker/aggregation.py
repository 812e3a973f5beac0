"""The aggregation: the ledger's home partitions, folded into windows and written to Redis
exactly once.

Each home partition the worker owns folds the ledger records it fetches into a *window* (one
``Tally``); a writer task applies windows to Redis one at a time, each in one script call
with the offset of its last record (``costline.connectors.redis_apply``). While a window is
written the next one fills, and the slower Redis is, the more each write carries (up to
``window_events``).

What each answer of Redis means is decided by ``costline.rules.watermarks`` (replays, lost
writes, another worker's writes); this module fetches, writes and seeks as it says. Resuming
from Redis's watermark means seeking a partition when it is assigned, before anything of it is
fetched: a plain aiokafka consumer in a group of its own does that with its rebalance
listener, the way aiokafka documents for offsets kept outside Kafka. (Faust seeks every
partition to Kafka's committed offsets after its own rebalance hooks, so inside Faust that
would take its private members.) Kafka's committed offsets of this group are kept near the
watermarks, for the lag tools people already use; nothing reads them back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, KafkaError

from costline.connectors.redis_apply import Applied, BatchWriter, Duplicates
from costline.connectors.redis_keys import slot_tag
from costline.rules import watermarks
from costline.rules.ledger import Record
from costline.rules.tally import Tally, tally_of
from costline.rules.watermarks import Position, SeekBack
from costline.streams.worker.health import Health
from costline.streams.worker.metrics import Metrics
from costline.streams.worker.retry import until_redis_answers

log = logging.getLogger("costline.aggregation")

# Most ledger records one fetch returns; each holds up to 10,000 entries.
FETCH_RECORDS = 200
FETCH_WAIT_MS = 100
COMMIT_EVERY_S = 5.0


@dataclass
class Window:
    """Records of one home partition folded and not yet written; kept to fold again without
    the events Redis says were counted before, or without records another worker counted."""

    epoch: int
    records: list[tuple[int, Record]] = field(default_factory=list)
    tally: Tally = field(default_factory=Tally)
    skip: set[int] = field(default_factory=set)

    @property
    def last(self) -> int:
        return self.records[-1][0]

    def add(self, offset: int, record: Record) -> None:
        self.records.append((offset, record))
        self.tally.fold((record,), self.skip)

    def refolded(self, offsets: Iterable[int]) -> Window:
        kept = set(offsets)
        records = [(o, r) for o, r in self.records if o in kept]
        return Window(self.epoch, records, tally_of((r for _, r in records), self.skip),
                      self.skip)


@dataclass
class Home:
    """A ledger partition this worker owns."""

    slot: str
    position: Position | None = None  # None until its watermark is read
    window: Window | None = None  # filling while ``writer`` writes the one before
    writer: asyncio.Task[None] | None = None
    writing: int = 0  # events of the window being written


class Aggregation(ConsumerRebalanceListener):  # type: ignore[misc]
    """Owns the ledger's partitions of one worker; ``run`` until stopped."""

    def __init__(self, *, consumer: Callable[[], AIOKafkaConsumer], topic: str,
                 namespace: str, writer: BatchWriter, metrics: Metrics, health: Health,
                 window_events: int, window_linger_s: float, unwritten_events: int) -> None:
        self.make_consumer = consumer
        self.topic, self.namespace = topic, namespace
        self.writer = writer
        self.metrics, self.health = metrics, health
        self.window_events, self.window_linger_s = window_events, window_linger_s
        self.unwritten_events = unwritten_events
        self.homes: dict[int, Home] = {}
        self.consumer: AIOKafkaConsumer | None = None
        self._wrote = asyncio.Event()
        self._committed_at = 0.0
        self._stopping = False
        self._stopped = asyncio.Event()

    # -- the loop --------------------------------------------------------------------------

    async def run(self) -> None:
        consumer = self.consumer = self.make_consumer()
        consumer.subscribe([self.topic], listener=self)
        try:
            await consumer.start()
            while not self._stopping:
                await self._resolve_new_homes()
                batches = await consumer.getmany(timeout_ms=FETCH_WAIT_MS,
                                                 max_records=FETCH_RECORDS)
                for tp, messages in batches.items():
                    await self._fold(tp.partition, messages)
                await self._hold_back()
                await self._commit_hints()
        finally:
            # Let the writes in flight finish (bounded), then leave the group.
            await self._settle(list(self.homes.values()), timeout=10.0)
            self.consumer = None
            await consumer.stop()
            self._stopped.set()

    async def stop(self) -> None:
        """Stop after the fetch in progress; returns once the group is left."""
        self._stopping = True
        if self.consumer is not None:
            await self._stopped.wait()

    async def _fold(self, partition: int, messages: Sequence[Any]) -> None:
        home = self.homes.get(partition)
        if home is None or home.position is None:
            return  # revoked since, or not resolved yet: fetched again after its seek
        epoch = home.position.epoch
        for message in messages:
            position = home.position
            if position is None or position.epoch != epoch:
                return  # sought back meanwhile: these are read again
            if not watermarks.admits(position, message.offset):
                self.metrics.inc("ledger_records_replayed_total")
                continue
            try:
                record = Record.decode(message.value)
            except (ValueError, TypeError, msgpack.UnpackException) as exc:
                # Only intake writes the ledger: anything else there counts for nothing, and
                # the watermark passes it like any record.
                self.metrics.inc("ledger_records_unreadable_total")
                log.error("ledger[%d] offset %d is not a ledger record, skipped: %s",
                          partition, message.offset, exc)
                record = Record()
            if home.window is None:
                home.window = Window(epoch)
            home.window.add(message.offset, record)
            home.position = watermarks.folded(position, message.offset)
            if home.window.tally.events >= self.window_events and _running(home.writer):
                await home.writer  # type: ignore[misc]  # Redis is behind: bounded memory
                if self.homes.get(partition) is not home:
                    return  # revoked meanwhile
            self._start_writer(partition, home)
        self._start_writer(partition, home)

    async def _hold_back(self) -> None:
        """Wait for writes while the worker holds more than ``unwritten_events`` events
        unwritten over all its partitions."""
        while self.unwritten() > self.unwritten_events and any(
                _running(home.writer) for home in self.homes.values()):
            self._wrote.clear()
            await self._wrote.wait()

    async def flush(self) -> None:
        """Until every window folded so far is written (or dropped)."""
        while True:
            for partition, home in self.homes.items():
                self._start_writer(partition, home)
            writers = _writers(self.homes.values())
            if not writers:
                return
            await asyncio.wait(writers)

    def unwritten(self) -> int:
        """Events folded and not yet in Redis, over every owned partition."""
        return sum(home.writing + (home.window.tally.events if home.window else 0)
                   for home in self.homes.values())

    # -- writing ---------------------------------------------------------------------------

    def _start_writer(self, partition: int, home: Home) -> None:
        if home.writer is not None and home.writer.done() and not home.writer.cancelled():
            home.writer.result()  # a writer that crashed stops the aggregation
        if home.window is not None and not _running(home.writer):
            home.writer = asyncio.ensure_future(self._drain(partition, home))
            home.writer.add_done_callback(lambda _: self._wrote.set())

    async def _drain(self, partition: int, home: Home) -> None:
        while home.window is not None:
            if self.window_linger_s > 0 and home.window.tally.events < self.window_events:
                # As a Kafka producer lingers: a busy partition's window takes more records,
                # so Redis gets fewer, larger writes; an idle one waits this long more.
                await asyncio.sleep(self.window_linger_s)
                if home.window is None:
                    break
            window, home.window = home.window, None
            home.writing = window.tally.events
            try:
                await self._write(partition, home, window)
            finally:
                home.writing = 0
                self._wrote.set()

    async def _write(self, partition: int, home: Home, window: Window) -> None:
        while True:
            position = home.position
            if position is None or position.epoch != window.epoch:
                return  # sought back: its records are read again
            offsets = [offset for offset, _ in window.records]
            keep = watermarks.to_write(offsets, position)
            if not keep:
                return  # another worker counted all of it
            if len(keep) < len(offsets):
                window = window.refolded(keep)
            started = time.perf_counter()
            outcome = await until_redis_answers(
                lambda w=window, expected=position.applied: self.writer.apply(  # type: ignore[misc]
                    home.slot, expected, w.last, w.tally),
                self.health, self.metrics)
            self.metrics.observe("redis_apply_seconds", time.perf_counter() - started)
            # Folding went on meanwhile (``folded`` moved); nothing else moves a position
            # whose writer is running.
            position = home.position
            if position is None or position.epoch != window.epoch:
                return
            if isinstance(outcome, Applied):
                home.position = watermarks.written(position, window.last)
                self.metrics.inc("batches_total")
                self.metrics.inc("events_total", window.tally.events)
                return
            if isinstance(outcome, Duplicates):
                self.metrics.inc("events_duplicate_total", len(outcome.digests))
                window.skip |= outcome.digests
                window = window.refolded(offset for offset, _ in window.records)
                continue
            self.metrics.inc("watermark_mismatch_total")
            home.position, action = watermarks.mismatch(position, outcome.stored)
            if isinstance(action, SeekBack):
                await self._seek_back(partition, home, action)
                return
            log.info("ledger[%d]: watermark %d was written elsewhere; going on after it",
                     partition, outcome.stored)

    async def _seek_back(self, partition: int, home: Home, action: SeekBack) -> None:
        log.warning("ledger[%d]: Redis holds watermark %d, behind what was written (Redis "
                    "lost writes); reading again from %d", partition, action.offset - 1,
                    action.offset)
        home.window = None
        if self.consumer is not None:
            self.consumer.seek(TopicPartition(self.topic, partition), action.offset)
            await self._expired_before({partition: action.offset})

    async def verify_watermarks(self) -> None:
        """Seek back the idle partitions whose watermark Redis lost: a partition that
        receives nothing more would otherwise keep its sums missing."""
        for partition, home in list(self.homes.items()):
            position = home.position
            if position is None or _running(home.writer) or home.window is not None:
                continue  # its write finds out
            stored = await self.writer.watermark(home.slot)
            if self.homes.get(partition) is not home or home.position is not position:
                continue  # it moved while Redis answered
            home.position, action = watermarks.verified(position, stored)
            if action is not None:
                self.metrics.inc("watermark_mismatch_total")
                await self._seek_back(partition, home, action)

    # -- partitions coming and going -------------------------------------------------------

    async def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        """Drop unwritten windows (the next owner reads them again from the watermark) and
        let the writes in flight finish, so the next owner finds a settled watermark."""
        gone = [self.homes.pop(tp.partition) for tp in revoked if tp.partition in self.homes]
        for home in gone:
            home.window = None
            self.writer.forget(home.slot)
        await self._settle(gone, timeout=10.0)

    async def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        """New partitions wait (paused) until their watermark is read from Redis; the loop
        reads it, even if Redis is away for a while, without holding up the group."""
        fresh = [tp for tp in assigned if tp.partition not in self.homes]
        for tp in fresh:
            self.homes[tp.partition] = Home(slot_tag(self.namespace, tp.partition))
        if fresh and self.consumer is not None:
            self.consumer.pause(*fresh)

    async def _resolve_new_homes(self) -> None:
        waiting = [(p, home) for p, home in self.homes.items() if home.position is None]
        if not waiting or self.consumer is None:
            return
        await until_redis_answers(
            lambda: self.writer.register_slots([home.slot for _, home in waiting]),
            self.health, self.metrics)
        starts: dict[int, int] = {}
        for partition, home in waiting:
            stored = await until_redis_answers(lambda h=home: self.writer.watermark(h.slot),  # type: ignore[misc]
                                               self.health, self.metrics)
            if self.homes.get(partition) is not home:
                continue  # revoked while Redis answered
            home.position, start = watermarks.resumed(stored)
            tp = TopicPartition(self.topic, partition)
            self.consumer.seek(tp, start)
            self.consumer.resume(tp)
            starts[partition] = start
        log.info("resuming %d ledger partitions from their Redis watermarks", len(waiting))
        await self._expired_before(starts)

    async def _expired_before(self, starts: dict[int, int]) -> None:
        """Say so when the ledger no longer holds records a partition is read from (Redis
        restored from a snapshot, or down, for longer than the ledger keeps them): Kafka then
        starts at its first kept record, and what was removed is missing from the totals."""
        if not starts or self.consumer is None:
            return
        tps = {TopicPartition(self.topic, p): start for p, start in starts.items()}
        try:
            kept = await self.consumer.beginning_offsets(list(tps))
        except KafkaError as exc:
            log.warning("could not read where the ledger begins: %s", exc)
            return
        for tp, start in tps.items():
            lost = watermarks.expired(start, kept.get(tp, start))
            if lost:
                self.metrics.inc("ledger_records_expired_total", lost,
                                 partition=str(tp.partition))
                log.error("ledger[%d]: records %d to %d were removed by the ledger's "
                          "retention before Redis counted them; their events are missing "
                          "from the totals until intake reads their input again "
                          "(docs/OPERATIONS.md, Kafka)", tp.partition, start, kept[tp] - 1)

    async def _settle(self, homes: list[Home], timeout: float) -> None:
        writers = _writers(homes)
        if writers:
            await asyncio.wait(writers, timeout=timeout)

    async def _commit_hints(self) -> None:
        """Keep the group's committed offsets near the watermarks (for lag tools)."""
        now = time.monotonic()
        if self.consumer is None or now - self._committed_at < COMMIT_EVERY_S:
            return
        self._committed_at = now
        offsets = {TopicPartition(self.topic, p): home.position.applied + 1
                   for p, home in self.homes.items()
                   if home.position is not None and home.position.applied >= 0}
        if offsets:
            try:
                await self.consumer.commit(offsets)
            except (CommitFailedError, KafkaError) as exc:
                log.debug("committing the watermarks as offsets failed: %s", exc)

    # -- for /metrics ----------------------------------------------------------------------

    def lag(self) -> dict[int, int]:
        """Ledger records of each owned partition not yet applied to Redis."""
        out = {}
        for partition, home in self.homes.items():
            if home.position is None or self.consumer is None:
                continue
            high = self.consumer.highwater(TopicPartition(self.topic, partition))
            if high is not None:
                out[partition] = max(0, high - home.position.applied - 1)
        return out


def _running(task: asyncio.Task[None] | None) -> bool:
    return task is not None and not task.done()


def _writers(homes: Iterable[Home]) -> list[asyncio.Task[None]]:
    return [home.writer for home in homes if home.writer is not None and not home.writer.done()]
