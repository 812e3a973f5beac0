"""The Faust application: the worker's agents, timers and pages, wired from the settings.

Topics carry raw bytes and the aggregation agent decodes them itself
(``costline.rules.events.parse_message``), so a bad message becomes a dead letter instead of an
exception inside Faust. The agent takes messages in batches (``take_events``) and folds them
into per-partition windows that a writer task applies to Redis, one script call per window
(``costline.streams.worker.aggregator``). The app's consumer hands each message to the agent's
stream without
a task per message (``costline.streams.worker.handoff``).

Where to resume a partition is decided by Redis, not by Kafka's committed offsets: when a
rebalance completes, and before Faust seeks to the committed offsets, the worker commits the
offset after each partition's Redis watermark, so Faust's own seek lands exactly there.

The rule engine and reclamation run on the Faust leader only (one worker of the group), so two
workers never race on the alert book or on a release.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import faust
from faust.types import TP
from redis import Redis as SyncRedis
from redis.asyncio import Redis
from redis.exceptions import ReadOnlyError

import costline.connectors.reclaim  # noqa: F401 - reclaimers validate their rule parameters
from costline.connectors import bucket_zone
from costline.connectors.alert_store import AlertStore
from costline.connectors.kafka import MAX_MESSAGE_BYTES, KafkaUnavailable, api_versions
from costline.connectors.redis_apply import BatchWriter
from costline.connectors.redis_keys import Calendar
from costline.connectors.redis_state import RedisState
from costline.connectors.slack_actions import add_actions_route
from costline.rules.prices import PriceBook
from costline.rules.tally import Folder
from costline.streams.settings import Settings
from costline.streams.worker import collector, handoff
from costline.streams.worker.aggregator import REDIS_DOWN, Aggregator
from costline.streams.worker.evaluation_process import ProcessRunner
from costline.streams.worker.evaluator import Evaluator, RuleSource
from costline.streams.worker.folding import Folding, FoldingPool, ProcessFolding
from costline.streams.worker.health import Health
from costline.streams.worker.metrics import Metrics
from costline.streams.worker.notifier import (
    build_actions_handler,
    build_notifier,
    deliver_until_done,
)
from costline.streams.worker.reclaim_alerts import cap_breach_alert, is_cap_breach
from costline.streams.worker.reclaimer import ReclaimActions, Reclaimer, build_reclaimer

log = logging.getLogger("costline.worker")

SOURCES = {"usage": "usage", "faults": "faults"}
# How often a worker checks that Redis still holds the watermarks of its idle partitions.
WATERMARK_CHECK_S = 10.0
# Input messages not yet applied to Redis (over the worker's partitions) from which
# the
# aggregation counts as behind, and rule evaluations rest longer
# (costline.streams.worker.evaluator): more
# than a few takes of messages waiting, whatever a message holds.
BEHIND_MESSAGES = 1_000
Send = Callable[[bytes, bytes], Awaitable[None]]


def faust_broker(bootstrap: str) -> list[str]:
    return [f"kafka://{server.strip()}" for server in bootstrap.split(",") if server.strip()]


def faust_app(settings: Settings, app_class: type[faust.App] | None = None) -> faust.App:
    """The worker's Faust app (``handoff.App``); ``app_class=faust.App`` gives it Faust's own
    consumer."""
    app_class = app_class or handoff.App
    datadir = settings.state_dir / "faust" / settings.namespace
    datadir.parent.mkdir(parents=True, exist_ok=True)  # Faust creates only the last level
    app = app_class(
        f"{settings.namespace}-aggregator",
        broker=faust_broker(settings.kafka_bootstrap),
        # TLS and SASL for Faust's consumer, producer and topic creation alike.
        broker_credentials=settings.kafka_security().faust_credentials(),
        store="memory://",
        datadir=str(datadir),
        web_port=settings.web_port,
        web_host="0.0.0.0",
        autodiscover=False,
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=settings.kafka_session_timeout_s,
        broker_heartbeat_interval=min(3.0, settings.kafka_session_timeout_s / 3),
        broker_rebalance_timeout=settings.kafka_rebalance_timeout_s,
        topic_partitions=settings.partitions,
        topic_allow_declare=True,
        producer_acks=-1,
        # The dead letter of a refused 10,000-event batch is a few MiB (topics allow 16 MiB).
        producer_max_request_size=MAX_MESSAGE_BYTES,
        # Messages Faust buffers ahead of the agent. 100-event batches are ~33 KB each, so
        # its default of 4,096 could hold 130 MiB; a few takes ahead keep the agent busy.
        stream_buffer_maxsize=max(1024, settings.batch_messages * 4),
        # Compressed bytes fetched ahead per partition: by default Kafka's own 1 MiB, not
        # Faust's 4 MiB, so a worker owning 24 partitions holds at most 24 MiB of them.
        consumer_max_fetch_size=settings.fetch_bytes,
        broker_commit_every=max(10_000, settings.batch_messages * 4),
        web_in_thread=False,
    )
    if isinstance(app, handoff.App):  # set before its consumer (made on first use) polls
        app.poll_bytes = settings.poll_bytes
    return app


class Wiring:
    """Builds the worker one concern at a time, on one Faust app and shared clients."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.app = faust_app(settings)
        self.metrics, self.health = Metrics(), Health()
        self.prices = PriceBook.load(settings.prices)
        self.redis = Redis.from_url(settings.redis_url, socket_timeout=10,
                                    socket_connect_timeout=5, health_check_interval=15)
        self.sync_redis = SyncRedis.from_url(settings.redis_url, socket_timeout=10,
                                             socket_connect_timeout=5)

    def topic(self, *names: str) -> Any:
        """Topics whose agents take Kafka's bytes and decode them themselves."""
        return self.app.topic(*(self.settings.topic(n) for n in names),
                              schema=handoff.RawSchema())

    def sender(self, name: str) -> Send:
        """Send to an output topic and wait for Kafka's acknowledgement."""
        topic_name = self.settings.topic(name)

        async def send(key: bytes, value: bytes) -> None:
            await self.app.producer.send_and_wait(topic_name, key, value, partition=None,
                                                  timestamp=None, headers=None)
        return send

    def every(self, seconds: float, name: str, step: Callable[[], Awaitable[Any]], *,
              on_leader: bool = False) -> None:
        """A timer whose failures are reported and retried on its next run, never fatal."""
        async def run() -> None:
            try:
                await step()
            except REDIS_DOWN as exc:
                self.health.failing("redis", exc)
            except Exception:  # noqa: BLE001 - one failed round must not stop the worker
                self.metrics.inc(f"{name}_errors_total")
                log.exception("%s failed", name)
        run.__name__ = run.__qualname__ = name
        self.app.timer(interval=seconds, on_leader=on_leader)(run)

    # -- concerns ---------------------------------------------------------------------

    def folding(self) -> Folding | None:
        """Where the aggregation folds (None: in the worker's process)."""
        settings = self.settings
        if settings.folding == "inline":
            return None
        takes, processes = settings.folding_takes, settings.folding_processes
        if processes == 1:
            return ProcessFolding(self.prices, takes)
        # in a pool the takes are the pool's, in all: its members' own depth is not used
        return FoldingPool([ProcessFolding(self.prices) for _ in range(processes)], takes)

    def aggregation(self) -> Aggregator:
        settings, app = self.settings, self.app
        sources = {settings.topic(name): short for name, short in SOURCES.items()}

        async def seek(topic: str, partition: int, offset: int) -> None:
            # seek_wait runs in the consumer's own thread: a seek from this one races the
            # fetcher resetting the same partition, and can kill aiokafka's fetch routine.
            await app.consumer.seek_wait({TP(topic, partition): offset})

        aggregator = Aggregator(
            namespace=settings.namespace, sources=sources,
            writer=BatchWriter(self.redis, settings.namespace, Calendar(settings.timezone),
                               settings.dedup_horizon_s),
            folder=Folder(self.prices), send_dead_letter=self.sender("dlq"), seek=seek,
            metrics=self.metrics, health=self.health, window_events=settings.window_events,
            window_linger_s=settings.window_linger_s, unwritten_events=settings.unwritten_events,
            folding=self.folding(),
        )
        source = self.topic(*SOURCES)

        @app.agent(source, concurrency=1)
        async def aggregate(stream: Any) -> None:
            async for events in stream.take_events(settings.batch_messages,
                                                   within=settings.batch_within_s):
                await aggregator.handle([event.message for event in events])

        @app.on_rebalance_complete.connect
        async def resume_from_redis(sender: Any, **kwargs: Any) -> None:
            assigned = [(tp.topic, tp.partition) for tp in app.consumer.assignment()]
            owned = set(assigned)
            aggregator.on_revoked([tp for tp in aggregator.partitions if tp not in owned])
            resume = await aggregator.on_assigned(assigned)
            if resume:
                # Faust seeks to the committed offsets right after this signal; aiokafka skips
                # a committed offset of 0, so seek here as well to cover a fresh watermark
                # (in the consumer's thread, as above).
                offsets = {TP(t, p): o for (t, p), o in resume.items()}
                await app.consumer._commit(offsets)
                await app.consumer.seek_wait(offsets)
                log.info("resuming %d partitions from Redis watermarks", len(resume))

        self.metrics.gauge("consumer_lag", lambda: self._lag(aggregator))
        self.metrics.gauge("tagsets_known",
                           lambda: {(): float(aggregator.writer.known_tagsets)})
        self.metrics.gauge("unwritten_events", lambda: {(): float(aggregator.unwritten())})
        self.every(WATERMARK_CHECK_S, "watermark_check", aggregator.verify_watermarks)

        async def record_zone() -> None:
            # Recorded at start (``costline worker``); again here, for a Redis that lost it.
            # Found different (another worker recorded its own zone first), it is shown in
            # /healthz: daily buckets are then being named in two zones.
            try:
                await asyncio.to_thread(bucket_zone.claim, self.sync_redis, settings.namespace,
                                        settings.timezone)
            except bucket_zone.ZoneMismatch as exc:
                self.health.failing("bucket_zone", str(exc))
                log.error("%s", exc)
            except ReadOnlyError:
                pass  # the aggregation's writes report it, as redis_writes
            else:
                self.health.recovered("bucket_zone")
        self.every(WATERMARK_CHECK_S, "zone_record", record_zone)
        return aggregator

    def alerting(self, aggregator: Aggregator) -> Evaluator:
        settings = self.settings
        runner = ProcessRunner(settings, self.prices) if settings.evaluator == "process" else None
        return Evaluator(
            source=RuleSource(settings.rules, settings.timezone, self.prices, self.health),
            state=RedisState(self.sync_redis, settings.namespace, settings.timezone),
            store=AlertStore(self.sync_redis, settings.namespace),
            publish=self.sender("alerts"), metrics=self.metrics, tick_s=settings.rules_tick_s,
            runner=runner,
            behind=lambda: sum(self._lag(aggregator).values()) >= BEHIND_MESSAGES,
        )

    def reclamation(self, evaluator: Evaluator) -> Reclaimer:
        send, alert = self.sender("actions"), self.sender("alerts")

        async def publish(record: dict[str, Any]) -> None:
            await send(str(record.get("action_id", "")).encode(),
                       json.dumps(record, separators=(",", ":")).encode())
            if is_cap_breach(record):
                change = cap_breach_alert(record, _notify_of(evaluator, record.get("rule")))
                await alert(change["alert_id"].encode(),
                            json.dumps(change, separators=(",", ":")).encode())

        reclaimer = build_reclaimer(self.settings, rules=evaluator.source.rules, sink=publish)

        async def evaluate() -> None:
            evaluation = await evaluator.step()
            if evaluation is not None:
                # Reused findings were submitted when they were found.
                await reclaimer.submit(evaluation.evaluated(), evaluation.at)

        # Polling the data generation is one MGET: often enough that an alert follows its
        # spend within a fraction of a second; the evaluator decides whether to evaluate.
        self.every(self.settings.rules_poll_s, "evaluation", evaluate, on_leader=True)
        # Grace periods end, plans are re-verified and released with time alone.
        self.every(self.settings.reclaim_tick_s, "reclaim", reclaimer.tick, on_leader=True)
        return reclaimer

    def slack(self, evaluator: Evaluator, reclaimer: Reclaimer) -> None:
        notifier = build_notifier(self.settings, self.redis)
        metrics, health = self.metrics, self.health

        @self.app.agent(self.topic("alerts"), concurrency=1)
        async def notify(stream: Any) -> None:
            async for events in stream.take_events(200, within=2.0):
                await deliver_until_done(notifier, [e.message.value for e in events], metrics,
                                         health)

        buttons = build_actions_handler(self.settings, self.redis, evaluator.store, notifier,
                                        reclaim=ReclaimActions(reclaimer))
        if buttons is not None:
            add_actions_route(self.app.web.web_app, buttons)

    def probes(self) -> None:
        """An idle worker makes no Redis or Kafka calls of its own: these make an outage
        visible in ``/healthz`` anyway (Faust reconnects to Kafka by itself)."""
        health, settings = self.health, self.settings
        security = settings.kafka_security()

        async def redis_answers() -> None:
            try:
                await asyncio.wait_for(self.redis.ping(), timeout=2.0)
            except (TimeoutError, *REDIS_DOWN) as exc:
                health.failing("redis", exc)
            else:
                health.recovered("redis")

        async def kafka_answers() -> None:
            try:
                await asyncio.to_thread(api_versions, settings.kafka_bootstrap, 2.0, security)
            except KafkaUnavailable as exc:
                health.failing("kafka", str(exc))
            else:
                health.recovered("kafka")

        self.every(2.0, "redis_probe", redis_answers)
        self.every(5.0, "kafka_probe", kafka_answers)

    def garbage_collection(self) -> None:
        @self.app.task
        async def settle_collector() -> None:
            """Once the worker has started (costline.streams.worker.collector)."""
            collector.settle()

    def pages(self) -> None:
        health, metrics = self.health, self.metrics

        @self.app.page("/healthz")
        async def healthz(web: Any, request: Any) -> Any:
            return web.json(health.report(), status=200 if health.ok else 503)

        @self.app.page("/metrics")
        async def metrics_page(web: Any, request: Any) -> Any:
            return web.text(metrics.render(), content_type="text/plain; version=0.0.4")

    def _lag(self, aggregator: Aggregator) -> dict[tuple[tuple[str, str], ...], float]:
        out = {}
        for (topic, partition), state in aggregator.partitions.items():
            try:
                high = self.app.consumer.highwater(TP(topic, partition))
            except Exception:  # noqa: BLE001 - no highwater before the first fetch
                continue
            if high is not None:
                labels = (("partition", str(partition)), ("topic", topic))
                out[labels] = float(max(0, high - state.applied - 1))
        return out


