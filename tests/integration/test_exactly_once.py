"""Exactly once for every producer, against the real Kafka and Redis.

Producers key their messages any way (at random, by host, not at all), batch events any way,
and resend single events out of earlier batches on other partitions. Through five kill -9s of
the worker and a kill -9 of Redis (which comes back from its append-only file, a second of
writes behind), ``costline spend`` must equal totals computed independently with Decimal, for
six groupings, and the dead-letter topic must hold exactly the malformed messages.
"""

from __future__ import annotations

import json
import os
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaProducer

from costline.streams.settings import Settings
from costline.streams.topics import create_topics
from tests.integration.redis_stores import RedisStore
from tests.integration.streamkit import (
    Ledger,
    Worker,
    read_all,
    rows_by_group,
    settings_of,
    spend_json,
    wait_caught_up,
    worker_env,
)

pytestmark = pytest.mark.integration

PARTITIONS = 4
DAY = 1795824000  # 2026-11-28T00:00:00Z, in the past whenever the tests run
AT = "2026-11-28T12:00:00Z"
GROUPINGS = [("team",), ("team", "project"), ("env",), ("category",), ("resource_type",),
             ("job",)]
TEAMS = ["pretrain", "posttrain", "eval", "infra"]
SHAPES = [("gpu.h100", "gpu_hour", 8.0), ("gpu.a100", "gpu_hour", 4.0),
          ("storage.ssd", "gb_hour", 4000.0), ("network.egress", "gb", 40.0),
          ("logs.ingest", "gb", 2.0)]


def event(rng: random.Random, n: int) -> dict[str, Any]:
    resource_type, unit, most = rng.choice(SHAPES)
    team = rng.choice(TEAMS)
    return {"event_id": f"ev-{n}", "kind": "usage", "ts": DAY + rng.randrange(86400),
            "resource_id": f"node-{rng.randrange(200)}", "resource_type": resource_type,
            "unit": unit, "quantity": round(rng.uniform(0.001, most), 4),
            "tags": {"team": team, "project": f"{team}-p{rng.randrange(5)}",
                     "env": rng.choice(["prod", "dev"]), "job": f"run-{rng.randrange(60)}"}}


MALFORMED = [
    b"not json at all",
    b"\xff\xfe\x00",
    b"[]",
    json.dumps({"event_id": "bad id!", "kind": "usage"}).encode(),
    json.dumps({"event_id": "m-1", "kind": "usage", "ts": DAY, "resource_id": "n",
                "resource_type": "gpu.nonexistent", "unit": "gpu_hour",
                "quantity": 1}).encode(),
    json.dumps({"event_id": "m-2", "kind": "usage", "ts": DAY, "resource_id": "n",
                "resource_type": "gpu.h100", "unit": "gpu_hour", "quantity": -1}).encode(),
]


@dataclass
class Sent:
    """What was produced, where, and what counting it must give."""

    ledger: Ledger
    malformed: list[tuple[int, bytes]]  # (partition, bytes) of every malformed message
    messages: int


def produce_every_way(bootstrap: str, topic: str, rng: random.Random, events: int) -> Sent:
    """Events in batches of random sizes under random keys, host keys or none; 5 % of them
    resent alone on another partition than their first copy; malformed messages between."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    ledger, malformed, messages = Ledger(), [], 0
    first_partition: dict[str, int] = {}
    pending = [event(rng, n) for n in range(events)]
    resends: list[dict[str, Any]] = []
    while pending:
        size = rng.choice([1, 1, 3, 17, 50, 200])
        batch, pending = pending[:size], pending[size:]
        key = rng.choice([os.urandom(8), f"host-{rng.randrange(9)}".encode(), None])
        value = json.dumps(batch if size > 1 or rng.random() < 0.5 else batch[0]).encode()
        sent = producer.send(topic, value, key=key).get(30)
        messages += 1
        for item in batch:
            ledger.count(item)
            first_partition[item["event_id"]] = sent.partition
            if rng.random() < 0.05:
                resends.append(item)
        if rng.random() < 0.01:
            raw = rng.choice(MALFORMED)
            partition = rng.randrange(PARTITIONS)
            producer.send(topic, raw, partition=partition).get(30)
            malformed.append((partition, raw))
            messages += 1
    for item in resends:  # each alone, on a partition its first copy did not go to
        others = [p for p in range(PARTITIONS) if p != first_partition[item["event_id"]]]
        producer.send(topic, json.dumps(item).encode(), partition=rng.choice(others)).get(30)
        messages += 1
    for raw in MALFORMED:  # every malformed kind at least once
        producer.send(topic, raw, partition=0).get(30)
        malformed.append((0, raw))
        messages += 1
    producer.flush(60)
    producer.close()
    assert len(resends) > 0.04 * events
    return Sent(ledger, malformed, messages)


@pytest.fixture
def worker(services, kafka_namespace: str, redis_store: RedisStore, tmp_path: Path
           ) -> Iterator[Worker]:
    env = worker_env(kafka_namespace, services.bootstrap, redis_store.url,
                     COSTLINE_PARTITIONS=str(PARTITIONS))
    create_topics(Settings(kafka_bootstrap=services.bootstrap, namespace=kafka_namespace,
                           partitions=PARTITIONS))
    proc = Worker(env, tmp_path / "worker.log")
    yield proc
    proc.stop()


def wait_for_progress(worker: Worker, store: RedisStore, share: float, messages: int) -> None:
    """Until intake has taken ``share`` of the input."""
    import time

    from costline.streams.progress import behind

    settings, redis = settings_of(worker.env), store.client()
    deadline = time.time() + 180
    while time.time() < deadline:
        if messages - behind(settings, redis).inputs >= share * messages:
            return
        assert worker.alive(), f"worker died; see {worker.log}"
        time.sleep(0.05)
    raise AssertionError(f"intake did not reach {share:.0%} of the input")


def test_every_producer_is_counted_once_through_kills_and_a_redis_restart(
        services, worker: Worker, kafka_namespace: str, redis_store: RedisStore) -> None:
    rng = random.Random(32)
    topic = f"{kafka_namespace}.usage.v1"
    sent = produce_every_way(services.bootstrap, topic, rng, events=20_000)
    worker.start()
    for step, share in enumerate(sorted(rng.uniform(0.05, 0.95) for _ in range(5))):
        wait_for_progress(worker, redis_store, share, sent.messages)
        worker.kill9()
        if step == 2:
            redis_store.crash_and_restart()
        worker.start()
    wait_caught_up(worker.env, worker, timeout=300)
    assert worker.starts == 6

    for by in GROUPINGS:
        report = spend_json(worker.env, "--period", "day", "--at", AT, "--by", ",".join(by))
        assert rows_by_group(report, by, "cost") == sent.ledger.total(
            "cost", by, {}, DAY, DAY + 86400), by

    letters = [json.loads(m.value) for m in read_all(services.bootstrap,
                                                     f"{kafka_namespace}.dlq.v1")]
    # A worker killed between a dead letter and its acknowledgement sends it again: the same
    # record, under the same key (source topic, partition and offset).
    by_source = {(letter["partition"], letter["offset"]): letter for letter in letters}
    assert len(by_source) == len(sent.malformed)
    assert Counter((letter["partition"], base64_raw(letter))
                   for letter in by_source.values()) == Counter(sent.malformed)
    assert all(letter["source_topic"] == topic and letter["reason"]
               for letter in by_source.values())


def base64_raw(letter: dict[str, Any]) -> bytes:
    import base64

    return base64.b64decode(letter["raw_b64"])
