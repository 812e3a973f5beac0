"""Spend in, alerts out: the real worker evaluates rules and posts to a Slack-compatible server."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from costline.connectors.slack_server import DEFAULT_TOKEN, LocalSlackThread
from costline.streams.settings import Settings
from costline.streams.topics import create_topics
from tests.integration.streamkit import Worker, cli_json, produce, worker_env

pytestmark = pytest.mark.integration

RULES = """
rules:
  - name: eval-daily
    kind: budget
    match: {team: eval}
    group_by: [team]
    period: day
    limit: 100
    warn_at: [0.5]
    severity: warning
    notify: {slack: "#ml-budgets"}
"""


@pytest.fixture
def slack() -> Iterator[LocalSlackThread]:
    server = LocalSlackThread(["ml-budgets", "costline-alerts"])
    server.start()
    yield server
    server.stop()


def _usage(i: int, quantity: float) -> tuple[bytes, bytes]:
    event = {"event_id": f"a{i}", "kind": "usage", "ts": time.time() - 60, "resource_id": "n1",
             "resource_type": "gpu.h100", "quantity": quantity, "unit": "gpu_hour",
             "tags": {"team": "eval", "job": "sweep-7"}}
    return event["event_id"].encode(), json.dumps(event).encode()


def _wait(condition, timeout: float = 60.0, what: str = "") -> None:  # type: ignore[no-untyped-def]
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)


def test_a_budget_alert_is_posted_escalated_in_place_and_survives_a_restart(
        services, kafka_namespace, tmp_path: Path, slack: LocalSlackThread):
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    env = worker_env(kafka_namespace, services.bootstrap, services.redis_url,
                     COSTLINE_RULES=str(rules), COSTLINE_RULES_TICK_S="2",
                     SLACK_BOT_TOKEN=DEFAULT_TOKEN, SLACK_API_URL=slack.start_url)
    create_topics(Settings(kafka_bootstrap=services.bootstrap, namespace=kafka_namespace,
                           partitions=2))
    worker = Worker(env, tmp_path / "worker.log")
    worker.start()
    server = slack.server
    assert server is not None
    try:
        usage = f"{kafka_namespace}.usage.v1"
        produce(services.bootstrap, usage, [_usage(1, 24.1)])  # 60.009 USD: past the 50% line
        _wait(lambda: len(server.messages("ml-budgets")) == 1, what="the first post")
        first = server.messages("ml-budgets")[0]
        assert "eval-daily" in first.text and "team=eval" in first.text
        assert "60.01" in first.text or "60.009" in first.text

        produce(services.bootstrap, usage, [_usage(2, 20.0)])  # 109.809 USD: past the limit
        _wait(lambda: first.edits >= 1 and first.replies, what="the escalation")
        assert len(server.messages("ml-budgets")) == 1  # updated in place, not a new post
        alerts = cli_json(env, "alerts")
        assert [(a["rule"], a["state"], a["value"], a["threshold"]) for a in alerts] == [
            ("eval-daily", "firing", "109.809000", "100.000000")]

        worker.kill9()
        worker.start()
        time.sleep(12)  # a few evaluations of the restarted worker
        assert len(server.messages("ml-budgets")) == 1
        assert len(server.calls_to("chat.postMessage")) == 1 + len(first.replies)
    finally:
        worker.stop()


def test_a_bad_rule_reload_keeps_the_last_good_set(services, kafka_namespace, tmp_path: Path):
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    env = worker_env(kafka_namespace, services.bootstrap, services.redis_url,
                     COSTLINE_RULES=str(rules), COSTLINE_RULES_TICK_S="1")
    create_topics(Settings(kafka_bootstrap=services.bootstrap, namespace=kafka_namespace,
                           partitions=2))
    worker = Worker(env, tmp_path / "worker.log")
    worker.start()
    try:
        from tests.integration.test_aggregation import _health

        _wait(lambda: _alive(env) and _health(env).get("rules", {}).get("loaded") == 1,
              what="the first rule load")
        rules.write_text(RULES.replace("limit: 100", "limit: lots"))
        _wait(lambda: "rules" in _health(env)["problems"], what="the refused reload")
        produce(services.bootstrap, f"{kafka_namespace}.usage.v1", [_usage(1, 50.0)])
        _wait(lambda: cli_json(env, "alerts") != [],
              what="an alert from the last good rules")
        rules.write_text(RULES)
        _wait(lambda: "rules" not in _health(env)["problems"], what="the good reload")
    finally:
        worker.stop()


def _alive(env: dict[str, str]) -> bool:
    from tests.integration.test_aggregation import _health

    try:
        _health(env)
    except OSError:
        return False
    return True
