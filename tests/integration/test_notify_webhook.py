"""The webhook notifier against a receiver that checks its signature, with its Redis ledger:
Alertmanager's payload (version 4), a burst as one group, the group sent again on each change,
a 4xx refused for good, 5xx retried, and the secret never in a log line."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from costline.connectors.delivery_ledger import DeliveryLedger
from costline.connectors.notify import DeliveryError
from costline.connectors.notify.webhook import WebhookNotifier
from tests.integration.streamkit import configured_or_private_redis
from tests.integration.webhook_receiver import WebhookReceiver

SITE = "https://costline.example.com"
SECRET = "whsec-notify-test-8d1f"


@pytest.fixture(scope="module")
def ledger_redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with configured_or_private_redis(tmp_path_factory.mktemp("redis")) as url:
        yield url


@pytest.fixture
async def ledger(ledger_redis_url: str, namespace: str) -> AsyncIterator[DeliveryLedger]:
    client = aioredis.from_url(ledger_redis_url)
    yield DeliveryLedger(client, namespace, "webhook")
    await client.aclose()


@pytest.fixture
async def receiver() -> AsyncIterator[WebhookReceiver]:
    async with WebhookReceiver(SECRET) as server:
        yield server


def notifier(ledger: DeliveryLedger, environ: dict[str, str] | None = None) -> WebhookNotifier:
    return WebhookNotifier(ledger, SITE, environ={"HOOK_SECRET": SECRET} if environ is None
                           else environ, backoff_s=0.05)


def record(url: str, team: str, state: str = "firing", line: str = "warn_80",
           at: str = "2026-11-30T08:05:00Z") -> dict[str, Any]:
    return {
        "alert_id": f"team-monthly/{team}", "rule": "team-monthly", "kind": "budget",
        "severity": "warning", "state": state, "previous_state": "firing",
        "group": {"team": team}, "since": "2026-11-30T08:00:00Z", "at": at,
        "value": "8123.450000", "threshold": "8000.000000", "line": line,
        "lines": [{"name": "warn_80", "value": "8000.000000"}], "currency": "USD",
        "unit": "currency",
        "period": {"start": "2026-11-01T00:00:00Z", "end": "2026-12-01T00:00:00Z"},
        "forecast": None, "rate_per_hour": None, "top": [], "faults": None, "reclaim": None,
        "notify": {"webhook": {"url": url, "secret_env": "HOOK_SECRET"}},
        "mode": "live", "summary": f"team={team} is past a line of its November budget.",
    }


async def test_a_burst_is_one_signed_group_sent_again_on_each_change(
        receiver: WebhookReceiver, ledger: DeliveryLedger) -> None:
    teams = ["pretrain", "posttrain", "eval"]
    async with notifier(ledger) as hook:
        burst = await hook.deliver([record(receiver.url, team) for team in teams])
        escalated = record(receiver.url, "eval", line="limit", at="2026-11-30T09:00:00Z")
        resolved = record(receiver.url, "pretrain", "resolved", at="2026-11-30T10:00:00Z")
        later = await hook.deliver([escalated, resolved])
    assert [d.outcome for d in burst] == ["digested"] * 3
    assert [d.outcome for d in later] == ["updated", "updated"]
    first, second, third = receiver.accepted()
    assert len(receiver.received) == 3, "every request signed and accepted"
    assert first.payload["version"] == "4" and first.payload["status"] == "firing"
    assert [a["labels"]["team"] for a in first.payload["alerts"]] == teams
    assert first.payload["groupLabels"] == {"alertname": "team-monthly"}
    assert first.payload["commonLabels"] == {"alertname": "team-monthly",
                                             "severity": "warning", "kind": "budget"}
    assert {p.payload["groupKey"] for p in (first, second, third)} == {
        first.payload["groupKey"]}, "one group: one key"
    assert [a["annotations"]["line"] for a in second.payload["alerts"]
            if a["labels"]["team"] == "eval"] == ["limit"]
    assert third.payload["status"] == "firing", "two alerts of the group still fire"
    statuses = {a["labels"]["team"]: a["status"] for a in third.payload["alerts"]}
    assert statuses == {"pretrain": "resolved", "posttrain": "firing", "eval": "firing"}
    assert third.idempotency_key == ("team-monthly/pretrain@2026-11-01T00:00:00Z|"
                                     "resolved|warn_80|2026-11-30T10:00:00+00:00")


async def test_a_muted_alert_is_not_sent_and_its_resolution_is(
        receiver: WebhookReceiver, ledger: DeliveryLedger) -> None:
    async with notifier(ledger) as hook:
        await hook.deliver([record(receiver.url, "pretrain")])
        assert await hook.deliver([record(receiver.url, "pretrain", "silenced",
                                          at="2026-11-30T09:00:00Z")]) == []
        await hook.deliver([record(receiver.url, "pretrain", "resolved",
                                   at="2026-11-30T10:00:00Z")])
    assert [r.payload["status"] for r in receiver.accepted()] == ["firing", "resolved"]


async def test_a_4xx_is_refused_for_good_and_a_5xx_is_retried(
        receiver: WebhookReceiver, ledger: DeliveryLedger) -> None:
    receiver.refuse_next(422)
    async with notifier(ledger) as hook:
        [refused] = await hook.deliver([record(receiver.url, "pretrain")])
        receiver.fail_next(4)
        with pytest.raises(DeliveryError):
            await hook.deliver([record(receiver.url, "eval")])
        [taken] = await hook.deliver([record(receiver.url, "eval")])
    assert (refused.outcome, taken.outcome) == ("failed", "posted")
    assert [r.status for r in receiver.received] == [422, 503, 503, 503, 503, 200]
    assert "ambiguous" not in await ledger.counts()


async def test_without_its_secret_nothing_is_sent_and_the_secret_is_never_logged(
        receiver: WebhookReceiver, ledger: DeliveryLedger,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with notifier(ledger, environ={}) as unsigned:
        [failed] = await unsigned.deliver([record(receiver.url, "pretrain")])
    assert failed.outcome == "failed" and receiver.received == []
    assert "environment variable HOOK_SECRET is not set" in caplog.text
    async with notifier(ledger) as signed:
        await signed.deliver([record(receiver.url, "eval")])
    assert SECRET not in caplog.text
