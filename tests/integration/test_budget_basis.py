"""A budget on net spend and one on gross spend, with a credit in the data, through the real
worker: the gross budget fires when spend crosses its line, the net one only when spend less
the credit does."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from costline.streams.settings import Settings
from costline.streams.topics import create_topics
from tests.integration.streamkit import Worker, cli_json, produce, wait_caught_up, worker_env

pytestmark = pytest.mark.integration

RULES = """
rules:
  - name: eval-net
    kind: budget
    match: {team: eval}
    group_by: [team]
    period: month
    limit: 100
  - name: eval-gross
    kind: budget
    basis: gross
    match: {team: eval}
    group_by: [team]
    period: month
    limit: 100
"""


def _money(event_id: str, cost: float, charge: str = "usage") -> tuple[bytes, bytes]:
    """``cost`` of GPU time (or a credit) for team eval, stated on the event."""
    event = {"event_id": event_id, "kind": "usage", "ts": time.time() - 1, "resource_id": "n1",
             "resource_type": "gpu.h100", "quantity": 1.0 if cost > 0 else 0.0,
             "unit": "gpu_hour", "cost": cost, "charge": charge, "tags": {"team": "eval"}}
    return event_id.encode(), json.dumps(event).encode()


def _firing(env: dict[str, str]) -> dict[str, str]:
    return {alert["rule"]: alert["value"] for alert in cli_json(env, "alerts")
            if alert["state"] == "firing"}


def _until(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)


def test_net_and_gross_budgets_fire_at_different_moments(
        services: Any, kafka_namespace: str, tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    env = worker_env(kafka_namespace, services.bootstrap, services.redis_url,
                     COSTLINE_RULES=str(rules), COSTLINE_RULES_TICK_S="1")
    create_topics(Settings(kafka_bootstrap=services.bootstrap, namespace=kafka_namespace,
                           partitions=2))
    worker = Worker(env, tmp_path / "worker.log")
    worker.start()
    usage = f"{kafka_namespace}.usage.v1"
    try:
        produce(services.bootstrap, usage, [_money("b1", 80.0), _money("b2", -30.0, "credit")])
        wait_caught_up(env, worker)
        time.sleep(3)  # a few evaluations: gross 80, net 50, under both lines
        assert _firing(env) == {}

        produce(services.bootstrap, usage, [_money("b3", 40.0)])  # gross 120, net 90
        _until(lambda: "eval-gross" in _firing(env), "the gross budget")
        time.sleep(3)
        assert _firing(env) == {"eval-gross": "120.000000"}

        produce(services.bootstrap, usage, [_money("b4", 20.0)])  # gross 140, net 110
        _until(lambda: "eval-net" in _firing(env), "the net budget")
        assert _firing(env) == {"eval-gross": "140.000000", "eval-net": "110.000000"}
        report = cli_json(env, "spend", "--by", "team")
        assert [(r["cost"], r["gross"], r["credits"]) for r in report["rows"]] == [
            ("110.000000", "140.000000", "30.000000")]
    finally:
        worker.stop()
