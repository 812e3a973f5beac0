"""Chaos run: the whole pipeline under worker kills, Redis and Kafka restarts and rebalances.

    .venv/bin/python bench/chaos.py [--events N] [--malformed M] [--kills K] [--state-dir DIR]
                                    [--rate R] [--seed S] [--json] [--write-doc FILE]

It needs a running ``costline stack`` with Apache Kafka (``--state-dir``, default
``$COSTLINE_STATE_DIR``): the run restarts that stack's Kafka broker and Redis server, so
start a stack of its own for it::

    .venv/bin/costline stack up --kafka apache --redis system --kafka-port 0 --redis-port 0 \\
        --state-dir /tmp/chaos-stack

Two ``costline worker`` processes share the consumer groups of a 4-partition input topic and
of the 4-partition ledger, with a rule file (a budget per team and env that fires and
escalates on the stream's spend, and an idle rule that reclaims with the ``dry_run``
connector in ``mode: live``) and a local Slack server. A producer thread streams usage events
at a steady rate: single events and 100-event batches, about 5% resent under a key of their
own (so on any partition: a message whole, or one event of a batch alone), malformed
messages mixed in, and the utilization samples of a few idle GPU boxes (and one busy one).
Meanwhile a fault driver, at random moments, kills a worker with SIGKILL and restarts it,
restarts Redis, restarts the Kafka broker, and adds a third worker to the group and later
removes it.

When the stream is counted (``costline.streams.progress.behind``) it checks, and prints with
the figures (events, messages, each fault with its time, how long the pipeline took to
recover, lag peaks, duration):

* totals: ``costline spend`` per day and per tag set equals the independently computed sum
  (``Ledger``'s pricing) to the micro-unit;
* dead letters: ``NS.dlq.v1``, deduplicated by its key ``topic:partition:offset``, holds
  exactly the malformed messages (a multiset of raw bytes);
* Slack: no alert was posted as a new message more often than once per period plus the
  notifier's ambiguous count (from its ledger in Redis);
* reclamation: per plan at most one release record on ``NS.actions.v1``, per resource at most
  one released plan, and never the busy box.

``--write-doc docs/RELIABILITY.md`` writes the figures, the machine and the command to
reproduce as Markdown. The exit code is 0 only when every check passed.
"""

from __future__ import annotations

import argparse
import base64
import heapq
import json
import os
import platform
import random
import secrets
import sys
import tempfile
import textwrap
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaError
from redis import Redis
from redis.exceptions import RedisError

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # the test helpers below live in the repository, not the package
    sys.path.insert(0, str(REPO))

from bench.common import counted, forget_namespace, redis_client  # noqa: E402
from costline.connectors.kafka import admin  # noqa: E402
from costline.connectors.redis_client import connect  # noqa: E402
from costline.connectors.redis_keys import slot_tag, wm_key  # noqa: E402
from costline.connectors.slack_server import DEFAULT_TOKEN, LocalSlackThread  # noqa: E402
from costline.streams import stack  # noqa: E402
from costline.streams.settings import Settings  # noqa: E402
from costline.streams.topics import create_topics  # noqa: E402
from tests.integration.streamkit import (  # noqa: E402
    Ledger,
    Worker,
    _expected,
    end_offsets,
    kill_master,
    read_all,
    rows_by_group,
    spend_json,
    usage_event,
    worker_env,
)

PARTITIONS = 4
BATCH_EVENTS = 100
BATCH_ODDS = 0.0025  # of a message being a 100-event batch: about a fifth of the events
RESEND_ODDS = 0.05
RESEND_WITHIN = 2000  # messages: how much later a resend goes out
TS_SPREAD_S = 300.0  # events are stamped up to this long before they are sent
SAMPLE_EVERY_S = 5.0
BACKFILL_S = 180
BUDGET_SHARE = 0.6  # a team's budget line, as a share of the team's expected spend
KILL_PAUSE_S = 2.0  # at most this long between a SIGKILL and the restart
MIN_FAULT_GAP_S = 2.0
JOIN_TIMEOUT_S = 120.0
SAMPLE_INTERVAL_S = 0.5
DRAIN_TIMEOUT_S = 900.0
SETTLE_TIMEOUT_S = 180.0
QUIET_S = 8.0
GROUPINGS: tuple[tuple[str, ...], ...] = (
    ("team", "job"), ("project", "owner", "cluster"), ("category", "resource_type", "billing"),
    (),
)
DIMENSIONS = ("team", "job", "env", "project", "owner", "cluster", "category",
              "resource_type", "billing")
PROJECTS = {"pretrain": "llm-70b", "posttrain": "assistant-v3", "eval": "evals",
            "infra": "platform"}
OWNERS = ("alice", "bob", "chen", "dana", "eve", "farid")
ENVS = ("prod", "dev")  # as ``usage_event`` draws them
FAULT_KINDS = ("kill", "redis", "kafka", "join", "leave")
EXERCISES = {
    "kill": "SIGKILL of a worker at any point: mid-take, between sending ledger records and "
            "acknowledging their input, after a dead letter was sent but before its take was "
            "acknowledged, between a window's Redis write and the next, during a Slack call or "
            "between a reclaim claim and its outcome. Its partitions wait for the session "
            "timeout (6 s). The survivor takes its input partitions again from Kafka's "
            "committed offsets (records of a take priced again reach the ledger twice, and "
            "their home partition counts each event once) and resumes its home partitions "
            "from their Redis watermarks. The restarted worker rejoins: a second rebalance.",
    "redis": "Redis is stopped and started again on its port and data (by hand: `kill` the "
             "pid `costline stack status` shows for it, then `costline stack up` with the same "
             "flavors and `--redis-port` set to the port it showed; `up` starts only what is "
             "not running): window writes, watermark reads, the Slack and reclaim ledgers fail "
             "and are retried with backoff while `/healthz` says degraded; watermarks, sums "
             "and the dedup memory come back together from the append-only file, and a home "
             "partition whose watermark came back older is read again from the ledger. On a "
             "Redis Cluster (`--redis-state-dir`), one master at random is killed with "
             "SIGKILL and its stack's supervisor starts it again from its append-only file: "
             "the slots it serves fail meanwhile, the others go on.",
    "kafka": "the broker (also group coordinator) is stopped and started again the same "
             "way (`--kafka-port`), and returns with its log. The producer buffers and "
             "retries idempotently, Faust reconnects and rejoins, commits and dead-letter "
             "sends fail and are retried. A worker that is starting while the broker is away "
             "exits (code 1: Faust gives up bootstrapping); the run starts it again, as a "
             "supervisor does (`restart: unless-stopped` in `docker-compose.yml`), and lists "
             "it among the workers that exited by themselves.",
    "join": "a third worker joins the groups: partitions move between live workers while "
            "both still process what they fetched, so a home partition's new owner's first "
            "write finds the watermark the old owner advanced (it goes on after it) or the "
            "old owner's last window finds the new owner's.",
    "leave": "the third worker stops cleanly (SIGTERM) and leaves the groups: its partitions "
             "move back, home partitions resumed from their watermarks.",
}


class ChaosError(RuntimeError):
    """The run could not be carried out (as opposed to a check that failed)."""


class NoStack(ChaosError):
    """No running ``costline stack`` whose Kafka and Redis this run may restart."""