def _notify_of(evaluator: Evaluator, rule_name: Any) -> dict[str, Any]:
    """Where a rule's alerts go (its ``notify`` block), for alerts made outside the engine."""
    rule = evaluator.source.rules().get(str(rule_name))
    notify = getattr(rule, "notify", None)
    return notify.model_dump(exclude_none=True) if notify is not None else {}


def build_app(settings: Settings) -> tuple[faust.App, Aggregator]:
    """The whole worker: aggregation, alerting, reclamation, Slack, probes and pages."""
    wiring = Wiring(settings)
    aggregator = wiring.aggregation()
    evaluator = wiring.alerting(aggregator)
    reclaimer = wiring.reclamation(evaluator)
    wiring.slack(evaluator, reclaimer)
    wiring.probes()
    wiring.pages()
    wiring.garbage_collection()
    _describe(wiring.metrics)
    return wiring.app, aggregator


def _describe(metrics: Metrics) -> None:
    for name, text in {
        "messages_total": "input messages taken from Kafka",
        "events_total": "events counted into Redis",
        "rejected_total": "input messages sent to the dead-letter topic, by reason",
        "batches_total": "Redis batch writes applied",
        "events_duplicate_total": "events ignored because their id was counted",
        "messages_replayed_total": "messages skipped as already applied",
        "redis_apply_seconds": "latency of one batch write to Redis",
        "evaluations_total": "rule evaluations run",
        "alert_changes_total": "alert state changes published",
        "evaluation_seconds": "latency of one evaluation (every rule on the tick; between "
                              "ticks, the rules new data can change)",
        "consumer_lag": "input messages not yet applied to Redis",
        "tagsets_known": "tag sets the worker knows Redis holds, so does not send again "
                         "(one budget over its partitions)",
        "unwritten_events": "events folded and not yet written to Redis, over the "
                            "worker's partitions (at most COSTLINE_UNWRITTEN_EVENTS and one "
                            "take)",
    }.items():
        metrics.describe(name, text)
