"""Producers that write in Kafka transactions (Kafka Connect and Flink sinks with exactly-once
on, any client with a ``transactional.id``), on the real Kafka: what they abort is never
counted, what they commit is counted once, and a transaction still open only once it commits.
And a worker upgraded from one whose intake was a Faust agent goes on where that agent's group
committed, instead of reading the input again."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata

from tests.integration.streamkit import (
    Worker,
    produce,
    settings_of,
    wait_caught_up,
)
from tests.integration.team_spend import gpu_hours, pipeline_env, spend_by_team

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("apache_kafka")]

PARTITIONS = 2


def usage(event_id: str, team: str, hours: float = 1.0) -> bytes:
    return json.dumps(gpu_hours(event_id, team, hours)).encode()


@pytest.fixture
def env(services: Any, kafka_namespace: str, tmp_path: Path) -> dict[str, str]:
    return pipeline_env(services, kafka_namespace, PARTITIONS, tmp_path / "state")


@pytest.fixture
def worker(env: dict[str, str], tmp_path: Path) -> Iterator[Worker]:
    proc = Worker(env, tmp_path / "worker.log")
    proc.start()
    yield proc
    proc.stop()


def transactional(bootstrap: str, name: str) -> KafkaProducer:
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=name)
    producer.init_transactions()
    return producer


def test_aborted_transactions_are_not_counted_and_committed_ones_are(
        services: Any, env: dict[str, str], worker: Worker, kafka_namespace: str) -> None:
    topic = f"{kafka_namespace}.usage.v1"
    producer = transactional(services.bootstrap, f"{kafka_namespace}-sink")
    producer.begin_transaction()
    for n in range(10):  # keyed, so both partitions hold aborted records and their markers
        producer.send(topic, usage(f"aborted-{n}", "aborted"), key=f"k{n}".encode())
    producer.flush()
    producer.abort_transaction()
    producer.begin_transaction()
    for n in range(10):  # new ids: a sink replaying with fresh ids after its abort
        producer.send(topic, usage(f"kept-{n}", "kept"), key=f"k{n}".encode())
    producer.commit_transaction()
    producer.close()
    # the ends of both partitions are commit markers: intake's commits pass them
    wait_caught_up(env, worker, timeout=90)
    assert spend_by_team(env) == {"kept": "24.900000"}  # 10 GPU-hours at 2.49


def test_an_open_transaction_is_counted_only_once_it_commits(
        services: Any, env: dict[str, str], worker: Worker, kafka_namespace: str) -> None:
    topic = f"{kafka_namespace}.usage.v1"
    produce(services.bootstrap, topic, [(b"p", usage("plain-0", "plain"))])
    producer = transactional(services.bootstrap, f"{kafka_namespace}-open")
    producer.begin_transaction()
    producer.send(topic, usage("open-0", "open"), key=b"p")
    producer.flush()  # in the log, past the plain event, but not committed
    produce(services.bootstrap, topic, [(b"p", usage("plain-1", "plain"))])
    wait_caught_up(env, worker, timeout=90)
    time.sleep(3)  # would the worker count what it must not, it has had the time to
    # the event before the open transaction, and none after it on its partition
    assert spend_by_team(env) == {"plain": "2.490000"}
    producer.commit_transaction()
    producer.close()
    wait_caught_up(env, worker, timeout=90)
    assert spend_by_team(env) == {"plain": "4.980000", "open": "2.490000"}


def test_an_upgraded_worker_goes_on_where_the_faust_agent_s_group_committed(
        services: Any, env: dict[str, str], kafka_namespace: str, tmp_path: Path) -> None:
    topic = f"{kafka_namespace}.usage.v1"
    settings = settings_of(env)
    old = [(f"k{n}".encode(), usage(f"old-{n}", "old")) for n in range(20)]
    produce(services.bootstrap, topic, old)
    # what an earlier worker's Faust agent committed: every message so far
    group = KafkaConsumer(bootstrap_servers=services.bootstrap, group_id=settings.app_group,
                          enable_auto_commit=False)
    ends = group.end_offsets([TopicPartition(topic, p) for p in range(PARTITIONS)])
    group.commit({tp: OffsetAndMetadata(end, "", -1) for tp, end in ends.items()})
    group.close()
    produce(services.bootstrap, topic, [(b"k0", usage("new-0", "new"))])
    proc = Worker(env, tmp_path / "worker.log")
    proc.start()
    try:
        wait_caught_up(env, proc, timeout=90)
        assert spend_by_team(env) == {"new": "2.490000"}
    finally:
        proc.stop()
