"""kill -9 of the worker while its notifier is sending: after a restart no alert is lost, and
every message Slack shows twice is one the ledger counted as ambiguous (Slack may have accepted
a request whose answer died with the process). A notifier stopped before its request left is
not in doubt: nothing reached Slack, so nothing is counted or marked as sent again."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from costline.connectors.delivery_ledger import DeliveryLedger
from costline.connectors.notify.slack import AMBIGUOUS_MARK, SlackNotifier
from costline.connectors.redis_client import connect_async
from costline.connectors.slack_render import AlertChange
from costline.connectors.slack_server import DEFAULT_TOKEN, LocalSlack, LocalSlackThread
from costline.rules.engine import alert_id
from costline.streams.settings import Settings
from costline.streams.topics import create_topics
from tests.integration.streamkit import Worker, produce, read_all, worker_env

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
TEAMS = [f"team-{i:02d}" for i in range(12)]


@pytest.fixture
def slack() -> Iterator[LocalSlackThread]:
    server = LocalSlackThread(["ml-budgets", "costline-alerts"])
    server.start()
    yield server
    server.stop()


def wait_for(condition: Callable[[], bool], what: str, worker: Worker,
              timeout: float = 180.0) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert worker.alive(), f"the worker died; see {worker.log}"
        assert time.time() < deadline, f"timed out waiting for {what}; see {worker.log}"
        time.sleep(0.1)


def usage(stage: str, team: str, quantity: float) -> tuple[bytes, bytes]:
    event = {"event_id": f"{stage}-{team}", "kind": "usage", "ts": time.time() - 60,
             "resource_id": f"{team}-node", "resource_type": "gpu.h100", "unit": "gpu_hour",
             "quantity": quantity, "tags": {"team": team, "job": f"{team}-run"}}
    return team.encode(), json.dumps(event).encode()


def replies(server: LocalSlack) -> int:
    return sum(len(root.replies) for root in server.messages("ml-budgets"))


class Deliveries:
    """Every change the rule engine published, against what the ledger says was done."""

    def __init__(self, bootstrap: str, redis_url: str, namespace: str) -> None:
        self.bootstrap, self.namespace = bootstrap, namespace
        self.redis = redis.Redis.from_url(redis_url, decode_responses=True)

    def published(self) -> list[AlertChange]:
        found = read_all(self.bootstrap, f"{self.namespace}.alerts.v1", timeout_s=3)
        return [AlertChange.from_record(json.loads(message.value)) for message in found]

    def steps(self, change: AlertChange) -> dict[str, str]:
        key = f"{{{self.namespace}:slack}}:change:{change.thread_key}:{change.change_key}"
        return self.redis.hgetall(key)  # type: ignore[return-value]

    def undelivered(self) -> list[str]:
        """Changes with neither a root posted nor both the update and the reply done."""
        missing = []
        for change in self.published():
            steps = self.steps(change)
            done = {step for step, marker in steps.items() if marker.startswith("done")}
            if "root" not in done and not {"update", "reply"} <= done:
                missing.append(f"{change.alert_id} {change.change_key}: {steps}")
        return missing

    def sent_ts(self) -> set[str]:
        """The ``ts`` of every message the ledger recorded as accepted by Slack."""
        found = set()
        for change in self.published():
            for step, marker in self.steps(change).items():
                if step in ("root", "reply") and marker.startswith("done "):
                    found.add(marker.split(" ", 1)[1])
        return found

    def ambiguous(self) -> int:
        return int(self.redis.hget(f"{{{self.namespace}:slack}}:counts", "ambiguous") or 0)


def test_a_worker_killed_mid_burst_loses_nothing_and_every_duplicate_is_counted(
        services: Any, kafka_namespace: str, tmp_path: Path, slack: LocalSlackThread) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    env = worker_env(kafka_namespace, services.bootstrap, services.redis_url,
                     COSTLINE_RULES=str(rules), COSTLINE_RULES_TICK_S="2",
                     SLACK_BOT_TOKEN=DEFAULT_TOKEN, SLACK_API_URL=slack.start_url)
    create_topics(Settings(kafka_bootstrap=services.bootstrap, namespace=kafka_namespace,
                           partitions=2))
    server = slack.server
    assert server is not None
    ledger = Deliveries(services.bootstrap, services.redis_url, kafka_namespace)
    day = time.strftime("%Y-%m-%dT00:00:00Z", time.gmtime(time.time() - 60))
    threads = [f"{{{kafka_namespace}:slack}}:thread:{alert_id('team-daily', {'team': t})}@{day}"
               for t in TEAMS]
    usage_topic = f"{kafka_namespace}.usage.v1"
    worker = Worker(env, tmp_path / "worker.log")
    worker.start()
    try:
        produce(services.bootstrap, usage_topic, [usage("warn", t, 24.1) for t in TEAMS])
        wait_for(lambda: ledger.redis.exists(*threads) == len(TEAMS), "the first posts", worker)
        assert replies(server) == 0

        produce(services.bootstrap, usage_topic, [usage("over", t, 20.0) for t in TEAMS])
        wait_for(lambda: replies(server) >= 2, "the escalations to start", worker)
        worker.kill9()
        at_kill = replies(server)
        assert at_kill < len(TEAMS), "the kill landed while the burst was being sent"

        worker.start()
        wait_for(lambda: len(ledger.published()) >= 2 * len(TEAMS) and not
                 ledger.undelivered(), "every change delivered after the restart", worker)
        time.sleep(5)  # redelivered batches settle: nothing may be sent again
    finally:
        worker.stop()

    published = ledger.published()
    assert {c.group["team"] for c in published if c.line == "limit"} == set(TEAMS)
    assert ledger.undelivered() == []
    roots = server.messages("ml-budgets")
    shown = {m.ts for m in roots} | {r.ts for m in roots for r in m.replies}
    accepted = ledger.sent_ts()
    assert accepted <= shown, "every message the ledger recorded is in Slack"
    duplicates = len(shown - accepted)
    assert duplicates <= ledger.ambiguous(), (
        f"{duplicates} message(s) sent twice, {ledger.ambiguous()} counted as ambiguous")


# ── a notifier stopped before its request left ───────────────────────────────────────────

NOVEMBER = {"start": "2026-11-01T00:00:00Z", "end": "2026-12-01T00:00:00Z"}


def change(line: str, value: str, at: str) -> dict[str, Any]:
    group = {"team": "pretrain"}
    return {
        "alert_id": alert_id("team-monthly", group), "rule": "team-monthly", "kind": "budget",
        "severity": "warning", "state": "firing", "previous_state": "firing", "group": group,
        "since": "2026-11-30T08:00:00Z", "at": at, "value": value,
        "threshold": "8000.000000" if line == "warn_80" else "10000.000000", "line": line,
        "lines": [{"name": "warn_80", "value": "8000.000000"},
                  {"name": "limit", "value": "10000.000000"}],
        "currency": "USD", "unit": "currency", "period": NOVEMBER, "forecast": None,
        "rate_per_hour": None, "top": [], "faults": None, "reclaim": None,
        "notify": {"slack": "#ml-budgets", "route_by_tag": None, "channel": "#ml-budgets"},
        "mode": "live", "summary": "team=pretrain is past a line of its November budget.",
    }


@pytest.fixture
async def local_slack() -> AsyncIterator[LocalSlack]:
    async with LocalSlack(channels=["ml-budgets", "costline-alerts"]) as server:
        yield server


@pytest.fixture
async def slack_ledger(redis_url: str, namespace: str) -> AsyncIterator[DeliveryLedger]:
    client = connect_async(redis_url)
    yield DeliveryLedger(client, namespace)
    await client.aclose()


async def test_a_notifier_stopped_while_pacing_leaves_nothing_in_doubt(
        local_slack: LocalSlack, slack_ledger: DeliveryLedger) -> None:
    def notifier() -> SlackNotifier:
        return SlackNotifier(token=DEFAULT_TOKEN, ledger=slack_ledger,
                             fallback_channel="#costline-alerts", base_url=local_slack.url,
                             min_interval_s=30.0)

    escalation = change("limit", "10240.000000", "2026-11-30T11:00:00Z")
    async with notifier() as first:
        await first.deliver([change("warn_80", "8123.450000", "2026-11-30T08:05:00Z")])
        sending = asyncio.create_task(first.deliver([escalation]))
        while not local_slack.calls_to("chat.update"):
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        assert not sending.done(), "the reply waits for the channel's pace"
        sending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sending
    assert len(local_slack.calls_to("chat.postMessage")) == 1, "the reply never left"

    async with notifier() as restarted:
        [delivery] = await restarted.deliver([escalation])
    [root] = local_slack.messages("ml-budgets")
    assert delivery.outcome == "updated"
    assert [r.text for r in root.replies] == [
        ":warning: Escalated from warn_80 to *limit*: $10,240.00 crossed limit ($10,000.00)."]
    assert AMBIGUOUS_MARK not in root.replies[0].text
    assert "ambiguous" not in await slack_ledger.counts()
