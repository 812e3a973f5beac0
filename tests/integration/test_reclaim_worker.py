"""Reclamation inside the real worker, on the real Slurm: a crash between planned and executed."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from costline.streams.settings import Settings
from costline.streams.topics import create_topics
from tests.integration.slurm import SlurmCluster, slurm, slurm_up  # noqa: F401 - fixtures
from tests.integration.streamkit import Worker, produce, read_all, worker_env

pytestmark = pytest.mark.integration

RULES = """
rules:
  - name: idle-box
    kind: idle
    match: {resource_type: "gpu.*"}
    group_by: [team]
    metric: gpu_util
    below: 0.05
    for: 10m
    reclaim: {connector: slurm, grace: 20s, action: cancel}
    mode: live
"""


def _idle_samples(job_id: str) -> list[tuple[bytes, bytes]]:
    now = time.time()
    tags = {"team": "research", "slurm_job_id": job_id}
    batch = [{"event_id": f"s-{job_id}-{i}", "kind": "utilization", "ts": now - i * 30,
              "resource_id": f"lab/box-{job_id}", "resource_type": "gpu.a100",
              "metric": "gpu_util", "value": 0.01, "tags": tags} for i in range(40)]
    return [(batch[0]["event_id"].encode(), json.dumps(batch).encode())]


def _steps(bootstrap: str, namespace: str) -> list[dict]:
    return [json.loads(m.value) for m in read_all(bootstrap, f"{namespace}.actions.v1", 3)]


def _wait_for(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def test_a_worker_killed_between_planned_and_executed_cancels_the_job_once(
        services, kafka_namespace, tmp_path: Path, slurm: SlurmCluster):  # noqa: F811
    job = slurm.submit("notebook-idle")
    slurm.wait_running(job)
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    env = worker_env(kafka_namespace, services.bootstrap, services.redis_url,
                     COSTLINE_RULES=str(rules), COSTLINE_RULES_TICK_S="1")
    create_topics(Settings(kafka_bootstrap=services.bootstrap, namespace=kafka_namespace,
                           partitions=2))
    worker = Worker(env, tmp_path / "worker.log")
    worker.start()
    try:
        produce(services.bootstrap, f"{kafka_namespace}.usage.v1", _idle_samples(job))
        _wait_for(lambda: any(s["step"] == "planned"
                              for s in _steps(services.bootstrap, kafka_namespace)),
                  90, "the plan")
        worker.kill9()
        assert slurm.state(job) == "RUNNING"  # still inside its grace period
        worker.start()
        _wait_for(lambda: any(s["step"] == "executed"
                              for s in _steps(services.bootstrap, kafka_namespace)),
                  120, "the release")
        time.sleep(20)  # more reclamation rounds of the restarted worker
        steps = _steps(services.bootstrap, kafka_namespace)
        executed = {s["action_id"] for s in steps if s["step"] == "executed"}
        assert len(executed) == 1
        assert {s["plan_id"] for s in steps if s["step"] == "planned"} == {
            s["plan_id"] for s in steps if s["step"] == "executed"}
        assert slurm.state(job) in ("gone", "COMPLETING", "CANCELLED")
    finally:
        worker.stop()


DRY_RUN_RULES = """
rules:
  - name: idle-box
    kind: idle
    match: {resource_type: "gpu.*"}
    group_by: [team]
    metric: gpu_util
    below: 0.05
    for: 10m
    reclaim: {connector: dry_run, grace: 5s}
    mode: dry_run
"""


def test_a_short_grace_ends_within_one_reclaim_tick(services, kafka_namespace, tmp_path: Path):
    """A 5 s grace was released 17 s after its warning when the timer ran every 15 s; with
    COSTLINE_RECLAIM_TICK_S=1 the dry run's closing step follows the grace within a tick."""
    from datetime import datetime

    rules = tmp_path / "rules.yaml"
    rules.write_text(DRY_RUN_RULES)
    env = worker_env(kafka_namespace, services.bootstrap, services.redis_url,
                     COSTLINE_RULES=str(rules), COSTLINE_RULES_TICK_S="1",
                     COSTLINE_RECLAIM_TICK_S="1")
    create_topics(Settings(kafka_bootstrap=services.bootstrap, namespace=kafka_namespace,
                           partitions=2))
    worker = Worker(env, tmp_path / "worker.log")
    worker.start()
    try:
        produce(services.bootstrap, f"{kafka_namespace}.usage.v1", _idle_samples("77"))
        _wait_for(lambda: any(s["step"] == "skipped"
                              for s in _steps(services.bootstrap, kafka_namespace)),
                  90, "the dry run's closing step")
        at = {s["step"]: datetime.fromisoformat(s["at"].replace("Z", "+00:00")).timestamp()
              for s in _steps(services.bootstrap, kafka_namespace)}
        # grace 5 s, then at most one 1 s tick; RFC 3339 times are whole seconds
        assert 5 <= at["skipped"] - at["warned"] <= 5 + 1 + 1, at
    finally:
        worker.stop()
    assert b"\x1b[" not in worker.log.read_bytes(), "terminal escapes in a log file"
