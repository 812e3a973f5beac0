"""The real worker on real Kafka and Redis publishes each alert's state changes to
``NS.alerts.v1`` in order: pending → firing, escalation, silenced and back, resolved."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, TopicPartition

from costline.rules.durations import parse_time
from costline.rules.state import BUCKET_S, align_down
from costline.streams.settings import Settings
from costline.streams.topics import create_topics
from tests.conftest import services_required
from tests.integration.streamkit import Worker, produce, run_cli, worker_env

pytestmark = pytest.mark.integration

RULES = """
rules:
  - name: eval-daily
    kind: budget
    match: {team: eval}
    group_by: [team]
    period: day
    limit: 100
    warn_at: [0.5]
    for: 4s
  - name: research-idle
    kind: idle
    match: {team: research}
    group_by: [job]
    below: 0.05
    for: 5m
  - name: infra-logs
    kind: log_explosion
    match: {team: infra}
    group_by: [job]
    window: 5m
    baseline: 5m
    max_rate: 10
"""

Step = tuple[str, str, str | None]


class AlertsTopic:
    """Everything published to ``NS.alerts.v1`` since the topic was created, read in order."""

    def __init__(self, bootstrap: str, namespace: str) -> None:
        self.consumer = KafkaConsumer(
            bootstrap_servers=bootstrap,
            enable_auto_commit=False,
            value_deserializer=lambda raw: json.loads(raw),
        )
        topic = f"{namespace}.alerts.v1"
        parts = self.consumer.partitions_for_topic(topic) or set()
        assert parts, f"{topic} does not exist"
        self.consumer.assign([TopicPartition(topic, p) for p in sorted(parts)])
        self.consumer.seek_to_beginning()
        self.changes: list[dict[str, Any]] = []

    def steps(self, rule: str) -> list[Step]:
        """(previous state, state, line) of every change of this rule's alerts, in order."""
        return [(c["previous_state"], c["state"], c["line"]) for c in self.of(rule)]

    def of(self, rule: str) -> list[dict[str, Any]]:
        return [change for change in self.changes if change["rule"] == rule]

    def wait(self, rule: str, count: int, timeout: float = 90.0) -> list[Step]:
        """Until this rule has published ``count`` changes; returns their steps."""
        deadline = time.time() + timeout
        while len(self.of(rule)) < count:
            assert time.time() < deadline, f"{rule}: {self.steps(rule)} after {timeout:.0f}s"
            for records in self.consumer.poll(timeout_ms=500).values():
                self.changes.extend(record.value for record in records)
        return self.steps(rule)

    def close(self) -> None:
        self.consumer.close()


Pipeline = tuple[dict[str, str], AlertsTopic, Callable[..., None]]
# libfaketime (Debian's libfaketime): preloaded into the worker and inherited by its child
# processes, it moves their wall clock by a fixed offset and leaves the monotonic clock alone,
# so Kafka's and Faust's timeouts run as usual.
FAKETIME_LIBRARIES = sorted(Path("/usr/lib").glob("*/faketime/libfaketimeMT.so.1"))
# Where a shifted worker's clock is when it starts: this long before a bucket boundary.
LEAD_S = 100


