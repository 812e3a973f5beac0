"""The Faust application: the worker's agents, services, timers and pages, wired from the
settings.

Input flows in two stages (docs/ARCHITECTURE.md):

* **intake**, a consumer of the input topics' committed records, run as a service of the app:
  takes messages in batches, prices them (in child processes by default), sends refused ones
  to the dead-letter topic and every event to the home partition of its event id on the
  ledger topic, then commits their offsets (``costline.streams.worker.input_takes``). At
  least once: a repeat is caught at home.
* **aggregation**, the ledger's consumer: folds each home partition into windows and writes
  them to Redis with the partition's watermark and dedup memory, exactly once
  (``costline.streams.worker.aggregation``).

Topics carry bytes; intake decodes them itself (``costline.rules.events.parse_message``), so a
bad message becomes a dead letter instead of an exception in a consumer. The rule engine and
reclamation run on the Faust leader only (one worker of the group), so two workers never race
on the alert book or on a release.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import faust
import faust.web
from aiokafka import AIOKafkaConsumer
from redis.exceptions import ReadOnlyError

from costline.connectors import bucket_zone
from costline.connectors.alert_store import AlertStore
from costline.connectors.kafka import KafkaUnavailable, api_versions
from costline.connectors.notify import Notifier
from costline.connectors.notify.slack import SlackNotifier
from costline.connectors.redis_apply import BatchWriter
from costline.connectors.redis_client import connect, connect_async
from costline.connectors.redis_keys import Calendar
from costline.connectors.redis_state import RedisState
from costline.connectors.refusal_tally import RefusalTally, dead_letter_record
from costline.rules.ledger import Intake as Pricer
from costline.rules.prices import PriceBook
from costline.streams.api.answers import OpenData
from costline.streams.api.routes import routes
from costline.streams.settings import Settings
from costline.streams.topics import INPUTS
from costline.streams.worker import api_pages, collector
from costline.streams.worker.aggregation import Aggregation
from costline.streams.worker.budget_gauges import BUDGET_SERIES, GAUGE_HELP, BudgetGauges
from costline.streams.worker.consumers import group_consumer
from costline.streams.worker.enforce_alerts import enforcement_alert
from costline.streams.worker.enforcer import EnforceActions, Enforcer, build_enforcer
from costline.streams.worker.evaluation_process import EvaluatorDied, ProcessRunner
from costline.streams.worker.evaluator import Evaluator, RuleSource
from costline.streams.worker.eviction_watch import EvictionWatch
from costline.streams.worker.faust_app import faust_app
from costline.streams.worker.health import Health
from costline.streams.worker.input_takes import InputTakes
from costline.streams.worker.intake import Intake
from costline.streams.worker.lifecycle import CheckpointKeeper, build_keeper, lifecycle_cap_alert
from costline.streams.worker.metric_help import DESCRIPTIONS
from costline.streams.worker.metrics import Metrics
from costline.streams.worker.notifier import (
    build_actions_handler,
    build_notifiers,
    deliver_until_done,
)
from costline.streams.worker.pricing import InlinePricing, PoolPricing, Pricing
from costline.streams.worker.reclaim_alerts import cap_breach_alert, is_cap_breach
from costline.streams.worker.reclaimer import ReclaimActions, Reclaimer, build_reclaimer
from costline.streams.worker.retry import REDIS_DOWN
from costline.streams.worker.timers import single_flight

log = logging.getLogger("costline.worker")

# How often a worker checks that Redis still holds the watermarks of its idle partitions.
WATERMARK_CHECK_S = 10.0
# The worker counts as behind, and rule evaluations rest longer (streams/worker/evaluator.py),
# from this many ledger records not yet in Redis or input messages not yet priced: when pricing
# holds the worker back, the backlog waits on the input topics and the ledger stays short.
BEHIND_LEDGER_RECORDS = 100
BEHIND_INPUT_MESSAGES = 1_000
# How often intake commits the input it delivered: a crash repeats at most this much input.
INPUT_COMMIT_EVERY_S = 2.0
# How often the leader looks for reminders a notifier owes its channel.
REMIND_S = 5.0
Send = Callable[[bytes, bytes], Awaitable[None]]


class Wiring:
    """Builds the worker one concern at a time, on one Faust app and shared clients."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.app = faust_app(settings)
        self.metrics, self.health = Metrics(), Health()
        self.prices = PriceBook.load(settings.prices)
        # A single Redis or a Redis Cluster, whichever the URL names (connectors.redis_client).
        self.redis = connect_async(settings.redis_url, health_check_s=15)
        self.sync_redis = connect(settings.redis_url)

    def topic(self, *names: str) -> Any:
        """Topics whose agents take Kafka's bytes and decode them themselves."""
        return self.app.topic(*(self.settings.topic(n) for n in names),
                              key_type=bytes, value_type=bytes,
                              key_serializer="raw", value_serializer="raw")

    async def send(self, topic: str, partition: int | None, key: bytes | None,
                   value: bytes) -> Awaitable[Any]:
        """Hand a message to the producer; the future says when Kafka has it."""
        return await self.app.producer.send(topic, key, value, partition=partition,
                                            timestamp=None, headers=None)

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
        self.app.timer(interval=seconds, on_leader=on_leader)(single_flight(self.app, run, name))

    # -- concerns ---------------------------------------------------------------------

    def pricing(self, partitions: int) -> Pricing:
        """Where intake parses and prices: in child processes, or in the worker's own."""
        settings = self.settings
        pricer = Pricer(self.prices, partitions)
        if settings.folding == "inline":
            return InlinePricing(pricer)
        return PoolPricing(settings.prices, partitions, settings.folding_processes, pricer)

    def intake(self, partitions: int) -> tuple[Intake, InputTakes]:
        settings = self.settings
        pricing = self.pricing(partitions)
        intake = Intake(pricing=pricing, send=self.send, ledger_topic=settings.topic("ledger"),
                        dlq_topic=settings.topic("dlq"), metrics=self.metrics,
                        health=self.health, depth=settings.folding_takes)
        source = InputTakes(
            # committed records only: never what a transactional producer aborts
            consumer=lambda group: group_consumer(settings, group,
                                                  isolation_level="read_committed"),
            group=settings.intake_group,
            earlier_group=settings.app_group, topics=[settings.topic(n) for n in INPUTS],
            batch_messages=settings.batch_messages, within_s=settings.batch_within_s,
            commit_every_s=INPUT_COMMIT_EVERY_S, metrics=self.metrics)

        @self.app.service
        class Input(faust.Service):
            """Starts the pricing processes and the input's consumer with the worker, and
            stops them with it."""

            async def on_start(self) -> None:
                await pricing.start()

            @faust.Service.task
            async def _take_in(self) -> None:
                await intake.run(source)

            async def on_stop(self) -> None:
                # Intake stops taking, delivers and commits what is in flight, and leaves its
                # group before the pricing processes stop.
                await source.stop(timeout_s=10.0)
                pricing.close()

        self.metrics.gauge("input_lag", lambda: {
            (("partition", str(tp.partition)), ("topic", tp.topic)): float(lag)
            for tp, lag in source.lag().items()})
        return intake, source

    def aggregation(self, partitions: int) -> Aggregation:
        settings = self.settings

        def consumer() -> AIOKafkaConsumer:
            return group_consumer(settings, settings.ledger_group,
                                  fetch_max_bytes=max(settings.fetch_bytes * 8, 8 * 1024 * 1024))

        aggregation = Aggregation(
            consumer=consumer, topic=settings.topic("ledger"), namespace=settings.namespace,
            writer=BatchWriter(self.redis, settings.namespace, Calendar(settings.timezone),
                               settings.dedup_horizon_s),
            metrics=self.metrics, health=self.health, window_events=settings.window_events,
            window_linger_s=settings.window_linger_s, unwritten_events=settings.unwritten_events)

        @self.app.service
        class Ledger(faust.Service):
            """The ledger's consumer, started and stopped with the worker."""

            @faust.Service.task
            async def _aggregate(self) -> None:
                await aggregation.run()

            async def on_stop(self) -> None:
                await aggregation.stop()

        self.metrics.gauge("consumer_lag", lambda: {
            (("partition", str(p)), ("topic", settings.topic("ledger"))): float(lag)
            for p, lag in aggregation.lag().items()})
        self.metrics.gauge("tagsets_known",
                           lambda: {(): float(aggregation.writer.known_tagsets)})
        self.metrics.gauge("unwritten_events", lambda: {(): float(aggregation.unwritten())})
        self.every(WATERMARK_CHECK_S, "watermark_check", aggregation.verify_watermarks)

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
        eviction = EvictionWatch(self.sync_redis, self.health)
        self.metrics.gauge("redis_evicting_nodes", lambda: {(): float(eviction.evicting)})
        self.every(WATERMARK_CHECK_S, "eviction_check", eviction.check)
        return aggregation

    def alerting(self, source: InputTakes, aggregation: Aggregation) -> Evaluator:
        settings = self.settings
        runner = ProcessRunner(settings, self.prices, stopping=lambda: self.app.should_stop) \
            if settings.evaluator == "process" else None
        if runner is not None:
            process = runner

            @self.app.service
            class EvaluationProcess(faust.Service):
                """Ends the evaluation process with the worker."""

                async def on_stop(self) -> None:
                    await asyncio.to_thread(process.stop)

        return Evaluator(
            source=RuleSource(settings.rules, settings.timezone, self.prices, self.health),
            state=RedisState(self.sync_redis, settings.namespace, settings.timezone),
            store=AlertStore(self.sync_redis, settings.namespace),
            publish=self.sender("alerts"), metrics=self.metrics, tick_s=settings.rules_tick_s,
            runner=runner,
            behind=lambda: (sum(aggregation.lag().values()) >= BEHIND_LEDGER_RECORDS
                            or sum(source.lag().values()) >= BEHIND_INPUT_MESSAGES),
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
            try:
                evaluation = await evaluator.step()
            except EvaluatorDied as exc:
                if not self.app.should_stop:
                    raise
                # SIGTERM to the process group ended the evaluation process first
                log.info("evaluation ended by the stop: %s", exc)
                return
            if evaluation is not None:
                # Reused findings were submitted when they were found; muted ones are not.
                await reclaimer.submit(evaluation.actionable(), evaluation.at)

        # Polling the data generation is one MGET: often enough that an alert follows its
        # spend within a fraction of a second; the evaluator decides whether to evaluate.
        self.every(self.settings.rules_poll_s, "evaluation", evaluate, on_leader=True)
        # Grace periods end, plans are re-verified and released with time alone.
        self.every(self.settings.reclaim_tick_s, "reclaim", reclaimer.tick, on_leader=True)
        return reclaimer

    def checkpoint_lifecycle(self, evaluator: Evaluator) -> CheckpointKeeper:
        """The checkpoint lifecycle on the leader: its steps to the audit log, an aborted
        round also as an alert (``costline.streams.worker.lifecycle``)."""
        send, alert = self.sender("actions"), self.sender("alerts")

        async def publish(record: dict[str, Any]) -> None:
            await send(str(record.get("action_id", "")).encode(),
                       json.dumps(record, separators=(",", ":")).encode())
            if is_cap_breach(record):
                change = lifecycle_cap_alert(record, _notify_of(evaluator, record.get("rule")))
                await alert(change["alert_id"].encode(),
                            json.dumps(change, separators=(",", ":")).encode())

        keeper = build_keeper(self.settings, rules=evaluator.source.rules, sink=publish)
        self.every(self.settings.reclaim_tick_s, "checkpoint_lifecycle", keeper.tick,
                   on_leader=True)
        return keeper

    def enforcement(self, evaluator: Evaluator) -> Enforcer:
        """Budget enforcement on the leader: each evaluation's findings, then a tick."""
        send, alert = self.sender("actions"), self.sender("alerts")

        async def publish(record: dict[str, Any]) -> None:
            await send(str(record.get("action_id", "")).encode(),
                       json.dumps(record, separators=(",", ":")).encode())
            rule = evaluator.source.rules().get(str(record.get("rule")))
            enforce = getattr(rule, "enforce", None)
            approval = str(enforce.params.get("approval") or "auto") if enforce else "auto"
            change = enforcement_alert(record, _notify_of(evaluator, record.get("rule")),
                                       approval)
            if change is not None:
                await alert(change["alert_id"].encode(),
                            json.dumps(change, separators=(",", ":")).encode())

        enforcer = build_enforcer(self.settings, rules=evaluator.source.rules, sink=publish)
        submitted: list[Any] = [None]

        async def enforce() -> None:
            evaluation = evaluator.last_evaluation
            if evaluation is not None and evaluation is not submitted[0]:
                submitted[0] = evaluation
                await enforcer.submit(evaluation.findings, evaluation.at)
            await enforcer.tick()

        self.every(self.settings.reclaim_tick_s, "enforcement", enforce, on_leader=True)
        return enforcer

    def notifiers(self, evaluator: Evaluator, reclaimer: Reclaimer,
                  enforcer: Enforcer | None = None) -> None:
        """One agent per notifier on the alerts topic, so a channel that is down holds back
        only its own alerts; the reminders time makes due (Alertmanager forgets an alert it
        is not told of again) on the leader; and the Slack buttons."""
        notifiers = build_notifiers(self.settings, self.redis)
        for notifier in notifiers.values():
            self._notify_agent(notifier)

        async def remind() -> None:
            for notifier in notifiers.values():
                await notifier.remind()
        self.every(REMIND_S, "notifier_reminders", remind, on_leader=True)

        @self.app.service
        class Notifiers(faust.Service):
            """Closes the notifiers' connections with the worker."""

            async def on_stop(self) -> None:
                for notifier in notifiers.values():
                    await notifier.close()

        slack = notifiers["slack"]
        assert isinstance(slack, SlackNotifier)
        buttons = build_actions_handler(self.settings, self.redis, evaluator.store, slack,
                                        reclaim=EnforceActions(enforcer, ReclaimActions(reclaimer))
                                        if enforcer else ReclaimActions(reclaimer))
        if buttons is not None:
            handler = buttons

            @self.app.page("/slack/actions")
            class SlackActions(faust.web.View):
                """Button presses (Block Kit actions), checked against the signing secret."""

                async def post(self, request: Any) -> Any:
                    return await handler(request)

    def _notify_agent(self, notifier: Notifier) -> None:
        metrics, health = self.metrics, self.health

        async def notify(stream: Any) -> None:
            async for events in stream.take_events(200, within=2.0):
                await deliver_until_done(notifier, [e.message.value for e in events], metrics,
                                         health)
        self.app.agent(self.topic("alerts"), name=f"notify-{notifier.name}",
                       concurrency=1)(notify)

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

    def refusal_tally(self, intake: Intake) -> None:
        """Counts every dead letter intake sends in the refusal tally (``costline spend``
        warns of the money refused in its period). A tally that fails is logged and counted,
        never holds up intake: the dead letters themselves are in Kafka."""
        tally = RefusalTally(self.sync_redis, self.settings.namespace)
        metrics = self.metrics

        def count_all(letters: list[tuple[bytes, bytes]]) -> None:
            for key, value in letters:
                record = dead_letter_record(value)
                if record is not None:
                    tally.count(key, record)

        async def count(letters: list[tuple[bytes, bytes]]) -> None:
            try:
                await asyncio.to_thread(count_all, letters)
            except Exception:  # noqa: BLE001 - the dead letters are sent; only the tally lags
                metrics.inc("refusal_tally_errors_total")
                log.warning("%d dead letter(s) not counted in the refusal tally",
                            len(letters), exc_info=True)
        intake.on_refused = count

    def api(self, evaluator: Evaluator) -> None:
        """The HTTP API (``/api/v1/...``) and the dashboard (``/``) on the worker's web port,
        and the budget gauges and spend counters of ``/metrics``, read by the leader."""
        settings = self.settings
        data = OpenData(settings, self.sync_redis, self.redis, evaluator.source.rules)
        token = settings.api_token.get_secret_value() if settings.api_token else None
        api_pages.mount(self.app, routes(data, token))
        gauges = BudgetGauges(data, settings.metrics_spend_keys, self.app.is_leader)
        for name in BUDGET_SERIES:
            self.metrics.gauge(name, gauges.read(name))
        self.metrics.counter_read("spend_total", gauges.read("spend_total"))
        for name, text in GAUGE_HELP.items():
            self.metrics.describe(name, text)

        async def read_gauges() -> None:
            await asyncio.to_thread(gauges.refresh)
        self.every(settings.metrics_refresh_s, "metrics_refresh", read_gauges, on_leader=True)

    def garbage_collection(self) -> None:
        async def settle_collector() -> None:
            """Once the worker has started (costline.streams.worker.collector)."""
            collector.settle()
        self.app.task(settle_collector)

    def pages(self) -> None:
        health, metrics = self.health, self.metrics

        @self.app.page("/healthz")
        async def healthz(web: Any, request: Any) -> Any:
            return web.json(health.report(), status=200 if health.ok else 503)

        @self.app.page("/metrics")
        async def metrics_page(web: Any, request: Any) -> Any:
            return web.text(metrics.render(), content_type="text/plain; version=0.0.4")


def _notify_of(evaluator: Evaluator, rule_name: Any) -> dict[str, Any]:
    """Where a rule's alerts go (its ``notify`` block), for alerts made outside the engine."""
    rule = evaluator.source.rules().get(str(rule_name))
    notify = getattr(rule, "notify", None)
    return notify.published({}) if notify is not None else {}


def build_app(settings: Settings, partitions: int | None = None
              ) -> tuple[faust.App, Aggregation]:
    """The whole worker: intake, aggregation, alerting, reclamation, notifiers, probes and
    pages. ``partitions``: the ledger topic's (the settings' when not given)."""
    wiring = Wiring(settings)
    partitions = partitions or settings.partitions
    intake, source = wiring.intake(partitions)
    wiring.refusal_tally(intake)
    aggregation = wiring.aggregation(partitions)
    evaluator = wiring.alerting(source, aggregation)
    reclaimer = wiring.reclamation(evaluator)
    wiring.checkpoint_lifecycle(evaluator)
    wiring.notifiers(evaluator, reclaimer, wiring.enforcement(evaluator))
    wiring.api(evaluator)
    wiring.probes()
    wiring.pages()
    wiring.garbage_collection()
    wiring.metrics.describe_all(DESCRIPTIONS)
    return wiring.app, aggregation
