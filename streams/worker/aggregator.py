"""The aggregation step: Kafka messages → priced sums in Redis, exactly once.

Per input partition the worker folds the messages it takes into a *window* (one ``Tally``) and
a writer task applies windows to Redis one at a time, each in one script call together with
the offset of its last message (the partition's watermark). While a window is being written
the next one fills, so parsing and Redis run side by side, and the slower Redis is, the more
each write carries (up to ``window_events``): a popular tag set costs one counter update per
write, not one per event. A worker that keeps up writes each take right away.

Every write names the watermark it expects Redis to hold (the one the worker last wrote), so

* a message at or below what was already folded is skipped (a replay after a seek or a
  restart);
* a write that finds an *older* watermark means Redis lost its last writes (it restarted
  without them): the worker seeks the partition back to the stored watermark, drops what it
  had folded beyond it and the messages it had already fetched, until the re-read ones arrive;
* a write that finds a *newer* watermark means another worker got there first (a rebalance):
  the worker adopts it and folds again only what that worker did not count.

Neither Redis nor Kafka being away loses anything: a write is retried with backoff, and a
restarted worker resumes from the watermark in Redis, whatever Kafka acknowledged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence, Set
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from redis.exceptions import BusyLoadingError, ConnectionError, RedisError, TimeoutError

from costline.connectors.redis_apply import (
    SUM_LIMIT,
    Applied,
    BatchWriter,
    Duplicates,
    Mismatch,
    Overflow,
)
from costline.connectors.redis_keys import slot_tag
from costline.rules.tally import COST, QUANTITY, WASTE_PREFIX, Folder, Tally
from costline.streams.worker.dead_letters import dead_letter
from costline.streams.worker.folding import Folding, InlineFolding, Screened, screen
from costline.streams.worker.health import Health
from costline.streams.worker.metrics import Metrics

log = logging.getLogger("costline.aggregator")

T = TypeVar("T")
REDIS_DOWN = (ConnectionError, TimeoutError, BusyLoadingError, OSError)
# Any error from Redis, also one it answers with (READONLY on a replica after a failover,
# OOM at maxmemory, MISCONF when it cannot persist): a write is retried until it succeeds,
# never dropped, and the worker reports Redis failing meanwhile.
REDIS_FAILING = (RedisError, OSError)
# Messages are refused a little below the script's limit: it compares sums in doubles, which
# may round a sum just below the limit up to it (by far less than this), and every refusal
# must leave sums the script accepts.
_REFUSED_AT = SUM_LIMIT - 2**30


class Message(Protocol):
    topic: str
    partition: int
    offset: int
    value: bytes | None


TP = tuple[str, int]
Seek = Callable[[str, int, int], Awaitable[None]]
SendDeadLetter = Callable[[bytes, bytes], Awaitable[None]]


@dataclass
class Window:
    """Messages of one partition folded and not yet written. It applies only on top of the
    watermark ``after``; ``messages`` are its accepted messages, kept to fold it again in the
    rare cases that need it (counted duplicates, a watermark moved by another worker)."""

    after: int
    last: int
    tally: Tally = field(default_factory=Tally)
    messages: list[Message] = field(default_factory=list)
    skip: frozenset[bytes] = frozenset()  # digests Redis said were counted before


@dataclass
class PartitionState:
    applied: int  # the last offset whose sums are in Redis
    admitted: int  # the last offset taken for folding (≥ folded)
    folded: int  # the last offset folded into a window (≥ applied)
    # While set, fetched messages above this offset are stale (fetched before a seek back).
    stale_above: int | None = None
    window: Window | None = None  # filling while ``writer`` writes the one before
    writer: asyncio.Task[None] | None = None
    writing: int = 0  # events of the window ``writer`` is writing
    # Moves on every seek back: a window filled across one is discarded, and so is a take
    # still being folded.
    epoch: int = 0


@dataclass
class Take:
    """Messages taken together, per partition, and the folder's answer for them."""

    parts: list[tuple[TP, PartitionState, int, list[Message]]]  # with the epoch taken in
    answer: asyncio.Future[list[Screened]]
    filled: asyncio.Future[None]  # set once the answer is in the partitions' windows


