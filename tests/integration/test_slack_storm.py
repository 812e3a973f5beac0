"""A storm of HTTP 429s: alerts are delayed as Slack asks, never lost and never posted twice.

The local Slack server answers every call with 429 and ``Retry-After`` until the storm is
spent. Delivery runs the way the worker runs it (``deliver_until_done`` around
``SlackNotifier.deliver``, with the Redis ledger), and once through the real worker.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import redis

from costline.connectors.delivery_ledger import DeliveryLedger
from costline.connectors.notify.slack import SlackNotifier
from costline.connectors.redis_client import connect_async
from costline.connectors.slack_server import (
    DEFAULT_TOKEN,
    LocalSlack,
    LocalSlackThread,
    RecordedCall,
)
from costline.rules.engine import alert_id
from costline.streams.settings import Settings
from costline.streams.topics import create_topics
from costline.streams.worker.health import Health
from costline.streams.worker.metrics import Metrics
from costline.streams.worker.notifier import deliver_until_done
from tests.integration.streamkit import Worker, produce, worker_env

TOKEN = "xoxb-storm-test"
NOVEMBER = {"start": "2026-11-01T00:00:00Z", "end": "2026-12-01T00:00:00Z"}


def record(rule: str, team: str, channel: str, value: str, line: str = "warn_80",
           at: str = "2026-11-30T08:05:00Z") -> dict[str, Any]:
    """An alert change in the engine's published shape."""
    group = {"team": team}
    return {
        "alert_id": alert_id(rule, group), "rule": rule, "kind": "budget",
        "severity": "warning" if line != "limit" else "critical", "state": "firing",
        "previous_state": "inactive" if line == "warn_80" else "firing", "group": group,
        "since": "2026-11-30T08:05:00Z", "at": at, "value": value,
        "threshold": "8000.000000" if line == "warn_80" else "10000.000000", "line": line,
        "lines": [{"name": "warn_80", "value": "8000.000000"},
                  {"name": "limit", "value": "10000.000000"}],
        "currency": "USD", "unit": "currency", "period": NOVEMBER, "forecast": None,
        "rate_per_hour": None, "top": [], "faults": None, "reclaim": None,
        "notify": {"slack": channel, "route_by_tag": None, "channel": channel}, "mode": "live",
        "summary": f"team={team} is past a line of its November budget.",
    }


def respects_retry_after(calls: Sequence[RecordedCall], retry_after: float) -> list[str]:
    """Every request that followed a 429, sent before that 429's Retry-After had passed."""
    early = []
    for answered, following in zip(calls, calls[1:], strict=False):
        waited = following.at - answered.at
        if answered.status == 429 and waited < retry_after:
            early.append(f"{following.method} {waited:.3f}s after a 429 from {answered.method}")
    return early


# ── through SlackNotifier.deliver ───────────────────────────────────────────────────────────


@pytest.fixture
async def slack() -> AsyncIterator[LocalSlack]:
    async with LocalSlack(tokens=[TOKEN], channels=["ml-budgets", "ml-infra", "ml-eval",
                                                    "costline-alerts"]) as server:
        yield server


@pytest.fixture
async def ledger(redis_url: str, namespace: str) -> AsyncIterator[DeliveryLedger]:
    client = connect_async(redis_url)
    yield DeliveryLedger(client, namespace)
    await client.aclose()


def raw(records: Sequence[dict[str, Any]]) -> list[bytes]:
    return [json.dumps(r).encode() for r in records]


BURST = [
    *(("team-monthly", f"team-{i}", "#ml-budgets") for i in range(5)),
    ("infra-monthly", "storage", "#ml-infra"), ("infra-monthly", "network", "#ml-infra"),
    ("eval-monthly", "eval", "#ml-eval"),
]


async def test_a_429_storm_delays_every_alert_past_retry_after_and_loses_none(
        slack: LocalSlack, ledger: DeliveryLedger) -> None:
    firing = [record(rule, team, channel, f"{8100 + i}.000000")
              for i, (rule, team, channel) in enumerate(BURST)]
    escalated = [record(rule, team, channel, f"{10100 + i}.000000", line="limit",
                        at="2026-11-30T11:00:00Z")
                 for i, (rule, team, channel) in enumerate(BURST)]
    metrics, health = Metrics(), Health()
    async with SlackNotifier(token=TOKEN, ledger=ledger, fallback_channel="#costline-alerts",
                             base_url=slack.url, min_interval_s=0.0, rate_limit_retries=1,
                             retry_backoff_s=0.05) as notifier:
        slack.rate_limit_next(4, retry_after=2)
        await deliver_until_done(notifier, raw(firing), metrics, health)
        slack.rate_limit_next(2, retry_after=2, method="chat.postMessage")
        await deliver_until_done(notifier, raw(escalated), metrics, health)

    assert [c.status for c in slack.calls].count(429) == 6, "the storm was spent on deliveries"
    assert respects_retry_after(slack.calls, 2.0) == []
    assert notifier.stats["postponed"] >= 1, "the storm outlasted the client's own retries"
    [digest] = slack.messages("ml-budgets")
    assert digest.blocks[0]["text"]["text"] == ":bell: 5 cost alerts"
    assert sorted(r.text for r in digest.replies) == [
        f":rotating_light: Escalated from warn_80 to *limit*: ${10100 + i:,}.00 crossed limit "
        "($10,000.00)." for i in range(5)]
    infra = slack.messages("ml-infra")
    assert sorted(m.text.split(": ", 1)[0] for m in infra) == [
        "[CRITICAL] infra-monthly · team=network", "[CRITICAL] infra-monthly · team=storage"]
    [evaluation] = slack.messages("ml-eval")
    for root in (*infra, evaluation):
        assert len(root.replies) == 1 and root.replies[0].text.startswith(
            ":rotating_light: Escalated from warn_80 to *limit*")
    for change in firing:
        assert await ledger.thread(f"{change['alert_id']}@{NOVEMBER['start']}") is not None
    assert "ambiguous" not in await ledger.counts(), "Slack answered every request"


