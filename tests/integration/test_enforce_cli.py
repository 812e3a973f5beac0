"""``costline enforce lift | pause | resume | status`` and ``costline actions`` against Redis
(a single one and a Redis Cluster): the enforcement ledger's keys share one hash slot."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from costline.connectors.enforce_ledger import redis_enforce_ledger
from costline.connectors.plugins import PLUGINS
from costline.connectors.redis_client import connect_async
from costline.rules.durations import period_bounds
from costline.rules.findings import Finding
from costline.rules.loader import load_rules
from costline.streams.cli.root import _register, app
from costline.streams.worker.enforcer import Enforcer
from tests.integration.slurm import reclaim_redis_url

__all__ = ["reclaim_redis_url"]

RULES = """
rules:
  - name: team-daily
    kind: budget
    group_by: [team, project]
    period: day
    limit: 100
    enforce: {connector: dry_run, grace: 1h}
"""


@pytest.fixture(scope="module")
def runner() -> CliRunner:
    _register()
    return CliRunner()


@pytest.fixture
def rule_file(tmp_path: Path) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    return path


async def _warned(url: str, namespace: str, rule_file: Path, now: float) -> None:
    client = connect_async(url)

    async def kept(record: dict[str, object]) -> None:
        raise RuntimeError("the worker publishes")

    enforcer = Enforcer(rules=load_rules([rule_file], plugins=PLUGINS),
                        ledger=redis_enforce_ledger(client, namespace), sink=kept)
    finding = Finding(group={"team": "pretrain", "project": "llm"}, value=150_000_000,
                      line="limit", threshold=100_000_000, rank=0, lines=(),
                      period=period_bounds(now, "day", "UTC"))
    await enforcer.submit({"team-daily": [finding]}, now)
    await client.aclose()


def costline(runner: CliRunner, url: str, namespace: str, rule_file: Path,
             *args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["--redis-url", url, "--namespace", namespace, "--rules",
                                 str(rule_file), *args])
    return result.exit_code, result.stdout + (result.stderr if result.stderr_bytes else "")


def test_status_lift_and_the_audit_log(runner: CliRunner, any_redis_url: str, namespace: str,
                                       rule_file: Path) -> None:
    import time

    asyncio.run(_warned(any_redis_url, namespace, rule_file, time.time()))
    code, out = costline(runner, any_redis_url, namespace, rule_file, "enforce", "status",
                         "--json")
    assert code == 0, out
    [item] = json.loads(out)["enforcements"]
    assert (item["state"], item["group"]) == ("warned", {"team": "pretrain", "project": "llm"})

    code, out = costline(runner, any_redis_url, namespace, rule_file, "enforce", "lift",
                         "--rule", "team-daily", "--group", "project=llm", "--group",
                         "team=pretrain", "--by", "alice")
    assert code == 0, out
    assert out.startswith("team=pretrain,project=llm: not enforced; lifted by alice")
    code, out = costline(runner, any_redis_url, namespace, rule_file, "enforce", "status",
                         "--json")
    assert json.loads(out)["enforcements"] == []

    code, out = costline(runner, any_redis_url, namespace, rule_file, "actions", "--json")
    steps = [(r["step"], r["automation"]) for r in json.loads(out)]
    assert steps == [("skipped", "enforce"), ("warned", "enforce"), ("planned", "enforce")]
    code, out = costline(runner, any_redis_url, namespace, rule_file, "enforce", "lift",
                         "--rule", "team-daily", "--group", "team=pretrain")
    assert code == 2 and "groups by team, project" in out


def test_pause_and_resume(runner: CliRunner, any_redis_url: str, namespace: str,
                          rule_file: Path) -> None:
    code, out = costline(runner, any_redis_url, namespace, rule_file, "enforce", "pause",
                         "--by", "ops", "--reason", "maintenance")
    assert (code, out.strip()) == (0, "enforcement paused by ops")
    code, out = costline(runner, any_redis_url, namespace, rule_file, "enforce", "status")
    assert out.startswith("paused by ops")
    code, out = costline(runner, any_redis_url, namespace, rule_file, "enforce", "resume")
    assert out.strip() == "enforcement resumed"