class Backoff:
    """Exponential backoff with a ceiling; one per wait for a success."""

    def __init__(self, first: float = 0.05, ceiling: float = 5.0) -> None:
        self.ceiling, self.delay = ceiling, first

    async def wait(self) -> None:
        await asyncio.sleep(self.delay)
        self.delay = min(self.delay * 2, self.ceiling)


class Aggregator:
    def __init__(self, *, namespace: str, sources: dict[str, str], writer: BatchWriter,
                 folder: Folder, send_dead_letter: SendDeadLetter, seek: Seek,
                 metrics: Metrics, health: Health, window_events: int = 10_000,
                 window_linger_s: float = 0.0, unwritten_events: int = 50_000,
                 folding: Folding | None = None) -> None:
        self.namespace = namespace
        self.sources = sources  # topic name → short source name used in Redis keys
        self.writer = writer
        self.folder = folder  # folds here what needs folding again (rare)
        # Folds what is taken: here, or in a child process (costline.streams.worker.folding).
        self.folding = folding or InlineFolding(folder)
        self.send_dead_letter = send_dead_letter
        self.seek = seek
        self.metrics = metrics
        self.health = health
        self.window_events = window_events
        self.window_linger_s = window_linger_s
        self.unwritten_events = unwritten_events
        self.partitions: dict[TP, PartitionState] = {}
        self._takes: deque[Take] = deque()  # submitted, not yet in the windows, in order
        self._filler: asyncio.Task[None] | None = None
        # Resolved after each window's write (successful or not) and when a writer ends: what
        # ``_hold_back`` waits on.
        self._wrote: asyncio.Future[None] | None = None

    # -- assignment -------------------------------------------------------------------

    def slot(self, tp: TP) -> str:
        return slot_tag(self.namespace, self.sources[tp[0]], tp[1])

    async def on_assigned(self, tps: Sequence[TP]) -> dict[TP, int]:
        """Read the watermarks of newly owned partitions; returns where to resume each."""
        self.folding.start()  # while Kafka fetches the first messages
        resume = {}
        for tp in tps:
            if tp[0] not in self.sources:
                continue
            applied = await self._retry_redis(lambda tp=tp: self.writer.watermark(self.slot(tp)))
            # A write still in flight from an earlier ownership may land after this read; the
            # next write then finds a newer watermark and adopts it.
            self.partitions[tp] = PartitionState(applied, applied, applied)
            resume[tp] = applied + 1
        await self._retry_redis(lambda: self.writer.register_slots(
            [self.slot(tp) for tp in resume]))
        return resume

    def on_revoked(self, tps: Sequence[TP]) -> None:
        for tp in tps:
            self.partitions.pop(tp, None)
            if tp[0] in self.sources:
                self.writer.forget(self.slot(tp))

    # -- filling windows ----------------------------------------------------------------

    async def handle(self, messages: Sequence[Message]) -> None:
        """Fold a take of messages into their partitions' windows and start their writes.

        Returns once the take is folded, or, when the folding runs in a child process, once
        at most ``folding.depth`` takes wait for it (the child folds them while the worker
        takes the next). Waits for a write only when a window is full."""
        by_tp: dict[TP, list[Message]] = {}
        for message in messages:
            by_tp.setdefault((message.topic, message.partition), []).append(message)
        parts = []
        for tp, batch in by_tp.items():
            state = self.partitions.get(tp)
            if state is None:
                await self.on_assigned([tp])
                state = self.partitions[tp]
            fresh = self._admit(state, batch)
            if fresh:
                state.admitted = fresh[-1].offset
                parts.append((tp, state, state.epoch, fresh))
        if not parts:
            return
        self.metrics.inc("messages_total", sum(len(part[3]) for part in parts))
        answer = self.folding.submit([[m.value or b"" for m in part[3]] for part in parts])
        take = Take(parts, answer, asyncio.get_running_loop().create_future())
        self._takes.append(take)
        if not _running(self._filler):
            self._filler = asyncio.ensure_future(self._fill_takes())
        depth = self.folding.depth
        if len(self._takes) > depth:
            await self._takes[len(self._takes) - 1 - depth].filled

    async def flush(self) -> None:
        """Wait until everything handled so far is written (or was dropped by a seek back)."""
        while self._takes:
            await self._takes[-1].filled
        for tp, state in list(self.partitions.items()):
            while state.window is not None or _running(state.writer):
                if not _running(state.writer):
                    self._start_writer(tp, state)
                await state.writer  # type: ignore[misc]

    def _admit(self, state: PartitionState, batch: list[Message]) -> list[Message]:
        fresh: list[Message] = []
        last = state.admitted
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

    async def _fill_takes(self) -> None:
        """Put the folder's answers into the windows, take after take, in order."""
        try:
            while self._takes:
                take = self._takes[0]
                screened = await take.answer
                for (tp, state, epoch, fresh), part in zip(take.parts, screened, strict=True):
                    await self._fill(tp, state, epoch, fresh, part)
                await self._hold_back()
                self._takes.popleft()
                take.filled.set_result(None)
        except BaseException as exc:
            # The agent waiting on a take raises it (as a fold or a write failing inline did).
            for take in self._takes:
                if not take.filled.done():
                    if isinstance(exc, Exception):
                        take.filled.set_exception(exc)
                    else:
                        take.filled.cancel()
            self._takes.clear()
            raise

    async def _fill(self, tp: TP, state: PartitionState, epoch: int, fresh: list[Message],
                    screened: Screened) -> None:
        if self._dropped(tp, state, epoch):
            return
        if fresh[0].offset <= state.folded:
            # Another worker counted some of them while they were folded (a rebalance): fold
            # here the ones above what it counted.
            fresh = [m for m in fresh if m.offset > state.folded]
            if not fresh:
                return
            tally, accepted = await self._screen(fresh)
            screened = Screened([], tally)
        else:
            accepted = await self._refuse_screened(fresh, screened.refused)
        if self._dropped(tp, state, epoch):
            return  # Redis lost writes while dead letters were sent: these are re-read
        window = state.window
        if window is None:
            window = state.window = Window(after=state.folded, last=state.folded)
        if not window.tally.events:
            window.tally = screened.tally
        elif window.tally.seen.isdisjoint(screened.tally.seen):
            window.tally.absorb(screened.tally)
        else:  # an event of the window sent again: fold these here, without it
            again, _ = await self._screen(accepted, window.tally.seen)
            window.tally.absorb(again)
        window.messages += accepted
        window.last = state.folded = fresh[-1].offset
        await self._schedule(tp, state)

    def _dropped(self, tp: TP, state: PartitionState, epoch: int) -> bool:
        """Revoked since it was taken, or seeked back: its messages are read again."""
        return self.partitions.get(tp) is not state or state.epoch != epoch

    async def _refuse_screened(self, fresh: list[Message],
                               refused: list[tuple[int, str, str]]) -> list[Message]:
        """Send the refused messages to the dead-letter topic; returns the others."""
        if not refused:
            return fresh
        for index, code, reason in refused:
            await self._refuse(fresh[index], code, reason)
        out = {index for index, _, _ in refused}
        return [message for index, message in enumerate(fresh) if index not in out]

    async def _schedule(self, tp: TP, state: PartitionState) -> None:
        if not _running(state.writer):
            self._start_writer(tp, state)
        elif state.window is not None and state.window.tally.events >= self.window_events:
            # Redis is behind: let it catch up before taking more (bounded memory).
            await state.writer  # type: ignore[misc]

    def unwritten(self) -> int:
        """Events folded and not yet in Redis, over every owned partition."""
        return sum(state.writing + (state.window.tally.events if state.window else 0)
                   for state in self.partitions.values())

    async def _hold_back(self) -> None:
        """Wait for writes while the worker holds more than ``unwritten_events`` unwritten.

        ``window_events`` bounds each partition, so without this a worker owning many
        partitions of a backlog while Redis is behind would hold a full window (and the one
        being written) for each of them. Called once a take is in the windows: that take may
        pass the bound, the next is not filled until the writes bring it back under."""
        while self.unwritten() > self.unwritten_events and any(
                _running(state.writer) for state in self.partitions.values()):
            if self._wrote is None or self._wrote.done():
                self._wrote = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._wrote)

    def _start_writer(self, tp: TP, state: PartitionState) -> None:
        if state.writer is not None and state.writer.done() and not state.writer.cancelled():
            state.writer.result()  # a writer that crashed stops the agent, as it would inline
        if state.window is not None:
            state.writer = asyncio.ensure_future(self._drain(tp, state))
            # also a writer that ends without writing (its window dropped while it lingered)
            state.writer.add_done_callback(lambda _: self._signal_written())

    def _signal_written(self) -> None:
        if self._wrote is not None and not self._wrote.done():
            self._wrote.set_result(None)

    async def _screen(self, messages: list[Message], skip: Set[bytes] = frozenset()
                      ) -> tuple[Tally, list[Message]]:
        """Fold here what needs folding again, as a folding process folds a take (without
        the events in ``skip``); refused messages go to the dead-letter topic before anything
        of the batch is counted, so a crash can repeat a dead letter but never lose one.
        Returns the sums and the messages they came from."""
        screened = screen(self.folder, [message.value or b"" for message in messages], skip)
        return screened.tally, await self._refuse_screened(messages, screened.refused)

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

    async def verify_watermarks(self) -> None:
        """Seek back the idle partitions whose watermark Redis lost.

        A Redis that restarted without its last writes is found by a partition's next write;
        a partition that receives nothing more would keep its sums missing, so the worker
        checks those now and then (one GET each)."""
        for tp, state in list(self.partitions.items()):
            if _busy(state):
                continue  # its write finds out
            applied = state.applied
            stored = await self.writer.watermark(self.slot(tp))
            if self.partitions.get(tp) is not state or _busy(state) or state.applied != applied:
                continue  # it moved while Redis answered: a write finds out
            if stored < applied:
                self.metrics.inc("watermark_mismatch_total")
                await self._seek_back(tp, state, stored)

    # -- writing windows ------------------------------------------------------------------

    async def _drain(self, tp: TP, state: PartitionState) -> None:
        while state.window is not None:
            if self.window_linger_s > 0 and state.window.tally.events < self.window_events:
                # As a Kafka producer lingers: a moment's wait lets a busy partition's window
                # take more messages, so Redis gets fewer, larger writes (each write has a
                # fixed cost on both sides); an idle partition's event waits this long more.
                await asyncio.sleep(self.window_linger_s)
                if state.window is None:
                    break  # dropped by a seek back while waiting
            window, state.window = state.window, None
            state.writing = window.tally.events
            try:
                await self._write(tp, state, window)
            finally:
                state.writing = 0
                self._signal_written()

    async def _write(self, tp: TP, state: PartitionState, window: Window) -> None:
        while True:
            if window.last <= state.applied:
                return  # another worker counted all of it
            if window.after != state.applied:
                window = await self._refold(state, window)
            started = time.perf_counter()
            outcome = await self._retry_redis(
                lambda w=window: self.writer.apply(self.slot(tp), state.applied, w.last,
                                                   w.tally))
            self.metrics.observe("redis_apply_seconds", time.perf_counter() - started)
            if isinstance(outcome, Applied):
                state.applied = window.last
                self.metrics.inc("batches_total")
                self.metrics.inc("events_total", window.tally.events)
                return
            if isinstance(outcome, Duplicates):
                self.metrics.inc("events_duplicate_total", len(outcome.digests))
                window.skip |= outcome.digests
                window = await self._refold(state, window)
                continue
            if isinstance(outcome, Overflow):
                window = await self._refuse_overflowing(tp, state, window, outcome.stored)
                continue
            assert isinstance(outcome, Mismatch)
            self.metrics.inc("watermark_mismatch_total")
            if outcome.stored < state.applied:
                await self._seek_back(tp, state, outcome.stored)
                return
            log.info("%s[%d]: watermark %d was advanced elsewhere; skipping to it",
                     tp[0], tp[1], outcome.stored)
            state.applied = outcome.stored
            state.admitted = max(state.admitted, outcome.stored)
            state.folded = max(state.folded, outcome.stored)

    async def _refold(self, state: PartitionState, window: Window) -> Window:
        """The window again from its messages: only those above the stored watermark, and
        without the events Redis said were counted before."""
        messages = [m for m in window.messages if m.offset > state.applied]
        tally, accepted = await self._screen(messages, window.skip)
        return Window(after=state.applied, last=window.last, tally=tally, messages=accepted,
                      skip=window.skip)

    async def _refuse_overflowing(self, tp: TP, state: PartitionState, window: Window,
                                  stored: dict[str, int]) -> Window:
        """Dead-letter the messages that would take a sum past what it may hold, then fold the
        rest again. Messages are added in offset order to what Redis holds: the first one that would
        pass the limit is refused, and so is every later one that would, while those that fit
        are counted. That depends only on Redis and the messages, not on how they were split
        into windows, so a crash and a replay refuse the same ones."""
        slot, sums, kept, refused = self.slot(tp), dict(stored), [], 0
        counted = set(window.skip)  # a resend of a kept message adds nothing
        for message in window.messages:
            if message.offset <= state.applied:
                continue
            alone, accepted = await self._screen([message], counted)
            adds = self.writer.additions(slot, alone, sums)
            past = [name for name, delta in adds.items() if sums[name] + delta >= _REFUSED_AT]
            if past:
                refused += 1
                await self._refuse(message, "out_of_range", _overflow_reason(past, alone))
                continue
            for name, delta in adds.items():
                sums[name] += delta
            counted |= alone.seen
            kept += accepted
        if not refused:
            raise RuntimeError(f"no message of the window passes the sums Redis refused: "
                               f"{sorted(stored)[:3]}")
        window.messages = kept
        return await self._refold(state, window)

    async def _seek_back(self, tp: TP, state: PartitionState, stored: int) -> None:
        log.warning("%s[%d]: Redis watermark %d is behind %d (Redis lost writes); "
                    "re-reading from %d", tp[0], tp[1], stored, state.applied, stored + 1)
        state.stale_above = state.admitted
        state.applied = state.admitted = state.folded = stored
        state.window = None
        state.epoch += 1
        await self.seek(tp[0], tp[1], stored + 1)

    async def _retry_redis(self, call: Callable[[], Awaitable[T]]) -> T:
        backoff = Backoff()
        while True:
            try:
                result = await call()
            except REDIS_FAILING as exc:
                # An unreachable Redis is "redis" (the probe's too); one that answers but
                # refuses (READONLY, OOM, ...) is "redis_writes", which the probe's PING
                # cannot see, so only a write that succeeds clears it.
                self.health.failing("redis" if isinstance(exc, REDIS_DOWN) else "redis_writes",
                                    exc)
                self.metrics.inc("redis_errors_total")
                log.warning("Redis failed, retrying: %s: %s", type(exc).__name__, exc)
                await backoff.wait()
                continue
            self.health.recovered("redis")
            self.health.recovered("redis_writes")
            return result


def _overflow_reason(hit: list[str], alone: Tally) -> str:
    """Which sums a message would take past the limit: bucket, tag set and measure."""
    shown = []
    for name in hit[:2]:
        key, field = name.split(" ", 1)
        tsid, measure = field.split(":", 1)
        bucket = key.rsplit(":b:", 1)[-1]
        shown.append(f"{_measure_name(measure)} of {alone.tagsets.get(tsid, tsid)} "
                     f"in bucket {bucket}")
    more = f" and {len(hit) - 2} more" if len(hit) > 2 else ""
    return (f"the sums it adds to would pass {SUM_LIMIT:,} micro-units, the most Redis keeps "
            f"exactly: {'; '.join(shown)}{more}")


def _measure_name(measure: str) -> str:
    if measure.startswith(WASTE_PREFIX):
        return f"waste ({measure[len(WASTE_PREFIX):]})"
    return {COST: "spend", QUANTITY: "quantity"}.get(measure, measure)


def _running(task: asyncio.Task[None] | None) -> bool:
    return task is not None and not task.done()


def _busy(state: PartitionState) -> bool:
    """Has messages being folded, folded messages not yet written, or a write in flight."""
    return (state.admitted != state.folded or state.window is not None
            or _running(state.writer))
