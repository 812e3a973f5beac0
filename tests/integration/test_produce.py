"""``costline produce`` and ``costline topics create`` against a real broker: what goes in
comes back byte for byte, bad lines stay out and are reported by line number."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, TopicPartition

from costline.connectors.kafka import admin

pytestmark = pytest.mark.integration

COSTLINE = str(Path(sys.executable).with_name("costline"))


def costline(bootstrap: str, namespace: str, *args: str) -> subprocess.CompletedProcess[str]:
    command = [COSTLINE, "--kafka-bootstrap", bootstrap, "--namespace", namespace, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def usage(event_id: str, quantity: float = 8.0) -> dict[str, Any]:
    return {"event_id": event_id, "kind": "usage", "ts": "2026-11-28T08:00:00Z",
            "resource_id": "cluster-a/node-017", "resource_type": "gpu.h100",
            "quantity": quantity, "unit": "gpu_hour",
            "tags": {"project": "llm-70b", "team": "pretrain"}}


def utilization(event_id: str) -> dict[str, Any]:
    return {"event_id": event_id, "kind": "utilization", "ts": 1795852800,
            "resource_id": "cluster-a/node-017", "resource_type": "gpu.h100",
            "metric": "gpu_util", "value": 0.02, "tags": {"job": "run-42"}}


def fault(event_id: str) -> dict[str, Any]:
    return {"event_id": event_id, "kind": "fault", "ts": "2026-11-28T08:05:00+01:00",
            "fault": "node_failure", "resource_type": "gpu.h100", "units": 512,
            "lost_seconds": 1800, "recovery_seconds": 900}


def line(value: Any) -> str:
    return json.dumps(value)


def partition_count(bootstrap: str, topic: str) -> int:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        return len(consumer.partitions_for_topic(topic) or ())
    finally:
        consumer.close()


def read_topic(bootstrap: str, topic: str, expect: int, timeout_s: float = 20.0
               ) -> list[tuple[bytes, bytes]]:
    """Every (key, value) of a topic: waits for ``expect`` messages, then a little longer to
    catch any extra one."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    got: list[tuple[bytes, bytes]] = []
    deadline = time.monotonic() + timeout_s
    settle: float | None = None
    while time.monotonic() < (settle or deadline):
        for records in consumer.poll(timeout_ms=300).values():
            got.extend((record.key, record.value) for record in records)
        if len(got) >= expect and settle is None:
            settle = time.monotonic() + 1.0
    consumer.close()
    return got


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_events_come_back_exactly_as_written(
    kafka_bootstrap: str, kafka_namespace: str, tmp_path: Path,
) -> None:
    """Each line is one message keyed by its event id, routed by kind, bytes unchanged."""
    ready_batch = [usage("u-b1", 1.5), usage("u-b2", 2.5)]
    lines = [line(usage("u-1")), line(utilization("m-1")), "", line(fault("f-1")),
             line(ready_batch), line(usage("u-2", 0.25))]
    second = write(tmp_path / "more.jsonl", [line(fault("f-2"))])
    result = costline(kafka_bootstrap, kafka_namespace, "produce", "--batch", "1", "--json",
                      str(write(tmp_path / "events.jsonl", lines)), str(second))
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert (summary["sent_events"], summary["sent_messages"], summary["rejected"]) == (7, 6, [])

    usage_topic = f"{kafka_namespace}.usage.v1"
    faults_topic = f"{kafka_namespace}.faults.v1"
    expected_usage = {(b"u-1", lines[0]), (b"m-1", lines[1]), (b"u-b1", lines[4]),
                      (b"u-2", lines[5])}
    got_usage = read_topic(kafka_bootstrap, usage_topic, len(expected_usage))
    assert sorted((k, v.decode()) for k, v in got_usage) == sorted(expected_usage)
    got_faults = read_topic(kafka_bootstrap, faults_topic, 2)
    assert sorted((k, v.decode()) for k, v in got_faults) == sorted(
        [(b"f-1", lines[3]), (b"f-2", line(fault("f-2")))])


