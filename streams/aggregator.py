"""The aggregation step: Kafka messages of one batch → priced sums in Redis, exactly once.

Per input partition the worker remembers ``applied``, the offset of the last message whose
sums it wrote. Redis keeps the same number (the watermark) and every write names the value it
expects there, so

* a message at or below ``applied`` is skipped (a replay after a seek or a restart);
* a write that finds an *older* watermark means Redis lost its last writes (it restarted
  without them): the worker seeks the partition back to the stored watermark and drops the
  messages it had already fetched beyond it until the re-read ones arrive;
* a write that finds a *newer* watermark means another worker got there first (a rebalance):
  the worker adopts it and skips what that worker already counted.

Neither Redis nor Kafka being away loses anything: the batch is retried with backoff and
its messages are acknowledged only after their sums are in Redis.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from redis.exceptions import BusyLoadingError, ConnectionError, TimeoutError

from connectors.redis_apply import Applied, BatchWriter, Duplicates, Mismatch, Outcome
from connectors.redis_keys import slot_tag
from rules.events import Rejection, parse_message
from rules.prices import PricingError
from rules.tally import Folder, Priced, Tally
from streams.dead_letters import dead_letter
from streams.health import Health
from streams.metrics import Metrics

log = logging.getLogger("costline.aggregator")

T = TypeVar("T")
REDIS_DOWN = (ConnectionError, TimeoutError, BusyLoadingError, OSError)


class Message(Protocol):
    topic: str
    partition: int
    offset: int
    value: bytes | None


TP = tuple[str, int]
Seek = Callable[[str, int, int], Awaitable[None]]
SendDeadLetter = Callable[[bytes, bytes], Awaitable[None]]


@dataclass
class PartitionState:
    applied: int
    # While set, fetched messages above this offset are stale (fetched before a seek back).
    stale_above: int | None = None


class Backoff:
    """Exponential backoff with a ceiling; reset after a success."""

    def __init__(self, first: float = 0.05, ceiling: float = 5.0) -> None:
        self.first, self.ceiling, self.delay = first, ceiling, first

    async def wait(self) -> None:
        await asyncio.sleep(self.delay)
        self.delay = min(self.delay * 2, self.ceiling)

    def reset(self) -> None:
        self.delay = self.first


class Aggregator:
    def __init__(self, *, namespace: str, sources: dict[str, str], writer: BatchWriter,
                 folder: Folder, send_dead_letter: SendDeadLetter, seek: Seek,
                 metrics: Metrics, health: Health) -> None:
        self.namespace = namespace
        self.sources = sources  # topic name → short source name used in Redis keys
        self.writer = writer
        self.folder = folder
        self.send_dead_letter = send_dead_letter
        self.seek = seek
        self.metrics = metrics
        self.health = health
        self.partitions: dict[TP, PartitionState] = {}

    # -- assignment -------------------------------------------------------------------

    def slot(self, tp: TP) -> str:
        return slot_tag(self.namespace, self.sources[tp[0]], tp[1])

    async def on_assigned(self, tps: Sequence[TP]) -> dict[TP, int]:
        """Read the watermarks of newly owned partitions; returns where to resume each."""
        resume = {}
        for tp in tps:
            if tp[0] not in self.sources:
                continue
            applied = await self._retry_redis(lambda tp=tp: self.writer.watermark(self.slot(tp)))
            self.partitions[tp] = PartitionState(applied)
            resume[tp] = applied + 1
        await self._retry_redis(lambda: self.writer.register_slots(
            [self.slot(tp) for tp in resume]))
        return resume

    def on_revoked(self, tps: Sequence[TP]) -> None:
        for tp in tps:
            self.partitions.pop(tp, None)

    # -- the batch --------------------------------------------------------------------

    async def handle(self, messages: Sequence[Message]) -> None:
        by_tp: dict[TP, list[Message]] = {}
        for message in messages:
            by_tp.setdefault((message.topic, message.partition), []).append(message)
        # Partitions are independent: while Redis runs one partition's script, the next one
        # is parsed and folded.
        await asyncio.gather(*(self._partition(tp, batch) for tp, batch in by_tp.items()))

    async def _partition(self, tp: TP, batch: list[Message]) -> None:
        state = self.partitions.get(tp)
        if state is None:
            await self.on_assigned([tp])
            state = self.partitions[tp]
        fresh = self._admit(state, batch)
        if not fresh:
            return
        events = await self._screen(fresh)
        outcome = await self._write(tp, state, fresh[-1].offset, events)
        if isinstance(outcome, Mismatch):
            await self._resync(tp, state, outcome.stored, batch)

    def _admit(self, state: PartitionState, batch: list[Message]) -> list[Message]:
        fresh: list[Message] = []
        last = state.applied
        for message in batch:
            offset = message.offset
            if state.stale_above is not None:
                if offset > state.stale_above:
                    continue
                state.stale_above = None
            if offset <= last:
                continue
            fresh.append(message)
            last = offset
        skipped = len(batch) - len(fresh)
        if skipped:
            self.metrics.inc("messages_replayed_total", skipped)
        return fresh

    async def _screen(self, messages: list[Message]) -> list[Priced]:
        """Parse and price; refused messages go to the dead-letter topic before anything
        of the batch is counted, so a crash can repeat a dead letter but never lose one."""
        events: list[Priced] = []
        for message in messages:
            verdict = parse_message(message.value or b"")
            if isinstance(verdict, Rejection):
                await self._refuse(message, verdict.code, verdict.reason)
                continue
            try:
                events.extend(self.folder.price(verdict.events))
            except PricingError as exc:
                await self._refuse(message, exc.code, exc.reason)
        self.metrics.inc("messages_total", len(messages))
        return events

    async def _refuse(self, message: Message, code: str, reason: str) -> None:
        key, value = dead_letter(message.topic, message.partition, message.offset,
                                 message.value, code, reason)
        backoff = Backoff()
        while True:
            try:
                await self.send_dead_letter(key, value)
                self.health.recovered("kafka")
                break
            except Exception as exc:  # noqa: BLE001 - any producer failure: wait and retry
                self.health.failing("kafka", exc)
                log.warning("dead-letter send failed, retrying: %s", exc)
                await backoff.wait()
        self.metrics.inc("rejected_total", reason=code)

    async def _write(self, tp: TP, state: PartitionState, last_offset: int,
                     events: list[Priced]) -> Outcome:
        skip: frozenset[bytes] = frozenset()
        while True:
            tally = Tally()
            self.folder.fold(tally, events, skip)
            started = time.perf_counter()
            outcome = await self._retry_redis(
                lambda tally=tally: self.writer.apply(self.slot(tp), state.applied, last_offset,
                                                      tally))
            self.metrics.observe("redis_apply_seconds", time.perf_counter() - started)
            if not isinstance(outcome, Duplicates):
                break
            self.metrics.inc("events_duplicate_total", len(outcome.digests))
            skip = skip | outcome.digests
        if isinstance(outcome, Applied):
            state.applied = last_offset
            self.metrics.inc("batches_total")
            self.metrics.inc("events_total", tally.events)
        return outcome

    async def _resync(self, tp: TP, state: PartitionState, stored: int,
                      batch: list[Message]) -> None:
        self.metrics.inc("watermark_mismatch_total")
        if stored < state.applied:
            log.warning("%s[%d]: Redis watermark %d is behind %d (Redis lost writes); "
                        "re-reading from %d", tp[0], tp[1], stored, state.applied, stored + 1)
            state.stale_above = state.applied
            state.applied = stored
            await self.seek(tp[0], tp[1], stored + 1)
            return
        log.info("%s[%d]: watermark %d was advanced elsewhere; skipping to it",
                 tp[0], tp[1], stored)
        state.applied = stored
        await self._partition(tp, batch)

    async def _retry_redis(self, call: Callable[[], Awaitable[T]]) -> T:
        backoff = Backoff()
        while True:
            try:
                result = await call()
            except REDIS_DOWN as exc:
                self.health.failing("redis", exc)
                self.metrics.inc("redis_errors_total")
                log.warning("Redis unavailable, retrying: %s", exc)
                await backoff.wait()
                continue
            self.health.recovered("redis")
            return result