def log(message: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ── configuration and the stack ──────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Config:
    events: int = 200_000
    malformed: int = 10_000
    kills: int = 10
    redis_restarts: int = 2
    kafka_restarts: int = 2
    rebalances: int = 2
    rate: float = 800.0  # events per second
    seed: int = 1
    state_dir: Path | None = None
    redis_state_dir: Path | None = None  # another stack's Redis (a Redis Cluster) instead
    namespace: str | None = None
    work_dir: Path | None = None
    keep: bool = False

    @property
    def window_s(self) -> float:
        """How long producing the stream takes at ``rate``."""
        return self.events / self.rate

    def command(self) -> list[str]:
        """The command line of this run, in groups of arguments."""
        return [".venv/bin/python bench/chaos.py",
                f"--events {self.events} --malformed {self.malformed} --kills {self.kills}",
                f"--redis-restarts {self.redis_restarts} --kafka-restarts "
                f"{self.kafka_restarts} --rebalances {self.rebalances}",
                f"--rate {self.rate:g} --seed {self.seed} --state-dir "
                f"{self.state_dir or '/tmp/chaos-stack'}"
                + (f" --redis-state-dir {self.redis_state_dir}" if self.redis_state_dir else "")]


@dataclass(frozen=True)
class Stack:
    state_dir: Path
    bootstrap: str
    redis_url: str
    kafka_log: Path
    redis_dir: Path  # the stack whose Redis a fault restarts (``state_dir`` unless told)
    redis_cluster: bool


def find_stack(state_dir: Path | None, redis_state_dir: Path | None = None) -> Stack:
    """The running stack whose Kafka (Apache, log on disk) and Redis (AOF) may be restarted;
    with ``redis_state_dir``, the Redis (a single one or a Redis Cluster) of that stack."""
    folder = state_dir or (Path(os.environ["COSTLINE_STATE_DIR"])
                           if os.environ.get("COSTLINE_STATE_DIR") else None)
    if folder is None:
        raise NoStack("no stack folder: pass --state-dir or set COSTLINE_STATE_DIR")
    redis_dir = redis_state_dir or folder
    kafka_info = stack.status(folder)
    redis_info = stack.status(redis_dir) if redis_state_dir else kafka_info
    kafka = _running(kafka_info, folder, "kafka")
    if kafka.flavor != "apache":
        raise NoStack(f"the stack in {folder} runs Kafka as {kafka.name}, which keeps no log "
                      "across a restart; start it with --kafka apache")
    redis = _running(redis_info, redis_dir, "redis")
    return Stack(folder, kafka_info.exports["COSTLINE_KAFKA_BOOTSTRAP"],
                 redis_info.exports["COSTLINE_REDIS_URL"], Path(kafka.log), redis_dir,
                 redis.flavor == "cluster")


def _running(info: Any, folder: Path, role: str) -> Any:
    """The service of ``role`` of the stack in ``folder`` (its ``info``): it must be running."""
    service = next((s for s in info.services if s.role == role and s.state == "running"), None)
    if service is None:
        raise NoStack(f"the stack in {folder} does not run {role}")
    return service


# ── the expectation ──────────────────────────────────────────────────────────────────────


def utc_day(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d")


@dataclass
class RunningLedger(Ledger):
    """``Ledger``'s expectation kept as running sums per UTC day and tag set, so that a
    million events fit in memory: each event is priced by ``Ledger``'s own rule once."""

    sums: Counter[tuple[str, tuple[str, ...]]] = field(default_factory=Counter)

    def count(self, event: dict[str, Any]) -> None:
        if event["event_id"] in self.seen:
            return
        self.seen.add(event["event_id"])
        micro, dims = _expected(event, "cost")
        if micro is not None:
            self.sums[(utc_day(event["ts"]), tuple(dims.get(k, "") for k in DIMENSIONS))] += micro

    def days(self) -> list[str]:
        return sorted({day for day, _ in self.sums})

    def day_total(self, day: str, by: Sequence[str]) -> dict[tuple[str, ...], int]:
        where = [DIMENSIONS.index(key) for key in by]
        out: Counter[tuple[str, ...]] = Counter()
        for (when, dims), micro in self.sums.items():
            if when == day:
                out[tuple(dims[i] for i in where)] += micro
        return {group: micro for group, micro in out.items() if micro}


# ── the input ────────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Outgoing:
    """One Kafka message of the run."""

    key: bytes
    value: bytes
    events: int = 0
    malformed: bool = False


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def usage(rng: random.Random, event_id: str, ts: float) -> dict[str, Any]:
    """``usage_event`` with the tags a training cluster's meter adds: project, owner, cluster."""
    event = usage_event(rng, event_id, ts)
    tags = event["tags"]
    job = int(tags["job"].rsplit("-", 1)[1])
    tags.update(project=PROJECTS[tags["team"]], owner=OWNERS[job % len(OWNERS)],
                cluster=f"cluster-{'ab'[job % 2]}")
    event["resource_id"] = f"{tags['cluster']}/{event['resource_id']}"
    return event


def malformed(rng: random.Random, index: int, ts: float) -> bytes:
    """The ``index``-th refused message: ten kinds in turn, nearly all of them unique."""
    good = usage(rng, f"bad-{index}", ts)
    kind = index % 10
    if kind == 0:
        return f"not json #{index}".encode()
    if kind == 1:
        return b"\xff\xfe" + str(index).encode()
    if kind == 8:
        return b"[]"
    broken: Any = {
        2: {**good, "surprise": index},
        3: {**good, "quantity": -1 - index},
        4: {**good, "resource_type": f"gpu.unknown-{index}"},
        5: {**good, "unit": "parsec"},
        6: {**good, "ts": ts + 86400},
        7: [good, {**good, "event_id": f"bad id {index}"}],
        9: {k: v for k, v in good.items() if k not in ("tags", "quantity")},
    }[kind]
    return _dumps(broken)


@dataclass
class StreamFigures:
    events: int = 0
    single: int = 0
    batches: int = 0
    resent_messages: int = 0
    resent_events: int = 0
    malformed: int = 0


class EventStream:
    """The usage stream, counted into the ledger as it is generated; timestamps are taken
    when a message is generated, just before it is sent."""

    def __init__(self, config: Config, ledger: RunningLedger) -> None:
        self.config = config
        self.ledger = ledger
        self.rng = random.Random(config.seed)
        self.figures = StreamFigures()
        self._resends: list[tuple[int, int, Outgoing]] = []
        self._step = 0

    def messages(self) -> Iterator[Outgoing]:
        while self.figures.events < self.config.events:
            self._step += 1
            yield from self._due_resends()
            if self._malformed_due():
                yield self._malformed()
            yield self._remember(self._good())
        while self.figures.malformed < self.config.malformed:
            yield self._malformed()
        for _, _, item in sorted(self._resends):
            yield self._resent(item)
        self._resends.clear()

    def _ts(self) -> float:
        return round(time.time() - self.rng.uniform(0, TS_SPREAD_S), 3)

    def _good(self) -> Outgoing:
        left = self.config.events - self.figures.events
        if left >= BATCH_EVENTS and self.rng.random() < BATCH_ODDS:
            first = self.figures.events
            batch = [usage(self.rng, f"c{first + j}", self._ts()) for j in range(BATCH_EVENTS)]
            for event in batch:
                self.ledger.count(event)
            self.figures.events += BATCH_EVENTS
            self.figures.batches += 1
            return Outgoing(batch[0]["event_id"].encode(), _dumps(batch), BATCH_EVENTS)
        event = usage(self.rng, f"c{self.figures.events}", self._ts())
        self.ledger.count(event)
        self.figures.events += 1
        self.figures.single += 1
        return Outgoing(event["event_id"].encode(), _dumps(event), 1)

    def _remember(self, item: Outgoing) -> Outgoing:
        if self.rng.random() < RESEND_ODDS:
            due = self._step + self.rng.randint(1, RESEND_WITHIN)
            heapq.heappush(self._resends, (due, self._step, item))
        return item

    def _due_resends(self) -> Iterator[Outgoing]:
        while self._resends and self._resends[0][0] <= self._step:
            yield self._resent(heapq.heappop(self._resends)[2])

    def _resent(self, item: Outgoing) -> Outgoing:
        """A resend under a key of its own, so on any partition: the message whole, or one
        event of a batch alone."""
        self.figures.resent_messages += 1
        value, events = item.value, item.events
        if events > 1 and self.rng.random() < 0.5:
            value, events = _dumps(self.rng.choice(json.loads(value))), 1
        self.figures.resent_events += events
        return Outgoing(f"resend-{self.figures.resent_messages}".encode(), value, 0)

    def _malformed_due(self) -> bool:
        left_bad = self.config.malformed - self.figures.malformed
        left_messages = (self.config.events - self.figures.events) / (
            1 + BATCH_ODDS * (BATCH_EVENTS - 1))
        return left_bad > 0 and self.rng.random() < left_bad / max(1.0, left_messages)

    def _malformed(self) -> Outgoing:
        index = self.figures.malformed
        self.figures.malformed += 1
        return Outgoing(f"bad-{index}".encode(), malformed(self.rng, index, self._ts()),
                        malformed=True)


@dataclass(frozen=True)
class Box:
    """A GPU box that reports its utilization; the idle ones are reclaimed."""

    resource_id: str
    util: float
    owner: str

    @property
    def idle(self) -> bool:
        return self.util < 0.05

    def sample(self, ts: float) -> dict[str, Any]:
        return {"event_id": f"util-{self.resource_id}-{int(ts * 1000)}", "kind": "utilization",
                "ts": round(ts, 3), "resource_id": self.resource_id,
                "resource_type": "gpu.h100", "metric": "gpu_util", "value": self.util,
                "tags": {"team": "research", "env": "dev", "owner": self.owner,
                         "job": f"notebook-{self.owner}", "units": "8"}}


BOXES = (Box("lab/gpu-box-1", 0.01, "gus"), Box("lab/gpu-box-2", 0.02, "hana"),
         Box("lab/gpu-box-3", 0.0, "ivan"), Box("lab/gpu-box-4", 0.85, "jo"))


class Sampler:
    """Utilization samples of the boxes: a backfill proving they have been idle for a while,
    then one sample per box every ``SAMPLE_EVERY_S``."""

    def __init__(self) -> None:
        self.next_at = 0.0
        self.sent = 0

    def backfill(self, now: float) -> list[Outgoing]:
        out = []
        for box in BOXES:
            samples = [box.sample(now - age) for age in range(BACKFILL_S, 0, -10)]
            out.append(Outgoing(box.resource_id.encode(), _dumps(samples)))
        self.sent += len(out)
        return out

    def due(self, now: float) -> list[Outgoing]:
        if now < self.next_at:
            return []
        self.next_at = now + SAMPLE_EVERY_S
        self.sent += len(BOXES)
        return [Outgoing(box.resource_id.encode(), _dumps(box.sample(now))) for box in BOXES]


# ── producing ────────────────────────────────────────────────────────────────────────────


class Producer(threading.Thread):
    """Sends the stream at a steady rate of events per second; a message whose delivery
    failed is sent again (same key, same bytes). Acknowledged offsets give the end of each
    partition without asking the broker, so lag is known while it restarts."""

    def __init__(self, bootstrap: str, topic: str, stream: EventStream, sampler: Sampler,
                 rate: float) -> None:
        super().__init__(name="chaos-producer", daemon=True)
        self.bootstrap, self.topic, self.rate = bootstrap, topic, rate
        self.stream, self.sampler = stream, sampler
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.ends: dict[int, int] = {}
        self.sent = self.acked = self.failed = 0
        self.malformed_acked: list[bytes] = []
        self.malformed_retried = 0
        self.retry: deque[Outgoing] = deque()
        self.finished_at = 0.0
        self.error: BaseException | None = None

    def run(self) -> None:
        kafka = KafkaProducer(
            bootstrap_servers=self.bootstrap, acks="all", enable_idempotence=True,
            linger_ms=20, batch_size=256 * 1024, delivery_timeout_ms=600_000,
            max_block_ms=300_000, retry_backoff_ms=200, allow_auto_create_topics=False)
        try:
            self._pace(kafka)
            self._finish(kafka)
        except BaseException as exc:  # noqa: BLE001 - reported by the run
            self.error = exc
        finally:
            self.finished_at = time.time()
            kafka.close(timeout=30)

    def send_now(self, items: Sequence[Outgoing]) -> tuple[int, ...]:
        """Send outside the paced stream (the backfill); returns the acknowledged ends."""
        kafka = KafkaProducer(bootstrap_servers=self.bootstrap, acks="all",
                              enable_idempotence=True)
        try:
            for item in items:
                kafka.send(self.topic, item.value, key=item.key).add_callback(self._acked, item)
                self.sent += 1
            kafka.flush(60)
        finally:
            kafka.close(timeout=30)
        deadline = time.time() + 30
        while self.acked < self.sent:  # the callbacks may run after the flush returned
            if time.time() > deadline:
                raise ChaosError("the first messages were never acknowledged")
            time.sleep(0.05)
        return self.acked_ends()

    def _pace(self, kafka: KafkaProducer) -> None:
        began = time.monotonic()
        for item in self.stream.messages():
            if self.stop_event.is_set():
                return
            self._send(kafka, item)
            for extra in [*self.sampler.due(time.time()), *self._retries()]:
                self._send(kafka, extra)
            ahead = began + self.stream.figures.events / self.rate - time.monotonic()
            if ahead > 0.005:
                time.sleep(ahead)

    def _finish(self, kafka: KafkaProducer) -> None:
        while not self.stop_event.is_set():
            kafka.flush(timeout=600)
            pending = self._retries()
            if not pending and self.acked + self.failed >= self.sent:
                return
            for item in pending:
                self._send(kafka, item)

    def _retries(self) -> list[Outgoing]:
        with self.lock:
            items = list(self.retry)
            self.retry.clear()
        return items

    def _send(self, kafka: KafkaProducer, item: Outgoing) -> None:
        future = kafka.send(self.topic, item.value, key=item.key)
        self.sent += 1
        future.add_callback(self._acked, item)
        future.add_errback(self._failed, item)

    def _acked(self, item: Outgoing, metadata: Any) -> None:
        with self.lock:
            self.acked += 1
            partition, offset = metadata.partition, metadata.offset
            self.ends[partition] = max(self.ends.get(partition, 0), offset + 1)
            if item.malformed:
                self.malformed_acked.append(item.value)

    def _failed(self, item: Outgoing, error: Exception) -> None:
        with self.lock:
            self.failed += 1
            self.malformed_retried += item.malformed
            self.retry.append(item)

    def acked_ends(self) -> tuple[int, ...]:
        with self.lock:
            return tuple(self.ends.get(p, 0) for p in range(PARTITIONS))


# ── watching ─────────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Sample:
    t: float  # seconds since the run started
    # per input partition, then per home partition of the ledger: what is counted (intake's
    # committed offset; the Redis watermark + 1) and what there is to count (the acknowledged
    # end; the ledger's end)
    applied: tuple[int, ...]
    ends: tuple[int, ...]

    @property
    def lag(self) -> int:
        return sum(max(0, e - a) for e, a in zip(self.ends, self.applied, strict=True))


class Monitor(threading.Thread):
    """Samples twice a second how far each input partition (intake's committed offsets
    against the acknowledged ends) and each home partition of the ledger (the Redis
    watermarks against the ledger's ends) is counted. A sample Kafka or Redis cannot answer
    (while it restarts) is skipped."""

    def __init__(self, bootstrap: str, redis_url: str, namespace: str,
                 ends: Callable[[], tuple[int, ...]], began: float) -> None:
        super().__init__(name="chaos-monitor", daemon=True)
        self.bootstrap, self.group = bootstrap, f"{namespace}-intake"
        self.redis = redis_client(redis_url, timeout_s=1.0)
        self.inputs = [TopicPartition(f"{namespace}.usage.v1", p) for p in range(PARTITIONS)]
        self.ledger = [TopicPartition(f"{namespace}.ledger.v1", p) for p in range(PARTITIONS)]
        self.keys = [wm_key(slot_tag(namespace, p)) for p in range(PARTITIONS)]
        self.ends, self.began = ends, began
        self.kafka: KafkaConsumer | None = None
        self.samples: list[Sample] = []
        self.stop_event = threading.Event()

    def position(self) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """(counted, to count) per partition, or None while Kafka or Redis is away."""
        try:
            if self.kafka is None:
                self.kafka = KafkaConsumer(bootstrap_servers=self.bootstrap, group_id=self.group,
                                           enable_auto_commit=False, session_timeout_ms=6000,
                                           request_timeout_ms=7000)
            committed = [self.kafka.committed(tp, timeout_ms=1000) or 0 for tp in self.inputs]
            ledger_ends = self.kafka.end_offsets(self.ledger, timeout_ms=1000)
            pipe = self.redis.pipeline(transaction=False)
            for key in self.keys:
                pipe.get(key)
            marks = pipe.execute()
        except (RedisError, OSError, KafkaError):
            return None
        applied = (*committed, *(int(v) + 1 if v is not None else 0 for v in marks))
        return applied, (*self.ends(), *(ledger_ends[tp] for tp in self.ledger))

    def run(self) -> None:
        while not self.stop_event.wait(SAMPLE_INTERVAL_S):
            found = self.position()
            if found is not None:
                self.samples.append(Sample(time.time() - self.began, *found))
        if self.kafka is not None:
            self.kafka.close()


# ── the workers and the faults ───────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Exit:
    """A worker that stopped without being told to."""

    worker: str
    at: float
    code: int | None
    log: str


class Cluster:
    """Two workers always, a third one while a rebalance is being forced."""

    def __init__(self, envs: Mapping[str, dict[str, str]], work_dir: Path, began: float) -> None:
        self.workers = {name: Worker(env, work_dir / f"{name}.log") for name, env in envs.items()}
        self.wanted: set[str] = set()
        self.exits: list[Exit] = []
        self.began = began

    def start(self, name: str) -> None:
        self.workers[name].start()
        self.wanted.add(name)

    def kill9(self, name: str) -> None:
        worker = self.workers[name]
        if worker.alive():
            worker.kill9()

    def stop(self, name: str) -> None:
        self.wanted.discard(name)
        self.workers[name].stop()

    def running(self) -> list[str]:
        return sorted(self.wanted)

    def revive(self) -> None:
        """Restart a wanted worker that exited on its own, and remember that it did."""
        for name in sorted(self.wanted):
            worker = self.workers[name]
            if worker.alive():
                continue
            code = worker.proc.returncode if worker.proc else None
            self.exits.append(Exit(name, time.time() - self.began, code, str(worker.log)))
            log(f"{name} exited by itself (code {code}); restarting it, see {worker.log}")
            worker.start()

    def stop_all(self) -> None:
        for name in list(self.wanted):
            self.stop(name)


@dataclass
class Fault:
    kind: str
    target: str
    at: float  # seconds since the run started
    took: float  # seconds the action took
    lag_before: int | None = None
    resumed_s: float | None = None
    recovered_s: float | None = None
    lag_peak: int | None = None


def fault_plan(config: Config, rng: random.Random) -> list[tuple[float, str]]:
    """When (seconds into the stream) each fault starts: uniform over the stream's window;
    the third worker's joins and leaves alternate."""
    window = config.window_s

    def moments(count: int) -> list[float]:
        return sorted(rng.uniform(0.05, 0.85) * window for _ in range(count))

    kinds = (["kill"] * config.kills + ["redis"] * config.redis_restarts
             + ["kafka"] * config.kafka_restarts)
    rng.shuffle(kinds)
    plan = list(zip(moments(len(kinds)), kinds, strict=True))
    turns = moments(2 * config.rebalances)
    plan += [(at, "join" if i % 2 == 0 else "leave") for i, at in enumerate(turns)]
    return sorted(plan)


class FaultDriver:
    """Injects the planned faults one after the other, each at its moment or as soon as the
    previous one is over; a worker that exits by itself meanwhile is restarted."""

    def __init__(self, cluster: Cluster, found: Stack, rng: random.Random, began: float,
                 members: Callable[[], int]) -> None:
        self.cluster, self.stack, self.rng, self.began = cluster, found, rng, began
        self.members = members
        self.faults: list[Fault] = []
        self.actions: dict[str, Callable[[], str]] = {
            "kill": self._kill, "redis": self._redis, "kafka": self._kafka,
            "join": self._join, "leave": self._leave}

    def run(self, plan: Sequence[tuple[float, str]], start: float) -> None:
        ready = 0.0
        for at, kind in plan:
            self.wait_until(max(start + at, ready))
            fault = self.inject(kind)
            self.faults.append(fault)
            log(f"fault {len(self.faults)}/{len(plan)}: {kind} {fault.target} at "
                f"{fault.at:.1f}s, took {fault.took:.1f}s")
            ready = fault.at + fault.took + MIN_FAULT_GAP_S

    def wait_until(self, moment: float) -> None:
        while time.time() - self.began < moment:
            self.cluster.revive()
            time.sleep(0.25)

    def inject(self, kind: str) -> Fault:
        started = time.time()
        target = self.actions[kind]()
        return Fault(kind, target, started - self.began, time.time() - started)

    def _kill(self) -> str:
        name = self.rng.choice(self.cluster.running())
        self.cluster.kill9(name)
        time.sleep(self.rng.uniform(0, KILL_PAUSE_S))
        self.cluster.workers[name].start()
        return name

    def _redis(self) -> str:
        if self.stack.redis_cluster:
            return kill_cluster_master(self.stack.redis_url, self.rng)
        stack.restart(self.stack.redis_dir, "redis")
        return "redis"

    def _kafka(self) -> str:
        stack.restart(self.stack.state_dir, "kafka")
        return "kafka"

    def _join(self) -> str:
        """Start the third worker and wait until the group counts it (a worker still
        starting up when it is stopped again would force no rebalance)."""
        self.cluster.start("w3")
        deadline = time.time() + JOIN_TIMEOUT_S
        while time.time() < deadline and self._members() < 3:
            self.cluster.revive()
            time.sleep(0.5)
        return "w3"

    def _members(self) -> int:
        try:
            return self.members()
        except Exception:  # noqa: BLE001 - Kafka may be restarting
            return 0

    def _leave(self) -> str:
        self.cluster.stop("w3")
        return "w3"


def kill_cluster_master(url: str, rng: random.Random) -> str:
    """SIGKILL one master at random of the Redis Cluster at ``url`` and wait until its stack
    has it back; its address is the fault's target."""
    with connect(url, timeout_s=5) as cluster:
        node = rng.choice(sorted(cluster.get_primaries(), key=lambda n: n.port))
    kill_master(f"redis://{node.host}:{node.port}/0")
    return f"{node.host}:{node.port}"


def measure(faults: Sequence[Fault], samples: Sequence[Sample], tolerance: int) -> None:
    """Recovery of each fault, from the samples: ``resumed_s`` is when every partition with
    work to do (input or home) had moved past where it stood once the action was over;
    ``recovered_s`` when the lag was back within ``tolerance`` of its level before the fault
    (both from the fault's start); ``lag_peak`` the highest lag in between."""
    for fault in faults:
        before = [s for s in samples if s.t <= fault.at]
        done = fault.at + fault.took
        after = [s for s in samples if s.t >= done]
        if not before or not after:
            continue
        fault.lag_before = before[-1].lag
        base = after[0].applied
        resumed = next((s for s in after if _all_moved(s, base)), None)
        recovered = next((s for s in after if s.lag <= fault.lag_before + tolerance), None)
        fault.resumed_s = round(resumed.t - fault.at, 1) if resumed else None
        fault.recovered_s = round(recovered.t - fault.at, 1) if recovered else None
        until = recovered.t if recovered else samples[-1].t
        fault.lag_peak = max(s.lag for s in samples if fault.at <= s.t <= until)


def _all_moved(sample: Sample, base: tuple[int, ...]) -> bool:
    pending = [p for p in range(len(base)) if sample.ends[p] > base[p]]
    return bool(pending) and all(sample.applied[p] > base[p] for p in pending)


# ── the checks ───────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    figures: dict[str, Any] = field(default_factory=dict)


def check_totals(env: Mapping[str, str], ledger: RunningLedger) -> Check:
    compared, wrong = 0, []
    for day in ledger.days():
        for by in GROUPINGS:
            args = ["--period", "day", "--at", f"{day}T12:00:00Z"]
            if by:
                args += ["--by", ",".join(by)]
            found = rows_by_group(spend_json(env, *args), by, "cost")
            expected = ledger.day_total(day, by)
            compared += len(expected)
            wrong += [f"{day} {'/'.join(by) or 'total'} {group}: costline {found.get(group, 0)} "
                      f"µ, expected {micro} µ" for group, micro in expected.items()
                      if found.get(group) != micro]
            wrong += [f"{day} {'/'.join(by) or 'total'} {group}: costline {micro} µ, expected 0"
                      for group, micro in found.items() if group not in expected]
    total = sum(ledger.sums.values())
    detail = (f"{compared:,} groups over {len(ledger.days())} day(s) and {len(GROUPINGS)} "
              f"groupings equal the independent sums (total {total / 1e6:,.6f} USD)"
              if not wrong else f"{len(wrong)} group(s) differ: " + "; ".join(wrong[:8]))
    return Check("totals", not wrong, detail, {"groups": compared, "total_micro": total,
                                                "differences": len(wrong)})


def check_dead_letters(bootstrap: str, namespace: str, sent: Sequence[bytes],
                       retried: int) -> Check:
    records = read_all(bootstrap, f"{namespace}.dlq.v1", timeout_s=15)
    by_key = {record.key: json.loads(record.value) for record in records}
    source = f"{namespace}.usage.v1"
    found = Counter(base64.b64decode(letter["raw_b64"]) for letter in by_key.values())
    expected = Counter(sent)
    missing, extra = expected - found, found - expected
    foreign = sum(1 for letter in by_key.values() if letter["source_topic"] != source)
    ok = not missing and not extra and not foreign
    detail = (f"{len(by_key):,} dead letters (after deduplicating {len(records):,} records by "
              f"key) are exactly the {len(sent):,} malformed messages")
    if not ok:
        detail = (f"{sum(missing.values())} malformed message(s) missing, {sum(extra.values())} "
                  f"unexpected, {foreign} from another topic; e.g. missing "
                  f"{[m[:60] for m in list(missing)[:3]]}, unexpected "
                  f"{[m[:60] for m in list(extra)[:3]]}")
        if retried:
            detail += f" ({retried} malformed send(s) were retried after a producer error)"
    return Check("dead letters", ok, detail, {"records": len(records), "keys": len(by_key),
                                              "repeated": len(records) - len(by_key),
                                              "malformed": len(sent)})


def alert_periods(bootstrap: str, namespace: str) -> tuple[list[dict[str, Any]],
                                                             dict[str, set[str]]]:
    """The alert changes the rule engine published, and each alert's periods."""
    changes = [json.loads(m.value) for m in read_all(bootstrap, f"{namespace}.alerts.v1",
                                                     timeout_s=5)]
    periods: dict[str, set[str]] = {}
    for change in changes:
        periods.setdefault(change["alert_id"], set()).add(
            str((change.get("period") or {}).get("start")))
    return changes, periods


def root_alerts(server: Any, redis: Redis, namespace: str, known: Sequence[str]
                ) -> list[set[str]]:
    """For each top-level message in Slack, the alerts it shows: the members the notifier's
    ledger recorded for it, and any alert id its text or blocks name (a message whose post
    was never recorded has only the latter)."""
    shown = []
    for channel in server.channels.values():
        for message in channel.messages:
            fields = redis.hkeys(f"{{{namespace}:slack}}:root:{channel.id}:{message.ts}")
            members = {f.decode()[2:].rsplit("@", 1)[0] for f in fields if f.startswith(b"m:")}
            content = json.dumps([message.text, message.blocks])
            shown.append(members | {alert for alert in known if alert in content})
    return shown


def check_slack(slack: LocalSlackThread, bootstrap: str, redis_url: str,
                namespace: str) -> Check:
    changes, periods = alert_periods(bootstrap, namespace)
    server = slack.server
    redis = redis_client(redis_url, timeout_s=5.0)
    try:
        roots = root_alerts(server, redis, namespace, list(periods)) if server else []
        ambiguous = int(redis.hget(f"{{{namespace}:slack}}:counts", "ambiguous") or 0)
    finally:
        redis.close()
    posts = {alert: sum(1 for shown in roots if alert in shown) for alert in periods}
    twice = {a: n for a, n in posts.items() if n > len(periods[a]) + ambiguous}
    calls = server.calls if server else []
    figures = {
        "alerts": len(periods), "changes": len(changes), "root_messages": len(roots),
        "replies": sum(1 for c in calls if c.method == "chat.postMessage"
                       and c.params.get("thread_ts")),
        "updates": sum(1 for c in calls if c.method == "chat.update"),
        "ambiguous": ambiguous, "alerts_posted": sum(1 for n in posts.values() if n),
        "escalated": len({c["alert_id"] for c in changes if c.get("line") == "limit"}),
    }
    detail = (f"{len(periods)} alerts ({figures['escalated']} escalated to the budget line) "
              f"in {len(roots)} new messages, {figures['updates']} updates and "
              f"{figures['replies']} replies; at most {max(posts.values(), default=0)} new "
              f"message(s) per alert; ambiguous count {ambiguous}")
    if twice:
        detail = "posted more than once beyond the ambiguous count: " + ", ".join(
            f"{a} ×{n}" for a, n in twice.items())
    return Check("slack", not twice, detail, figures)


def check_reclaim(bootstrap: str, namespace: str) -> Check:
    raw = [m.value for m in read_all(bootstrap, f"{namespace}.actions.v1", timeout_s=5)]
    records = [json.loads(value) for value in dict.fromkeys(raw)]  # re-published = same bytes
    releases = [r for r in records if r["step"] == "executed" or r.get("dry_run") is True]
    per_plan = Counter(r["plan_id"] for r in releases)
    per_resource = Counter(r["resource_id"] for r in {r["plan_id"]: r for r in releases}.values())
    busy = {box.resource_id for box in BOXES if not box.idle}
    twice = [f"plan {p} released {n}×" for p, n in per_plan.items() if n > 1]
    twice += [f"{r} released by {n} plans" for r, n in per_resource.items() if n > 1]
    twice += [f"busy {r} released" for r in per_resource if r in busy]
    steps = Counter(r["step"] for r in records)
    detail = (f"{len(per_plan)} release(s) of {len(per_resource)} resource(s), each once; "
              f"{len({r['plan_id'] for r in records})} plans: "
              + ", ".join(f"{n} {step}" for step, n in steps.items()))
    if twice:
        detail = "; ".join(twice)
    return Check("reclamation", not twice, detail, {
        "records": len(raw), "republished": len(raw) - len(records), "steps": dict(steps),
        "released": sorted(per_resource)})


# ── the report ───────────────────────────────────────────────────────────────────────────


@dataclass
class Report:
    config: dict[str, Any]
    machine: dict[str, Any]
    figures: dict[str, Any]
    faults: list[Fault]
    exits: list[Exit]
    checks: list[Check]
    lag_peak: dict[str, Any]
    work_dir: str

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "ok": self.ok}, indent=2, default=str)

    def fault_counts(self) -> dict[str, int]:
        counts = Counter(fault.kind for fault in self.faults)
        return {kind: counts[kind] for kind in FAULT_KINDS if counts[kind]}

    def fault_summary(self) -> str:
        return ", ".join(f"{n} {kind}" for kind, n in self.fault_counts().items())

    def render_text(self) -> str:
        f = self.figures
        lines = [
            f"costline chaos run: {f['events']:,} events in {f['messages']:,} messages "
            f"({f['malformed']:,} malformed, {f['resent_messages']:,} resent, "
            f"{f['batches']:,} batches of {BATCH_EVENTS}, {f['samples']:,} utilization "
            f"messages) at {f['rate']:,.0f} events/s",
            f"duration {f['duration_s']:.0f}s: producing {f['produce_s']:.0f}s; caught up "
            f"{f['drain_s']:.0f}s after the stream and the faults were over; alerts and "
            f"reclamation settled {f['settle_s']:.0f}s later"
            + ("" if f["settled"] else f" (not within {SETTLE_TIMEOUT_S:.0f}s)"),
            f"faults: {self.fault_summary()}; workers that exited by themselves: "
            f"{len(self.exits)}",
            f"lag peak {self.lag_peak['lag']:,} (messages and ledger records) at "
            f"{self.lag_peak['t']:.0f}s",
            "",
            f"{'#':>3} {'fault':<6} {'target':<6} {'at s':>7} {'took s':>7} {'lag before':>11} "
            f"{'resumed s':>10} {'recovered s':>12} {'lag peak':>9}",
        ]
        for i, fault in enumerate(self.faults, 1):
            lines.append(
                f"{i:>3} {fault.kind:<6} {fault.target:<6} {fault.at:>7.1f} {fault.took:>7.1f} "
                f"{_n(fault.lag_before):>11} {_s(fault.resumed_s):>10} "
                f"{_s(fault.recovered_s):>12} {_n(fault.lag_peak):>9}")
        lines.append("")
        for check in self.checks:
            lines.append(f"{'PASS' if check.ok else 'FAIL'} {check.name}: {check.detail}")
        lines.append(f"logs: {self.work_dir}")
        return "\n".join(lines)


