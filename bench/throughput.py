"""Throughput of the costline worker against its own ceilings, measured in one run.

    .venv/bin/python bench/throughput.py [--events N] [--tagsets N] [--partitions N] [--json]
        [--single-events N] [--batch-size N] [--without-rules] [--profile py-spy|pyinstrument]
        [--scale N,N,...] [--scale-partitions N] [--rounds N] [--folding inline|process]
        [--folding-processes N]
        [--save PATH]

One data set of usage events (realistic shapes, Zipf-popular tag sets, timestamps over the
last two days) is generated once and produced with kafka-python before anything is timed:
as single-event messages (the first ``--single-events`` events, default 100,000: Faust's
per-message cost would make 1M single messages take ~15 minutes here) and as batch messages
of ``--batch-size`` events (all of them). Both copies put the same events in the same
partitions in the same order (a message's partition follows its job tag).

Then, for each copy, three consumers read the same topic, each alone in a fresh subprocess,
timed from the first fetched message to the last one handled:

(a) ceiling: a plain aiokafka consumer calling ``costline.rules.events.parse_message`` on every
message
message;
(b) Faust no-op: ``costline.streams.worker.app.build_app`` in its own consumer group with the
aggregator's
    ``handle`` replaced by a no-op, so Faust's settings, the consumer's hand-off
    (``costline.streams.worker.handoff``) and the agent (``take_events``) are the worker's own (the
    rest of the
    app, e.g. its timers, runs too, over an empty namespace);
(b') plain Faust agent: an agent as Faust's own examples write one (``async for`` over the
    stream, one event at a time, no ``take_events``), on Faust's own consumer and the worker's
    Faust settings, in its own consumer group; it does nothing with a message;
(c) costline: the real worker (``build_app``), done when every partition's Redis watermark
    ``{ns:usage:P}:wm`` reaches the topic's end offset.

(b) is the stricter baseline for costline (the same app, less costline's own work and what it
waits on); (b') is a no-op agent on Faust as it comes, against which Faust's per-message cost
on a machine can be compared with figures measured elsewhere.

It prints events/s, CPU per event, the ratios c/a, c/b and c/b', the worker's peak RSS
(VmHWM) and the CPU and peak RSS of its child processes (the rules' evaluation, and the folding
with ``--folding process``, the worker's default: its "CPU per event" is then its own process's
alone), Redis memory of the namespace per distinct tag set, and checks that Redis's total equals the
generator's (``PriceBook.charge``, to the micro-unit). The machine's load during each window
is printed too: other work on the machine shows there. ``--without-rules`` adds a pass of the
batched worker with an empty rule directory; ``--profile`` a pass under a sampling profiler,
with its hotspots (neither is part of the table's figures).

Rounds (``--rounds N``): (b), (b') and (c) run N-1 more times on each copy, one after the
other, with fresh consumer groups and Redis state, and the median and range of c/b, c/b' and
of each one's events/s are printed below the table (its figures are round 1). On a shared
2-CPU machine one run's ratios can be a third off the next run's.

Scaling out (``--scale``, default 1,2,3; 0 skips it): the batched copy once more, on a topic
of ``--scale-partitions`` partitions (default 6), read by N real workers in one consumer group
for each N, with fresh Redis state and a fresh group each time. The workers import and build
the app, join the group together and fetch once it has split the partitions; each N is timed
from the first fetch to every watermark at its end offset. It prints events/s and the speed-up
over one worker, what the split allows (the busiest worker's share of the events: popular tag
sets make partitions unequal), each worker's partitions (from its ``consumer_lag`` series),
events, CPU and peak RSS, the CPU seconds of the workers, Redis, the local Kafka broker and
everything else on the machine, the most the machine's CPUs allow at that CPU per event, and
the total check for every N. It adds about 2 minutes per 500,000 events on two CPUs.

Every run uses its own namespace ``bench<hex>`` and deletes its topics, consumer groups and
Redis keys when it ends. Progress goes to stderr; the table (or ``--json``) to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.common import (  # noqa: E402 - needs REPO on the path
    DEFAULT_REDIS,
    RESOURCES,
    child_figures,
    cpu_seconds,
    free_port,
    vm_status,
)

DEFAULT_BOOTSTRAP = "127.0.0.1:19092"
DAY_S = 86400

# Probability that a job meters each resource type (a job meters at least one).
METER_ODDS = {"gpu.h100": 0.9, "storage.ssd": 0.7, "network.egress": 0.5, "logs.ingest": 0.6}


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def git_state() -> dict[str, Any]:
    """The commit and the files that differ from it (read-only git commands)."""
    def run(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                                  timeout=20).stdout
        except (OSError, subprocess.SubprocessError):
            return ""
    dirty = [line[3:] for line in run("status", "--porcelain", "--untracked-files=no")
             .splitlines() if len(line) > 3]
    return {"commit": run("rev-parse", "--short", "HEAD").strip(), "dirty": dirty}


def cpu_jiffies() -> list[int]:
    """The machine's aggregate CPU counters (``cpu`` line of /proc/stat)."""
    with open("/proc/stat") as fh:
        return [int(x) for x in fh.readline().split()[1:]]


def machine_load(start: tuple[list[int], float], redis_url: str) -> dict[str, float]:
    """Share of the machine's CPUs that were busy (and stolen) since ``start``, the load
    average, and the Redis server's CPU seconds: other work on the machine shows here."""
    before, redis_before = start
    after = cpu_jiffies()
    delta = [b - a for a, b in zip(before, after, strict=False)]
    total = sum(delta[:8]) or 1  # user nice system idle iowait irq softirq steal
    idle = delta[3] + delta[4]
    return {"busy_pct": 100 * (total - idle) / total, "steal_pct": 100 * delta[7] / total,
            "loadavg_1m": os.getloadavg()[0],
            "redis_cpu_s": redis_info(redis_url)["cpu_s"] - redis_before}


