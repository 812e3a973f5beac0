"""Budget enforcement inside the real worker, on the real Slurm with accounting: spend crosses
the line, the worker holds the account's pending job and says so in an alert of its own, and
``costline enforce lift`` gives it back."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from costline.streams.settings import Settings
from costline.streams.topics import create_topics
from tests.integration.slurm import (  # noqa: F401 - fixtures
    SlurmCluster,
    slurm,
    slurm_account,
    slurm_accounting,
    slurm_up,
)
from tests.integration.streamkit import Worker, produce, read_all, worker_env

pytestmark = pytest.mark.integration

RULES = """
rules:
  - name: account-daily
    kind: budget
    group_by: [team]
    period: day
    limit: 100
    enforce: {connector: slurm, action: hold_pending, account_tag: team, grace: 2s}
    mode: live
"""


def _spend(account: str) -> list[tuple[bytes, bytes]]:
    event = {"event_id": f"u-{account}", "kind": "usage", "ts": time.time() - 30,
             "resource_id": "hpc/pool", "resource_type": "gpu.h100", "quantity": 50,
             "unit": "gpu_hour", "tags": {"team": account}}
    return [(event["event_id"].encode(), json.dumps(event).encode())]


def _records(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    return [json.loads(m.value) for m in read_all(bootstrap, topic, 3)]


def _wait_for(check: Any, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not check():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def test_the_worker_holds_a_pending_job_and_the_command_line_lifts_it(
        services: Any, kafka_namespace: str, tmp_path: Path, slurm: SlurmCluster,  # noqa: F811
        slurm_account: str) -> None:  # noqa: F811
    account = slurm_account
    # Far enough ahead that the job is still pending however slowly the worker starts; once
    # held, its begin time is brought forward, so only the hold keeps it from running.
    queued = slurm.submit("queued", 600, f"--account={account}", "--begin=now+600")
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    env = worker_env(kafka_namespace, services.bootstrap, services.redis_url,
                     COSTLINE_RULES=str(rules), COSTLINE_RULES_TICK_S="1",
                     COSTLINE_RECLAIM_TICK_S="1")
    create_topics(Settings(kafka_bootstrap=services.bootstrap, namespace=kafka_namespace,
                           partitions=2))
    actions, alerts = f"{kafka_namespace}.actions.v1", f"{kafka_namespace}.alerts.v1"
    worker = Worker(env, tmp_path / "worker.log")
    worker.start()
    try:
        produce(services.bootstrap, f"{kafka_namespace}.usage.v1", _spend(account))
        _wait_for(lambda: any(r["step"] == "executed"
                              for r in _records(services.bootstrap, actions)), 90, "the hold")
        assert slurm.reason(queued) == "PENDING JobHeldAdmin"
        subprocess.run(["scontrol", "update", f"JobId={queued}", "StartTime=now"],
                       check=True, capture_output=True, timeout=30)
        time.sleep(3)  # two of CI's backfill cycles
        assert slurm.reason(queued) == "PENDING JobHeldAdmin"
        changes = [c for c in _records(services.bootstrap, alerts)
                   if c["alert_id"] == f"account-daily/enforce/team={account}"]
        assert [c["state"] for c in changes][-1] == "firing"
        assert changes[-1]["enforce"] == {"subject": f"team={account}", "approve": False,
                                          "lift": True}

        done = subprocess.run(
            [sys.executable, "-m", "costline.streams", "enforce", "lift", "--rule",
             "account-daily", "--group", f"team={account}", "--by", "ops"],
            env=env, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"team={account}: lifted by ops")
        _wait_for(lambda: slurm.state(queued) == "RUNNING", 30, "the job to run")
        _wait_for(lambda: any(r["step"] == "lifted"
                              for r in _records(services.bootstrap, actions)), 30,
                  "the worker to publish the lift")
    finally:
        worker.stop()