def test_bad_lines_are_reported_by_line_number_and_not_sent(
    kafka_bootstrap: str, kafka_namespace: str, tmp_path: Path,
) -> None:
    """Invalid JSON, a missing field, an unknown kind and a negative quantity stay out."""
    bad_usage = {**usage("u-bad"), "quantity": -1}
    lines = [line(usage("u-1")), "{not json", line({"event_id": "x", "kind": "usage"}),
             line({**usage("u-k"), "kind": "invoice"}), line(bad_usage), line(usage("u-2"))]
    path = write(tmp_path / "mixed.jsonl", lines)
    result = costline(kafka_bootstrap, kafka_namespace, "produce", "--batch", "1", "--json",
                      str(path))
    assert result.returncode == 1
    summary = json.loads(result.stdout)
    assert [(r["file"], r["line"]) for r in summary["rejected"]] == [
        (str(path), 2), (str(path), 3), (str(path), 4), (str(path), 5)]
    assert [r["code"] for r in summary["rejected"]] == [
        "invalid_json", "missing_field", "unknown_kind", "out_of_range"]
    assert summary["sent_events"] == 2
    got = read_topic(kafka_bootstrap, f"{kafka_namespace}.usage.v1", 2)
    assert sorted(key for key, _ in got) == [b"u-1", b"u-2"]

    human = costline(kafka_bootstrap, kafka_namespace, "produce", str(path))
    assert human.returncode == 1
    assert f"{path}:2: invalid_json" in human.stdout
    assert f"{path}:5: out_of_range" in human.stdout


def test_topic_option_rejects_events_of_the_other_topic(
    kafka_bootstrap: str, kafka_namespace: str, tmp_path: Path,
) -> None:
    lines = [line(usage("u-1")), line(fault("f-1")), line([usage("u-2"), fault("f-2")])]
    path = write(tmp_path / "usage.jsonl", lines)
    result = costline(kafka_bootstrap, kafka_namespace, "produce", "--topic", "usage",
                      "--batch", "1", "--json", str(path))
    assert result.returncode == 1
    rejected = json.loads(result.stdout)["rejected"]
    assert [(r["line"], r["code"]) for r in rejected] == [(2, "wrong_topic"), (3, "wrong_topic")]
    assert "event 1: kind 'fault'" in rejected[1]["reason"]
    got = read_topic(kafka_bootstrap, f"{kafka_namespace}.usage.v1", 1)
    assert [key for key, _ in got] == [b"u-1"]


def test_events_are_sent_in_batches_unless_asked_otherwise(
    kafka_bootstrap: str, kafka_namespace: str, tmp_path: Path,
) -> None:
    """46 events, as a new user's file had: far fewer messages than events by default."""
    path = write(tmp_path / "many.jsonl", [line(usage(f"u-{n}")) for n in range(46)])
    result = costline(kafka_bootstrap, kafka_namespace, "produce", "--json", str(path))
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    partitions = partition_count(kafka_bootstrap, f"{kafka_namespace}.usage.v1")
    assert summary["sent_events"] == 46
    assert summary["sent_messages"] <= partitions


def test_batch_groups_events_into_arrays_keyed_by_their_first_event(
    kafka_bootstrap: str, kafka_namespace: str, tmp_path: Path,
) -> None:
    from costline.connectors.kafka import partition_of

    events = [usage(f"u-{i}") for i in range(40)]
    path = write(tmp_path / "many.jsonl", [line(e) for e in events])
    result = costline(kafka_bootstrap, kafka_namespace, "produce", "--batch", "3", "--json",
                      str(path))
    assert result.returncode == 0, result.stderr
    sent = json.loads(result.stdout)["sent_messages"]
    got = read_topic(kafka_bootstrap, f"{kafka_namespace}.usage.v1", sent)
    assert len(got) == sent
    batches = {key: json.loads(value) for key, value in got}
    assert all(1 <= len(batch) <= 3 for batch in batches.values())
    assert sorted((e for batch in batches.values() for e in batch),
                  key=lambda e: int(e["event_id"][2:])) == events
    partitions = partition_count(kafka_bootstrap, f"{kafka_namespace}.usage.v1")
    for key, batch in batches.items():
        assert key == batch[0]["event_id"].encode()
        # every event of a batch lands where its own id would have gone alone
        assert {partition_of(e["event_id"], partitions) for e in batch} == {
            partition_of(key.decode(), partitions)}


def test_topics_create_twice_creates_once(kafka_bootstrap: str, kafka_namespace: str) -> None:
    first = costline(kafka_bootstrap, kafka_namespace, "topics", "create", "--partitions", "3",
                     "--json")
    assert first.returncode == 0, first.stderr
    names = {f"{kafka_namespace}.{name}.v1" for name in
             ("usage", "faults", "ledger", "alerts", "actions", "dlq")}
    assert set(json.loads(first.stdout)["created"]) == names
    second = costline(kafka_bootstrap, kafka_namespace, "topics", "create", "--json")
    assert second.returncode == 0, second.stderr
    again = json.loads(second.stdout)
    assert (again["created"], set(again["existing"])) == ([], names)
    client = admin(kafka_bootstrap)
    try:
        sizes = {t["name"]: len(t["partitions"]) for t in client.describe_topics(sorted(names))}
    finally:
        client.close()
    assert sizes[f"{kafka_namespace}.usage.v1"] == 3
    assert sizes[f"{kafka_namespace}.faults.v1"] == 3
    assert sizes[f"{kafka_namespace}.ledger.v1"] == 3
