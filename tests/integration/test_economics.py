"""Training economics through the real worker, Kafka and Redis: a run's dollars per million
tokens and per step, a failed run's spend as waste, the checkpoint inventory, the interval
advice, and the lifecycle deleting real files — only the ones it may."""

from __future__ import annotations

import json
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from costline.rules.durations import period_bounds
from costline.streams.settings import Settings
from costline.streams.topics import create_topics
from tests.integration.streamkit import (
    Worker,
    cli_json,
    produce,
    read_all,
    run_cli,
    wait_caught_up,
    worker_env,
)

pytestmark = pytest.mark.integration

HOUR, HALF = 3600, 1800
TB = 10**12
RUN = {"project": "llm-70b", "stage": "pretrain", "job": "run-42"}
SFT = {"project": "assistant", "stage": "posttrain", "job": "sft-7"}
RULES = """
rules:
  - name: retention
    kind: checkpoint_lifecycle
    match: {{stage: pretrain}}
    keep_last: 3
    keep_every: 4
    expire_after: 2h
    act: {{connector: filesystem, grace: 3s, root: "{root}"}}
    mode: live
  - name: interval
    kind: checkpoint_interval
    match: {{stage: pretrain}}
    fault_rate: 0.000474
"""


def events(now: float, root: Path) -> list[tuple[str, list[dict[str, Any]]]]:
    """Eight hours of run-42 on 512 H100s ($2.49 a GPU-hour) training 640M tokens in 100
    steps an hour, a 1 TB checkpoint every 30 minutes (#1 eight hours ago … #16 thirty
    minutes ago; #3 tagged keep=true, #5 being restored), and sft-7, 16 GPU-hours that
    failed."""
    usage = [{"event_id": f"u-{h}", "kind": "usage", "ts": now - h * HOUR,
              "resource_id": "cluster-a/pool", "resource_type": "gpu.h100",
              "unit": "gpu_hour", "quantity": 512.0, "tags": RUN} for h in range(1, 9)]
    usage.append({"event_id": "u-sft", "kind": "usage", "ts": now - 3 * HOUR,
                  "resource_id": "cluster-b/node-1", "resource_type": "gpu.h100",
                  "unit": "gpu_hour", "quantity": 16.0, "tags": SFT})
    progress = [{"event_id": f"p-{h}", "kind": "progress", "ts": now - h * HOUR + 600,
                 "step": 100 * (9 - h), "steps": 100, "tokens": 640_000_000, "tags": RUN}
                for h in range(1, 9)]
    checkpoints = []
    for i in range(1, 17):
        folder = root / "run-42" / f"step-{i}"
        folder.mkdir(parents=True)
        (folder / "model.pt").write_bytes(b"w" * 4096)
        tags = {**RUN, "keep": "true"} if i == 3 else RUN
        checkpoints.append({"event_id": f"c-{i}", "kind": "checkpoint",
                            "ts": now - (17 - i) * HALF, "location": str(folder),
                            "step": 50 * i, "bytes": TB, "tier": "storage.parallel_fs",
                            "write_seconds": 60, "tags": tags})
    others = [
        {"event_id": "r-5", "kind": "restore", "ts": now - 600,
         "location": str(root / "run-42" / "step-5"), "tags": RUN},
        {"event_id": "end-sft", "kind": "run_end", "ts": now - HOUR, "status": "failed",
         "reason": "NCCL watchdog", "tags": SFT},
    ]
    return [("usage", usage), ("usage", progress), ("usage", progress),  # a resend
            ("usage", checkpoints), ("usage", others)]


def _steps(bootstrap: str, namespace: str) -> list[dict[str, Any]]:
    return [json.loads(m.value) for m in read_all(bootstrap, f"{namespace}.actions.v1", 3)]


