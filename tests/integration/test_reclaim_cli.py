"""``costline actions`` and ``costline reclaim pause | resume | status`` against a single Redis
and a Redis Cluster."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from costline.connectors.reclaim_ledger import RedisReclaimLedger
from costline.connectors.redis_client import connect_async
from costline.rules.findings import ReclaimRequest
from costline.rules.reclaim import make_plan, planned
from costline.streams.cli.root import _register, app
from tests.integration.slurm import reclaim_redis_url

__all__ = ["reclaim_redis_url"]
ROOT = Path(__file__).parents[2]


@pytest.fixture
def redis_url(reclaim_redis_url: str) -> str:
    """The single Redis of ``any_redis_url``: a private one when none is configured."""
    return reclaim_redis_url


@pytest.fixture(scope="module")
def runner() -> CliRunner:
    _register()
    return CliRunner()


def costline(runner: CliRunner, url: str, namespace: str, *args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["--redis-url", url, "--namespace", namespace, *args])
    return result.exit_code, result.stdout


async def _one_plan(url: str, namespace: str) -> str:
    request = ReclaimRequest(resource_id="slurm/4211", resource_type="gpu.h100", tags={},
                             connector="slurm", params={"action": "cancel"}, grace=900,
                             mode="dry_run", idle_since=1_796_025_600.0,
                             requested_at=1_796_027_400.0)
    plan = make_plan(request, "gpu-idle", {"job_id": "4211"}, 2_490_000, "USD",
                     1_796_027_400.0)
    client = connect_async(url)
    await RedisReclaimLedger(client, namespace).open(plan, planned(plan, 0).to_dict())
    await client.aclose()
    return plan.plan_id


def test_actions_lists_the_latest_steps(runner: CliRunner, any_redis_url: str,
                                        namespace: str) -> None:
    plan_id = asyncio.run(_one_plan(any_redis_url, namespace))
    code, out = costline(runner, any_redis_url, namespace, "actions", "--json")
    assert code == 0
    [record] = json.loads(out)
    assert (record["action_id"], record["step"], record["mode"]) == (
        f"{plan_id}:planned", "planned", "dry_run")
    code, out = costline(runner, any_redis_url, namespace, "actions")
    assert code == 0 and "planned" in out and "gpu-idle" in out


def test_pause_status_resume(runner: CliRunner, any_redis_url: str,
                             namespace: str) -> None:
    asyncio.run(_one_plan(any_redis_url, namespace))
    assert costline(runner, any_redis_url, namespace, "reclaim", "pause", "--by", "ada",
                    "--reason", "maintenance") == (0, "reclamation paused by ada\n")
    code, out = costline(runner, any_redis_url, namespace, "reclaim", "status", "--json")
    report = json.loads(out)
    assert (code, report["paused"], report["paused_by"], report["reason"]) == (
        0, True, "ada", "maintenance")
    assert [(p["resource_id"], p["state"]) for p in report["plans"]] == [
        ("slurm/4211", "planned")]
    code, out = costline(runner, any_redis_url, namespace, "reclaim", "status")
    assert code == 0 and out.startswith("paused by ada") and "1 open plan(s)" in out
    assert costline(runner, any_redis_url, namespace, "reclaim", "resume") == (
        0, "reclamation resumed\n")
    assert costline(runner, any_redis_url, namespace, "reclaim", "resume") == (
        0, "reclamation was not paused\n")
    assert costline(runner, any_redis_url, namespace, "reclaim", "status")[1].startswith(
        "running")


def test_status_gives_the_time_under_the_rule_as_loaded_now(
        runner: CliRunner, any_redis_url: str, namespace: str, tmp_path: Path) -> None:
    """A grace lengthened in the rule file since the plan was made applies: the status says
    when the plan is due now. A rule set that does not load leaves the planned time."""
    asyncio.run(_one_plan(any_redis_url, namespace))
    rules = (ROOT / "rules" / "definitions" / "efficiency.yaml").read_text()
    assert "grace: 15m" in rules
    lengthened = tmp_path / "rules.yaml"
    lengthened.write_text(rules.replace("grace: 15m", "grace: 2h"))
    broken = tmp_path / "broken.yaml"
    broken.write_text("rules: [{name: x}]\n")
    shown = {}
    for name, path in (("lengthened", lengthened), ("broken", broken)):
        done = runner.invoke(app, ["--redis-url", any_redis_url, "--namespace", namespace,
                                   "reclaim", "status", "--json"],
                             env={"COSTLINE_RULES": str(path)})
        assert done.exit_code == 0, done.output
        [plan] = json.loads(done.stdout)["plans"]
        shown[name] = (plan["execute_at"], plan["due"])
        if name == "broken":
            assert "do not load" in done.stderr
    # planned at 2026-11-30T08:30:00Z with 15 minutes of grace
    assert shown == {"lengthened": ("2026-11-30T10:30:00Z", True),
                     "broken": ("2026-11-30T08:45:00Z", True)}
