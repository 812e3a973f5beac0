"""The usage events the benchmarks send: one catalogue of tag sets, two ways of drawing and
sending them.

* ``jobs``: tag sets are drawn with Zipf popularity (a few jobs meter most of the usage), and
  each message is keyed by a job: a partition holds its own jobs, and a message's events all
  belong to jobs of its partition.
* ``uniform``: tag sets are drawn uniformly, messages are taken in event-time order (so one
  message spans about as many tag sets as it has events) and keyed at random, unrelated to
  their tags.

Either way every tag set of the catalogue occurs at least once, event time advances over the
last two days with a few minutes of disorder (collectors are late by different amounts), one
timestamp in five is RFC 3339 and the rest Unix seconds, and the expected total is what
``PriceBook.charge`` gives each event, in micro-units.
"""

from __future__ import annotations

import itertools
import json
import random
import secrets
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from bench.common import log

DATA_SETS = ("jobs", "uniform")
DAY_S = 86400
# resource type → unit of its usage events (checked against the price book)
RESOURCES = {
    "gpu.h100": "gpu_hour",
    "storage.ssd": "gb_hour",
    "network.egress": "gb",
    "logs.ingest": "gb",
}
# Probability that a job meters each resource type (a job meters at least one).
METER_ODDS = {"gpu.h100": 0.9, "storage.ssd": 0.7, "network.egress": 0.5, "logs.ingest": 0.6}
ZIPF_S = {"jobs": 1.1, "uniform": 0.0}


@dataclass
class Meter:
    """One tag set: a job's use of one resource type."""

    tags: dict[str, str]
    resource_type: str
    unit: str
    nodes: int
    size: float  # GPUs per node, or GB of a volume


@dataclass
class DataSet:
    name: str
    partitions: int
    batch: int
    # (partition, key, value) of every message, in the order they are sent
    messages: list[tuple[int, bytes, bytes]]
    events: int
    tagsets: int
    expected_micro: int
    ts_min: float
    ts_max: float
    events_by_partition: list[int] = field(default_factory=list)
    top_share: float = 0.0  # share of the events in the 1% most popular tag sets

    def by_partition(self) -> list[list[bytes]]:
        """Each input partition's messages, in order."""
        parts: list[list[bytes]] = [[] for _ in range(self.partitions)]
        for partition, _, value in self.messages:
            parts[partition].append(value)
        return parts

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "events": self.events, "tagsets": self.tagsets,
                "messages": len(self.messages), "events_per_message": self.batch,
                "partitions": self.partitions, "events_by_partition": self.events_by_partition,
                "top1pct_share": round(self.top_share, 3),
                "expected_cost_micro": self.expected_micro}


def build_meters(rng: random.Random, count: int) -> list[Meter]:
    """``count`` distinct tag sets: jobs of projects of teams, each metering 1-4 resources."""
    n_projects, n_teams, n_owners = 400, 40, 1500
    teams = [f"team-{i:02d}" for i in range(n_teams)]
    projects = [f"proj-{i:03d}" for i in range(n_projects)]
    project_team = {p: rng.choice(teams) for p in projects}
    owners = [f"user{i:04d}" for i in range(n_owners)]
    # Popular projects and owners have many jobs (Zipf), so a few own most tag sets.
    proj_cw = list(itertools.accumulate(1 / (r + 1) ** 1.1 for r in range(n_projects)))
    owner_cw = list(itertools.accumulate(1 / (r + 1) ** 1.1 for r in range(n_owners)))
    envs, env_w = ("prod", "staging", "dev"), (0.55, 0.15, 0.30)
    meters: list[Meter] = []
    job_no: Counter[str] = Counter()
    while len(meters) < count:
        project = rng.choices(projects, cum_weights=proj_cw)[0]
        job_no[project] += 1
        tags = {
            "project": project,
            "team": project_team[project],
            "env": rng.choices(envs, env_w)[0],
            "job": f"{project}-run-{job_no[project]:05d}",
            "owner": rng.choices(owners, cum_weights=owner_cw)[0],
        }
        kinds = [rt for rt, odds in METER_ODDS.items() if rng.random() < odds] or ["gpu.h100"]
        nodes = rng.choice((1, 1, 2, 4, 8, 16, 32, 64))
        for rt in kinds:
            if len(meters) >= count:
                break
            size = (rng.choice((1, 2, 4, 8, 8, 8)) if rt == "gpu.h100"
                    else round(rng.lognormvariate(7.5, 1.2), 1))
            meters.append(Meter(tags, rt, RESOURCES[rt], nodes, size))
    rng.shuffle(meters)  # popularity rank is independent of the job's place in the catalogue
    return meters


