"""Intake: input messages → priced entries on the ledger, at least once.

A Faust agent takes input messages in batches (``noack_take``), has them parsed and priced
(``costline.streams.worker.pricing``), sends each refused message to the dead-letter topic with
its exact bytes, and each home partition its ledger records; then it acknowledges the
messages, and Faust commits their offsets. A crash before the acknowledgement makes Faust
deliver them again: their entries reach the ledger twice, and the home partition counts each
event once (its dedup memory). So intake needs no state of its own, and its order does not
matter: takes are priced side by side, up to ``depth`` at a time.
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
        """The agent's body: take, price (up to ``depth`` takes at a time), deliver, ack."""
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
        while True:
            events, answer = await taken.get()
            await self.deliver(events, await answer)
            for event in events:
                await stream.ack(event)

    async def deliver(self, events: Sequence[EventT[Any]], taken: Taken) -> None:
        """Send a take's dead letters and ledger records, and wait for Kafka to have them."""
        sends: list[tuple[str, int | None, bytes | None, bytes]] = []
        letters = []
        for index, code, reason in taken.refused:
            message = events[index].message
            key, value = dead_letter(message.topic, message.partition, message.offset,
                                     message.value, code, reason)
            sends.append((self.dlq_topic, None, key, value))
            letters.append((key, value))
            self.metrics.inc("rejected_total", reason=code)
        for home, records in taken.records.items():
            sends += [(self.ledger_topic, home, None, record) for record in records]
        await self._send_all(sends)
        if letters and self.on_refused is not None:
            await self.on_refused(letters)
        self.metrics.inc("entries_total", taken.events)
        for event in events:
            message = event.message
            self.delivered[(message.topic, message.partition)] = message.offset

    async def _send_all(self, sends: list[tuple[str, int | None, bytes | None, bytes]]) -> None:
        """Send and wait for every acknowledgement; a send that fails is sent again (Kafka
        away), so a take is acknowledged only once all of it is in Kafka."""
        backoff = Backoff()
        while sends:
            futures = [await self.send(topic, partition, key, value)
                       for topic, partition, key, value in sends]
            results = await asyncio.gather(*futures, return_exceptions=True)
            failed = [send for send, result in zip(sends, results, strict=True)
                      if isinstance(result, BaseException)]
            if not failed:
                self.health.recovered("kafka")
                return
            error = next(r for r in results if isinstance(r, BaseException))
            self.health.failing("kafka", error)
            log.warning("%d of %d sends failed, sending them again: %s", len(failed),
                        len(sends), error)
            sends = failed
            await backoff.wait()