def _n(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def machine(redis_url: str, kafka_log: Path) -> dict[str, Any]:
    cpu = next((line.split(":", 1)[1].strip() for line in _lines("/proc/cpuinfo")
                if line.startswith("model name")), platform.processor() or "unknown")
    memory = next((int(line.split()[1]) // 1024 for line in _lines("/proc/meminfo")
                   if line.startswith("MemTotal")), None)
    kafka = next((line.split("Kafka version:", 1)[1].split()[0]
                  for line in reversed(_lines(kafka_log)) if "Kafka version:" in line), "?")
    client = redis_client(redis_url, timeout_s=5.0)
    try:
        info = client.info("server")
        # a cluster client answers per node: any node's version will do
        server = next(iter(info.values())) if "redis_version" not in info else info
        redis_version = server.get("redis_version", "?")
    finally:
        client.close()
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_mib": memory,
            "os": platform.platform(), "python": platform.python_version(),
            "kafka": f"Apache Kafka {kafka}", "redis": f"Redis {redis_version}",
            "load_at_start": [round(x, 2) for x in os.getloadavg()]}


def _lines(path: str | Path) -> list[str]:
    try:
        return Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return []


def _wrap(text: str, indent: str = "") -> str:
    return textwrap.fill(text, width=96, subsequent_indent=indent, break_long_words=False,
                         break_on_hyphens=False)


