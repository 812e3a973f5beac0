"""Scaling out against the real Kafka and Redis: workers of one consumer group split the input
partitions between them, and the totals stay exact while a worker leaves, comes back and
another one joins in the middle of a stream."""

from __future__ import annotations

import json
import random
import re
import threading
import time
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from costline.streams.settings import Settings
from costline.streams.topics import create_topics
from tests.conftest import Services
from tests.integration.streamkit import (
    Ledger,
    Worker,
    end_offsets,
    produce,
    rows_by_group,
    spend_json,
    usage_event,
    wait_caught_up,
    worker_env,
)

pytestmark = pytest.mark.integration

# Eight, not six: Faust's sticky assignor moves no partition off a worker that holds at most
# ceil(P/N), so a fourth worker joining three that hold two of six each would stay idle.
PARTITIONS = 8
DAY = 1795824000  # 2026-11-28T00:00:00Z, in the past whenever the tests run
AT = "2026-11-28T12:00:00Z"
LAG = re.compile(r"^costline_consumer_lag\{([^}]*)\}", re.M)
LABEL = re.compile(r'(\w+)="([^"]*)"')

Message = tuple[bytes, bytes]


@dataclass
class Group:
    """Workers of one namespace, hence one consumer group."""

    services: Services
    namespace: str
    folder: Path
    workers: list[Worker] = field(default_factory=list)

    @property
    def topic(self) -> str:
        return f"{self.namespace}.usage.v1"

    @property
    def ledger(self) -> str:
        return f"{self.namespace}.ledger.v1"

    def add(self) -> Worker:
        env = worker_env(self.namespace, self.services.bootstrap, self.services.redis_url,
                         COSTLINE_PARTITIONS=str(PARTITIONS))
        worker = Worker(env, self.folder / f"worker-{len(self.workers)}.log")
        worker.start()
        self.workers.append(worker)
        return worker

    def live(self) -> list[Worker]:
        return [w for w in self.workers if w.alive()]


@pytest.fixture
def group(services, kafka_namespace: str, tmp_path: Path) -> Iterator[Group]:
    create_topics(Settings(kafka_bootstrap=services.bootstrap, namespace=kafka_namespace,
                           partitions=PARTITIONS))
    members = Group(services, kafka_namespace, tmp_path)
    yield members
    for worker in members.workers:
        worker.stop()


def metrics(worker: Worker) -> str:
    url = f"http://127.0.0.1:{worker.env['COSTLINE_WEB_PORT']}/metrics"
    with urllib.request.urlopen(url, timeout=5) as answer:
        return str(answer.read().decode())


def owned(worker: Worker, topic: str) -> set[int] | None:
    """The partitions of ``topic`` a worker applies, from the labels of its consumer_lag
    series (None while its web server is not up)."""
    try:
        text = metrics(worker)
    except OSError:
        return None
    labels = [dict(LABEL.findall(found)) for found in LAG.findall(text)]
    return {int(x["partition"]) for x in labels if x.get("topic") == topic}


def wait_split(group: Group, count: int, timeout: float = 60) -> list[set[int]]:
    """Until the ``count`` live workers own every partition between them, each partition
    exactly once and every worker at least one."""
    deadline = time.time() + timeout
    seen: list[set[int] | None] = []
    while time.time() < deadline:
        live = group.live()
        assert len(live) == count, [w.log for w in group.workers if not w.alive()]
        seen = [owned(w, group.ledger) for w in live]
        sets = [s for s in seen if s]
        if len(sets) == count and sum(map(len, sets)) == PARTITIONS and (
                set().union(*sets) == set(range(PARTITIONS))):
            return sets
        time.sleep(0.3)
    raise AssertionError(f"no exclusive split over {count} workers in {timeout}s: {seen}")


def stream(rng: random.Random, ledger: Ledger, prefix: str, n: int) -> list[Message]:
    """Single events, 20-event batches and resends of the same message (same key, so the
    same partition: the dedup horizon is per partition)."""
    messages: list[Message] = []
    i = 0
    while i < n:
        if rng.random() < 0.1:
            batch = [usage_event(rng, f"{prefix}{i + j}", DAY + rng.randrange(86400))
                     for j in range(20)]
            i += 20
            value = json.dumps(batch).encode()
            events = batch
        else:
            event = usage_event(rng, f"{prefix}{i}", DAY + rng.randrange(86400))
            i += 1
            value = json.dumps(event).encode()
            events = [event]
        key = events[0]["event_id"].encode()
        messages.append((key, value))
        if rng.random() < 0.05:
            messages.append((key, value))
        for event in events:
            ledger.count(event)
    return messages


def paced(messages: list[Message], seconds: float) -> Iterable[Message]:
    """The messages spread over ``seconds``: a stream that is still flowing while the group
    changes."""
    pause = seconds / max(1, len(messages) // 100)
    for i, message in enumerate(messages):
        if i and i % 100 == 0:
            time.sleep(pause)
        yield message


def figure(worker: Worker, name: str) -> float:
    """A series of this worker's /metrics without labels (0 when it has none yet)."""
    found = re.search(rf"^costline_{name} (\S+)$", metrics(worker), re.M)
    return float(found.group(1)) if found else 0.0


def test_workers_split_partitions_and_totals_stay_exact_through_rebalances(services, group):
    rng, ledger = random.Random(17), Ledger()
    for _ in range(3):
        group.add()
    produce(services.bootstrap, group.topic, stream(rng, ledger, "a", 3000))
    assert sorted(map(len, wait_split(group, 3))) == [2, 3, 3]

    # A stream flows while one worker leaves (SIGTERM), then comes back and another joins.
    flowing = threading.Thread(target=produce, args=(
        services.bootstrap, group.topic, paced(stream(rng, ledger, "b", 8000), 15)))
    flowing.start()
    time.sleep(2)
    leaving = group.workers[1]
    leaving.stop()
    assert flowing.is_alive(), "the stream ended before the worker left: pace it slower"
    wait_split(group, 2)
    leaving.start()
    group.add()
    wait_split(group, 4)
    flowing.join(60)
    assert not flowing.is_alive()
    # Data for every partition once the four share them: each of them must count some.
    produce(services.bootstrap, group.topic, stream(rng, ledger, "c", 3000))

    ends = end_offsets(services.bootstrap, group.topic)
    assert sorted(ends) == list(range(PARTITIONS))
    wait_caught_up(group.workers[0].env, timeout=60)
    assert all(figure(w, "events_total") > 0 for w in group.live())
    # and each remembers, for the partitions it owns now, tag sets it need not send again
    assert all(figure(w, "tagsets_known") > 0 for w in group.live())
    env = group.workers[0].env
    by_job = spend_json(env, "--period", "day", "--at", AT, "--by", "team,job")
    assert rows_by_group(by_job, ("team", "job"), "cost") == ledger.total(
        "cost", ("team", "job"), {}, DAY, DAY + 86400)
    grand = spend_json(env, "--period", "day", "--at", AT)
    assert rows_by_group(grand, (), "cost") == ledger.total("cost", (), {}, DAY, DAY + 86400)