def test_the_economics_of_a_run_end_to_end(services, kafka_namespace, tmp_path: Path) -> None:
    root, outside = tmp_path / "hot", tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "precious.bin").write_bytes(b"never touched")
    now = time.time()
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES.format(root=root))
    env = worker_env(kafka_namespace, services.bootstrap, services.redis_url,
                     COSTLINE_RULES=str(rules), COSTLINE_RULES_TICK_S="1",
                     COSTLINE_RECLAIM_TICK_S="1")
    create_topics(Settings(kafka_bootstrap=services.bootstrap, namespace=kafka_namespace,
                           partitions=4))
    for topic, batch in events(now, root):
        produce(services.bootstrap, f"{kafka_namespace}.{topic}.v1",
                [(batch[0]["event_id"].encode(), json.dumps(batch).encode())])
    # nothing is planned until everything is counted and #2 is pinned
    assert run_cli(env, "checkpoints", "pause", "--reason", "test").returncode == 0
    pinned = run_cli(env, "checkpoints", "pin", str(root / "run-42" / "step-2"), "--by", "erin")
    assert pinned.returncode == 0, pinned.stderr
    worker = Worker(env, tmp_path / "worker.log")
    worker.start()
    try:
        wait_caught_up(env, worker)
        _check_runs(env, now)
        _check_inventory(env)
        _check_advice(env, now)
        planned = cli_json(env, "checkpoints", "plan")
        # older than 2 h: #1–#13; every 4th kept (#4, #8, #12); pinned #2, exempt #3,
        # restored #5
        doomed = {1, 6, 7, 9, 10, 11, 13}
        assert {int(p["location"].rsplit("-", 1)[1]) for p in planned} == doomed
        assert run_cli(env, "checkpoints", "resume").returncode == 0
        deadline = time.time() + 90
        while time.time() < deadline:
            steps = _steps(services.bootstrap, kafka_namespace)
            if len([s for s in steps if s["step"] == "executed"]) >= len(doomed):
                break
            time.sleep(1)
        time.sleep(3)  # more rounds: nothing else may happen
        left = {int(p.name.split("-")[1]) for p in (root / "run-42").iterdir()}
        assert left == set(range(1, 17)) - doomed
        assert (outside / "precious.bin").read_bytes() == b"never touched"
        steps = _steps(services.bootstrap, kafka_namespace)
        assert len([s for s in steps if s["step"] == "executed"]) == len(doomed)
        assert all(s["saves_per_day"] == "9.840000" for s in steps)  # $0.41 an hour
        after = cli_json(env, "checkpoints", "list")
        assert after["tiers"][0]["checkpoints"] == 16 - len(doomed)
        alerts = {a["rule"]: a for a in cli_json(env, "alerts")}
        assert alerts["interval"]["group"] == {"job": "run-42"}
    finally:
        worker.stop()


def _check_runs(env: dict[str, str], now: float) -> None:
    report = cli_json(env, "runs")
    shown = run_cli({**env, "COLUMNS": "160"}, "runs")
    assert shown.returncode == 0 and "$1.99" in shown.stdout and "5.12B" in shown.stdout
    runs = {row["run"]: row for row in report["runs"]}
    # 8 × 512 GPU-hours at $2.49: $10,199.04 for 5,120M tokens in 800 steps (the resend
    # counted once): $1.992 per million tokens, $12.7488 a step
    assert runs["run-42"] | {"ended_at": None} == {
        "run": "run-42", "status": "running", "ended_at": None, "cost": "10199.040000",
        "waste": "0.000000", "tokens": "5120000000", "cost_per_mtok": "1.992000",
        "steps": "800", "cost_per_step": "12.748800", "checkpoints": 16}
    # sft-7 failed: its 16 GPU-hours ($39.84) are all waste
    assert (runs["sft-7"]["status"], runs["sft-7"]["cost"], runs["sft-7"]["waste"]) == (
        "failed", "39.840000", "39.840000")
    start, _ = period_bounds(now, "month", "UTC")
    hours = [h for h in range(1, 9) if now - h * HOUR >= start]
    spend = cli_json(env, "spend", "--by", "job", "--per", "tokens")
    row = next(r for r in spend["rows"] if r["group"] == {"job": "run-42"})
    assert row["tokens"] == str(640_000_000 * len(hours))
    if now - 3 * HOUR >= start:  # sft-7's hours are in this month
        by_fault = cli_json(env, "spend", "--by", "fault", "--where", "job=sft-7")
        assert by_fault["rows"] == [
            {"group": {"fault": ""}, "cost": "39.840000", "gross": "39.840000",
             "credits": "0.000000", "waste": "0.000000"},
            {"group": {"fault": "failed_run"}, "cost": "0.000000", "gross": "0.000000",
             "credits": "0.000000", "waste": "39.840000"}]


def _check_inventory(env: dict[str, str]) -> None:
    report = cli_json(env, "checkpoints", "list")
    # 16 TB on storage.parallel_fs at $0.00041/GB-hour: $6.56 an hour, $157.44 a day
    assert report["tiers"][0] | {"so_far": "?"} == {
        "tier": "storage.parallel_fs", "checkpoints": 16, "bytes": 16 * TB, "runs": 1,
        "per_day": "157.440000", "so_far": "?"}
    [run] = report["runs"]
    assert run["checkpoints"][-1]["latest"] and run["checkpoints"][1]["pinned_by"] == "erin"
    shown = run_cli({**env, "COLUMNS": "160"}, "checkpoints")  # the list, for people
    assert shown.returncode == 0 and "run-42: 16 checkpoint(s)" in shown.stdout
    assert "pinned by erin" in shown.stdout and "$157.44" in shown.stdout


def _check_advice(env: dict[str, str], now: float) -> None:
    # As of the moment the events were made: by the time the command runs, the clock may be
    # in the next 5-minute slot, and the 6-hour window would have moved past the oldest hour.
    report = cli_json(env, "advise", "checkpoints", "--rule", "interval", "--at", str(now))
    [run] = report["runs"]
    assert (run["run"], run["accelerators"], run["interval_seconds"], run["write_seconds"]) == (
        "run-42", "512.00", "1800.0", "60.0")
    assert run["burn_per_hour"] == "1274.880000" and not run["fault_rate"]["measured"]
    assert run["storage_per_hour"] == "6.560000"
    assert Decimal(run["at_stake_per_day"]) > 0