def _bullets(items: Sequence[str]) -> str:
    return "\n".join(_wrap(f"* {item}", "  ") for item in items)


def _md_result(report: Report) -> str:
    rows = "\n".join(f"| {check.name} | {'pass' if check.ok else '**FAIL**'} | "
                     f"{check.detail} |" for check in report.checks)
    verdict = "Every check passed." if report.ok else "**Some checks failed** (see below)."
    return f"## Result\n\n{verdict}\n\n| check | verdict | detail |\n|---|---|---|\n{rows}"


def _md_run(report: Report) -> str:
    f = report.figures
    exits = "none" if not report.exits else "; ".join(
        f"{e.worker} at {e.at:.0f} s (exit code {e.code})" for e in report.exits)
    unsettled = "" if f["settled"] else " (not all of them: the checks ran anyway)"
    return "## The run\n\n" + _bullets([
        f"{f['events']:,} usage events in {f['messages']:,} Kafka messages on {PARTITIONS} "
        f"partitions: {f['single']:,} single events, {f['batches']:,} batches of "
        f"{BATCH_EVENTS} events, {f['resent_messages']:,} resends (same `event_id`s under a "
        f"key of their own, a batch whole or one of its events alone; "
        f"{f['resent_events']:,} events), {f['malformed']:,} malformed messages and "
        f"{f['samples']:,} utilization messages of {len(BOXES)} GPU boxes "
        f"({sum(b.idle for b in BOXES)} idle, 1 busy). Tags `team`, `project`, `job`, "
        f"`owner`, `cluster`, `env`; event times up to {TS_SPREAD_S:.0f} s before sending.",
        f"Produced at a steady {f['rate']:,.0f} events/s for {f['produce_s']:.0f} s; total "
        f"duration {f['duration_s']:.0f} s. The workers had caught up {f['drain_s']:.0f} s "
        f"after the stream was sent and the last fault was over; every alert change had been "
        f"handled and every idle box's plan closed {f['settle_s']:.0f} s later{unsettled}.",
        f"Rules: a daily budget per team and env (limit {f['budget_limit']:,} USD, warning at "
        f"50%), which fires and escalates on the stream's own spend; an idle rule (`gpu_util` "
        "below 0.05 for 1 m) with `reclaim: {connector: dry_run, grace: 5s}`, `mode: live`. "
        "Alerts go to a local Slack server (`connectors/slack_server.py`).",
        f"Faults: {report.fault_summary()} (a `join` adds a third worker to the group, the "
        f"next `leave` removes it). Workers that exited by themselves: {exits}.",
        f"Lag peak: {report.lag_peak['lag']:,} input messages and ledger records, "
        f"{report.lag_peak['t']:.0f} s into "
        "the run.",
    ])


