"""The pagerduty notifier against the local Events API v2 stand-in
(``connectors/pagerduty_server.py``), with its Redis ledger: trigger on firing, acknowledge
when muted, resolve on resolution, one PagerDuty alert per costline alert; 429s honoured,
400s refused for good, and the routing key never in a log line."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from itertools import pairwise
from typing import Any

import pytest
import redis.asyncio as aioredis

from costline.connectors.delivery_ledger import DeliveryLedger
from costline.connectors.notify import DeliveryError
from costline.connectors.notify.pagerduty import PagerDutyNotifier
from costline.connectors.pagerduty_server import LocalPagerDuty
from tests.integration.streamkit import configured_or_private_redis

SITE = "https://costline.example.com"
KEY = "e93facc04764012d7bfb002500d5d1a6"
ENVIRON = {"PD_FINOPS": KEY, "PD_SHORT": "too-short"}


@pytest.fixture(scope="module")
def ledger_redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with configured_or_private_redis(tmp_path_factory.mktemp("redis")) as url:
        yield url


@pytest.fixture
async def ledger(ledger_redis_url: str, namespace: str) -> AsyncIterator[DeliveryLedger]:
    client = aioredis.from_url(ledger_redis_url)
    yield DeliveryLedger(client, namespace, "pagerduty")
    await client.aclose()


@pytest.fixture
async def pagerduty() -> AsyncIterator[LocalPagerDuty]:
    async with LocalPagerDuty() as server:
        yield server


def notifier(pagerduty: LocalPagerDuty, ledger: DeliveryLedger) -> PagerDutyNotifier:
    return PagerDutyNotifier(ledger, pagerduty.url, SITE, environ=ENVIRON, backoff_s=0.05)


def record(state: str = "firing", line: str = "warn_80", at: str = "2026-11-30T08:05:00Z",
           key_env: str = "PD_FINOPS", severity: str = "warning") -> dict[str, Any]:
    return {
        "alert_id": "team-monthly/3f2a9c", "rule": "team-monthly", "kind": "budget",
        "severity": severity, "state": state, "previous_state": "firing",
        "group": {"team": "pretrain"}, "since": "2026-11-30T08:00:00Z", "at": at,
        "value": "8123.450000" if line == "warn_80" else "10240.000000",
        "threshold": "8000.000000" if line == "warn_80" else "10000.000000", "line": line,
        "lines": [{"name": "warn_80", "value": "8000.000000"},
                  {"name": "limit", "value": "10000.000000"}],
        "currency": "USD", "unit": "currency",
        "period": {"start": "2026-11-01T00:00:00Z", "end": "2026-12-01T00:00:00Z"},
        "forecast": None, "rate_per_hour": None, "top": [], "faults": None, "reclaim": None,
        "notify": {"pagerduty": {"routing_key_env": key_env, "severity_at": "warning"}},
        "mode": "live", "summary": "team=pretrain is past a line of its November budget.",
    }


ESCALATED = {"line": "limit", "at": "2026-11-30T11:40:00Z"}


async def test_an_alert_triggers_is_acknowledged_when_muted_and_resolves(
        pagerduty: LocalPagerDuty, ledger: DeliveryLedger) -> None:
    async with notifier(pagerduty, ledger) as pd:
        outcomes = [await pd.deliver([change]) for change in (
            record(), record(**ESCALATED), record("silenced", "limit", "2026-11-30T12:00:00Z"),
            record("resolved", "limit", "2026-11-30T13:00:00Z"))]
    assert [d.outcome for [d] in outcomes] == ["posted", "updated", "updated", "updated"]
    assert [e.status for e in pagerduty.events] == [202] * 4, "every event valid as documented"
    assert [e.action for e in pagerduty.events] == ["trigger", "trigger", "acknowledge",
                                                    "resolve"]
    [alert] = pagerduty.alerts
    assert (alert.dedup_key, alert.status, len(alert.events)) == (
        "team-monthly/3f2a9c", "resolved", 4)
    first = pagerduty.events[0].body
    assert first["payload"]["custom_details"]["value"] == "8123.450000"
    assert first["payload"]["severity"] == "warning"
    assert pagerduty.events[0].key_tail == KEY[-4:]


async def test_a_redelivered_change_is_not_sent_again(
        pagerduty: LocalPagerDuty, ledger: DeliveryLedger) -> None:
    async with notifier(pagerduty, ledger) as pd:
        await pd.deliver([record(), record(**ESCALATED)])
    async with notifier(pagerduty, ledger) as restarted:
        again = await restarted.deliver([record(), record(**ESCALATED)])
    assert [d.outcome for d in again] == ["duplicate", "duplicate"]
    assert len(pagerduty.events) == 2


async def test_a_429_delays_the_event_as_retry_after_asks_and_loses_nothing(
        pagerduty: LocalPagerDuty, ledger: DeliveryLedger) -> None:
    pagerduty.throttle_next(2, retry_after=1)
    async with notifier(pagerduty, ledger) as pd:
        [delivery] = await pd.deliver([record()])
    assert delivery.outcome == "posted"
    assert [e.status for e in pagerduty.events] == [429, 429, 202]
    waits = [later.at - earlier.at for earlier, later in pairwise(pagerduty.events)]
    assert min(waits) >= 0.95, waits
    assert "ambiguous" not in await ledger.counts()


async def test_server_errors_past_the_retries_ask_for_redelivery_without_doubt(
        pagerduty: LocalPagerDuty, ledger: DeliveryLedger) -> None:
    pagerduty.fail_next(4, status=503)
    async with notifier(pagerduty, ledger) as pd:
        with pytest.raises(DeliveryError):
            await pd.deliver([record()])
        [delivery] = await pd.deliver([record()])
    assert delivery.outcome == "posted"
    assert [e.status for e in pagerduty.events] == [503] * 4 + [202]
    assert "ambiguous" not in await ledger.counts(), "PagerDuty answered every request"


async def test_a_400_is_refused_for_good_and_the_key_is_never_logged(
        pagerduty: LocalPagerDuty, ledger: DeliveryLedger,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with notifier(pagerduty, ledger) as pd:
        [refused] = await pd.deliver([record(key_env="PD_SHORT")])
        [unset] = await pd.deliver([record(key_env="PD_NOWHERE")])
    assert (refused.outcome, unset.outcome) == ("failed", "failed")
    assert [e.status for e in pagerduty.events] == [400], "a 400 is not retried"
    assert "Length of 'routing_key' is incorrect" in caplog.text
    assert "environment variable PD_NOWHERE is not set" in caplog.text
    assert "too-short" not in caplog.text and KEY not in caplog.text


async def test_alerts_below_severity_at_never_reach_pagerduty(
        pagerduty: LocalPagerDuty, ledger: DeliveryLedger) -> None:
    async with notifier(pagerduty, ledger) as pd:
        assert await pd.deliver([record(severity="info")]) == []
    assert pagerduty.events == []


async def test_the_stand_in_refuses_what_the_real_api_refuses(
        pagerduty: LocalPagerDuty) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        async def post(body: Any) -> tuple[int, dict[str, Any]]:
            async with session.post(f"{pagerduty.url}/v2/enqueue", json=body) as answer:
                return answer.status, await answer.json()

        status, answer = await post({"routing_key": KEY, "event_action": "trigger",
                                     "payload": {"summary": "x", "source": "y",
                                                 "severity": "fatal"}})
        assert (status, answer["status"]) == (400, "invalid event")
        assert answer["errors"] == ["'payload.severity' is invalid (must be one of: "
                                    "critical, error, warning, info)"]
        status, answer = await post({"routing_key": KEY, "event_action": "resolve"})
        assert status == 400 and "'dedup_key' is required" in answer["errors"][0]
        status, answer = await post({"routing_key": KEY, "event_action": "resolve",
                                     "dedup_key": "never-opened"})
        assert (status, answer["message"]) == (202, "Event processed")
    assert pagerduty.alerts == [], "a resolve with nothing open is dropped"
