"""A month of a training cluster, compressed: the events ``costline demo`` plays.

The figures follow public reports so the story is plausible, not invented:

* Llama 3 pre-training saw 419 unexpected interruptions in 54 days on 16,384 H100s, 78% of
  them hardware (Meta, "The Llama 3 Herd of Models", 2024, §3.3.4): about 4.7e-4
  interruptions per GPU-day, so a 512-GPU run fails about once every four days.
* Silent data corruption hits about one machine in a thousand in a large fleet (Dixit et al.,
  "Silent Data Corruptions at Scale", Meta, 2021); when it is found, training rolls back to
  the last checkpoint verified clean, hours earlier.
* Collective-communication timeouts (NCCL watchdog, default 10-30 min) stall every rank of a
  job before the job is restarted.

Everything here is generated from a seed, so two runs tell the same story, and it is placed
relative to ``now`` alone: the last ``days`` days, whatever the day of the month. Calendar
budgets then see the part of those days that falls in their period.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from costline.streams.demo import training
from costline.streams.demo.training import hours

HOUR = 3600
INTERRUPTIONS_PER_GPU_DAY = 419 / (54 * 16384)


@dataclass
class Scenario:
    now: float
    start: float
    # Messages for the usage topic: one event, or a list of events sent as one batch.
    usage: list[dict[str, Any] | list[dict[str, Any]]] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)
    story: list[str] = field(default_factory=list)


def _usage(event_id: str, ts: float, resource_id: str, resource_type: str, unit: str,
           quantity: float, tags: dict[str, str]) -> dict[str, Any]:
    return {"event_id": event_id, "kind": "usage", "ts": round(ts, 3),
            "resource_id": resource_id, "resource_type": resource_type, "unit": unit,
            "quantity": quantity, "tags": tags}


DEV_BOXES = [("dev-gpu-01", "erin", 0.01), ("dev-gpu-02", "farid", 0.02),
             ("dev-gpu-03", "gita", 0.0), ("dev-gpu-04", "hugo", 0.71)]
GPUS_PER_BOX = 8
FOCUS_SAMPLE = Path(__file__).parent / "data" / "focus" / "focus_1.0_sample_1000.csv"


def training_cluster(now: float, days: int = 10, seed: int = 42,
                     slurm_jobs: dict[str, str] | None = None,
                     checkpoint_root: Path = training.DEFAULT_ROOT) -> Scenario:
    """The last ``days`` days of a 512-GPU pre-training run, post-training experiments, dev
    boxes (``slurm_jobs``: box → the Slurm job holding it), logs, checkpoints (under
    ``checkpoint_root``) and the cloud bill for the rest."""
    rng = random.Random(seed)
    scenario = Scenario(now=now, start=now - days * 86400)
    _pretraining(scenario, rng)
    _posttraining(scenario, rng)
    _dev_boxes(scenario, rng, slurm_jobs or {})
    _sweep(scenario)
    _logs(scenario, rng)
    _checkpoints(scenario, rng)
    _run_42(scenario, checkpoint_root)
    _cloud_bill(scenario)
    return scenario


def _today(now: float, ago: float) -> float:
    """``ago`` seconds before ``now``, or, when that is before today's UTC midnight, a minute
    after it: the day's fault-waste rule counts today, whatever the hour the demo runs at."""
    midnight = now - now % 86400
    return max(now - ago, min(midnight + 60, now - 30))


PRETRAIN = {"project": "llm-70b", "team": "pretrain", "env": "prod", "stage": "pretrain",
            "job": "run-42", "owner": "alice"}


def _pretraining(s: Scenario, rng: random.Random) -> None:
    nodes = 64
    for hour in hours(s.start, s.now):
        for node in range(nodes):
            s.usage.append(_usage(f"pt-{int(hour)}-{node}", hour + 60, f"cluster-a/node-{node:03d}",
                                  "gpu.h100", "gpu_hour", 8.0, PRETRAIN))
    span_days = (s.now - s.start) / 86400
    expected = INTERRUPTIONS_PER_GPU_DAY * 512 * span_days
    failures = max(2, round(expected))
    for i in range(failures):
        ts = rng.uniform(s.start + HOUR, s.now - 2 * HOUR)
        s.faults.append(_fault(f"pt-nf-{i}", ts, "node_failure", 512,
                               lost=rng.uniform(900, 3600), recovery=rng.uniform(600, 1800)))
    s.faults.append(_fault("pt-nccl-0", _today(s.now, 5 * HOUR), "comm_timeout", 512,
                           lost=1800, recovery=1200))
    s.faults.append(_fault("pt-sdc-0", _today(s.now, 3 * HOUR), "silent_data_corruption", 512,
                           lost=6 * HOUR, recovery=2400))
    s.story.append(f"pre-training run-42: 512 H100s, {failures} node failures, one NCCL "
                   "timeout, one silent-data-corruption rollback of 6 h")


