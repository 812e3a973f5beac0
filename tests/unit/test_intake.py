"""Intake: a take's dead letters and ledger records reach Kafka before the take is told
delivered; a failed send is sent again; takes are priced side by side and delivered in
order; a take of nothing but skipped markers is delivered at once."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from costline.rules.ledger import Intake as Pricer
from costline.rules.ledger import Record, Taken, event_key
from costline.rules.prices import PriceBook
from costline.streams.settings import DEFAULT_PRICES
from costline.streams.worker.health import Health
from costline.streams.worker.intake import Intake
from costline.streams.worker.metrics import Metrics
from costline.streams.worker.pricing import InlinePricing

PRICES = PriceBook.load(DEFAULT_PRICES)


@dataclass
class Message:
    topic: str
    partition: int
    offset: int
    value: bytes


@dataclass(eq=False)
class Take:
    messages: list[Message]


def usage(event_id: str) -> bytes:
    return json.dumps({"event_id": event_id, "kind": "usage", "ts": 1_700_000_000,
                       "resource_id": "n", "resource_type": "gpu.h100", "quantity": 1,
                       "unit": "gpu_hour"}).encode()


class Kafka:
    """Sends that succeed (or fail, ``failures`` times), remembering what Kafka has."""

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.has: list[tuple[str, int | None, bytes | None, bytes]] = []
        self.log: list[str] = []

    async def send(self, topic: str, partition: int | None, key: bytes | None,
                   value: bytes) -> asyncio.Future[None]:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.failures:
            self.failures -= 1
            done.set_exception(ConnectionError("broker away"))
        else:
            self.has.append((topic, partition, key, value))
            self.log.append(f"sent {topic}")
            done.set_result(None)
        return done


class Source:
    """Takes of messages, and the takes intake says are delivered."""

    def __init__(self, takes: list[Take], kafka: Kafka) -> None:
        self.takes_, self.kafka = takes, kafka
        self.acked: list[int] = []
        self.delivered_takes: list[Take] = []

    async def takes(self) -> Any:
        for take in self.takes_:
            yield take
        await asyncio.sleep(0.2)  # the input goes quiet: what is in flight is still delivered

    def delivered(self, take: Take) -> None:
        self.delivered_takes.append(take)
        for message in take.messages:
            self.acked.append(message.offset)
            self.kafka.log.append(f"ack {message.offset}")


def intake(kafka: Kafka, depth: int = 2) -> Intake:
    return Intake(pricing=InlinePricing(Pricer(PRICES, 3)), send=kafka.send,
                  ledger_topic="t.ledger.v1", dlq_topic="t.dlq.v1", metrics=Metrics(),
                  health=Health(), depth=depth)


def take(*values: bytes, first: int = 0) -> Take:
    return Take([Message("t.usage.v1", 1, first + n, v) for n, v in enumerate(values)])


async def test_refused_messages_and_ledger_records_reach_kafka_before_the_acknowledgement():
    kafka = Kafka()
    source = Source([take(usage("a"), b"{bad", usage("b"))], kafka)
    await intake(kafka).run(source)
    assert source.acked == [0, 1, 2]
    first_ack = kafka.log.index("ack 0")
    assert all(entry.startswith("sent") for entry in kafka.log[:first_ack])
    [letter] = [value for topic, _, _, value in kafka.has if topic == "t.dlq.v1"]
    assert json.loads(letter)["offset"] == 1 and json.loads(letter)["code"] == "invalid_json"
    ledger = [(p, Record.decode(v)) for topic, p, _, v in kafka.has if topic == "t.ledger.v1"]
    assert sum(len(r.entries) for _, r in ledger) == 2
    assert all(p is not None and 0 <= p < 3 for p, _ in ledger)


async def test_a_failed_send_is_sent_again_and_the_take_delivered_only_after():
    kafka = Kafka(failures=2)
    source = Source([take(usage("a"))], kafka)
    agent = intake(kafka)
    await agent.run(source)
    assert source.acked == [0]
    assert len([v for t, _, _, v in kafka.has if t == "t.ledger.v1"]) == 1
    assert "kafka" not in agent.health.problems


async def test_takes_are_handed_to_kafka_in_order_and_each_delivered_once_all_is_in():
    kafka = Kafka()
    takes = [take(usage(f"e{n}"), first=n) for n in range(6)]
    source = Source(takes, kafka)
    await intake(kafka, depth=3).run(source)
    assert sorted(source.acked) == list(range(6))
    sent = [Record.decode(v).entries[0][1] for t, _, _, v in kafka.has if t == "t.ledger.v1"]
    assert sent == [event_key(f"e{n}", 3)[0] for n in range(6)]


async def test_a_take_of_only_skipped_records_is_delivered_without_pricing_or_sending():
    kafka = Kafka()
    empty = Take([])
    source = Source([take(usage("a")), empty, take(usage("b"), first=1)], kafka)
    agent = intake(kafka)
    priced: list[int] = []  # messages in each take priced
    submit = agent.pricing.submit

    def counted(values: Sequence[bytes]) -> asyncio.Future[Taken]:
        priced.append(len(values))
        return submit(values)

    agent.pricing.submit = counted  # type: ignore[method-assign]
    await agent.run(source)
    assert empty in source.delivered_takes
    assert priced == [1, 1], "the empty take is not priced"
    assert len([v for t, _, _, v in kafka.has if t == "t.ledger.v1"]) == 2