# ── through the real worker ─────────────────────────────────────────────────────────────────

RULES = """
rules:
  - name: team-daily
    kind: budget
    group_by: [team]
    period: day
    limit: 100
    warn_at: [0.5]
    notify: {slack: "#ml-budgets"}
"""
TEAMS = ["pretrain", "posttrain", "eval", "infra", "vision", "speech"]


@pytest.fixture
def slack_thread() -> Iterator[LocalSlackThread]:
    server = LocalSlackThread(["ml-budgets", "costline-alerts"])
    server.start()
    yield server
    server.stop()


def wait_for(condition: Callable[[], bool], what: str, worker: Worker,
              timeout: float = 120.0) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert worker.alive(), f"the worker died; see {worker.log}"
        assert time.time() < deadline, f"timed out waiting for {what}; see {worker.log}"
        time.sleep(0.25)


def usage(team: str, quantity: float) -> tuple[bytes, bytes]:
    event = {"event_id": f"storm-{team}", "kind": "usage", "ts": time.time() - 60,
             "resource_id": f"{team}-node", "resource_type": "gpu.h100", "unit": "gpu_hour",
             "quantity": quantity, "tags": {"team": team, "job": f"{team}-run"}}
    return team.encode(), json.dumps(event).encode()


def test_the_worker_keeps_alerts_in_kafka_through_a_429_storm_and_a_kill_and_posts_each_once(
        services: Any, kafka_namespace: str, tmp_path: Path,
        slack_thread: LocalSlackThread) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    env = worker_env(kafka_namespace, services.bootstrap, services.redis_url,
                     COSTLINE_RULES=str(rules), COSTLINE_RULES_TICK_S="2",
                     SLACK_BOT_TOKEN=DEFAULT_TOKEN, SLACK_API_URL=slack_thread.start_url)
    create_topics(Settings(kafka_bootstrap=services.bootstrap, namespace=kafka_namespace,
                           partitions=2))
    server = slack_thread.server
    assert server is not None
    slack_thread.loop.call_soon_threadsafe(lambda: server.rate_limit_next(8, retry_after=2))
    store = redis.Redis.from_url(services.redis_url)
    day = time.strftime("%Y-%m-%dT00:00:00Z", time.gmtime(time.time() - 60))
    threads = [f"{{{kafka_namespace}:slack}}:thread:{alert_id('team-daily', {'team': t})}@{day}"
               for t in TEAMS]
    worker = Worker(env, tmp_path / "worker.log")
    worker.start()
    try:
        produce(services.bootstrap, f"{kafka_namespace}.usage.v1",
                [usage(team, 24.1 + i) for i, team in enumerate(TEAMS)])
        wait_for(lambda: [c.status for c in server.calls].count(429) >= 2, "the storm", worker)
        worker.kill9()
        assert server.messages("ml-budgets") == [], "nothing got through before the kill"
        worker.start()  # only Kafka still has the alerts: the killed worker acked none of them
        wait_for(lambda: store.exists(*threads) == len(TEAMS), "every alert in Slack", worker)
        time.sleep(6)  # a few more evaluations and redeliveries: nothing may be sent again
        roots = {tuple(v.decode().split(" ", 1)) for v in store.mget(threads)}
    finally:
        worker.stop()
        store.close()

    calls = list(server.calls)
    assert [c.status for c in calls].count(429) == 8, "the storm outlasted the client's retries"
    assert respects_retry_after(calls, 2.0) == []
    posted = server.messages("ml-budgets")
    assert {(m.channel, m.ts) for m in posted} == roots, "one root per thread in the ledger"
    shown = " ".join(m.text for m in posted)
    assert all(f"team={team}" in shown for team in TEAMS), shown
    accepted = [c for c in server.calls_to("chat.postMessage") if c.status == 200 and not c.error]
    assert len(accepted) == len(posted), "nothing posted twice, no change beyond the first"