def _fault(event_id: str, ts: float, kind: str, units: int, lost: float, recovery: float
           ) -> dict[str, Any]:
    return {"event_id": event_id, "kind": "fault", "ts": round(ts, 3), "fault": kind,
            "resource_type": "gpu.h100", "units": units, "lost_seconds": round(lost),
            "recovery_seconds": round(recovery), "tags": dict(PRETRAIN)}


def _posttraining(s: Scenario, rng: random.Random) -> None:
    for n in range(60):
        begin = rng.uniform(s.start, s.now - 4 * HOUR)
        hours = rng.choice([1, 2, 3, 4])
        job = f"sft-{n:03d}" if n % 3 else f"rl-{n:03d}"
        tags = {"project": "assistant-v3", "team": "posttrain", "env": "prod",
                "stage": "posttrain", "job": job, "owner": rng.choice(["bob", "chen", "dana"])}
        node = f"cluster-b/node-{rng.randrange(16):03d}"
        for h in range(hours):
            s.usage.append(_usage(f"post-{n}-{h}", begin + h * HOUR, node, "gpu.h100",
                                  "gpu_hour", 8.0, tags))
        s.usage.append(training.run_end(job, begin + hours * HOUR - 60, tags, n % 9 == 0))
    s.story.append("post-training: 60 short SFT/RL experiments on 8-GPU nodes; every ninth, "
                   "an RL run, failed (NaN loss): its spend bought nothing")


def _dev_boxes(s: Scenario, rng: random.Random, slurm_jobs: dict[str, str]) -> None:
    for box, owner, util in DEV_BOXES:
        # ``units``: the accelerators the box holds, what a release's saving is counted for.
        tags = {"project": "sandbox", "team": "research", "env": "dev", "stage": "dev",
                "owner": owner, "job": f"notebook-{owner}", "units": str(GPUS_PER_BOX)}
        if box in slurm_jobs:
            tags["slurm_job_id"] = slurm_jobs[box]
        for hour in hours(s.now - 14 * HOUR, s.now):
            s.usage.append(_usage(f"dev-{box}-{int(hour)}", hour, f"lab/{box}", "gpu.a100",
                                  "gpu_hour", float(GPUS_PER_BOX), tags))
        samples = []
        for minute in range(60, 0, -1):
            ts = s.now - minute * 60
            value = max(0.0, util + rng.uniform(-0.005, 0.005)) if util < 0.5 else util
            samples.append({"event_id": f"util-{box}-{int(ts)}", "kind": "utilization",
                            "ts": round(ts, 3), "resource_id": f"lab/{box}",
                            "resource_type": "gpu.a100", "metric": "gpu_util",
                            "value": round(value, 4), "tags": tags})
        s.usage.append(samples)  # one scrape of the box: a batch message
    s.story.append(f"dev boxes: three {GPUS_PER_BOX}-GPU A100 boxes idle for the last hour, "
                   "one busy")


SWEEP_JOBS = 10
SWEEP_GPU_HOURS = 64.0


def _sweep(s: Scenario) -> None:
    """Research's learning-rate sweep on the Slurm partition ``slurm-a``, today: ten jobs of
    64 H100-hours, past the team's daily GPU budget line there (``slurm-daily-gpu``)."""
    for i in range(SWEEP_JOBS):
        tags = {"project": "sweep-lr", "team": "research", "cluster": "slurm-a",
                "stage": "eval", "job": f"sweep-{i}"}
        s.usage.append(_usage(f"sweep-{i}", _today(s.now, 40 * 60 - i * 60),
                              f"slurm-a/node-{i:02d}", "gpu.h100", "gpu_hour",
                              SWEEP_GPU_HOURS, tags))
    s.story.append(f"research's learning-rate sweep today: {SWEEP_JOBS} Slurm jobs of "
                   f"{SWEEP_GPU_HOURS:g} H100-hours, past its daily GPU budget line on slurm-a")