def _md_faults(report: Report) -> str:
    rows = "\n".join(
        f"| {i} | {fault.kind} | {fault.target} | {fault.at:.1f} | {fault.took:.1f} | "
        f"{_n(fault.lag_before)} | {_s(fault.resumed_s)} | {_s(fault.recovered_s)} | "
        f"{_n(fault.lag_peak)} |" for i, fault in enumerate(report.faults, 1))
    legend = _wrap(
        f"Times are seconds since the run started. *took* is how long the fault itself lasted "
        f"(a killed worker is restarted after a random pause of up to {KILL_PAUSE_S:.0f} s; a "
        "restart of Redis or Kafka lasts until the service answers again; a join until the "
        "group counts the third worker; a leave until it has exited). *resumed* is when every "
        "partition with work to do had moved past where it stood when the fault was over: an "
        "input partition's committed offset, a home partition's Redis watermark; *recovered* "
        "is when the lag (input messages acknowledged and not committed, plus ledger records "
        f"not applied) was back within {report.figures['tolerance']:,} (2 s of production) of "
        "its level before the fault; both count from the fault's start. *lag "
        "peak* is the highest lag in between. A `-` means that moment did not come before the "
        f"run ended. Faults overlap in effect: the figures are sampled every "
        f"{SAMPLE_INTERVAL_S} s and a fault's recovery includes whatever came after it.")
    header = ("| # | fault | target | at s | took s | lag before | resumed s | recovered s | "
              "lag peak |\n|---|---|---|---|---|---|---|---|---|")
    return f"## Faults and recovery\n\n{legend}\n\n{header}\n{rows}"