def run_pipeline(services: Any, kafka_namespace: str, tmp_path: Path,
                 extra: dict[str, str]) -> Iterator[Pipeline]:
    """A worker evaluating ``RULES`` every second (its environment plus ``extra``), the
    alerts topic, and a way to send events."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    env = worker_env(
        kafka_namespace,
        services.bootstrap,
        services.redis_url,
        COSTLINE_RULES=str(rules),
        COSTLINE_RULES_TICK_S="1",
        COSTLINE_STATE_DIR=str(tmp_path / "state"),
        **extra,
    )
    create_topics(Settings(kafka_bootstrap=services.bootstrap, namespace=kafka_namespace,
                           partitions=2))
    topic = AlertsTopic(services.bootstrap, kafka_namespace)
    worker = Worker(env, tmp_path / "worker.log")
    worker.start()
    sent = iter(range(1_000_000))

    def send(*events: dict[str, Any]) -> None:
        messages = []
        for event in events:
            event = {"event_id": f"e{next(sent)}", "resource_type": "gpu.h100", **event}
            messages.append((event["event_id"].encode(), json.dumps(event).encode()))
        produce(services.bootstrap, f"{kafka_namespace}.usage.v1", messages)

    try:
        yield env, topic, send
    finally:
        worker.stop()
        topic.close()


@pytest.fixture
def pipeline(services: Any, kafka_namespace: str, tmp_path: Path) -> Iterator[Pipeline]:
    yield from run_pipeline(services, kafka_namespace, tmp_path, {})


@pytest.fixture
def pipeline_before_boundary(
    services: Any, kafka_namespace: str, tmp_path: Path
) -> Iterator[tuple[Pipeline, float]]:
    """``pipeline`` with the worker's wall clock ahead of this process's by the offset (0 to
    5 minutes) that starts it ``LEAD_S`` before a bucket boundary, and the offset. Without
    libfaketime the worker keeps the real clock (offset 0), unless CI requires it."""
    ahead, clock = 0.0, {}
    if FAKETIME_LIBRARIES:
        ahead = round((-LEAD_S - time.time()) % BUCKET_S, 3)
        clock = {"LD_PRELOAD": str(FAKETIME_LIBRARIES[0]), "FAKETIME": f"+{ahead}",
                 "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
    elif services_required():
        pytest.fail("libfaketime is required (REQUIRE_SERVICES=1) but not installed",
                    pytrace=False)
    for piece in run_pipeline(services, kafka_namespace, tmp_path, clock):
        yield piece, ahead


def gpu_hours(hours: float, ts: float, **tags: str) -> dict[str, Any]:
    return {"kind": "usage", "ts": ts, "resource_id": "node-1", "quantity": hours,
            "unit": "gpu_hour", "tags": tags}


def gpu_util(value: float, ts: float, **tags: str) -> dict[str, Any]:
    return {"kind": "utilization", "ts": ts, "resource_id": "node-9", "metric": "gpu_util",
            "value": value, "tags": tags}


def test_a_budget_alert_goes_pending_firing_escalates_and_is_silenced_until_unmuted(
    pipeline: Pipeline,
) -> None:
    env, topic, send = pipeline
    send(gpu_hours(24.1, time.time(), team="eval"))  # 60.009 USD: past the 50% line
    assert topic.wait("eval-daily", 2) == [
        ("inactive", "pending", "warn_50"),
        ("pending", "firing", "warn_50"),
    ]
    pending, firing = topic.of("eval-daily")
    assert firing["since"] == firing["at"]
    assert parse_time(firing["at"]) - parse_time(pending["at"]) >= 4

    send(gpu_hours(20, time.time(), team="eval"))  # 109.809 USD: past the budget line
    assert topic.wait("eval-daily", 3)[2] == ("firing", "firing", "limit")
    assert topic.of("eval-daily")[2]["value"] == "109.809000"

    added = run_cli(env, "silence", "add", "--for", "1h", "--rule", "eval-daily", "--by", "test")
    assert added.returncode == 0, added.stderr
    assert topic.wait("eval-daily", 4)[3] == ("firing", "silenced", "limit")
    silence_id = added.stdout.split()[1]
    expired = run_cli(env, "silence", "expire", silence_id)
    assert expired.returncode == 0, expired.stderr
    assert topic.wait("eval-daily", 5)[4] == ("silenced", "firing", "limit")
    assert len({c["alert_id"] for c in topic.of("eval-daily")}) == 1


def test_an_idle_gpu_alert_fires_and_resolves_when_the_gpu_gets_busy(
    pipeline: Pipeline,
) -> None:
    _, topic, send = pipeline
    now = time.time()
    send(*(gpu_util(0.01, now - s, team="research", job="nb-3") for s in range(360, -1, -30)))
    assert topic.wait("research-idle", 1) == [("inactive", "firing", "idle")]
    assert topic.of("research-idle")[0]["group"] == {"job": "nb-3", "resource_id": "node-9"}
    send(gpu_util(0.9, time.time(), team="research", job="nb-3"))
    assert topic.wait("research-idle", 2)[1] == ("firing", "resolved", "idle")


def test_a_log_explosion_resolves_once_its_window_moves_past_the_spike(
    pipeline_before_boundary: tuple[Pipeline, float],
) -> None:
    (_, topic, send), ahead = pipeline_before_boundary

    def worker_now() -> float:
        return time.time() + ahead

    # let the spike's bucket stay in the window a while; with the worker's clock shifted the
    # boundary is LEAD_S away from its start, and this waits only on a very slow start
    if BUCKET_S - worker_now() % BUCKET_S < 45:
        time.sleep(BUCKET_S - worker_now() % BUCKET_S + 1)
    window_end = align_down(worker_now())
    spike = {**gpu_hours(0, window_end - 150, team="infra", job="run-8"),
             "resource_type": "logs.ingest", "unit": "gb", "quantity": 2}
    send(spike)  # 1 USD of logs in one 5-minute window: 12 USD/h, past max_rate 10
    assert topic.wait("infra-logs", 1) == [("inactive", "firing", "max_rate")]
    assert topic.of("infra-logs")[0]["rate_per_hour"] == "12.000000"
    steps = topic.wait("infra-logs", 2, timeout=BUCKET_S + 60)
    assert steps[1] == ("firing", "resolved", "max_rate")
    assert parse_time(topic.of("infra-logs")[1]["at"]) >= window_end + BUCKET_S
