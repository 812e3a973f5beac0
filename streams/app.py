"""The Faust application: one agent that folds usage and fault messages into Redis.

Topics carry raw bytes and the agent decodes them itself (``rules.events.parse_message``), so
a bad message becomes a dead letter instead of an exception inside Faust. The agent takes
messages in batches (``take_events``): one Redis script call per partition per batch is what
makes the pipeline fast, and Faust acknowledges a batch only after the call returned.

Where to resume a partition is decided by Redis, not by Kafka's committed offsets: when a
rebalance completes, and before Faust seeks to the committed offsets, the worker commits the
offset after each partition's Redis watermark, so Faust's own seek lands exactly there.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import faust

import connectors.reclaim  # noqa: F401 - reclaimers validate their rule parameters
from faust.types import TP
from redis import Redis as SyncRedis
from redis.asyncio import Redis

from connectors.alert_store import AlertStore
from connectors.kafka import KafkaUnavailable, api_versions
from connectors.redis_apply import BatchWriter
from connectors.redis_keys import Calendar
from connectors.redis_state import RedisState
from connectors.slack_actions import add_actions_route
from rules.prices import PriceBook
from rules.tally import Folder
from streams.aggregator import REDIS_DOWN, Aggregator
from streams.evaluator import Evaluator, RuleSource
from streams.health import Health
from streams.metrics import Metrics
from streams.notifier import build_actions_handler, build_notifier, deliver_until_done
from streams.reclaimer import ReclaimActions, build_reclaimer
from streams.settings import Settings

log = logging.getLogger("costline.worker")

SOURCES = {"usage": "usage", "faults": "faults"}


def faust_broker(bootstrap: str) -> list[str]:
    return [f"kafka://{server.strip()}" for server in bootstrap.split(",") if server.strip()]


def build_app(settings: Settings) -> tuple[faust.App, Aggregator]:
    datadir = settings.state_dir / "faust" / settings.namespace
    datadir.parent.mkdir(parents=True, exist_ok=True)  # Faust creates only the last level
    app = faust.App(
        f"{settings.namespace}-aggregator",
        broker=faust_broker(settings.kafka_bootstrap),
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
        stream_buffer_maxsize=max(4096, settings.batch_messages * 4),
        broker_commit_every=max(10_000, settings.batch_messages * 4),
        web_in_thread=False,
    )
    metrics, health = Metrics(), Health()
    topics = {settings.topic(name): short for name, short in SOURCES.items()}
    source = app.topic(*topics, value_serializer="raw", key_serializer="raw")
    dlq = app.topic(settings.topic("dlq"), value_serializer="raw", key_serializer="raw")
    redis = Redis.from_url(settings.redis_url, socket_timeout=10, socket_connect_timeout=5,
                           health_check_interval=15)

    async def send_dead_letter(key: bytes, value: bytes) -> None:
        await app.producer.send_and_wait(dlq.get_topic_name(), key, value, partition=None,
                                         timestamp=None, headers=None)

    async def seek(topic: str, partition: int, offset: int) -> None:
        await app.consumer.seek(TP(topic, partition), offset)

    prices = PriceBook.load(settings.prices)
    alerts = app.topic(settings.topic("alerts"), value_serializer="raw", key_serializer="raw")
    sync_redis = SyncRedis.from_url(settings.redis_url, socket_timeout=10, socket_connect_timeout=5)

    async def publish_alert(key: bytes, value: bytes) -> None:
        await app.producer.send_and_wait(alerts.get_topic_name(), key, value, partition=None,
                                         timestamp=None, headers=None)

    evaluator = Evaluator(
        source=RuleSource(settings.rules, settings.timezone, prices, health),
        state=RedisState(sync_redis, settings.namespace, settings.timezone),
        store=AlertStore(sync_redis, settings.namespace),
        publish=publish_alert,
        metrics=metrics,
        tick_s=settings.rules_tick_s,
    )

    aggregator = Aggregator(
        namespace=settings.namespace,
        sources=topics,
        writer=BatchWriter(redis, settings.namespace, Calendar(settings.timezone),
                           settings.dedup_horizon_s),
        folder=Folder(prices),
        send_dead_letter=send_dead_letter,
        seek=seek,
        metrics=metrics,
        health=health,
    )
    _describe(metrics, app, aggregator)

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
            # Faust seeks to the committed offsets right after this signal.
            await app.consumer._commit({TP(t, p): o for (t, p), o in resume.items()})
            log.info("resuming %d partitions from Redis watermarks", len(resume))

    actions = app.topic(settings.topic("actions"), value_serializer="raw", key_serializer="raw")

    async def publish_action(record: dict[str, Any]) -> None:
        await app.producer.send_and_wait(actions.get_topic_name(),
                                         str(record.get("action_id", "")).encode(),
                                         json.dumps(record, separators=(",", ":")).encode(),
                                         partition=None, timestamp=None, headers=None)

    reclaimer = build_reclaimer(settings, rules=evaluator.source.rules, sink=publish_action)
    notifier = build_notifier(settings, redis)

    @app.agent(alerts, concurrency=1)
    async def notify(stream: Any) -> None:
        async for events in stream.take_events(200, within=2.0):
            await deliver_until_done(notifier, [e.message.value for e in events], metrics,
                                     health)

    buttons = build_actions_handler(settings, redis, evaluator.store, notifier,
                                    reclaim=ReclaimActions(reclaimer))
    if buttons is not None:
        add_actions_route(app.web.web_app, buttons)

    @app.timer(interval=2.0, on_leader=True)
    async def evaluate_rules() -> None:
        """Only the leader evaluates; a failure is reported and retried on the next tick."""
        try:
            evaluation = await evaluator.step()
            if evaluation is not None:
                await reclaimer.submit(evaluation.findings, evaluation.at)
        except REDIS_DOWN as exc:
            health.failing("redis", exc)
        except Exception:  # noqa: BLE001 - one bad evaluation must not stop the worker
            metrics.inc("evaluation_errors_total")
            log.exception("rule evaluation failed")

    @app.timer(interval=15.0, on_leader=True)
    async def follow_reclaim_plans() -> None:
        """Grace periods end, plans are re-verified and released with time alone."""
        try:
            await reclaimer.tick()
        except REDIS_DOWN as exc:
            health.failing("redis", exc)
        except Exception:  # noqa: BLE001 - a failed round is retried on the next tick
            metrics.inc("reclaim_errors_total")
            log.exception("reclamation round failed")

    @app.timer(interval=2.0)
    async def probe_redis() -> None:
        """An idle worker makes no Redis calls; this makes a Redis outage visible anyway."""
        try:
            await asyncio.wait_for(redis.ping(), timeout=2.0)
        except (*REDIS_DOWN, asyncio.TimeoutError) as exc:
            health.failing("redis", exc)
        else:
            health.recovered("redis")

    @app.timer(interval=5.0)
    async def probe_kafka() -> None:
        """Faust reconnects to Kafka on its own; this only makes an outage visible."""
        try:
            await asyncio.to_thread(api_versions, settings.kafka_bootstrap, 2.0)
        except KafkaUnavailable as exc:
            health.failing("kafka", str(exc))
        else:
            health.recovered("kafka")

    @app.page("/healthz")
    async def healthz(web: Any, request: Any) -> Any:
        return web.json(health.report(), status=200 if health.ok else 503)

    @app.page("/metrics")
    async def metrics_page(web: Any, request: Any) -> Any:
        return web.text(metrics.render(), content_type="text/plain; version=0.0.4")

    return app, aggregator


def _describe(metrics: Metrics, app: faust.App, aggregator: Aggregator) -> None:
    metrics.describe("messages_total", "input messages taken from Kafka")
    metrics.describe("events_total", "events counted into Redis")
    metrics.describe("rejected_total", "input messages sent to the dead-letter topic, by reason")
    metrics.describe("batches_total", "Redis batch writes applied")
    metrics.describe("events_duplicate_total", "events ignored because their id was counted")
    metrics.describe("messages_replayed_total", "messages skipped as already applied")
    metrics.describe("redis_apply_seconds", "latency of one batch write to Redis")
    metrics.describe("evaluations_total", "rule evaluations run")
    metrics.describe("alert_changes_total", "alert state changes published")
    metrics.describe("evaluation_seconds", "latency of one evaluation of every rule")

    def lag() -> dict[tuple[tuple[str, str], ...], float]:
        out = {}
        for (topic, partition), state in aggregator.partitions.items():
            try:
                high = app.consumer.highwater(TP(topic, partition))
            except Exception:  # noqa: BLE001 - no highwater before the first fetch
                continue
            if high is not None:
                labels = (("partition", str(partition)), ("topic", topic))
                out[labels] = float(max(0, high - state.applied - 1))
        return out

    metrics.gauge("consumer_lag", lag)