def _md_checked() -> str:
    groupings = ", ".join("`" + ",".join(g) + "`" for g in GROUPINGS if g)
    return "## What is checked\n\n" + _bullets([
        "**totals** — `costline spend --period day --by …` for each UTC day the events fall "
        f"in, grouped by {groupings} and in total, equals the sum computed independently from "
        "the generated events (`Ledger`'s pricing in `tests/integration/streamkit.py`, each "
        "`event_id` once), to the micro-unit.",
        "**dead letters** — `NS.dlq.v1`, deduplicated by its key `topic:partition:offset` (a "
        "worker killed after sending a dead letter but before acknowledging its batch sends it "
        "again under the same key), holds exactly the malformed messages sent, compared as a "
        "multiset of raw bytes.",
        "**slack** — per alert id, the new (top-level) messages on the Slack server are at "
        "most one per alert period plus the notifier's ambiguous count (`{NS:slack}:counts`: "
        "steps left in doubt by a process that died between a Slack call and its answer).",
        "**reclamation** — on `NS.actions.v1` (re-published records deduplicated by their "
        "bytes), each plan has at most one release record (`executed`, or the `dry_run` "
        "connector's release, recorded as `skipped` with `\"dry_run\": true` after the "
        "execution claim), each resource at most one released plan, and the busy box none.",
    ])