def quantity(rng: random.Random, meter: Meter) -> float:
    """What a collector reports for one interval of up to 5 minutes."""
    rt = meter.resource_type
    if rt == "gpu.h100":
        return round(meter.size * rng.randint(30, 300) / 3600, 6)
    if rt == "storage.ssd":
        return round(meter.size * 300 / 3600, 4)
    if rt == "network.egress":
        return round(rng.lognormvariate(0.0, 1.5), 6)
    return round(rng.lognormvariate(-3.0, 1.0), 6)  # logs.ingest


def generate(name: str, events: int, tagsets: int, partitions: int, seed: int,
             batch: int = 100, run_id: str | None = None) -> DataSet:
    """The data set ``name`` (``DATA_SETS``): ``events`` usage events over ``tagsets`` tag
    sets in messages of ``batch`` events on ``partitions`` partitions."""
    from costline.connectors.kafka import partition_of
    from costline.rules.events import UsageEvent
    from costline.rules.prices import PriceBook
    from costline.streams.settings import DEFAULT_PRICES

    if name not in DATA_SETS:
        raise ValueError(f"unknown data set {name!r}: one of {', '.join(DATA_SETS)}")
    book = PriceBook.load(DEFAULT_PRICES)
    for rt, unit in RESOURCES.items():
        assert book.price_of(rt).unit == unit, f"{rt} is not priced per {unit}"
    rng = random.Random(seed)
    tagsets = min(tagsets, events)
    meters = build_meters(rng, tagsets)
    # Every tag set occurs once; the other events draw one by popularity (rank r weighs 1/r^s).
    s = ZIPF_S[name]
    cw = list(itertools.accumulate(1 / (r + 1) ** s for r in range(tagsets)))
    order = list(range(tagsets)) + rng.choices(range(tagsets), cum_weights=cw,
                                               k=events - tagsets)
    rng.shuffle(order)
    popularity = Counter(order)
    top_share = sum(c for _, c in popularity.most_common(max(1, tagsets // 100))) / events

    run_id = run_id or secrets.token_hex(3)
    t0, span = time.time() - 2 * DAY_S + 600, 2 * DAY_S - 900
    dumps = json.JSONEncoder(separators=(",", ":")).encode
    construct, charge = UsageEvent.model_construct, book.charge
    keyed_by_job = name == "jobs"
    # Random keys, from a generator of their own: the same for a seed (so is the spread over
    # the partitions), and not shifting the events drawn from ``rng``.
    keys = random.Random(f"{seed}:keys")
    # events waiting for a message: per partition (jobs), or one queue (uniform)
    pending: list[list[bytes]] = [[] for _ in range(partitions if keyed_by_job else 1)]
    first_job: list[str] = [""] * len(pending)
    part_of: dict[str, int] = {}
    messages: list[tuple[int, bytes, bytes]] = []
    by_partition = [0] * partitions
    expected, ts_min, ts_max = 0, float("inf"), 0.0
    step = max(1, events // 5)

    def send(queue: int) -> None:
        values = pending[queue]
        if keyed_by_job:
            partition, key = queue, first_job[queue]
        else:
            key = f"{keys.getrandbits(64):016x}"
            partition = partition_of(key, partitions)
        messages.append((partition, key.encode(), b"[" + b",".join(values) + b"]"))
        by_partition[partition] += len(values)
        values.clear()

    for i, m in enumerate(order):
        meter = meters[m]
        base = t0 + span * i / events - rng.uniform(0, 300)
        if rng.random() < 0.2:
            ts: Any = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(base)) + "Z"
            unix = float(int(base))
        else:
            ts = unix = round(base, 3)
        ts_min, ts_max = min(ts_min, unix), max(ts_max, unix)
        job = meter.tags["job"]
        rid = (f"{job}/node-{rng.randrange(meter.nodes)}" if meter.resource_type == "gpu.h100"
               else f"{job}/{meter.resource_type}")
        event = {"event_id": f"{run_id}-{i:09d}-{rng.getrandbits(32):08x}", "kind": "usage",
                 "ts": ts, "resource_id": rid, "resource_type": meter.resource_type,
                 "quantity": quantity(rng, meter), "unit": meter.unit, "tags": meter.tags}
        expected += charge(construct(**event)).cost_micro
        queue = 0
        if keyed_by_job:
            queue = part_of.get(job, -1)
            if queue < 0:
                queue = part_of[job] = partition_of(job, partitions)
        if not pending[queue]:
            first_job[queue] = job
        pending[queue].append(dumps(event).encode())
        if len(pending[queue]) == batch:
            send(queue)
        if (i + 1) % step == 0:
            log(f"{name}: generated {i + 1:,}/{events:,} events")
    for queue, values in enumerate(pending):
        if values:
            send(queue)
    assert ts_max <= time.time(), "an event is in the future"
    return DataSet(name, partitions, batch, messages, events, tagsets, expected, ts_min,
                   ts_max, by_partition, top_share)
