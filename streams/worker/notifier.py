"""The notifying side of the worker: what runs the notifiers on ``NS.alerts.v1``, and the
Slack buttons.

Each notifier has its own agent (``costline.streams.worker.app``), which takes alert changes
in small batches (so a burst for one destination can become one digest) and acknowledges them
only once its channel has them, or once the notifier decided they need no message. A channel
that is down leaves its batch in Kafka and retries it; the other channels go on.
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from typing import Any

from costline.connectors.alert_store import AlertStore
from costline.connectors.notify import NOTIFIERS, DeliveryError, Notifier, Setup
from costline.connectors.notify.slack import SlackNotifier
from costline.connectors.redis_client import AsyncRedisClient
from costline.connectors.slack_actions import (
    ActionRequest,
    ApproverPolicy,
    RedisReplayGuard,
    SlackActionsHandler,
    make_actions_handler,
)
from costline.rules.durations import rfc3339
from costline.streams.settings import Settings
from costline.streams.worker.health import Health
from costline.streams.worker.metrics import Metrics
from costline.streams.worker.retry import Backoff

log = logging.getLogger("costline.notifier")


def build_notifiers(settings: Settings, redis: AsyncRedisClient) -> dict[str, Notifier]:
    """Every registered notifier, configured from the settings; a channel without what it
    needs to send (no token, no mail server) logs what it would send instead."""
    setup = Setup(settings, redis)
    return {name: notifier.build(setup) for name, notifier in NOTIFIERS.items()}


async def deliver_until_done(notifier: Notifier, raw: list[bytes], metrics: Metrics,
                             health: Health) -> None:
    """Deliver a batch of alert changes; wait and retry while the channel is unavailable."""
    records: list[dict[str, Any]] = []
    for value in raw:
        try:
            records.append(json.loads(value))
        except ValueError:
            metrics.inc("alert_records_unreadable_total", notifier=notifier.name)
    backoff = Backoff(first=1.0, ceiling=60.0)
    while records:
        try:
            deliveries = await notifier.deliver(records)
        except DeliveryError as exc:
            health.failing(notifier.name, exc)
            log.warning("%s unavailable, its alerts wait in Kafka: %s", notifier.name, exc)
            await backoff.wait()
            continue
        health.recovered(notifier.name)
        for delivery in deliveries:
            metrics.inc("notifier_deliveries_total", notifier=notifier.name,
                        outcome=delivery.outcome)
        return


class WorkerActions:
    """What the Slack buttons do: Snooze is a silence of the alert's rule and group.

    Keep and Approve belong to reclamation; they are delegated when it runs in this worker.
    """

    def __init__(self, store: AlertStore, reclaim: Any | None = None) -> None:
        self.store = store
        self.reclaim = reclaim

    async def snooze(self, request: ActionRequest, duration: timedelta) -> str | None:
        import asyncio
        import time

        book = await asyncio.to_thread(self.store.book)
        alert = book.alerts.get(request.alert_id)
        group = dict(alert.payload.get("group", {})) if alert else {}
        ends = time.time() + duration.total_seconds()
        await asyncio.to_thread(
            self.store.add_silence, ends_at=ends, rule=request.rule, matchers=group,
            created_by=request.user_name or request.user_id, comment="snoozed from Slack")
        return f"until {rfc3339(ends)}"

    async def keep(self, request: ActionRequest, duration: timedelta) -> str | None:
        if self.reclaim is None:
            raise RuntimeError("reclamation does not run in this worker")
        result: str | None = await self.reclaim.keep(request, duration)
        return result

    async def approve(self, request: ActionRequest) -> str | None:
        if self.reclaim is None:
            raise RuntimeError("reclamation does not run in this worker")
        result: str | None = await self.reclaim.approve(request)
        return result

    async def lift(self, request: ActionRequest) -> str | None:
        if self.reclaim is None:
            raise RuntimeError("enforcement does not run in this worker")
        result: str | None = await self.reclaim.lift(request)
        return result


def build_actions_handler(settings: Settings, redis: AsyncRedisClient, store: AlertStore,
                          notifier: SlackNotifier, reclaim: Any | None = None
                          ) -> SlackActionsHandler | None:
    """The ``/slack/actions`` handler, or None when no signing secret is configured."""
    if settings.slack_signing_secret is None:
        return None
    approvers = ApproverPolicy(
        by_rule={rule: frozenset(users) for rule, users in settings.slack_approvers.items()})
    return make_actions_handler(
        signing_secret=settings.slack_signing_secret.get_secret_value(),
        actions=WorkerActions(store, reclaim),
        approvers=approvers,
        replay_guard=RedisReplayGuard(redis, settings.namespace),
        notes=notifier,
    )
