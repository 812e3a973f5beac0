"""``costline scrape slurm`` against a real Slurm (``bash .ci/slurm.sh`` starts a single-node
one): a running job's CPU-hours of one window reach the worker's spend once, tagged from the
job, however many scrapers counted that window."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis import Redis

from costline.connectors.slurm_scrape import SlurmJob, parse_squeue, run_squeue
from costline.rules.prices import PriceBook, exact, to_micro
from costline.streams.settings import Settings
from costline.streams.topics import create_topics
from tests.conftest import unavailable
from tests.integration.streamkit import (
    REPO,
    Worker,
    read_all,
    rows_by_group,
    run_cli,
    spend_json,
    wait_caught_up,
    worker_env,
)

pytestmark = pytest.mark.integration

WINDOW = 10
PRICES = PriceBook.load(REPO / "rules" / "prices" / "example.yaml")


@pytest.fixture
def slurm() -> None:
    """A Slurm whose node can run a job."""
    for tool in ("squeue", "sbatch", "sinfo", "scancel"):
        if shutil.which(tool) is None:
            unavailable("Slurm", f"{tool} is not installed (bash .ci/slurm.sh sets one up)")
    try:
        probe = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], capture_output=True,
                               text=True, timeout=20)
    except subprocess.TimeoutExpired:
        unavailable("Slurm", "sinfo did not answer in 20s")
    said = probe.stdout.strip() or probe.stderr.strip()[:200]
    if probe.returncode != 0 or not {"idle", "mix", "alloc"} & set(probe.stdout.split()):
        unavailable("Slurm", f"no node can run a job (sinfo: {said})")


def job_state(job_id: str) -> SlurmJob | None:
    return next((j for j in parse_squeue(run_squeue()) if j.job_id == job_id), None)


@pytest.fixture
def running_job(slurm: None) -> Iterator[SlurmJob]:
    submitted = subprocess.run(
        ["sbatch", "--parsable", "-J", "costline-scrape-test", "-n", "1", "--output=/dev/null",
         "--comment", "project=llm-70b team=pretrain owner=ana", "--wrap", "sleep 900"],
        capture_output=True, text=True, timeout=30, check=True)
    job_id = submitted.stdout.strip().split(";")[0]
    try:
        deadline = time.monotonic() + 60
        while True:
            job = job_state(job_id)
            if job is not None and "RUNNING" in job.state and job.start is not None:
                break
            assert time.monotonic() < deadline, f"job {job_id} did not start: {job}"
            time.sleep(0.5)
        yield job
    finally:
        subprocess.run(["scancel", job_id], timeout=30, check=False)


@pytest.fixture
def worker(services: Any, kafka_namespace: str, tmp_path: Path) -> Iterator[Worker]:
    env = worker_env(kafka_namespace, services.bootstrap, services.redis_url)
    create_topics(Settings(kafka_bootstrap=services.bootstrap, namespace=kafka_namespace,
                           partitions=4))
    proc = Worker(env, tmp_path / "worker.log")
    proc.start()
    yield proc
    proc.stop()


def scrape_once(worker: Worker) -> dict[str, Any]:
    done = run_cli(worker.env, "scrape", "slurm", "--once", "--interval", str(WINDOW), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_a_running_job_is_counted_once_per_window_with_its_tags(
    services: Any, worker: Worker, running_job: SlurmJob,
) -> None:
    assert running_job.start is not None
    # Just after the first window end the job ran in, so both scrapes below see that window.
    boundary = math.ceil(max(time.time(), running_job.start + 1) / WINDOW) * WINDOW
    time.sleep(max(0.0, boundary - time.time()) + 0.2)
    rounds = [scrape_once(worker), scrape_once(worker)]
    assert all(r["error"] is None and r["events"].get("usage", 0) >= 1 for r in rounds)

    namespace = worker.env["COSTLINE_NAMESPACE"]
    topic = f"{namespace}.usage.v1"
    redis = Redis.from_url(services.redis_url)
    try:
        wait_caught_up(worker.env, worker)
    finally:
        redis.close()
    mine = [event for record in read_all(services.bootstrap, topic, timeout_s=3)
            for event in json.loads(record.value)
            if event["resource_id"] == f"slurm/{running_job.job_id}"]
    ids = {event["event_id"] for event in mine}
    assert len(mine) >= 2 and len(ids) < len(mine), "both scrapes should count one window"

    first = mine[0]
    window_end = int(first["event_id"].split(":")[3])
    ran = window_end - max(window_end - WINDOW, running_job.start)
    assert (first["resource_type"], first["unit"]) == ("cpu.general", "vcpu_hour")
    assert first["quantity"] == pytest.approx(running_job.cpus * ran / 3600)
    assert first["tags"] == {
        "job": "costline-scrape-test", "project": "llm-70b", "team": "pretrain",
        "owner": "ana", "slurm_job_id": running_job.job_id,
        **{k: v for k, v in running_job.tags.items()
           if k in ("account", "partition", "user", "cluster")}}

    price = PRICES.prices["cpu.general"].price
    expected = sum(to_micro(exact(e["quantity"]) * price)
                   for e in {e["event_id"]: e for e in mine}.values())
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(first["ts"]))
    spend = spend_json(worker.env, "--by", "slurm_job_id", "--where",
                       f"slurm_job_id={running_job.job_id}", "--period", "day", "--at", at)
    assert rows_by_group(spend, ["slurm_job_id"], "cost") == {(running_job.job_id,): expected}