def write_json(path: str, data: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


# ======================================================================================
# The data set
# ======================================================================================


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
    events: int
    tagsets: int
    partitions: int
    zipf_s: float
    # per partition, the JSON bytes of each event, in order
    parts: list[list[bytes]]
    expected_cost_micro: int
    # The single-event case uses the first ``single_events`` events (a prefix of every
    # partition): the Faust path costs too much per message to take all of them in 10 minutes.
    single_events: int = 0
    single_counts: list[int] = field(default_factory=list)
    expected_single_micro: int = 0
    by_resource: Counter = field(default_factory=Counter)
    top_share: float = 0.0  # share of events in the 1% most popular tag sets
    ts_min: float = 0.0
    ts_max: float = 0.0
    generate_s: float = 0.0
    # The same events spread over the scaling topic's partitions (same bytes objects).
    scale_parts: list[list[bytes]] = field(default_factory=list)

    def singles(self) -> list[list[bytes]]:
        return [p[:n] for p, n in zip(self.parts, self.single_counts, strict=True)]

    def batches(self, size: int, parts: list[list[bytes]] | None = None
                ) -> list[list[bytes]]:
        return [[b"[" + b",".join(p[i:i + size]) + b"]" for i in range(0, len(p), size)]
                for p in (self.parts if parts is None else parts)]


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
    job_no: Counter = Counter()
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


def generate(events: int, tagsets: int, partitions: int, zipf_s: float, seed: int,
             run_id: str, single_events: int | None = None,
             scale_partitions: int = 0) -> DataSet:
    from costline.rules.events import UsageEvent
    from costline.rules.prices import PriceBook
    from costline.streams.settings import DEFAULT_PRICES

    started = time.perf_counter()
    book = PriceBook.load(DEFAULT_PRICES)
    for rt, unit in RESOURCES.items():
        assert book.price_of(rt).unit == unit, f"{rt} is not priced per {unit}"
    rng = random.Random(seed)
    if tagsets > events:
        log(f"--tagsets {tagsets} > --events {events}: at most {events} tag sets can occur")
        tagsets = events
    meters = build_meters(rng, tagsets)
    # Every tag set occurs at least once (so exactly ``tagsets`` distinct ones occur); the
    # rest of the events pick a tag set with Zipf popularity (rank r has weight 1/r^s).
    cw = list(itertools.accumulate(1 / (r + 1) ** zipf_s for r in range(tagsets)))
    order = list(range(tagsets)) + rng.choices(range(tagsets), cum_weights=cw,
                                               k=events - tagsets)
    rng.shuffle(order)
    popularity = Counter(order)
    top = max(1, tagsets // 100)
    top_share = sum(c for _, c in popularity.most_common(top)) / events

    now = time.time()
    # Event time advances through the data set over the last two days, with a few minutes
    # of disorder (collectors are late by different amounts); never in the future.
    t0, span = now - 2 * DAY_S + 600, 2 * DAY_S - 900
    parts: list[list[bytes]] = [[] for _ in range(partitions)]
    scale_parts: list[list[bytes]] = [[] for _ in range(scale_partitions)]
    part_of: dict[str, int] = {}
    expected = expected_single = 0
    single_n = events if not single_events else min(events, single_events)
    single_counts = [0] * partitions
    by_resource: Counter = Counter()
    ts_min, ts_max = float("inf"), 0.0
    dumps = json.JSONEncoder(separators=(",", ":")).encode
    construct = UsageEvent.model_construct
    charge = book.charge
    step = max(1, events // 10)
    for i, m in enumerate(order):
        meter = meters[m]
        base = t0 + span * i / events - rng.uniform(0, 300)
        if rng.random() < 0.2:  # some producers send RFC 3339, most Unix seconds
            ts: Any = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(base)) + "Z"
            unix = float(int(base))
        else:
            ts = unix = round(base, 3)
        ts_min, ts_max = min(ts_min, unix), max(ts_max, unix)
        q = quantity(rng, meter)
        job = meter.tags["job"]
        rid = f"{job}/node-{rng.randrange(meter.nodes)}"
        if meter.resource_type != "gpu.h100":
            rid = f"{job}/{meter.resource_type}"
        event = {
            "event_id": f"{run_id}-{i:09d}-{rng.getrandbits(32):08x}",
            "kind": "usage",
            "ts": ts,
            "resource_id": rid,
            "resource_type": meter.resource_type,
            "quantity": q,
            "unit": meter.unit,
            "tags": meter.tags,
        }
        cost = charge(construct(**event)).cost_micro
        expected += cost
        by_resource[meter.resource_type] += 1
        p = part_of.get(job)
        if p is None:
            p = part_of[job] = zlib.crc32(job.encode()) % partitions
        value = dumps(event).encode()
        parts[p].append(value)
        if scale_partitions:
            scale_parts[zlib.crc32(job.encode()) % scale_partitions].append(value)
        if i < single_n:
            expected_single += cost
            single_counts[p] += 1
        if (i + 1) % step == 0:
            log(f"generated {i + 1:,}/{events:,} events")
    assert ts_max <= time.time(), "an event is in the future"
    return DataSet(events, tagsets, partitions, zipf_s, parts, expected, single_n,
                   single_counts, expected_single, by_resource, top_share, ts_min, ts_max,
                   time.perf_counter() - started, scale_parts)


# ======================================================================================
# Kafka and Redis plumbing
# ======================================================================================


def produce(bootstrap: str, topic: str, parts: list[list[bytes]], label: str) -> dict[str, Any]:
    from costline.connectors.kafka import COMPRESSION, producer

    total = sum(len(p) for p in parts)
    prod = producer(bootstrap, client_id="costline-bench")
    started = time.perf_counter()
    sent, last_log = 0, started
    # Interleave partitions (chunks of 200) as a fleet of collectors would.
    for start in range(0, max(len(p) for p in parts), 200):
        for partition, values in enumerate(parts):
            for value in values[start:start + 200]:
                prod.send(topic, value=value, partition=partition)
                sent += 1
        if time.perf_counter() - last_log > 5:
            last_log = time.perf_counter()
            log(f"producing {label}: {sent:,}/{total:,} messages")
    prod.flush()
    prod.close()
    took = time.perf_counter() - started
    log(f"produced {label}: {total:,} messages in {took:.1f}s ({total / took:,.0f} msg/s)")
    return {"messages": total, "seconds": took, "codec": COMPRESSION,
            "bytes": sum(len(v) for p in parts for v in p)}


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        return {tp.partition: off for tp, off in consumer.end_offsets(tps).items()}
    finally:
        consumer.close()


def redis_keys(r: Any, ns: str) -> list[bytes]:
    keys: list[bytes] = []
    for pattern in (f"{{{ns}:*", f"{ns}:*"):
        keys.extend(r.scan_iter(match=pattern, count=2000))
    return keys


def unlink_namespaces(redis_url: str, namespaces: list[str]) -> int:
    """Delete every Redis key of these namespaces; returns how many there were."""
    from redis import Redis

    r = Redis.from_url(redis_url)
    deleted = 0
    try:
        for ns in namespaces:
            keys = redis_keys(r, ns)
            for i in range(0, len(keys), 1000):
                deleted += r.unlink(*keys[i:i + 1000])
    finally:
        r.close()
    return deleted


def delete_namespace(bootstrap: str, redis_url: str, namespaces: list[str]) -> None:
    deleted = unlink_namespaces(redis_url, namespaces)
    try:
        from costline.connectors.kafka import admin

        client = admin(bootstrap)
        try:
            topics = [t for t in client.list_topics()
                      if any(t.startswith((f"{ns}.", f"{ns}-")) for ns in namespaces)]
            if topics:
                client.delete_topics(topics)
            groups = [g["group_id"] for g in client.list_groups()
                      if any(g["group_id"].startswith(f"{ns}-") for ns in namespaces)]
            if groups:
                try:
                    client.delete_groups(groups)
                except Exception as exc:  # noqa: BLE001 - a group still closing: best effort
                    log(f"could not delete consumer groups {groups}: {exc}")
        finally:
            client.close()
        log(f"cleanup: unlinked {deleted} Redis keys, deleted topics {sorted(topics)}, "
            f"groups {groups}")
    except Exception as exc:  # noqa: BLE001 - cleanup must not hide the results
        log(f"cleanup of Kafka failed: {exc}")


def namespace_memory(redis_url: str, ns: str) -> dict[str, Any]:
    """MEMORY USAGE (exact, SAMPLES 0) of every key of the namespace, by kind of key."""
    from redis import Redis

    r = Redis.from_url(redis_url)
    keys = redis_keys(r, ns)
    by_kind: Counter = Counter()
    count: Counter = Counter()
    for i in range(0, len(keys), 500):
        chunk = keys[i:i + 500]
        pipe = r.pipeline(transaction=False)
        for key in chunk:
            pipe.memory_usage(key, samples=0)
        for key, used in zip(chunk, pipe.execute(), strict=True):
            text = key.decode()
            kind = ("dedup" if ":seen:" in text
                    else "buckets " + text.split(":b:", 1)[1].split(":", 1)[0] if ":b:" in text
                    else "tagsets" if text.endswith((":tagsets", ":first")) else "other")
            by_kind[kind] += used or 0
            count[kind] += 1
    tagsets = sum(r.hlen(k) for k in keys if k.endswith(b":tagsets"))
    seen = sum(r.scard(k) for k in keys if b":seen:" in k)
    r.close()
    return {"keys": len(keys), "bytes": sum(by_kind.values()), "by_kind": dict(by_kind),
            "keys_by_kind": dict(count), "tagsets": tagsets, "dedup_members": seen}


def redis_info(redis_url: str) -> dict[str, Any]:
    from redis import Redis

    r = Redis.from_url(redis_url)
    mem = r.info("memory")
    cpu = r.info("cpu")
    stats = r.info("commandstats")
    r.close()
    ev = stats.get("cmdstat_evalsha", {})
    return {"used_memory": mem["used_memory"],
            "cpu_s": cpu["used_cpu_user"] + cpu["used_cpu_sys"],
            "evalsha_calls": ev.get("calls", 0), "evalsha_usec": ev.get("usec", 0)}


def scrape_series(port: int) -> list[tuple[str, dict[str, str], float]]:
    """The worker's own /metrics as (name, labels, value), histogram buckets left out."""
    import re
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
    except OSError as exc:
        log(f"could not read the worker's /metrics: {exc}")
        return []
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#") or "_bucket" in line:
            continue
        series, _, value = line.rpartition(" ")
        name, _, labels = series.partition("{")
        try:
            out.append((name, dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', labels)),
                        float(value)))
        except ValueError:
            continue
    return out


def scrape_metrics(port: int) -> dict[str, float]:
    """The worker's own /metrics (counters and histogram sums), labels summed away."""
    out: dict[str, float] = {}
    for name, _, value in scrape_series(port):
        out[name] = out.get(name, 0.0) + value
    return out


def redis_total(redis_url: str, ns: str, ts_min: float, ts_max: float) -> int:
    from redis import Redis

    from costline.connectors.redis_state import RedisState

    r = Redis.from_url(redis_url)
    try:
        totals = RedisState(r, ns, "UTC").totals("cost", {}, [], ts_min - DAY_S, ts_max + 3600)
    finally:
        r.close()
    return sum(totals.values())


def watermarks(r: Any, ns: str, partitions: int) -> list[int]:
    from costline.connectors.redis_keys import slot_tag, wm_key

    raw = r.mget([wm_key(slot_tag(ns, "usage", p)) for p in range(partitions)])
    return [-1 if v is None else int(v) for v in raw]


# ======================================================================================
# The consumers (each runs in its own subprocess: ``--role``)
# ======================================================================================


class Probe:
    """First fetched message → last handled message, wall and CPU time, in the child."""

    def __init__(self, out: str, ends: dict[int, int], profile: str | None = None,
                 profile_out: str | None = None) -> None:
        self.out = out
        self.ends = ends
        self.missing = {p for p, end in ends.items() if end > 0}
        self.last: dict[int, int] = {}
        self.t_first: float | None = None
        self.cpu_first = 0.0
        self.messages = 0
        self.calls = 0
        self.events = 0
        self.rejected = 0
        self.done = False
        self.t_first_handle: float | None = None
        self.in_handle = 0.0
        self.profile, self.profile_out, self.profiler = profile, profile_out, None

    def first(self) -> None:
        if self.t_first is None:
            self.t_first = time.perf_counter()
            self.cpu_first = time.process_time()
            write_json(self.out + ".first", {"t": time.time()})
            if self.profile == "pyinstrument":
                from pyinstrument import Profiler

                self.profiler = Profiler(interval=0.001, async_mode="disabled")
                self.profiler.start()

    def saw(self, partition: int, offset: int) -> None:
        if offset >= self.ends.get(partition, 0) - 1:
            self.missing.discard(partition)

    def finish(self) -> None:
        if self.done or self.missing:
            return
        self.done = True
        t_last, cpu_last = time.perf_counter(), time.process_time()
        if self.profiler is not None:
            self.profiler.stop()
            assert self.profile_out
            Path(self.profile_out + ".txt").write_text(
                self.profiler.output_text(unicode=False, color=False, show_all=False))
            Path(self.profile_out + ".html").write_text(self.profiler.output_html())
        assert self.t_first is not None
        write_json(self.out, {
            "elapsed_s": t_last - self.t_first, "cpu_s": cpu_last - self.cpu_first,
            "messages": self.messages, "events": self.events, "rejected": self.rejected,
            "calls": self.calls, "t_done": time.time(), "in_handle_s": self.in_handle,
            "first_handle_after_s": (None if self.t_first_handle is None
                                     else self.t_first_handle - self.t_first),
            **vm_status(),
        })


async def ceiling(a: argparse.Namespace, probe: Probe) -> None:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from costline.rules.events import Rejection, parse_message

    consumer = AIOKafkaConsumer(bootstrap_servers=a.bootstrap, enable_auto_commit=False,
                                group_id=None, auto_offset_reset="earliest")
    await consumer.start()
    try:
        tps = [TopicPartition(a.topic, p) for p in range(a.partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        while not probe.done:
            batch = await consumer.getmany(timeout_ms=1000)
            for tp, records in batch.items():
                if not records:
                    continue
                probe.first()
                probe.calls += 1
                for record in records:
                    verdict = parse_message(record.value)
                    if isinstance(verdict, Rejection):
                        probe.rejected += 1
                    else:
                        probe.events += len(verdict.events)
                probe.messages += len(records)
                probe.saw(tp.partition, records[-1].offset)
            probe.finish()
    finally:
        await consumer.stop()



def own_group(suffix: str) -> None:
    """Every Faust app built from now on gets its own consumer group: ``<id>-<suffix>``
    (``faust_app`` builds a ``costline.streams.worker.handoff.App``, or the ``faust.App`` it is
    given)."""
    import faust

    from costline.streams.worker import handoff

    for module in (faust, handoff):
        base = module.App

        class OwnGroupApp(base):  # type: ignore[misc, valid-type]
            def __init__(self, id: str, **kwargs: Any) -> None:
                super().__init__(f"{id}-{suffix}", **kwargs)

        module.App = OwnGroupApp  # type: ignore[misc]


def time_first_fetch(a: argparse.Namespace, probe: Probe) -> None:
    """Start the probe's clock at the first fetched message: one check per fetch, not per
    message. With ``--go``, fetch nothing until the parent says go."""
    from faust.transport import consumer as faust_consumer

    wait_next = faust_consumer.Consumer._wait_next_records
    gate = {"path": f"{a.go}.fetch" if a.go else None}

    async def _wait_next_records(self: Any, timeout: float) -> Any:
        if gate["path"] is not None:
            if not os.path.exists(gate["path"]):
                # Nothing taken from the client, so nothing is in flight while the group
                # forms: its rebalances stay short and nobody reads alone meanwhile.
                await asyncio.sleep(0.05)
                return {}, set()
            gate["path"] = None
        records, active = await wait_next(self, timeout)
        if records and probe.t_first is None and any(records.values()):
            probe.first()
        return records, active

    faust_consumer.Consumer._wait_next_records = _wait_next_records


def run_plain(a: argparse.Namespace, probe: Probe) -> None:
    """(b'): ``async for`` over the stream's events, doing nothing with them."""
    import faust

    from costline.streams.settings import Settings
    from costline.streams.worker.app import faust_app

    own_group("plain")
    time_first_fetch(a, probe)
    settings = Settings(kafka_bootstrap=a.bootstrap, redis_url=a.redis_url, namespace=a.ns,
                        web_port=a.port, partitions=a.partitions)
    app = faust_app(settings, app_class=faust.App)  # Faust's own consumer
    source = app.topic(settings.topic("usage"), value_serializer="raw", key_serializer="raw")

    @app.agent(source)
    async def plain(stream: Any) -> None:
        async for event in stream.events():
            probe.calls += 1
            probe.messages += 1
            probe.saw(event.message.partition, event.message.offset)
            probe.finish()

    faust.Worker(app, loglevel="warning", quiet=True).execute_from_commandline()


def run_faust(a: argparse.Namespace, probe: Probe, noop: bool) -> None:
    import faust

    from costline.streams.settings import Settings

    if noop:
        own_group("noop")  # same app, settings and agent as the worker
    time_first_fetch(a, probe)

    from costline.streams.worker.app import build_app

    extra: dict[str, Any] = {"rules": Path(a.rules)} if a.rules else {}
    settings = Settings(kafka_bootstrap=a.bootstrap, redis_url=a.redis_url, namespace=a.ns,
                        web_port=a.port, partitions=a.partitions, folding=a.folding,
                        folding_processes=a.folding_processes, **extra)
    app, aggregator = build_app(settings)
    real_handle = aggregator.handle
    usage = settings.topic("usage")

    async def handle(messages: list[Any]) -> None:
        started = time.perf_counter()
        if probe.t_first_handle is None:
            probe.t_first_handle = started
        if not noop:
            await real_handle(messages)
        probe.in_handle += time.perf_counter() - started
        probe.calls += 1
        probe.messages += len(messages)
        last: dict[int, int] = {}
        for m in messages:
            if m.topic == usage:
                last[m.partition] = m.offset
        for p, off in last.items():
            probe.saw(p, off)
        probe.finish()

    aggregator.handle = handle  # type: ignore[method-assign]
    if noop:
        async def on_assigned(tps: Any) -> dict[Any, int]:
            return {}  # no Redis: start where Kafka says (earliest)

        aggregator.on_assigned = on_assigned  # type: ignore[method-assign]
    if a.go:
        record_assignments(app, usage, a.out + ".assign")
        wait_for_go(a.out + ".ready", a.go)
    faust.Worker(app, loglevel="warning", quiet=True).execute_from_commandline()


def record_assignments(app: Any, topic: str, path: str) -> None:
    """Append the input partitions this worker owns after every rebalance (one JSON line
    each): which worker got what, and when the group last moved partitions."""
    @app.on_rebalance_complete.connect
    async def note(sender: Any, **kwargs: Any) -> None:
        owned = sorted(tp.partition for tp in app.consumer.assignment() if tp.topic == topic)
        with open(path, "a") as fh:
            fh.write(json.dumps({"t": time.time(), "partitions": owned}) + "\n")


def wait_for_go(ready: str, go: str) -> None:
    """Imports and ``build_app`` take seconds of CPU: the workers of one scaling step do
    them first, then join the consumer group together (and fetch once it has split the
    partitions: ``{go}.fetch``)."""
    write_json(ready, {"t": time.time()})
    while not os.path.exists(go):
        time.sleep(0.02)


def child_main(a: argparse.Namespace) -> None:
    ends = {int(p): int(o) for p, o in json.loads(a.ends).items()}
    probe = Probe(a.out, ends, a.child_profile, a.profile_out)
    ROLES[a.role](a, probe)


# What each consumer subprocess runs (``--role``).
ROLES: dict[str, Callable[[argparse.Namespace, Probe], None]] = {
    "ceiling": lambda a, probe: asyncio.run(ceiling(a, probe)),
    "noop": lambda a, probe: run_faust(a, probe, noop=True),
    "plain": run_plain,
    "worker": lambda a, probe: run_faust(a, probe, noop=False),
}


# ======================================================================================
# The parent: run each consumer, watch it, collect figures
# ======================================================================================


# The consumers (a), (b) and (b'): role → (name, what it runs).
BASELINES = {
    "ceiling": ("(a) ceiling", "plain aiokafka consumer + parse_message"),
    "noop": ("(b) Faust no-op", "build_app with a no-op handle"),
    "plain": ("(b') plain Faust agent", "async for over the stream, on Faust's own consumer "
              "and the worker's Faust settings"),
}


@dataclass
class Child:
    proc: subprocess.Popen[bytes]
    out: str
    log_path: Path
    port: int = 0

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.alive():
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
            except ProcessLookupError:
                pass

    def tail(self) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-25:])
        except OSError:
            return ""


class Bench:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.run_id = "bench" + secrets.token_hex(3)
        self.dir = Path(tempfile.mkdtemp(prefix=f"costline-{self.run_id}-"))
        self.children: list[Child] = []
        self.namespaces: list[str] = []

    def spawn(self, role: str, ns: str, topic: str, ends: dict[int, int], tag: str,
              profile: str | None = None, rules: Path | None = None,
              go: Path | None = None) -> Child:
        out = str(self.dir / f"{tag}.json")
        log_path = self.dir / f"{tag}.log"
        port = free_port()
        cmd = [sys.executable, str(Path(__file__).resolve()), "--role", role, "--ns", ns,
               "--topic", topic, "--partitions", str(len(ends)),
               "--ends", json.dumps(ends), "--out", out, "--port", str(port),
               "--bootstrap", self.a.bootstrap, "--redis-url", self.a.redis_url]
        if profile == "pyinstrument":
            cmd += ["--child-profile", "pyinstrument", "--profile-out", str(self.dir / tag)]
        if rules is not None:
            cmd += ["--rules", str(rules)]
        if go is not None:
            cmd += ["--go", str(go)]
        cmd += ["--folding", self.a.folding, "--folding-processes", str(self.a.folding_processes)]
        with log_path.open("wb") as fh:
            proc = subprocess.Popen(cmd, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        child = Child(proc, out, log_path, port)
        self.children.append(child)
        return child

    def wait(self, child: Child, label: str, total_msgs: int,
             progress: Any = None, hook: Any = None) -> dict[str, Any]:
        started, last_log = time.perf_counter(), time.perf_counter()
        hooked = False
        machine0: tuple[list[int], float] | None = None
        while True:
            if not hooked and os.path.exists(child.out + ".first"):
                hooked = True
                machine0 = (cpu_jiffies(), redis_info(self.a.redis_url)["cpu_s"])
                if hook is not None:
                    hook()
            if os.path.exists(child.out) and (progress is None or progress()[0] >= total_msgs):
                result = json.loads(Path(child.out).read_text())
                if machine0 is not None:
                    result["machine"] = machine_load(machine0, self.a.redis_url)
                return result
            if not child.alive():
                raise RuntimeError(f"{label} exited with {child.proc.returncode}:\n{child.tail()}")
            if time.perf_counter() - started > self.a.timeout:
                raise RuntimeError(f"{label} did not finish in {self.a.timeout}s:\n{child.tail()}")
            if time.perf_counter() - last_log > 10:
                last_log = time.perf_counter()
                extra = ""
                if progress is not None:
                    done, note = progress()
                    extra = f": {done:,}/{total_msgs:,} messages applied {note}"
                log(f"{label} running {time.perf_counter() - started:.0f}s{extra}")
            time.sleep(0.05)

    # -- the three consumers -------------------------------------------------------

    def run_baseline(self, role: str, ns: str, topic: str, ends: dict[int, int],
                     tag: str) -> dict[str, Any]:
        name, what = BASELINES[role]
        label = f"{name} [{tag}]"
        log(f"{label}: {what}")
        child = self.spawn(role, ns, topic, ends, f"{role}-{tag}")
        try:
            return self.wait(child, label, sum(ends.values()))
        finally:
            child.stop()

    def run_worker(self, ns: str, topic: str, ends: dict[int, int], tag: str,
                   profile: str | None = None, rules: Path | None = None) -> dict[str,
                   Any]:
        from redis import Redis

        label = f"(c) costline worker [{tag}]" + (f" under {profile}" if profile else "")
        log(f"{label}: costline.streams.worker.app.build_app, "
            "done when Redis watermarks reach the end offsets")
        r = Redis.from_url(self.a.redis_url)
        before = redis_info(self.a.redis_url)
        total = sum(ends.values())
        child = self.spawn("worker", ns, topic, ends, f"worker-{tag}",
                           profile if profile == "pyinstrument" else None, rules)
        spy: subprocess.Popen[bytes] | None = None
        spy_out = self.dir / f"pyspy-{tag}.txt"

        def progress() -> tuple[int, str]:
            wms = watermarks(r, ns, self.a.partitions)
            return sum(w + 1 for w in wms), f"(watermarks {wms})"

        def attach() -> None:
            nonlocal spy
            if profile == "py-spy":
                spy = subprocess.Popen(
                    [str(Path(sys.executable).parent / "py-spy"), "record", "--pid",
                     str(child.proc.pid), "--format", "raw", "--function", "--rate", "200",
                     "--output", str(spy_out)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        try:
            result = self.wait(child, label, total, progress, attach)
            result["t_wm_done"] = time.time()
            # The parent's view: VmHWM of the worker process itself.
            result.update({f"parent_{k}": v for k, v in vm_status(child.proc.pid).items()})
            # The rules are evaluated in a child process of the worker: its own figures.
            result.update(child_figures(child.proc.pid))
            after = redis_info(self.a.redis_url)
            result["redis"] = {k: after[k] - before[k] for k in after}
            result["metrics"] = scrape_metrics(child.port)
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                spy.wait(60)
                result["pyspy"] = str(spy_out)
            return result
        finally:
            child.stop()
            if spy is not None and spy.poll() is None:
                spy.kill()
            r.close()

    # -- the whole run --------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        from costline.streams.settings import Settings
        from costline.streams.topics import create_topics

        a = self.a
        log(f"run {self.run_id}: {a.events:,} events, {a.tagsets:,} tag sets, "
            f"{a.partitions} partitions, batches of {a.batch_size}; files in {self.dir}")
        load_start = os.getloadavg()
        data = generate(a.events, a.tagsets, a.partitions, a.zipf, a.seed, self.run_id,
                        a.single_events, a.scale_partitions if a.scale else 0)
        log(f"generated in {data.generate_s:.1f}s; expected total {data.expected_cost_micro:,} "
            f"micro-units; top 1% of tag sets hold {data.top_share:.0%} of events")
        cases = {
            "single": (data.singles(), data.single_events, data.expected_single_micro),
            "batched": (data.batches(a.batch_size), a.events, data.expected_cost_micro),
        }
        report: dict[str, Any] = {
            "run_id": self.run_id, "events": a.events, "tagsets": data.tagsets,
            "partitions": a.partitions, "batch_size": a.batch_size, "zipf_s": a.zipf,
            "seed": a.seed, "loadavg_start": load_start, "cpus": os.cpu_count(),
            "events_by_resource": dict(data.by_resource), "top1pct_share": data.top_share,
            "expected_cost_micro": data.expected_cost_micro, "generate_s": data.generate_s,
            "single_events": data.single_events, "git": git_state(), "cases": {},
            "folding": a.folding, "folding_processes": a.folding_processes,
        }
        topics: dict[str, tuple[str, str, dict[int, int]]] = {}
        for case, (parts, n_events, expected) in cases.items():
            ns = f"{self.run_id}{case[0]}"
            self.namespaces.append(ns)
            settings = Settings(kafka_bootstrap=a.bootstrap, redis_url=a.redis_url,
                                namespace=ns, partitions=a.partitions)
            create_topics(settings)
            topic = settings.topic("usage")
            produced = produce(a.bootstrap, topic, parts, case)
            ends = end_offsets(a.bootstrap, topic, a.partitions)
            assert sum(ends.values()) == produced["messages"], (ends, produced)
            topics[case] = (ns, topic, ends)
            report["cases"][case] = {"events": n_events, "expected_cost_micro": expected,
                                     "messages": produced["messages"], "produce": produced,
                                     "namespace": ns, "topic": topic}
        scaling = self.produce_scaling_copy(data) if a.scale else None
        scale_events = [len(p) for p in data.scale_parts]
        del cases, parts, data.parts, data.scale_parts
        for case, (ns, topic, ends) in topics.items():
            entry = report["cases"][case]
            n_events, expected = entry["events"], entry["expected_cost_micro"]
            entry["a"] = self.run_baseline("ceiling", ns, topic, ends, case)
            if entry["a"]["events"] != n_events or entry["a"]["rejected"]:
                raise RuntimeError(f"ceiling parsed {entry['a']['events']} events, "
                                   f"{entry['a']['rejected']} rejected: the data set is bad")
            entry["b"] = self.run_baseline("noop", ns, topic, ends, case)
            entry["b_plain"] = self.run_baseline("plain", ns, topic, ends, case)
            used_before = redis_info(a.redis_url)["used_memory"]
            entry["c"] = self.run_worker(ns, topic, ends, case)
            entry["redis_memory"] = namespace_memory(a.redis_url, ns)
            entry["redis_memory"]["used_memory_delta"] = (
                redis_info(a.redis_url)["used_memory"] - used_before)
            entry["total"] = total_check(a.redis_url, ns, data, expected)
            dlq = end_offsets(a.bootstrap, f"{ns}.dlq.v1", 1)
            entry["dead_letters"] = sum(dlq.values())
            log(f"[{case}] total check: redis {entry['total']['redis']:,} vs expected "
                f"{expected:,} -> {'OK' if entry['total']['ok'] else 'MISMATCH'}")
            for k in ("a", "b", "b_plain", "c"):
                add_rates(entry[k], n_events, entry["messages"])
            entry["c_over_a"] = entry["c"]["events_per_s"] / entry["a"]["events_per_s"]
            entry.update(ratios(entry["b"], entry["b_plain"], entry["c"]))
            log(f"[{case}] a {entry['a']['events_per_s']:,.0f} ev/s, b "
                f"{entry['b']['events_per_s']:,.0f} ev/s, b' "
                f"{entry['b_plain']['events_per_s']:,.0f} ev/s, c "
                f"{entry['c']['events_per_s']:,.0f} ev/s")
        if a.rounds > 1:
            self.run_rounds(topics, report, data)
        if scaling is not None:
            report["scaling"] = self.run_scaling(*scaling, data, scale_events)
        if a.without_rules:
            ns, topic, ends = topics["batched"]
            log("the batched worker again with an empty rule directory (fresh Redis state and "
                "consumer group, same topic)")
            self.fresh_worker_state(ns)
            empty = self.dir / "no-rules"
            empty.mkdir(exist_ok=True)
            var = self.run_worker(ns, topic, ends, "batched-no-rules", rules=empty)
            add_rates(var, a.events)
            var["total"] = total_check(a.redis_url, ns, data, data.expected_cost_micro)
            report["without_rules"] = var
            log(f"[batched, no rules] {var['events_per_s']:,.0f} ev/s, total "
                f"{'OK' if var['total']['ok'] else 'MISMATCH'}")
        if a.profile:
            case = a.profile_case
            ns, topic, ends = topics[case]
            log(f"profiling the {case} worker with {a.profile} (fresh Redis state and "
                "consumer group, same topic)")
            self.fresh_worker_state(ns)
            prof = self.run_worker(ns, topic, ends, f"{case}-profiled", a.profile)
            events, expected = ((a.events, data.expected_cost_micro) if case == "batched"
                                else (data.single_events, data.expected_single_micro))
            prof["case"] = case
            add_rates(prof, events)
            prof["total"] = total_check(a.redis_url, ns, data, expected)
            prof["total_ok"] = prof["total"]["ok"]
            if not prof["total_ok"]:
                log(f"profiled pass: Redis total {prof['total']['redis']:,} != expected "
                    f"{expected:,}")
            if a.profile == "py-spy" and prof.get("pyspy"):
                prof["hotspots"] = summarize_collapsed(Path(prof["pyspy"]))
            else:
                prof["text"] = str(self.dir / f"worker-{case}-profiled.txt")
            report["profile"] = prof
        report["files"] = str(self.dir)
        return report

    # -- rounds: the same comparison again, for its spread -------------------------------

    def run_rounds(self, topics: dict[str, tuple[str, str, dict[int, int]]],
                   report: dict[str, Any], data: DataSet) -> None:
        """``--rounds N``: (b), (b') and (c) N-1 more times on each case's topic, one after
        the other, each with fresh consumer groups and (c) with fresh Redis state. Figures
        on a shared 2-CPU machine move by a third from one run to the next, so a ratio is
        given as its median and range over the rounds (the table's run is round 1)."""
        a = self.a
        for case, (ns, topic, ends) in topics.items():
            entry = report["cases"][case]
            n_events, expected = entry["events"], entry["expected_cost_micro"]
            rounds = [round_figures(entry["b"], entry["b_plain"], entry["c"],
                                    entry["total"]["ok"])]
            for r in range(2, a.rounds + 1):
                tag = f"{case}-round{r}"
                self.forget_groups([aggregator_group(ns, "noop"), aggregator_group(ns, "plain")])
                b = self.run_baseline("noop", ns, topic, ends, tag)
                b_plain = self.run_baseline("plain", ns, topic, ends, tag)
                self.reset_group_state(ns)
                c = self.run_worker(ns, topic, ends, tag)
                for run in (b, b_plain, c):
                    add_rates(run, n_events, entry["messages"])
                ok = total_check(a.redis_url, ns, data, expected)["ok"]
                rounds.append(round_figures(b, b_plain, c, ok))
                log(f"[{case}] round {r}/{a.rounds}: c/b {rounds[-1]['c_over_b']:.3f}, "
                    f"c/b' {rounds[-1]['c_over_b_plain']:.3f}, total {'OK' if ok else 'MISMATCH'}")
            entry["rounds"] = rounds

    def forget_groups(self, groups: list[str]) -> None:
        """Delete consumer groups, retried while they are closing."""
        while_groups_close("deleting consumer groups",
                           lambda: delete_groups(self.a.bootstrap, groups))

    # -- scaling out: N workers in one consumer group ----------------------------------

    def produce_scaling_copy(self, data: DataSet) -> tuple[str, str, dict[int, int]]:
        """The batched copy again, on a topic with ``--scale-partitions`` partitions (an even
        split for 1, 2 and 3 workers with the default 6)."""
        from costline.streams.settings import Settings
        from costline.streams.topics import create_topics

        a = self.a
        ns = f"{self.run_id}x"
        self.namespaces.append(ns)
        settings = Settings(kafka_bootstrap=a.bootstrap, redis_url=a.redis_url, namespace=ns,
                            partitions=a.scale_partitions)
        create_topics(settings)
        topic = settings.topic("usage")
        produced = produce(a.bootstrap, topic, data.batches(a.batch_size, data.scale_parts),
                           "scaling copy")
        ends = end_offsets(a.bootstrap, topic, a.scale_partitions)
        assert sum(ends.values()) == produced["messages"], (ends, produced)
        return ns, topic, ends

    def run_scaling(self, ns: str, topic: str, ends: dict[int, int], data: DataSet,
                    events_by_partition: list[int]) -> dict[str, Any]:
        runs = []
        for i, n in enumerate(self.a.scale):
            if i:
                self.reset_group_state(ns)
            run = self.run_group(ns, topic, ends, n, events_by_partition)
            run["total"] = total_check(self.a.redis_url, ns, data, data.expected_cost_micro)
            log(f"[{n} worker(s)] {run['events_per_s']:,.0f} ev/s, partitions "
                f"{[w['partitions'] for w in run['workers']]}, total "
                f"{'OK' if run['total']['ok'] else 'MISMATCH'}")
            runs.append(run)
        base = next((r["events_per_s"] for r in runs if r["workers_n"] == 1), None)
        for run in runs:
            run["speedup"] = run["events_per_s"] / base if base else None
        return {"namespace": ns, "topic": topic, "partitions": len(ends),
                "messages": sum(ends.values()), "events": self.a.events,
                "events_by_partition": events_by_partition, "runs": runs,
                "note": scaling_note(runs, os.cpu_count() or 1)}

    def reset_group_state(self, ns: str) -> None:
        """``fresh_worker_state``, retried while the group is closing."""
        while_groups_close("resetting the consumer group", lambda: self.fresh_worker_state(ns))

    def run_group(self, ns: str, topic: str, ends: dict[int, int], n: int,
                  events_by_partition: list[int]) -> dict[str, Any]:
        """N workers: they import and build the app, join the group together, and fetch
        once the group has split the partitions; timed from the first fetch to the moment
        every partition's watermark reached its end offset."""
        from redis import Redis

        label = f"(scale) {n} worker(s)"
        log(f"{label} in one consumer group, done when every Redis watermark reaches the end")
        code = code_fingerprint()
        step = f"scale{n}-{secrets.token_hex(2)}"  # a count may be given twice
        go = self.dir / f"go-{step}"
        children = [self.spawn("worker", ns, topic, ends, f"{step}-w{i}", go=go)
                    for i in range(n)]
        r = Redis.from_url(self.a.redis_url)
        try:
            self.wait_children(children, label, "ready", lambda: all(
                os.path.exists(c.out + ".ready") for c in children))
            go.touch()
            joining = time.perf_counter()
            self.wait_children(children, label, "split the partitions", lambda: all(
                os.path.exists(c.out + ".assign") for c in children) and exclusive_split(
                [last_assignment(c) for c in children], len(ends)))
            joined_s = time.perf_counter() - joining
            cpu0 = [cpu_seconds(c.proc.pid) for c in children]
            Path(f"{go}.fetch").touch()
            run = self.watch_group(children, r, ns, ends, label)
            run["joined_s"], run["code"] = joined_s, code
            run["workers"] = [self.worker_figures(c, c0, topic)
                              for c, c0 in zip(children, cpu0, strict=True)]
        finally:
            for child in children:
                child.stop()
            r.close()
        run.update(group_figures(run, self.a.events, events_by_partition,
                                 os.cpu_count() or 1))
        return run

    def wait_children(self, children: list[Child], label: str, what: str,
                      done: Any, timeout: float = 300) -> None:
        deadline = time.perf_counter() + timeout
        while not done():
            for c in children:
                if not c.alive():
                    raise RuntimeError(f"{label}: a worker exited with {c.proc.returncode}:\n"
                                       f"{c.tail()}")
            if time.perf_counter() > deadline:
                raise RuntimeError(f"{label}: workers not {what} in {timeout}s")
            time.sleep(0.05)

    def watch_group(self, children: list[Child], r: Any, ns: str, ends: dict[int, int],
                    label: str) -> dict[str, Any]:
        """Poll the watermarks until every partition is applied; the machine's, Redis's
        and the local Kafka broker's CPU over the same window."""
        total = sum(ends.values())
        started = last_log = time.perf_counter()
        brokers = broker_pids()
        machine0: tuple[list[int], float] | None = None
        kafka0 = 0.0
        while True:
            now = time.time()
            applied = sum(w + 1 for w in watermarks(r, ns, len(ends)))
            if machine0 is None and any(os.path.exists(c.out + ".first") for c in children):
                machine0 = (cpu_jiffies(), redis_info(self.a.redis_url)["cpu_s"])
                kafka0 = sum(map(cpu_seconds, brokers))
            if applied >= total:
                break
            dead = [c for c in children if not c.alive()]
            if dead:
                raise RuntimeError(f"{label}: a worker exited with {dead[0].proc.returncode}:"
                                   f"\n{dead[0].tail()}")
            if time.perf_counter() - started > self.a.timeout:
                raise RuntimeError(f"{label} did not finish in {self.a.timeout}s")
            if time.perf_counter() - last_log > 10:
                last_log = time.perf_counter()
                log(f"{label} running: {applied:,}/{total:,} messages applied")
            time.sleep(0.05)
        machine = machine_load(machine0 or (cpu_jiffies(), 0.0), self.a.redis_url)
        if brokers:
            machine["kafka_cpu_s"] = sum(map(cpu_seconds, brokers)) - kafka0
        t_first = min(f["t"] for f in map(read_json, (c.out + ".first" for c in children)) if f)
        moved = [sum(1 for a in read_jsonl(c.out + ".assign") if a["t"] > t_first)
                 for c in children]
        return {"workers_n": len(children), "elapsed_s": now - t_first, "machine": machine,
                "messages": total, "rebalances_while_timed": max(moved)}

    def worker_figures(self, child: Child, cpu0: float, topic: str) -> dict[str, Any]:
        """One worker of the group: what it owns (its consumer_lag series), what it did and
        what it cost, read before it is stopped."""
        series = scrape_series(child.port)
        counters: Counter = Counter()
        for name, _, value in series:
            counters[name.removeprefix("costline_")] += value
        return {
            "pid": child.proc.pid,
            "partitions": sorted(int(labels["partition"]) for name, labels, _ in series
                                 if name == "costline_consumer_lag"
                                 and labels.get("topic") == topic),
            "cpu_s": cpu_seconds(child.proc.pid) - cpu0,
            **{k: counters[k] for k in ("events_total", "messages_total", "batches_total",
                                        "watermark_mismatch_total", "evaluations_total")},
            **vm_status(child.proc.pid),
            **child_figures(child.proc.pid),
        }

    def fresh_worker_state(self, ns: str) -> None:
        """Forget what the worker of ``ns`` did: its Redis keys and its consumer group.

        The group goes too: a worker whose Redis watermark is gone resumes at offset 0, and
        aiokafka's seek_to_committed() does not seek to a committed 0, so with the old
        group's offsets (at the end) the partitions would never be read again.
        """
        delete_redis_only(self.a.redis_url, ns)
        delete_groups(self.a.bootstrap, [aggregator_group(ns)])

    def cleanup(self) -> None:
        for child in self.children:
            child.stop()
        if self.namespaces and not self.a.keep:
            delete_namespace(self.a.bootstrap, self.a.redis_url, self.namespaces)


def while_groups_close(what: str, step: Callable[[], None], attempts: int = 10) -> None:
    """Run ``step``, again every 2 s while it fails: a consumer group that just lost its
    last member may still be closing for a moment (GroupNotEmpty)."""
    for attempt in range(attempts):
        try:
            step()
            return
        except Exception as exc:  # noqa: BLE001 - GroupNotEmpty while members leave
            if attempt == attempts - 1:
                raise
            log(f"{what}: {exc}; retrying")
            time.sleep(2)


def aggregator_group(ns: str, suffix: str = "") -> str:
    """The consumer group of the worker's app in ``ns`` (``own_group(suffix)``'s, if given)."""
    return f"{ns}-aggregator" + (f"-{suffix}" if suffix else "")


def add_rates(run: dict[str, Any], events: int, messages: int | None = None
              ) -> dict[str, Any]:
    """A consumer's events/s and CPU-µs per event (and messages/s) from its elapsed and CPU
    seconds."""
    run["events_per_s"] = events / run["elapsed_s"]
    run["cpu_us_per_event"] = 1e6 * run["cpu_s"] / events
    if messages is not None:
        run["messages_per_s"] = messages / run["elapsed_s"]
    return run


def ratios(b: dict[str, Any], b_plain: dict[str, Any], c: dict[str, Any]) -> dict[str, float]:
    return {"c_over_b": c["events_per_s"] / b["events_per_s"],
            "c_over_b_plain": c["events_per_s"] / b_plain["events_per_s"]}


def round_figures(b: dict[str, Any], b_plain: dict[str, Any], c: dict[str, Any],
                  total_ok: bool) -> dict[str, Any]:
    """One round: the events/s of (b), (b') and (c) (``add_rates`` done), and the ratios."""
    rates = {"b": b["events_per_s"], "b_plain": b_plain["events_per_s"],
             "c": c["events_per_s"]}
    return {"events_per_s": rates, **ratios(b, b_plain, c), "total_ok": total_ok}


def total_check(redis_url: str, ns: str, data: DataSet, expected: int) -> dict[str, Any]:
    """Redis's total of ``ns`` against the generator's."""
    total = redis_total(redis_url, ns, data.ts_min, data.ts_max)
    return {"redis": total, "expected": expected, "ok": total == expected}


def spread(values: list[float], fmt: str) -> str:
    """``median (lowest–highest)``."""
    return (f"{format(statistics.median(values), fmt)} "
            f"({format(min(values), fmt)}–{format(max(values), fmt)})")


def read_json(path: str) -> dict[str, Any] | None:
    try:
        return json.loads(Path(path).read_text())  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return None


def read_jsonl(path: str) -> list[dict[str, Any]]:
    try:
        return [json.loads(line) for line in Path(path).read_text().splitlines() if line]
    except OSError:
        return []


def code_fingerprint() -> str:
    """A digest of the worker's sources as a step's workers import them: every step starts
    new processes, so a change to the code between steps would compare two programs."""
    import hashlib

    digest = hashlib.sha1()
    for path in sorted(p for d in ("rules", "connectors", "streams")
                       for p in (REPO / d).rglob("*.py")):
        digest.update(str(path.relative_to(REPO)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def last_assignment(child: Child) -> list[int]:
    """The input partitions a worker owned after its latest rebalance."""
    assigns = read_jsonl(child.out + ".assign")
    return list(assigns[-1]["partitions"]) if assigns else []


def exclusive_split(owned: list[list[int]], partitions: int) -> bool:
    """Every partition owned by exactly one worker. A worker may still be idle: Faust's
    sticky assignor moves no partition off a worker holding at most ceil(P/N) of them."""
    return sorted(p for ps in owned for p in ps) == list(range(partitions))


def broker_pids() -> list[int]:
    """Kafka broker processes on this machine (Apache Kafka's main class, or Tansu), to tell
    the broker's CPU from the rest; none when the broker runs elsewhere."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"kafka.Kafka" in args or args[0].endswith(b"tansu"):
            pids.append(int(entry.name))
    return pids


def group_figures(run: dict[str, Any], events: int, events_by_partition: list[int],
                  cpus: int) -> dict[str, Any]:
    """Rates, the split, and where the machine's CPU went during one scaling step."""
    workers = run["workers"]
    elapsed, machine = run["elapsed_s"], run["machine"]
    worker_cpu = sum(w["cpu_s"] for w in workers)
    busy_cpu = machine["busy_pct"] / 100 * cpus * elapsed
    pipeline_cpu = worker_cpu + machine["redis_cpu_s"] + machine.get("kafka_cpu_s", 0.0)
    # Popular tag sets make partitions unequal: the busiest worker's share of the events
    # bounds the speed-up even with a CPU per worker.
    heaviest = max(sum(events_by_partition[p] for p in w["partitions"]) for w in workers)
    return {
        "events_per_s": events / elapsed,
        "split_ok": exclusive_split([w["partitions"] for w in workers],
                                    len(events_by_partition)),
        "split_bound_speedup": sum(events_by_partition) / max(1, heaviest),
        "worker_cpu_s": worker_cpu,
        "cpu_us_per_event": 1e6 * worker_cpu / events,
        "busy_cpu_s": busy_cpu,
        # the machine's busy CPU that was not the workers, Redis or the local broker
        "other_cpu_s": max(0.0, busy_cpu - pipeline_cpu),
        "pipeline_cpu_us_per_event": 1e6 * pipeline_cpu / events,
        # the most the machine could take if the workers, Redis and Kafka had every CPU
        "cpu_bound_events_per_s": cpus * events / pipeline_cpu if pipeline_cpu else None,
    }


def delete_groups(bootstrap: str, groups: list[str]) -> None:
    from costline.connectors.kafka import admin

    client = admin(bootstrap)
    try:
        client.delete_groups(groups)
    finally:
        client.close()


def delete_redis_only(redis_url: str, ns: str) -> None:
    from redis import Redis

    r = Redis.from_url(redis_url)
    keys = redis_keys(r, ns)
    for i in range(0, len(keys), 1000):
        r.unlink(*keys[i:i + 1000])
    r.close()


# ======================================================================================
# Profile summary (py-spy collapsed stacks) and the report
# ======================================================================================


# Leaf frames of a thread that is waiting, not working: the event loops in select(), the
# to_thread pool's workers blocked on their queue or on a pipe, lock waits.
IDLE_LEAVES = ("EpollSelector.select (selectors.py", "_wait_for_tstate_lock (threading.py",
               "Condition.wait (threading.py", "_worker (concurrent/futures/thread.py",
               # a to_thread worker waiting for the evaluation process's answer (its pipe)
               "_PollLikeSelector.select (selectors.py")


# Where a busy sample belongs: the first marker found in its stack names its phase.
PHASES = (
    ("Evaluator.", "rule evaluation (to_thread, leader)"),
    ("parse_message (", "parse: costline.rules.events.parse_message (pydantic)"),
    ("Folder.price (", "price: Folder.price / PriceBook.charge"),
    ("Folder.fold (", "fold: Folder.fold (tag sets, sums, digests)"),
    ("BatchWriter.", "Redis write: BatchWriter (build, msgpack, client)"),
    ("Aggregator.", "aggregator, other"),
    ("aiokafka/", "Kafka client (aiokafka, its thread)"),
    ("faust/", "Faust machinery"),
    ("mode/", "Faust machinery"),
)


def summarize_collapsed(path: Path, top: int = 25) -> dict[str, Any]:
    """Self and inclusive share of busy samples per function from py-spy's ``--format raw``.

    Samples whose leaf is the event loop waiting in ``select`` (or a thread waiting on a
    lock) are counted as idle and left out of the percentages.
    """
    self_c: Counter = Counter()
    incl: Counter = Counter()
    by_thread: Counter = Counter()
    phases: Counter = Counter()
    total = idle = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [f for f in stack.split(";") if not f.startswith("process ")]
        frames = [f for f in frames if not f.startswith("thread ")]
        if not frames:
            continue
        total += n
        leaf = _short(frames[-1])
        if leaf.startswith(IDLE_LEAVES) or (
                # a thread's blocking (sync) Redis read: waiting for the server
                leaf.startswith("_HiredisParser.read_from_socket")
                and "Thread._bootstrap" in stack):
            idle += n
            continue
        by_thread["other threads" if "Thread._bootstrap" in stack else "main thread"] += n
        phases[next((label for marker, label in PHASES if marker in stack), "other")] += n
        self_c[_short(frames[-1])] += n
        for name in {_short(f) for f in frames}:
            incl[name] += n
    busy = total - idle
    if not busy:
        return {"samples": total, "busy": 0, "self": [], "inclusive": []}
    return {
        "samples": total, "busy": busy, "idle_pct": round(100 * idle / total, 1),
        "threads": {k: round(100 * v / busy, 1) for k, v in by_thread.items()},
        "phases": [(k, round(100 * v / busy, 1)) for k, v in phases.most_common()],
        "self": [(name, round(100 * c / busy, 1)) for name, c in self_c.most_common(top)],
        "inclusive": [(name, round(100 * c / busy, 1)) for name, c in incl.most_common(top * 3)],
    }


def _short(frame: str) -> str:
    """``func (/path/site-packages/pkg/mod.py:12)`` → ``func (pkg/mod.py:12)``."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    for marker in ("site-packages/", str(REPO) + "/", "/lib/python3.11/", "/lib/python3"):
        if marker in where:
            where = where.split(marker, 1)[1]
    return f"{name} ({where})" if where else name


def print_table(rep: dict[str, Any]) -> None:
    cases = rep["cases"]
    names = [c for c in ("single", "batched") if c in cases]
    head = {"single": "single-event msgs", "batched": f"{rep['batch_size']}-event batches"}
    w = 38

    def row(label: str, cells: list[str]) -> None:
        print(f"{label:<{w}}" + "".join(f"{c:>22}" for c in cells))

    def rule() -> None:
        print("-" * (w + 22 * len(names)))

    c0 = cases[names[0]]
    print()
    print(f"costline throughput, run {rep['run_id']}: {rep['events']:,} usage events, "
          f"{rep['tagsets']:,} distinct tag sets (Zipf s={rep['zipf_s']}, top 1% of tag sets = "
          f"{rep['top1pct_share']:.0%} of events), {rep['partitions']} partitions, "
          f"{rep['cpus']} CPUs, Kafka codec {c0['produce']['codec']}")
    if cases.get("single", {}).get("events", rep["events"]) != rep["events"]:
        print(f"single-event case: the first {cases['single']['events']:,} events of the same "
              "data set (a prefix of every partition); --single-events 0 takes all")
    print("each consumer runs alone in a fresh process, timed from its first fetched message "
          "to its last handled one")
    if "folding" in rep:
        processes = rep.get("folding_processes", 1)
        where = ("its own process" if rep["folding"] == "inline" else "a child process"
                 if processes == 1 else f"{processes} child processes")
        print(f"the worker (c) folds in {where} (--folding {rep['folding']}"
              + (f" --folding-processes {processes})" if processes > 1 else ")"))
    git = rep.get("git", {})
    if git:
        print(f"code: commit {git.get('commit')}"
              + (f", modified: {', '.join(git['dirty'])}" if git.get("dirty") else ", clean"))
    print()
    row("", [head[n] for n in names])
    row("events", [f"{cases[n]['events']:,}" for n in names])
    row("messages", [f"{cases[n]['messages']:,}" for n in names])
    rule()
    for key, label in (("a", "(a) ceiling: aiokafka + parse   ev/s"),
                       ("b", "(b) Faust no-op agent           ev/s"),
                       ("b_plain", "(b') plain Faust agent          ev/s"),
                       ("c", "(c) costline end to end         ev/s")):
        e = [cases[n][key] for n in names]
        row(label, [f"{x['events_per_s']:,.0f}" for x in e])
        row("      messages/s", [f"{x['messages_per_s']:,.0f}" for x in e])
        row("      elapsed s", [f"{x['elapsed_s']:.2f}" for x in e])
        row("      CPU us/event (that process)", [f"{x['cpu_us_per_event']:.1f}" for x in e])
        row("      that process's CPU % of wall",
            [f"{100 * x['cpu_s'] / x['elapsed_s']:.0f}%" for x in e])
        row("      machine busy % / steal % (2 CPUs)",
            [f"{x['machine']['busy_pct']:.0f}% / {x['machine']['steal_pct']:.0f}%"
             if "machine" in x else "-" for x in e])
        row("      Redis server CPU s", [f"{x['machine']['redis_cpu_s']:.1f}"
                                         if "machine" in x else "-" for x in e])
    rule()
    row("c/a", [f"{cases[n]['c_over_a']:.3f}" for n in names])
    row("c/b", [f"{cases[n]['c_over_b']:.3f}" for n in names])
    row("c/b'", [f"{cases[n]['c_over_b_plain']:.3f}" for n in names])
    row("worker peak RSS (VmHWM)",
        [f"{cases[n]['c'].get('parent_VmHWM', cases[n]['c'].get('VmHWM', 0)) / 1024:.0f} MiB"
         for n in names])
    for role, what in (("evaluator", "evaluation process"), ("folder", "folding process")):
        row(f"{what}: CPU s / peak RSS",
            [f"{cases[n]['c'][f'{role}_cpu_s']:.1f} / "
             f"{cases[n]['c'][f'{role}_VmHWM'] / 1024:.0f} MiB"
             + (f" ({count:.0f})" if (count := cases[n]["c"].get(f"{role}_processes", 1)) > 1
                else "")
             if f"{role}_cpu_s" in cases[n]["c"] else "-" for n in names])
    row("worker time inside handle()",
        [f"{100 * cases[n]['c']['in_handle_s'] / cases[n]['c']['elapsed_s']:.0f}%"
         for n in names])
    def metric(n: str, name: str) -> float:
        return float(cases[n]["c"].get("metrics", {}).get(f"costline_{name}", 0.0))

    row("worker time in Redis apply (metric)",
        [f"{100 * metric(n, 'redis_apply_seconds_sum') / cases[n]['c']['elapsed_s']:.0f}%"
         for n in names])
    row("Redis batch writes (batches_total)", [f"{metric(n, 'batches_total'):,.0f}"
                                                for n in names])
    row("rule evaluations / their seconds",
        [f"{metric(n, 'evaluations_total'):.0f} / {metric(n, 'evaluation_seconds_sum'):.1f}"
         for n in names])
    row("Redis EVALSHA s (all clients!)",
        [f"{cases[n]['c']['redis']['evalsha_usec'] / 1e6:.1f}" for n in names])
    row("distinct tag sets in Redis", [f"{cases[n]['redis_memory']['tagsets']:,}" for n in names])

    def per_tagset(n: str, without_dedup: bool = False) -> str:
        m = cases[n]["redis_memory"]
        used = m["bytes"] - (m["by_kind"].get("dedup", 0) if without_dedup else 0)
        return f"{used / max(1, m['tagsets']):,.0f}"

    row("Redis bytes / tag set (all ns keys)", [per_tagset(n) for n in names])
    row("  without dedup memory", [per_tagset(n, True) for n in names])
    row("  dedup memory bytes / event",
        [f"{cases[n]['redis_memory']['by_kind'].get('dedup', 0) / cases[n]['events']:.1f}"
         for n in names])
    row("namespace MiB (MEMORY USAGE)",
        [f"{cases[n]['redis_memory']['bytes'] / 2**20:.1f}" for n in names])
    row("  INFO used_memory delta MiB (noisy)",
        [f"{cases[n]['redis_memory']['used_memory_delta'] / 2**20:.1f}" for n in names])
    row("dead letters", [str(cases[n]["dead_letters"]) for n in names])
    row("total check (Redis == generator)",
        ["OK" if cases[n]["total"]["ok"] else "MISMATCH" for n in names])
    for n in names:
        t = cases[n]["total"]
        print(f"  {n}: expected {t['expected']:,} micro-units, Redis {t['redis']:,}")
    mem = cases[names[-1]]["redis_memory"]
    print(f"Redis by key kind ({names[-1]}): "
          + ", ".join(f"{k} {v / 2**20:.1f} MiB in {mem['keys_by_kind'][k]} keys"
                      for k, v in sorted(mem["by_kind"].items())))
    var = rep.get("without_rules")
    if var:
        m = var.get("metrics", {})
        print(f"batched worker with no rule files: {var['events_per_s']:,.0f} ev/s "
              f"({var['elapsed_s']:.1f}s, {var['cpu_us_per_event']:.1f} CPU us/event, peak RSS "
              f"{var.get('parent_VmHWM', var.get('VmHWM', 0)) / 1024:.0f} MiB, Redis apply "
              f"{100 * m.get('costline_redis_apply_seconds_sum', 0) / var['elapsed_s']:.0f}% "
              f"of the time), total {'OK' if var['total']['ok'] else 'MISMATCH'}")
    print_rounds(cases, names)
    prof = rep.get("profile")
    if prof:
        print()
        print(f"profile of the {prof['case']} worker ({rep['profile_tool']}, separate pass): "
              f"{prof['events_per_s']:,.0f} ev/s under the profiler, total "
              f"{'OK' if prof['total_ok'] else 'MISMATCH'}")
        spots = prof.get("hotspots")
        if spots and spots.get("busy"):
            print(f"{spots['samples']:,} samples, {spots['idle_pct']}% idle (event loop in "
                  f"select); busy samples by thread: {spots['threads']}")
            print("busy samples by phase:")
            for name, pct in spots.get("phases", []):
                print(f"  {pct:5.1f}%  {name}")
            print("self time (% of busy samples):")
            for name, pct in spots["self"][:20]:
                print(f"  {pct:5.1f}%  {name}")
            print("inclusive time (% of busy samples):")
            for name, pct in spots["inclusive"][:45]:
                print(f"  {pct:5.1f}%  {name}")
        elif prof.get("text"):
            print(f"pyinstrument report: {prof['text']} (and .html)")
    if rep.get("scaling"):
        print_scaling(rep["scaling"])
    print(f"\nfiles (logs, profiles): {rep['files']}")


def print_rounds(cases: dict[str, Any], names: list[str]) -> None:
    with_rounds = [n for n in names if cases[n].get("rounds")]
    if not with_rounds:
        return
    count = len(cases[with_rounds[0]]["rounds"])
    print(f"\nrounds: (b), (b') and (c) {count} times on each topic, one after the other, "
          "fresh groups and Redis state each time; median (lowest–highest)")
    for name in with_rounds:
        rounds = cases[name]["rounds"]
        rates = {k: [r["events_per_s"][k] for r in rounds] for k in ("b", "b_plain", "c")}
        ok = all(r["total_ok"] for r in rounds)
        print(f"  {name}: c/b {spread([r['c_over_b'] for r in rounds], '.3f')}, "
              f"c/b' {spread([r['c_over_b_plain'] for r in rounds], '.3f')}; ev/s: "
              f"b {spread(rates['b'], ',.0f')}, b' {spread(rates['b_plain'], ',.0f')}, "
              f"c {spread(rates['c'], ',.0f')}; totals {'OK' if ok else 'MISMATCH'}")


def print_scaling(sc: dict[str, Any]) -> None:
    runs = sc["runs"]
    print()
    print(f"scaling out: N workers in one consumer group (fresh Redis state and group per N), "
          f"{sc['events']:,} events in {sc['messages']:,} batch messages on "
          f"{sc['partitions']} partitions (events per partition: "
          f"{', '.join(f'{n:,}' for n in sc['events_by_partition'])})")
    print("the workers join together and fetch once the group has split the partitions; timed "
          "from the first fetch to the last partition's watermark at its end offset")
    cols = ("workers", "ev/s", "speed-up", "split allows", "CPU allows ev/s", "elapsed s",
            "CPU us/ev", "machine busy", "workers CPU s", "Redis CPU s", "Kafka CPU s",
            "other CPU s", "total")
    widths = [max(9, len(c) + 2) for c in cols]
    print("".join(f"{c:>{w}}" for c, w in zip(cols, widths, strict=True)))
    for r in runs:
        m = r["machine"]
        kafka = m.get("kafka_cpu_s")
        cells = (str(r["workers_n"]), f"{r['events_per_s']:,.0f}",
                 f"{r['speedup']:.2f}x" if r["speedup"] else "-",
                 f"{r['split_bound_speedup']:.2f}x",
                 f"{r['cpu_bound_events_per_s']:,.0f}" if r["cpu_bound_events_per_s"] else "-",
                 f"{r['elapsed_s']:.1f}",
                 f"{r['cpu_us_per_event']:.1f}", f"{m['busy_pct']:.0f}%",
                 f"{r['worker_cpu_s']:.1f}", f"{m['redis_cpu_s']:.1f}",
                 "-" if kafka is None else f"{kafka:.1f}", f"{r['other_cpu_s']:.1f}",
                 "OK" if r["total"]["ok"] else "MISMATCH")
        print("".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=True)))
    for r in runs:
        print(f"  {r['workers_n']} worker(s): split {'OK' if r['split_ok'] else 'NOT EXCLUSIVE'}"
              f", group formed in {r['joined_s']:.1f}s, {r['rebalances_while_timed']} "
              f"rebalance(s) while timed, machine load average {r['machine']['loadavg_1m']:.2f}")
        for i, w in enumerate(r["workers"]):
            print(f"    w{i}: partitions {w['partitions'] or 'none (idle)'}, "
                  f"{w['events_total']:,.0f} events, "
                  f"CPU {w['cpu_s']:.1f}s, peak RSS {w.get('VmHWM', 0) / 1024:.0f} MiB, "
                  f"{w['evaluations_total']:.0f} rule evaluations"
                  + (f" (their process: CPU {w['evaluator_cpu_s']:.1f}s, peak RSS "
                     f"{w['evaluator_VmHWM'] / 1024:.0f} MiB)" if "evaluator_cpu_s" in w
                     else ""))
    if len({r["code"] for r in runs}) > 1:
        print("WARNING: the worker's code changed between the steps (code "
              f"{', '.join(r['code'] for r in runs)}): they do not compare one program")
    print(sc["note"])


def scaling_note(runs: list[dict[str, Any]], cpus: int) -> str:
    """What limits the speed-up, in this run's own figures."""
    one = next((r for r in runs if r["workers_n"] == 1), runs[0])
    m = one["machine"]
    kafka = m.get("kafka_cpu_s")
    text = (f"NOTE: this machine has {cpus} CPUs, shared by the workers, Kafka, Redis and any "
            f"other work on it. With {one['workers_n']} worker(s), in {one['elapsed_s']:.1f}s "
            f"({m['busy_pct']:.0f}% busy, load average {m['loadavg_1m']:.1f}): workers "
            f"{one['worker_cpu_s']:.1f} CPU-s, Redis {m['redis_cpu_s']:.1f} (the server's, "
            f"all its clients), Kafka "
            f"{'not on this machine' if kafka is None else f'{kafka:.1f}'}, other processes "
            f"{one['other_cpu_s']:.1f}.")
    ceiling = one["cpu_bound_events_per_s"]
    if ceiling:
        text += (f" The pipeline spends {one['pipeline_cpu_us_per_event']:.0f} CPU-us per "
                 f"event (workers + Redis + Kafka), so {cpus} CPUs take at most about "
                 f"{ceiling:,.0f} ev/s, {ceiling / one['events_per_s']:.2f}x one worker's rate,"
                 f" however many workers run: on this machine the CPUs bound the speed-up, not "
                 f"the partitions. While other processes hold CPU, more worker processes also "
                 f"win a larger share of it, which flatters the speed-up.")
    return text


def worker_counts(text: str) -> list[int]:
    counts = [int(x) for x in text.split(",") if x.strip()]
    if any(n < 0 for n in counts):
        raise argparse.ArgumentTypeError("worker counts are positive")
    return [n for n in counts if n]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from costline.streams.settings import Settings

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--tagsets", type=int, default=100_000)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=100, help="events per batch message")
    p.add_argument("--single-events", type=int, default=100_000,
                   help="events in the single-event case: the first N of the data set "
                        "(0 = all; Faust's per-message cost makes all of 1M take ~15 min)")
    p.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of tag set popularity")
    p.add_argument("--seed", type=int, default=20261130)
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--save", metavar="PATH", help="also write the JSON figures to PATH")
    p.add_argument("--profile", choices=("py-spy", "pyinstrument"),
                   help="add a profiled pass of the worker (not in the table)")
    p.add_argument("--profile-case", choices=("batched", "single"), default="batched",
                   help="which copy of the data the profiled pass reads (default batched)")
    p.add_argument("--rounds", type=int, default=1,
                   help="run (b), (b') and (c) this many times on each case's topic and print "
                        "the median and range of c/b and c/b' (each round adds about a "
                        "minute per case)")
    p.add_argument("--without-rules", action="store_true",
                   help="also run the batched worker with no rule files (how much of (c) the "
                        "leader's rule evaluation costs); adds about 2 minutes")
    p.add_argument("--scale", type=worker_counts, default=[1, 2, 3], metavar="N,N,...",
                   help="worker counts of the scaling pass: N workers in one consumer group on "
                        "the batched copy (default 1,2,3; 0 skips the pass)")
    p.add_argument("--scale-partitions", type=int, default=6,
                   help="partitions of the scaling pass's topic (default 6: an even split "
                        "for 1, 2 and 3 workers)")
    p.add_argument("--folding", choices=("inline", "process"),
                   default=Settings.model_fields["folding"].default,
                   help="where the worker folds (COSTLINE_FOLDING; default: the worker's)")
    p.add_argument("--folding-processes", type=int,
                   default=Settings.model_fields["folding_processes"].default,
                   help="the worker's folding processes (COSTLINE_FOLDING_PROCESSES)")
    p.add_argument("--timeout", type=float, default=900, help="seconds per consumer")
    p.add_argument("--keep", action="store_true", help="keep topics and Redis keys")
    p.add_argument("--bootstrap", default=DEFAULT_BOOTSTRAP)
    p.add_argument("--redis-url", default=DEFAULT_REDIS)
    # internal: the consumer subprocesses
    p.add_argument("--role", choices=ROLES, help=argparse.SUPPRESS)
    p.add_argument("--ns", help=argparse.SUPPRESS)
    p.add_argument("--topic", help=argparse.SUPPRESS)
    p.add_argument("--ends", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--child-profile", help=argparse.SUPPRESS)
    p.add_argument("--profile-out", help=argparse.SUPPRESS)
    p.add_argument("--rules", help=argparse.SUPPRESS)
    p.add_argument("--go", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main() -> None:
    a = parse_args()
    if a.role:
        sys.argv = sys.argv[:1]  # faust.Worker must not see our flags
        child_main(a)
        return
    bench = Bench(a)
    try:
        report = bench.run()
        report["profile_tool"] = a.profile
    finally:
        bench.cleanup()
    if a.save:
        Path(a.save).write_text(json.dumps(report, indent=2, default=str))
    if a.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print_table(report)


if __name__ == "__main__":
    main()
