"""The alertmanager notifier against a real Prometheus Alertmanager (Debian's package) on
loopback, with its Redis ledger: alerts arrive with their labels, are told again while they
fire, and resolution ends them. Checked through the Alertmanager's API and ``amtool``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from costline.connectors.delivery_ledger import DeliveryLedger
from costline.connectors.notify.alertmanager import AlertmanagerNotifier
from costline.connectors.redis_client import connect_async
from costline.rules.durations import rfc3339
from tests.integration.alertmanager import alerts, amtool, received_total, running_alertmanager

SITE = "https://costline.example.com"
NOVEMBER = "2026-11-01T00:00:00Z"


@pytest.fixture(scope="module")
def alertmanager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_alertmanager(tmp_path_factory.mktemp("alertmanager")) as url:
        yield url


@pytest.fixture
async def ledger(any_redis_url: str, namespace: str) -> AsyncIterator[DeliveryLedger]:
    """On a single Redis and on a Redis Cluster: the reminders' keys share a slot."""
    client = connect_async(any_redis_url)
    yield DeliveryLedger(client, namespace, "alertmanager")
    await client.aclose()


def record(team: str, url: str, *, state: str = "firing", line: str = "warn_80",
           value: str = "8123.450000", at: float | None = None, timeout: str = "5m"
           ) -> dict[str, Any]:
    moment = time.time() if at is None else at
    return {
        "alert_id": f"team-monthly/{team}", "rule": "team-monthly", "kind": "budget",
        "severity": "warning", "state": state, "previous_state": "firing",
        "group": {"team": team}, "since": rfc3339(moment - 60), "at": rfc3339(moment),
        "value": value, "threshold": "8000.000000" if line == "warn_80" else "10000.000000",
        "line": line,
        "lines": [{"name": "warn_80", "value": "8000.000000"},
                  {"name": "limit", "value": "10000.000000"}],
        "currency": "USD", "unit": "currency",
        "period": {"start": "2026-11-01T00:00:00Z", "end": "2026-12-01T00:00:00Z"},
        "forecast": None, "rate_per_hour": None, "top": [], "faults": None, "reclaim": None,
        "notify": {"alertmanager": {"url": url, "resolve_timeout": timeout,
                                    "labels": {"receiver": "finops"}}},
        "mode": "live", "summary": f"team={team} is past a line of its November budget.",
    }


def mine(url: str, team: str) -> list[dict[str, Any]]:
    return [a for a in alerts(url) if a["labels"].get("team") == team]


async def test_an_alert_arrives_with_its_labels_is_updated_and_resolution_ends_it(
        alertmanager: str, ledger: DeliveryLedger, namespace: str) -> None:
    team = f"pretrain-{namespace}"
    async with AlertmanagerNotifier(ledger, SITE) as notifier:
        [first] = await notifier.deliver([record(team, alertmanager)])
        assert first.outcome == "posted"
        [held] = mine(alertmanager, team)
        assert held["labels"] == {"alertname": "team-monthly", "severity": "warning",
                                  "kind": "budget", "team": team, "receiver": "finops"}
        assert held["annotations"]["line"] == "warn_80"
        assert held["annotations"]["summary"].startswith("[WARNING] team-monthly · team=")
        assert held["status"]["state"] == "active"
        assert held["generatorURL"] == f"{SITE}/?alert=team-monthly%2F{team}"
        [listed] = [a for a in amtool(alertmanager, "alert", "query", f"team={team}")]
        assert listed["labels"]["alertname"] == "team-monthly"

        escalated = record(team, alertmanager, line="limit", value="10240.000000",
                           at=time.time() + 1)
        [update] = await notifier.deliver([escalated])
        assert update.outcome == "updated"
        [held_again] = mine(alertmanager, team)
        assert held_again["fingerprint"] == held["fingerprint"], "the same alert, updated"
        assert held_again["annotations"]["line"] == "limit"

        resolved = {**escalated, "state": "resolved", "at": rfc3339(time.time() + 2)}
        [closing] = await notifier.deliver([resolved])
        assert closing.outcome == "updated"
    await asyncio.sleep(0.5)
    assert mine(alertmanager, team) == [], "resolution ended the alert"
    assert amtool(alertmanager, "alert", "query", f"team={team}") == []
    assert await ledger.open_alerts() == []


async def test_a_firing_alert_is_told_again_within_its_resolve_timeout(
        alertmanager: str, ledger: DeliveryLedger, namespace: str) -> None:
    reminded, forgotten = f"reminded-{namespace}", f"forgotten-{namespace}"
    async with AlertmanagerNotifier(ledger, SITE) as notifier:
        await notifier.deliver([record(reminded, alertmanager, timeout="4s"),
                                record(forgotten, alertmanager, timeout="4s")])
        first_end = mine(alertmanager, reminded)[0]["endsAt"]
        await ledger.close(f"team-monthly/{forgotten}@{NOVEMBER}")  # no reminders for it
        for _ in range(14):  # 7 s: past its resolve_timeout, reminded every second
            await notifier.remind()
            await asyncio.sleep(0.5)
        assert notifier.stats["reminders"] >= 5
    [held] = mine(alertmanager, reminded)
    assert held["status"]["state"] == "active" and held["endsAt"] > first_end
    assert mine(alertmanager, forgotten) == [], "an alert nobody tells again ends by itself"


async def test_a_muted_alert_ends_and_a_burst_is_one_request(
        alertmanager: str, ledger: DeliveryLedger, namespace: str) -> None:
    teams = [f"burst{i}-{namespace}" for i in range(5)]
    before = received_total(alertmanager)
    async with AlertmanagerNotifier(ledger, SITE) as notifier:
        outcomes = await notifier.deliver([record(team, alertmanager) for team in teams])
        assert {d.outcome for d in outcomes} == {"digested"}
        assert len({d.ref for d in outcomes}) == 1, "one root for the burst"
        assert received_total(alertmanager) - before == len(teams)
        assert all(mine(alertmanager, team) for team in teams)
        muted = {**record(teams[0], alertmanager, at=time.time() + 1), "state": "silenced"}
        [silenced] = await notifier.deliver([muted])
        assert silenced.outcome == "updated"
    await asyncio.sleep(0.5)
    assert mine(alertmanager, teams[0]) == [], "muted: the Alertmanager stops hearing of it"
    assert all(mine(alertmanager, team) for team in teams[1:])
    assert sorted(a.thread_key for a in await ledger.open_alerts()) == sorted(
        f"team-monthly/{team}@{NOVEMBER}" for team in teams[1:])


async def test_a_restarted_notifier_does_not_post_again(
        alertmanager: str, ledger: DeliveryLedger, namespace: str, tmp_path: Path) -> None:
    team = f"restart-{namespace}"
    change = record(team, alertmanager)
    async with AlertmanagerNotifier(ledger, SITE) as notifier:
        await notifier.deliver([change])
    before = received_total(alertmanager)
    async with AlertmanagerNotifier(ledger, SITE) as restarted:
        [again] = await restarted.deliver([change])
    assert again.outcome == "duplicate"
    assert received_total(alertmanager) == before
