"""The Slack side of the worker: the notifier agent on ``NS.alerts.v1`` and the buttons.

The agent takes alert changes in small batches (so a burst for one channel can become one
digest message) and acknowledges them only once Slack has them, or once the notifier decided
they need no message; a Slack outage leaves them in Kafka and the batch is retried.
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from typing import Any

from costline.connectors.alert_store import AlertStore
from costline.connectors.redis_client import AsyncRedisClient
from costline.connectors.slack_actions import (
    ActionRequest,
    ApproverPolicy,
    RedisReplayGuard,
    SlackActionsHandler,
    make_actions_handler,
)
from costline.connectors.slack_ledger import SlackLedger
from costline.connectors.slack_sender import DeliveryError, SlackNotifier
from costline.rules.durations import rfc3339
from costline.streams.settings import Settings
from costline.streams.worker.health import Health
from costline.streams.worker.metrics import Metrics
from costline.streams.worker.retry import Backoff

log = logging.getLogger("costline.notifier")


def build_notifier(settings: Settings, redis: AsyncRedisClient) -> SlackNotifier:
    """A notifier that sends when ``SLACK_BOT_TOKEN`` is set and only logs otherwise."""
    sending = settings.slack_bot_token is not None
    return SlackNotifier(
        token=settings.slack_bot_token,
        ledger=SlackLedger(redis, settings.namespace) if sending else None,
        fallback_channel=settings.slack_fallback_channel,
        base_url=settings.slack_api_url,
        channel_by_tag_value=settings.slack_channels,
    )


async def deliver_until_done(notifier: SlackNotifier, raw: list[bytes], metrics: Metrics,
                             health: Health) -> None:
    """Deliver a batch of alert changes; wait and retry while Slack is unavailable."""
    records: list[dict[str, Any]] = []
    for value in raw:
        try:
            records.append(json.loads(value))
        except ValueError:
            metrics.inc("alert_records_unreadable_total")
    backoff = Backoff(first=1.0, ceiling=60.0)
    while records:
        try:
            deliveries = await notifier.deliver(records)
        except DeliveryError as exc:
            health.failing("slack", exc)
            log.warning("Slack unavailable, the alerts wait in Kafka: %s", exc)
            await backoff.wait()
            continue
        health.recovered("slack")
        for delivery in deliveries:
            metrics.inc("slack_deliveries_total", outcome=delivery.outcome)
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
