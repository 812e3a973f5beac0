"""Intake: input messages → priced entries on the ledger, at least once.

A Faust agent takes input messages in batches (``noack_take``), has them parsed and priced
(``costline.streams.worker.pricing``), sends each refused message to the dead-letter topic with
its exact bytes, and each home partition its ledger records; then it acknowledges the
messages, and Faust commits their offsets. A crash before the acknowledgement makes Faust
deliver them again: their entries reach the ledger twice, and the home partition counts each
event once (its dedup memory). So intake needs no state of its own, and its order does not
matter: up to ``depth`` takes are priced, and awaited from Kafka, side by side.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import faust
from faust.types import EventT

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


class Intake:
    """Delivers priced takes: dead letters and ledger records, then the acknowledgement."""

    def __init__(self, *, pricing: Pricing, send: Send, ledger_topic: str, dlq_topic: str,
                 metrics: Metrics, health: Health, depth: int) -> None:
        self.pricing = pricing
        self.send = send
        self.ledger_topic, self.dlq_topic = ledger_topic, dlq_topic
        self.metrics, self.health = metrics, health
        self.depth = depth
        # input partition → the last offset delivered (for the lag gauge)
        self.delivered: dict[tuple[str, int], int] = {}
        self.on_refused: OnRefused | None = None

    async def run(self, stream: faust.Stream[Any], batch_messages: int,
                  within_s: float) -> None:
        """The agent's body: take, price, hand the records to Kafka, acknowledge."""
        taken: asyncio.Queue[tuple[Sequence[EventT[Any]], asyncio.Future[Taken]]] = (
            asyncio.Queue(maxsize=self.depth))
        delivering = asyncio.ensure_future(self._deliver_in_order(taken, stream))
        try:
            async for events in stream.noack_take(batch_messages, within=within_s):
                if delivering.done():
                    delivering.result()  # a delivery that failed stops the agent
                values = [event.message.value or b"" for event in events]
                self.metrics.inc("messages_total", len(values))
                put = asyncio.ensure_future(taken.put((events, self.pricing.submit(values))))
                await asyncio.wait({put, delivering}, return_when=asyncio.FIRST_COMPLETED)
                if not put.done():
                    put.cancel()
                    delivering.result()
        finally:
            delivering.cancel()

    async def _deliver_in_order(
        self, taken: asyncio.Queue[tuple[Sequence[EventT[Any]], asyncio.Future[Taken]]],
        stream: faust.Stream[Any],
    ) -> None:
        """Hand each take's records to the producer in the order taken; Kafka's answers are
        awaited beside the next takes' (up to ``depth`` takes), each take acknowledged once
        all of its own are in."""
        confirming: set[asyncio.Task[None]] = set()
        try:
            while True:
                events, answer = await taken.get()
                sends = self.sends_of(events, await answer)
                futures = [await self.send(*send) for send in sends]
                confirming.add(asyncio.ensure_future(
                    self._confirm(events, await answer, sends, futures, stream)))
                while len(confirming) >= self.depth or any(t.done() for t in confirming):
                    done, confirming = await asyncio.wait(
                        confirming, return_when=asyncio.FIRST_COMPLETED)
                    for task in done:
                        task.result()  # a confirmation that failed stops the agent
        finally:
            for task in confirming:
                task.cancel()

    def sends_of(self, events: Sequence[EventT[Any]], taken: Taken
                 ) -> list[tuple[str, int | None, bytes | None, bytes]]:
        """A take's dead letters and ledger records, as (topic, partition, key, value)."""
        sends: list[tuple[str, int | None, bytes | None, bytes]] = []
        for index, code, reason in taken.refused:
            message = events[index].message
            key, value = dead_letter(message.topic, message.partition, message.offset,
                                     message.value, code, reason)
            sends.append((self.dlq_topic, None, key, value))
            self.metrics.inc("rejected_total", reason=code)
        for home, records in taken.records.items():
            sends += [(self.ledger_topic, home, None, record) for record in records]
        return sends

    async def _confirm(self, events: Sequence[EventT[Any]], taken: Taken,
                       sends: list[tuple[str, int | None, bytes | None, bytes]],
                       futures: list[Awaitable[Any]], stream: faust.Stream[Any]) -> None:
        """Wait until Kafka has every record of a take, sending again what failed (Kafka
        away), then acknowledge the take's messages: only then may Faust commit them."""
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
        for event in events:
            message = event.message
            self.delivered[(message.topic, message.partition)] = message.offset
            await stream.ack(event)