def _md_machine(report: Report) -> str:
    m = report.machine
    return "## Machine\n\n" + _wrap(
        f"{m['cores']} cores ({m['cpu']}), {m['memory_mib']:,} MiB memory, {m['os']}, Python "
        f"{m['python']}, {m['kafka']} (KRaft, one node, log on disk), {m['redis']} "
        "(append-only file, fsync every second). Load average (1, 5, 15 min) when the run "
        f"started: {', '.join(str(x) for x in m['load_at_start'])}.")


def _md_reproduce(report: Report) -> str:
    command = " \\\n    ".join([*report.figures["command"], "--write-doc docs/RELIABILITY.md"])
    return f"""## Reproduce

```
export COSTLINE_KAFKA_LIBS=...   # optional: a folder with Apache Kafka's jars, else Maven
.venv/bin/costline stack up --kafka apache --redis system --kafka-port 0 --redis-port 0 \\
    --state-dir /tmp/chaos-stack
{command}
.venv/bin/costline stack down --state-dir /tmp/chaos-stack
```

`make chaos` runs the full size (1,000,000 events); `tests/integration/test_chaos.py` runs
shorter ones in CI against the CI stack: on its Redis, and on a Redis Cluster of three masters
(`--redis-state-dir`), where a Redis fault kills one master."""


def render_markdown(report: Report) -> str:
    intro = _wrap(
        "`bench/chaos.py` runs the whole pipeline — two `costline worker` processes on one "
        "consumer group, the rules, the Slack notifier and reclamation — while it kills "
        "workers, restarts Redis and the Kafka broker and forces rebalances, then checks that "
        "nothing was lost or counted twice. This page is written by the run (`--write-doc`); "
        "the figures are those of one run.")
    exercised = "## What each fault exercises\n\n" + _bullets(
        [f"**{kind}** — {EXERCISES[kind]}" for kind in FAULT_KINDS])
    sections = [f"# Reliability: the pipeline under chaos\n\n{intro}", _md_result(report),
                _md_run(report), _md_faults(report), exercised, _md_checked(),
                _md_machine(report), _md_reproduce(report)]
    return "\n\n".join(sections) + "\n"


# ── the run ──────────────────────────────────────────────────────────────────────────────

RULES = """\
rules:
  - name: chaos-team-daily
    kind: budget
    group_by: [team, env]
    period: day
    limit: {limit}
    warn_at: [0.5]
    severity: warning
    notify: {{slack: "#ml-budgets"}}
  - name: chaos-gpu-idle
    kind: idle
    match: {{resource_type: "gpu.*", team: research}}
    group_by: [team]
    metric: gpu_util
    below: 0.05
    for: 1m
    reclaim: {{connector: dry_run, grace: 5s}}
    mode: live
    severity: warning
    notify: {{slack: "#ml-gpu-idle"}}
"""


def budget_limit(config: Config) -> int:
    """The budget line of a team and env: ``BUDGET_SHARE`` of its expected spend in this run,
    so that the warning fires at about a third of the stream and the budget line later."""
    rng = random.Random(config.seed + 1)
    micro = [_expected(usage(rng, f"p{i}", time.time()), "cost")[0] or 0 for i in range(4000)]
    per_group = sum(micro) / len(micro) * config.events / (len(PROJECTS) * len(ENVS))
    return max(1, int(per_group * BUDGET_SHARE / 1e6))


