"""Past what Kafka keeps. Redis restored from a snapshot older than the ledger's retention (or
down for longer) finds ledger records removed before it counted them; intake down for longer
than the input topics keep messages finds input removed before it priced it. Neither can be
counted from Kafka any more, and the worker says so, by partition and offset, instead of
starting silently at the first kept record; what Kafka still holds is counted exactly."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from kafka import KafkaProducer, TopicPartition

from bench.common import worker_series
from costline.connectors.kafka import admin
from costline.rules.events import parse_message
from costline.rules.ledger import Intake
from costline.rules.prices import PriceBook
from costline.streams.settings import DEFAULT_PRICES
from costline.streams.topics import create_topics
from tests.integration.streamkit import (
    Ledger,
    Worker,
    rows_by_group,
    settings_of,
    spend_json,
    usage_event,
    wait_caught_up,
    worker_env,
)

pytestmark = pytest.mark.integration

PARTITIONS = 2
DAY = 1795824000  # 2026-11-28T00:00:00Z
AT = "2026-11-28T12:00:00Z"


def to_ledger(bootstrap: str, topic: str, events: list[dict[str, object]]) -> dict[int, int]:
    """The events' ledger records, as intake writes them: one to each partition named."""
    parsed = parse_message(json.dumps(events).encode())
    records = Intake(PriceBook.load(DEFAULT_PRICES), PARTITIONS).records(parsed.events)
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    for home, record in records.items():
        producer.send(topic, record.encode(), partition=home).get(30)
    producer.close()
    return {home: 1 for home in records}


def expired(worker: Worker, series: str) -> dict[str, float]:
    """The worker's ``costline_<series>`` by partition."""
    return {labels["partition"]: value for name, labels, value in worker_series(worker)
            if name == f"costline_{series}"}


def remove_before(bootstrap: str, offsets: dict[TopicPartition, int]) -> None:
    """What retention does once records are old enough: the log begins at ``offsets``."""
    client = admin(bootstrap)
    try:
        client.delete_records(offsets)
    finally:
        client.close()


def namespace_env(services, namespace: str) -> dict[str, str]:
    """A worker's environment for the namespace, its topics created."""
    env = worker_env(namespace, services.bootstrap, services.redis_url,
                     COSTLINE_PARTITIONS=str(PARTITIONS))
    create_topics(settings_of(env))
    return env


def test_records_removed_before_they_were_counted_are_reported(
        services, kafka_namespace: str, tmp_path: Path) -> None:
    env = namespace_env(services, kafka_namespace)
    settings = settings_of(env)
    ledger_topic = settings.topic("ledger")
    rng = random.Random(5)
    removed = to_ledger(services.bootstrap, ledger_topic,
                        [usage_event(rng, f"gone-{n}", DAY + n) for n in range(40)])
    remove_before(services.bootstrap,
                  {TopicPartition(ledger_topic, p): n for p, n in removed.items()})
    kept, expected = [usage_event(rng, f"kept-{n}", DAY + n) for n in range(40)], Ledger()
    for event in kept:
        expected.count(event)
    to_ledger(services.bootstrap, ledger_topic, kept)

    worker = Worker(env, tmp_path / "worker.log")
    worker.start()
    try:
        wait_caught_up(env, worker)
        assert expired(worker, "ledger_records_expired_total") == {
            str(p): float(n) for p, n in removed.items()}
        log = worker.log.read_text()
        for partition in removed:
            assert f"ledger[{partition}]: records 0 to 0 were removed by the ledger's " \
                   "retention before Redis counted them" in log
        report = spend_json(env, "--period", "day", "--at", AT, "--by", "team")
        assert rows_by_group(report, ("team",), "cost") == expected.total(
            "cost", ("team",), {}, DAY, DAY + 86400)
    finally:
        worker.stop()


def test_input_removed_before_intake_priced_it_is_reported(
        services, kafka_namespace: str, tmp_path: Path) -> None:
    env = namespace_env(services, kafka_namespace)
    settings = settings_of(env)
    usage = TopicPartition(settings.topic("usage"), 0)
    rng = random.Random(6)
    counted, expected = [usage_event(rng, f"counted-{n}", DAY + n) for n in range(30)], Ledger()
    for event in counted:
        expected.count(event)
    worker = Worker(env, tmp_path / "worker.log")
    worker.start()
    try:
        send(services.bootstrap, usage, counted)
        wait_caught_up(env, worker)
        worker.stop()  # intake is down ...
        send(services.bootstrap, usage, [usage_event(rng, f"gone-{n}", DAY + n)
                                         for n in range(20)])
        remove_before(services.bootstrap, {usage: 30 + 20})  # ... for longer than it is kept
        worker.start()
        wait_caught_up(env, worker)
        assert expired(worker, "input_messages_expired_total") == {"0": 20.0}
        assert f"{usage.topic}[0]: messages 30 to 49 were removed by the topic's retention " \
               "before intake priced them" in worker.log.read_text()
        report = spend_json(env, "--period", "day", "--at", AT, "--by", "team")
        assert rows_by_group(report, ("team",), "cost") == expected.total(
            "cost", ("team",), {}, DAY, DAY + 86400)
    finally:
        worker.stop()


def send(bootstrap: str, tp: TopicPartition, events: list[dict[str, object]]) -> None:
    """One message per event, to ``tp``."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    for event in events:
        producer.send(tp.topic, json.dumps(event).encode(), partition=tp.partition)
    producer.flush(30)
    producer.close()
