"""Running Slurm jobs (``squeue --json``) → GPU-hour and vCPU-hour usage events.

A job holds its allocation whether it computes or not, and the allocation is what is paid
for: each round counts, per running job, its GPUs (or, without GPUs, its CPUs) times the part
of the last window it ran. Windows are aligned to multiples of the interval and a usage
event's id names its job and window end, so two scrapers or an overlapping cron run count a
window once. A job that ends between two rounds loses the end of its last window: ``squeue``
no longer shows it.

Tags come from the job: ``slurm_job_id`` (what the Slurm reclaim connector reads), account,
partition, user, ``job`` (the job name, unless the comment names one), cluster, and the
comment's ``key=value`` pairs (separated by spaces, commas or semicolons). The resource id is
``slurm/<job id>``.

A training run's job that ``squeue`` shows ended (for a few minutes after, ``MinJobAge``) is
reported as a ``run_end`` event: ``COMPLETED`` succeeded, ``CANCELLED`` cancelled, and
``FAILED``, ``TIMEOUT``, ``NODE_FAIL``, ``OUT_OF_MEMORY``, ``BOOT_FAIL`` or ``DEADLINE``
failed, so a failed run's spend becomes waste. A job is a training run when its tags match
``runs`` (by default a ``stage`` of ``pretrain`` or ``posttrain``): a notebook cancelled by
reclamation is not a run that failed. Its id names the job and its end time, so every round
that sees it counts it once, and a job requeued and ended again is judged by its last end.

``squeue --json`` changed shape between releases (22.05 writes numbers and a state string,
23.02 and later ``{"set", "number"}`` objects and a state list): both are read.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from costline.connectors.focus import tag_key, tag_value
from costline.rules.events import MAX_TAGS, RUN_TAG, RunEndEvent, RunStatus, UsageEvent
from costline.rules.globs import glob_match
from costline.rules.prices import PriceBook

SQUEUE = ("squeue", "--all", "--json")
COUNTED_STATES = frozenset({"RUNNING"})
END_STATES = {"COMPLETED": RunStatus.succeeded, "CANCELLED": RunStatus.cancelled,
              **dict.fromkeys(("FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                               "DEADLINE"), RunStatus.failed)}
RUN_JOBS = {"stage": ("pretrain", "posttrain")}
_PAIR = re.compile(r"([A-Za-z][A-Za-z0-9_.:-]*)=([^\s,;]+)")
_GRES_TYPE = re.compile(r"^gpu:([^:(]+):\d+")
_TRES_TYPE = re.compile(r"gres[:/]gpu:([^:=]+):\d+")
_ID_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


class SqueueError(RuntimeError):
    """``squeue`` failed or printed something that is not its JSON."""


def number(value: Any) -> float | None:
    """A Slurm number in either shape: ``42`` or ``{"set": true, "infinite": false, "number":
    42}``; ``None`` when unset or infinite."""
    if isinstance(value, Mapping):
        if not value.get("set", True) or value.get("infinite", False):
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def states(value: Any) -> frozenset[str]:
    if isinstance(value, str):
        return frozenset({value})
    return frozenset(str(item) for item in value or ())


def tres(text: str) -> dict[str, str]:
    """``"cpu=32,mem=128000M,node=1,gres/gpu=8"`` → ``{"cpu": "32", ..., "gres/gpu": "8"}``."""
    pairs = (item.partition("=") for item in text.split(",") if "=" in item)
    return {key.strip(): value.strip() for key, _, value in pairs}


def comment_tags(text: str) -> dict[str, str]:
    """``"project=llm-70b team=pretrain"`` → tags; anything not ``key=value`` is ignored."""
    found: dict[str, str] = {}
    for raw_key, raw_value in _PAIR.findall(text):
        key, value = tag_key(raw_key), tag_value(raw_value)
        if key is not None and value is not None:
            found.setdefault(key, value)
    return found


@dataclass(frozen=True)
class SlurmJob:
    """What costing needs of one job."""

    job_id: str
    state: frozenset[str]
    start: float | None
    cpus: int
    gpus: Mapping[str | None, int]  # GPU type (None: untyped) → count
    cluster: str
    tags: Mapping[str, str]
    end: float | None = None


def _job_id(job: Mapping[str, Any]) -> str:
    """``4211``, or ``4300_7`` for task 7 of array job 4300 (the form ``scancel`` takes)."""
    task = number(job.get("array_task_id"))
    array = number(job.get("array_job_id"))
    if task is not None and array:
        return f"{int(array)}_{int(task)}"
    return str(int(number(job.get("job_id")) or 0))


def _gpu_type(job: Mapping[str, Any]) -> str | None:
    """The GPU type of an untyped count, from ``gres_detail`` or ``tres_per_node``."""
    for detail in job.get("gres_detail") or ():
        match = _GRES_TYPE.match(str(detail))
        if match:
            return match.group(1)
    match = _TRES_TYPE.search(str(job.get("tres_per_node") or ""))
    return match.group(1) if match else None


def _gpus(job: Mapping[str, Any], allocated: Mapping[str, str]) -> dict[str | None, int]:
    typed = {key.split(":", 1)[1]: int(value) for key, value in allocated.items()
             if key.startswith("gres/gpu:") and value.isdigit()}
    if typed:
        return {kind: count for kind, count in typed.items() if count > 0}
    count = allocated.get("gres/gpu", "0")
    total = int(count) if count.isdigit() else 0
    return {_gpu_type(job): total} if total > 0 else {}


def _comment(job: Mapping[str, Any]) -> str:
    comment = job.get("comment") or ""
    if isinstance(comment, Mapping):  # older releases: {"job": ..., "administrator": ...}
        comment = comment.get("job") or ""
    return str(comment)


def _tags(job: Mapping[str, Any], job_id: str, cluster: str) -> dict[str, str]:
    """Job facts win over comment pairs, except ``job``: a comment may name the run."""
    tags: dict[str, str] = {}
    name = tag_value(job.get("name"))
    if name is not None:
        tags["job"] = name
    tags.update(comment_tags(_comment(job)))
    facts = {"slurm_job_id": job_id, "account": job.get("account"),
             "partition": job.get("partition"), "user": job.get("user_name"), "cluster": cluster}
    for key, raw in facts.items():
        value = tag_value(raw)
        if value is not None:
            tags.pop(key, None)
            tags[key] = value
    # The job's own facts were added last; when over the limit, comment pairs give way.
    return dict(list(tags.items())[-MAX_TAGS:])


def parse_job(job: Mapping[str, Any], default_cluster: str) -> SlurmJob:
    job_id = _job_id(job)
    cluster = str(job.get("cluster") or default_cluster)
    allocated = tres(str(job.get("tres_alloc_str") or ""))
    cpu_text = allocated.get("cpu", "")
    cpus = int(cpu_text) if cpu_text.isdigit() else int(number(job.get("cpus")) or 0)
    return SlurmJob(job_id, states(job.get("job_state")), number(job.get("start_time")), cpus,
                    _gpus(job, allocated), cluster, _tags(job, job_id, cluster),
                    number(job.get("end_time")))


def parse_squeue(text: str, default_cluster: str = "slurm") -> list[SlurmJob]:
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise SqueueError(f"squeue did not print JSON: {exc}") from exc
    if not isinstance(doc, Mapping) or not isinstance(doc.get("jobs"), list):
        raise SqueueError("squeue's JSON has no jobs list")
    return [parse_job(job, default_cluster) for job in doc["jobs"] if isinstance(job, Mapping)]


def run_squeue(command: Sequence[str] = SQUEUE, timeout_s: float = 30.0) -> str:
    try:
        done = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SqueueError(f"{command[0]}: {exc}") from exc
    if done.returncode != 0:
        raise SqueueError(f"{' '.join(command)} exited {done.returncode}: "
                          f"{done.stderr.strip()[:300]}")
    return done.stdout


@dataclass
class SlurmScraper:
    """Counts each aligned window once; remembers the last window it counted."""

    interval_s: float
    prices: PriceBook
    default_gpu: str = "gpu.h100"
    cpu_type: str = "cpu.general"
    default_cluster: str = "slurm"
    skipped: Counter[str] = field(default_factory=Counter)
    last_end: float | None = None
    runs: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: dict(RUN_JOBS))
    """Tag → globs a job's tags must match to be a training run whose end is reported."""

    def window(self, now: float) -> tuple[float, float] | None:
        """The windows completed since the last round (one interval on the first round, at
        most ten after a long pause); ``None`` when no new window has completed."""
        end = math.floor(now / self.interval_s) * self.interval_s
        if self.last_end is not None and end <= self.last_end:
            return None
        start = end - self.interval_s
        if self.last_end is not None and end - self.last_end <= 10 * self.interval_s:
            start = self.last_end
        return start, end

    def events(self, jobs: Sequence[SlurmJob], now: float) -> list[UsageEvent | RunEndEvent]:
        found: list[UsageEvent | RunEndEvent] = []
        for job in jobs:
            ended = self.run_end(job, now)
            if ended is not None:
                found.append(ended)
        window = self.window(now)
        if window is None:
            return found
        self.last_end = window[1]
        for job in jobs:
            if not job.state & COUNTED_STATES:
                self.skipped["not_running"] += 1
            elif job.start is None:
                self.skipped["no_start_time"] += 1
            else:
                found.extend(self._usage(job, job.start, *window))
        return found

    def run_end(self, job: SlurmJob, now: float) -> RunEndEvent | None:
        """The end of a training run's job that ``squeue`` shows ended, else ``None``."""
        ended = sorted(state for state in job.state if state in END_STATES)
        if not ended or RUN_TAG not in job.tags or not all(
                any(glob_match(job.tags.get(key, ""), glob) for glob in globs)
                for key, globs in self.runs.items()):
            return None
        ts = job.end if job.end is not None and job.end <= now else now
        cluster = _ID_UNSAFE.sub("_", job.cluster)
        return RunEndEvent(event_id=f"slurm:{cluster}:{job.job_id}:end:{int(ts)}",
                           kind="run_end", ts=round(ts, 3), status=END_STATES[ended[0]],
                           reason=f"Slurm job {job.job_id} {ended[0]}", tags=dict(job.tags))

    def resource_type(self, gpu_type: str | None) -> str:
        """``gpu.<type>`` when the price book prices it per GPU-hour, else the default."""
        if gpu_type is None:
            return self.default_gpu
        name = f"gpu.{gpu_type}".lower()
        for candidate in (name, name.replace("_", "-")):
            price = self.prices.prices.get(candidate)
            if price is not None and price.unit == "gpu_hour":
                return candidate
        self.skipped["gpu_type_unpriced_as_default"] += 1
        return self.default_gpu

    def units(self, job: SlurmJob) -> dict[tuple[str, str], int]:
        """(resource type, unit) → how many the job holds: its GPUs, else its CPUs."""
        held: Counter[tuple[str, str]] = Counter()
        for kind, count in job.gpus.items():
            held[(self.resource_type(kind), "gpu_hour")] += count
        if not held and job.cpus > 0:
            held[(self.cpu_type, "vcpu_hour")] = job.cpus
        return dict(held)

    def _usage(self, job: SlurmJob, started: float, start: float, end: float
               ) -> list[UsageEvent]:
        since = max(start, started)
        if since >= end:
            return []  # started after this window: the next round counts it
        hours = (end - since) / 3600
        cluster = _ID_UNSAFE.sub("_", job.cluster)
        return [
            UsageEvent(
                event_id=f"slurm:{cluster}:{job.job_id}:{int(end)}:{rtype}", kind="usage",
                ts=round(since, 3), resource_id=f"slurm/{job.job_id}", resource_type=rtype,
                quantity=count * hours, unit=unit, tags=dict(job.tags))
            for (rtype, unit), count in self.units(job).items()
        ]