class Run:
    """One chaos run against one stack; ``execute`` returns its report."""

    def __init__(self, config: Config, found: Stack) -> None:
        self.config, self.stack = config, found
        self.namespace = config.namespace or "chaos" + secrets.token_hex(4)
        self.work_dir = config.work_dir or Path(tempfile.mkdtemp(prefix="costline-chaos-"))
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.topic = f"{self.namespace}.usage.v1"
        self.began = time.time()
        self.rng = random.Random(config.seed)
        self.ledger = RunningLedger()
        self.stream = EventStream(config, self.ledger)
        self.sampler = Sampler()
        self.producer = Producer(found.bootstrap, self.topic, self.stream, self.sampler,
                                 config.rate)
        self.monitor = Monitor(found.bootstrap, found.redis_url, self.namespace,
                               self.producer.acked_ends, self.began)
        self.settings = Settings(kafka_bootstrap=found.bootstrap, redis_url=found.redis_url,
                                 namespace=self.namespace, partitions=PARTITIONS)
        self.redis = redis_client(found.redis_url, timeout_s=5.0)
        self.slack = LocalSlackThread(["ml-budgets", "ml-gpu-idle", "costline-alerts"])
        self.limit = budget_limit(config)
        self.cluster: Cluster | None = None
        self.marks: dict[str, float] = {}
        self.settled_in_time = False

    # the phases

    def execute(self) -> Report:
        log(f"namespace {self.namespace}, logs in {self.work_dir}")
        machine_info = machine(self.stack.redis_url, self.stack.kafka_log)
        try:
            cluster = self.prepare()
            driver = FaultDriver(cluster, self.stack, self.rng, self.began,
                                 self.group_members)
            self.stream_with_faults(driver)
            self.drain(cluster)
            self.settle(cluster)
            cluster.stop_all()
            checks = self.check()
        finally:
            self.shutdown()
        return self.report(machine_info, driver.faults, cluster.exits, checks)

    def prepare(self) -> Cluster:
        create_topics(self.settings)
        rules = self.work_dir / "rules.yaml"
        rules.write_text(RULES.format(limit=self.limit))
        url = self.slack.start()
        envs = {name: self.env(name, rules, url) for name in ("w1", "w2", "w3")}
        self.cluster = Cluster(envs, self.work_dir, self.began)
        for name in ("w1", "w2"):
            self.cluster.start(name)
        self.monitor.start()
        self.producer.send_now(self.sampler.backfill(time.time()))
        self.wait(self.counted, 300, "the workers to count the first samples",
                  self.cluster)
        log(f"workers ready after {time.time() - self.began:.0f}s; budget line "
            f"{self.limit} USD per team and env")
        return self.cluster

    def env(self, name: str, rules: Path, slack_url: str) -> dict[str, str]:
        folder = self.work_dir / name
        folder.mkdir(exist_ok=True)
        return worker_env(self.namespace, self.stack.bootstrap, self.stack.redis_url,
                          COSTLINE_RULES=str(rules), COSTLINE_RULES_TICK_S="2",
                          COSTLINE_TIMEZONE="UTC", COSTLINE_STATE_DIR=str(folder),
                          SLACK_BOT_TOKEN=DEFAULT_TOKEN, SLACK_API_URL=slack_url)

    def stream_with_faults(self, driver: FaultDriver) -> None:
        plan = fault_plan(self.config, self.rng)
        start = time.time() - self.began
        self.marks["produce_start"] = start
        log(f"streaming {self.config.events:,} events at {self.config.rate:g}/s "
            f"(~{self.config.window_s:.0f}s) with {len(plan)} faults")
        self.producer.start()
        driver.run(plan, start)
        while self.producer.is_alive():
            driver.cluster.revive()
            self.producer.join(0.5)
        if self.producer.error is not None:
            raise ChaosError(f"producing failed: {self.producer.error!r}")
        self.marks["produce_end"] = self.producer.finished_at - self.began
        self.marks["faults_end"] = time.time() - self.began

    def drain(self, cluster: Cluster) -> None:
        cluster.stop("w3")
        log(f"stream sent; waiting until its {self.producer.acked:,} messages are counted")
        self.wait(self.counted, DRAIN_TIMEOUT_S, "the workers to catch up", cluster)
        self.marks["drained"] = time.time() - self.began

    def settle(self, cluster: Cluster) -> None:
        """Until every alert change was handled by the notifier, every idle box's plan is
        closed, and Slack has been quiet for a while (or ``SETTLE_TIMEOUT_S``)."""
        log("waiting for alerts and reclamation to settle")
        self.settled_in_time = self.wait(self.settled, SETTLE_TIMEOUT_S, "", cluster,
                                         interval=2.0)
        self.marks["settled"] = time.time() - self.began
        if not self.settled_in_time:
            log("alerts or reclamation did not settle; checking anyway")

    def settled(self) -> bool:
        server = self.slack.server
        calls = server.calls if server else []
        quiet = not calls or time.time() - calls[-1].at >= QUIET_S
        return quiet and self.notifier_done() and self.plans_closed()

    def notifier_done(self) -> bool:
        topic = f"{self.namespace}.alerts.v1"
        ends = end_offsets(self.stack.bootstrap, topic)
        consumer = KafkaConsumer(bootstrap_servers=self.stack.bootstrap,
                                 group_id=f"{self.namespace}-aggregator",
                                 enable_auto_commit=False)
        try:
            return all((consumer.committed(TopicPartition(topic, p)) or 0) >= end
                       for p, end in ends.items())
        finally:
            consumer.close()

    def plans_closed(self) -> bool:
        records = [json.loads(m.value) for m in read_all(
            self.stack.bootstrap, f"{self.namespace}.actions.v1", timeout_s=2)]
        closed = {r["resource_id"] for r in records
                  if r["step"] in ("executed", "skipped", "failed")}
        return all(box.resource_id in closed for box in BOXES if box.idle)

    def check(self) -> list[Check]:
        log("checking")
        env = self.cluster.workers["w1"].env if self.cluster else {}
        return [
            check_totals(env, self.ledger),
            check_dead_letters(self.stack.bootstrap, self.namespace,
                               self.producer.malformed_acked, self.producer.malformed_retried),
            check_slack(self.slack, self.stack.bootstrap, self.stack.redis_url, self.namespace),
            check_reclaim(self.stack.bootstrap, self.namespace),
        ]

    def shutdown(self) -> None:
        self.producer.stop_event.set()
        self.monitor.stop_event.set()
        if self.cluster is not None:
            self.cluster.stop_all()
        if self.slack.thread.is_alive():
            self.slack.stop()
        self.redis.close()
        if not self.config.keep:
            forget_namespace(self.stack.bootstrap, self.stack.redis_url, self.namespace)

    # helpers

    def group_members(self) -> int:
        group = f"{self.namespace}-aggregator"
        client = admin(self.stack.bootstrap, timeout_s=5)
        try:
            return len(client.describe_groups([group]).get(group, {}).get("members") or [])
        finally:
            client.close()

    def counted(self) -> bool:
        """Whether everything acknowledged so far is counted in Redis."""
        return counted(self.settings, self.redis)

    def wait(self, condition: Callable[[], bool], timeout: float, what: str,
             cluster: Cluster, interval: float = 0.5) -> bool:
        deadline = time.time() + timeout
        while time.time() < deadline:
            cluster.revive()
            try:
                if condition():
                    return True
            except Exception as exc:  # noqa: BLE001 - a service may be restarting
                log(f"not yet ({type(exc).__name__}: {exc})")
            time.sleep(interval)
        if what:
            raise ChaosError(f"timed out after {timeout:.0f}s waiting for {what}; "
                             f"see {self.work_dir}")
        return False

    @staticmethod
    def retry(call: Callable[[], Any], tries: int = 20) -> Any:
        for attempt in range(tries):
            try:
                return call()
            except Exception:  # noqa: BLE001 - Kafka may still be starting
                if attempt == tries - 1:
                    raise
                time.sleep(3)
        return None

    def report(self, machine_info: dict[str, Any], faults: list[Fault], exits: list[Exit],
               checks: list[Check]) -> Report:
        figures = self.figures()
        measure(faults, self.monitor.samples, figures["tolerance"])
        peak = max(self.monitor.samples, key=lambda s: s.lag, default=Sample(0, (), ()))
        config = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self.config).items()}
        return Report(config, machine_info, figures, faults, exits, checks,
                      {"lag": peak.lag, "t": round(peak.t, 1)}, str(self.work_dir))

    def figures(self) -> dict[str, Any]:
        marks, stream = self.marks, self.stream.figures
        produce_s = marks["produce_end"] - marks["produce_start"]
        messages = self.producer.sent
        return {
            **asdict(stream), "samples": self.sampler.sent, "messages": messages,
            "rate": self.config.rate, "produce_s": round(produce_s, 1),
            "drain_s": round(marks["drained"] - marks["faults_end"], 1),
            "settle_s": round(marks["settled"] - marks["drained"], 1),
            "settled": self.settled_in_time,
            "duration_s": round(time.time() - self.began, 1),
            "producer_send_failures": self.producer.failed,
            "tolerance": max(500, int(2 * messages / max(produce_s, 1.0))),
            "budget_limit": self.limit, "namespace": self.namespace,
            "command": self.config.command(),
        }


def run(config: Config) -> Report:
    """Carry out one chaos run; raises ``NoStack`` when there is no stack to restart."""
    return Run(config, find_stack(config.state_dir, config.redis_state_dir)).execute()


# ── command line ─────────────────────────────────────────────────────────────────────────


def arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench/chaos.py", description=__doc__.split("\n")[0])
    defaults = Config()
    parser.add_argument("--events", type=int, default=defaults.events)
    parser.add_argument("--malformed", type=int, default=defaults.malformed)
    parser.add_argument("--kills", type=int, default=defaults.kills,
                        help="SIGKILLs of a worker (each followed by a restart)")
    parser.add_argument("--redis-restarts", type=int, default=defaults.redis_restarts)
    parser.add_argument("--kafka-restarts", type=int, default=defaults.kafka_restarts)
    parser.add_argument("--rebalances", type=int, default=defaults.rebalances,
                        help="times a third worker joins the group and later leaves it")
    parser.add_argument("--rate", type=float, default=defaults.rate, help="events per second")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--state-dir", type=Path, default=None,
                        help="the costline stack to restart (default $COSTLINE_STATE_DIR)")
    parser.add_argument("--redis-state-dir", type=Path, default=None,
                        help="use the Redis of this costline stack instead, e.g. a Redis "
                        "Cluster (stack up --kafka none --redis cluster): a Redis restart "
                        "is then a kill -9 of one master, which the stack starts again")
    parser.add_argument("--namespace", default=None, help="default: chaos<random hex>")
    parser.add_argument("--keep", action="store_true",
                        help="keep the run's topics and Redis keys")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--write-doc", type=Path, default=None, metavar="FILE",
                        help="write the report as Markdown (docs/RELIABILITY.md)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = arguments(argv)
    config = Config(events=args.events, malformed=args.malformed, kills=args.kills,
                    redis_restarts=args.redis_restarts, kafka_restarts=args.kafka_restarts,
                    rebalances=args.rebalances, rate=args.rate, seed=args.seed,
                    state_dir=args.state_dir, redis_state_dir=args.redis_state_dir,
                    namespace=args.namespace, keep=args.keep)
    try:
        report = run(config)
    except ChaosError as exc:
        print(f"chaos: {exc}", file=sys.stderr)
        return 2
    print(report.to_json() if args.json else report.render_text())
    if args.write_doc is not None:
        args.write_doc.write_text(render_markdown(report))
        log(f"wrote {args.write_doc}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
