"""Intake: input messages → priced entries on the ledger, at least once.

Intake takes input messages in batches (``costline.streams.worker.input_takes``: committed
records only), has them parsed and priced (``costline.streams.worker.pricing``), sends each
refused message to the dead-letter topic with its exact bytes, and each home partition its
ledger records; then it tells the source the take is delivered, and its offsets may be
committed. A crash before that makes the input be read again: its entries reach the ledger
twice, and the home partition counts each event once (its dedup memory). So intake needs no
state of its own, and its order does not matter: up to ``depth`` takes are priced, and awaited
from Kafka, side by side.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any, Protocol

from costline.rules.ledger import Taken
from costline.streams.worker.dead_letters import dead_letter
from costline.streams.worker.health import Health
from costline.streams.worker.metrics import Metrics
from costline.streams.worker.pricing import Pricing
from costline.streams.worker.retry import Backoff

log = logging.getLogger("costline.intake")

# (topic, partition or None, key, value) → a future of the send (Kafka's acknowledgement).
Send = Callable[[str, int | None, bytes | None, bytes], Awaitable[Awaitable[Any]]]
# Told the (key, value) of a take's dead letters once Kafka has them: the refusal tally.
OnRefused = Callable[[list[tuple[bytes, bytes]]], Awaitable[None]]


class Take(Protocol):
    """Input messages fetched together: each has ``topic``, ``partition``, ``offset`` and
    ``value`` (aiokafka's ``ConsumerRecord``)."""

    messages: Sequence[Any]


class Source(Protocol):
    def takes(self) -> AsyncGenerator[Any, None]:
        """Takes of input messages, in order, until stopped."""

    def delivered(self, take: Any) -> None:
        """The take's records are in Kafka: its input may be committed."""


class Intake:
    """Delivers priced takes: dead letters and ledger records, then tells the source."""

    def __init__(self, *, pricing: Pricing, send: Send, ledger_topic: str, dlq_topic: str,
                 metrics: Metrics, health: Health, depth: int) -> None:
        self.pricing = pricing
        self.send = send
        self.ledger_topic, self.dlq_topic = ledger_topic, dlq_topic
        self.metrics, self.health = metrics, health
        self.depth = depth
        self.on_refused: OnRefused | None = None

    async def run(self, source: Source) -> None:
        """Take, price, hand the records to Kafka, tell the source."""
        taken: asyncio.Queue[tuple[Take, asyncio.Future[Taken]]] = asyncio.Queue(
            maxsize=self.depth)
        delivering = asyncio.ensure_future(self._deliver_in_order(taken, source))
        try:
            async with contextlib.aclosing(source.takes()) as takes:
                async for take in takes:
                    if delivering.done():
                        delivering.result()  # a delivery that failed stops intake
                    if not take.messages:  # only markers and aborted records: nothing to send
                        source.delivered(take)
                        continue
                    values = [message.value or b"" for message in take.messages]
                    self.metrics.inc("messages_total", len(values))
                    put = asyncio.ensure_future(taken.put((take, self.pricing.submit(values))))
                    await asyncio.wait({put, delivering}, return_when=asyncio.FIRST_COMPLETED)
                    if not put.done():
                        put.cancel()
                        delivering.result()
        finally:
            delivering.cancel()

    async def _deliver_in_order(
        self, taken: asyncio.Queue[tuple[Take, asyncio.Future[Taken]]], source: Source,
    ) -> None:
        """Hand each take's records to the producer in the order taken; Kafka's answers are
        awaited beside the next takes' (up to ``depth`` takes), each take told delivered once
        all of its own are in."""
        confirming: set[asyncio.Task[None]] = set()
        try:
            while True:
                take, answer = await taken.get()
                sends = self.sends_of(take.messages, await answer)
                futures = [await self.send(*send) for send in sends]
                confirming.add(asyncio.ensure_future(
                    self._confirm(take, await answer, sends, futures, source)))
                while len(confirming) >= self.depth or any(t.done() for t in confirming):
                    done, confirming = await asyncio.wait(
                        confirming, return_when=asyncio.FIRST_COMPLETED)
                    for task in done:
                        task.result()  # a confirmation that failed stops intake
        finally:
            for task in confirming:
                task.cancel()

    def sends_of(self, messages: Sequence[Any], taken: Taken
                 ) -> list[tuple[str, int | None, bytes | None, bytes]]:
        """A take's dead letters and ledger records, as (topic, partition, key, value)."""
        sends: list[tuple[str, int | None, bytes | None, bytes]] = []
        for index, code, reason in taken.refused:
            message = messages[index]
            key, value = dead_letter(message.topic, message.partition, message.offset,
                                     message.value, code, reason)
            sends.append((self.dlq_topic, None, key, value))
            self.metrics.inc("rejected_total", reason=code)
        for home, records in taken.records.items():
            sends += [(self.ledger_topic, home, None, record) for record in records]
        return sends

    async def _confirm(self, take: Take, taken: Taken,
                       sends: list[tuple[str, int | None, bytes | None, bytes]],
                       futures: list[Awaitable[Any]], source: Source) -> None:
        """Wait until Kafka has every record of a take, sending again what failed (Kafka
        away), then tell the source: only then may its offsets be committed."""
        letters = [(key, value) for topic, _, key, value in sends
                   if topic == self.dlq_topic and key is not None]
        backoff = Backoff()
        while True:
            results = await asyncio.gather(*futures, return_exceptions=True)
            failed = [send for send, result in zip(sends, results, strict=True)
                      if isinstance(result, BaseException)]
            if not failed:
                self.health.recovered("kafka")
                break
            error = next(r for r in results if isinstance(r, BaseException))
            self.health.failing("kafka", error)
            log.warning("%d of %d sends failed, sending them again: %s", len(failed),
                        len(sends), error)
            await backoff.wait()
            sends = failed
            futures = [await self.send(*send) for send in sends]
        if letters and self.on_refused is not None:
            await self.on_refused(letters)
        self.metrics.inc("entries_total", taken.events)
        source.delivered(take)