def _logs(s: Scenario, rng: random.Random) -> None:
    tags = {"project": "llm-70b", "team": "pretrain", "env": "prod", "job": "run-42",
            "owner": "alice"}
    for hour in hours(s.now - 48 * HOUR, s.now - HOUR):
        s.usage.append(_usage(f"log-{int(hour)}", hour + 300, "logging/cluster-a",
                              "logs.ingest", "gb", round(rng.uniform(1.5, 2.5), 3), tags))
    for minute in range(40, 0, -1):
        s.usage.append(_usage(f"log-burst-{minute}", s.now - minute * 60, "logging/cluster-a",
                              "logs.ingest", "gb", 4.0, tags))
    s.story.append("logs: a debug flag left on 40 minutes ago: run-42 ingests 240 GB of logs "
                   "an hour, 120× its usual 2 GB")


CHECKPOINT_TB = 1.0
RETENTION_BROKE_H = 12


def _checkpoints(s: Scenario, rng: random.Random) -> None:
    """Retention keeps the last 40 checkpoints of 1 TB, until a config change saves one every
    6 minutes and keeps them all: checkpoint storage, measured in GB-hours per hour, grows
    10 TB an hour. The growth rule compares the last 6 hours with the 7 days before: at least
    2.5 times as much, at any minute of the hour (the last whole hour is the last counted)."""
    tags = {"project": "llm-70b", "team": "pretrain", "env": "prod", "stage": "pretrain"}
    steady_gb = 40 * CHECKPOINT_TB * 1000
    broke = s.now - RETENTION_BROKE_H * HOUR
    for hour in hours(s.start, s.now):
        # The parallel file system is provisioned, not metered: fixed spend.
        s.usage.append(_usage(f"pfs-{int(hour)}", hour + 900, "lustre/scratch-a",
                              "storage.parallel_fs", "gb_hour", 250_000.0, tags))
        kept_gb = steady_gb + rng.uniform(-500, 500)
        if hour + 1800 > broke:
            kept_gb = steady_gb + 10 * CHECKPOINT_TB * 1000 * (hour + 1800 - broke) / HOUR
        s.usage.append(_usage(f"ckpt-{int(hour)}", hour + 1800, "s3://ckpt/llm-70b",
                              "storage.checkpoint", "gb_hour", round(kept_gb, 1), tags))
    s.story.append(f"checkpoints: {RETENTION_BROKE_H} hours ago a config change began saving a "
                   "1 TB checkpoint every 6 minutes and keeping them all: 40 TB kept became "
                   f"{40 + 10 * RETENTION_BROKE_H} TB")


def _run_42(s: Scenario, root: Path) -> None:
    """run-42's progress and checkpoint inventory (``costline.streams.demo.training``)."""
    broke = s.now - RETENTION_BROKE_H * HOUR
    s.usage.append(training.progress(s.start, s.now, broke, PRETRAIN))
    written = training.checkpoints(s.start, s.now, broke, PRETRAIN, root)
    s.usage.append(written)
    sdc = next(f["ts"] for f in s.faults if f["event_id"] == "pt-sdc-0")
    s.usage.append(training.restore(sdc, written, PRETRAIN))
    s.story.append(f"run-42 trains {training.STEPS_PER_HOUR} steps of 4M tokens an hour at "
                   f"full speed; each checkpoint stalls it {training.WRITE_S} s, and a slow "
                   f"node has held every rank back by a fifth for {training.SLOW_H} hours; "
                   f"{len(written)} checkpoints of 1 TB are kept, the oldest (tagged keep=true) "
                   "the evaluation baseline")


def _cloud_bill(s: Scenario) -> None:
    """The FOCUS sample bill (real, anonymised) as the cloud spend around the cluster; its
    charge dates are moved into the scenario's window, its amounts kept."""
    from costline.connectors.focus import CostBasis, FocusConverter
    from costline.connectors.focus_file import open_focus, read_rows

    converter = FocusConverter(basis=CostBasis.effective, currency="USD", now=float("inf"))
    events = []
    with open_focus(FOCUS_SAMPLE) as (text, _):
        for row in read_rows(text, CostBasis.effective):
            made = converter.convert(row)
            event = getattr(made, "event", None)
            if event is not None:
                events.append(event.model_dump(mode="json", exclude_none=True))
    if not events:
        return
    first = min(e["ts"] for e in events)
    last = max(e["ts"] for e in events)
    span = max(1.0, _unix(last) - _unix(first))
    window = s.now - HOUR - s.start
    for event in events:
        event["ts"] = round(s.start + (_unix(event["ts"]) - _unix(first)) / span * window, 3)
        event["tags"].setdefault("team", "cloud-shared")
    for i in range(0, len(events), 500):
        s.usage.append(events[i:i + 500])
    s.story.append(f"cloud bill: {len(events)} FOCUS rows from AWS, Google Cloud, Microsoft "
                   "and Oracle (FinOps Foundation sample, CC BY 4.0)")


def _unix(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
