"""How long an alert takes to come out of costline, and what one evaluation of the rules costs.

    .venv/bin/python bench/latency.py [--json] [--rate N] [--seconds S] [--probe-every S]
                                      [--groups N] [--rules N] [--repeats N] [--fresh N]
                                      [--profile] [--memory] [--skip-e2e] [--skip-eval]

(1) End to end. The real worker (``costline worker``, a child process with a namespace of its
own) runs one rule: a daily budget of one micro-unit per value of the tag ``probe``
(``group_by: [probe]``), so every probe event opens an alert of its own. First a burst of
``--burst`` single-event usage messages measures the worker's maximum (messages produced →
everything counted, ``costline.streams.progress.behind``). Then background usage events flow
at ``--rate`` messages/s (default: half that maximum) for ``--seconds``, with a probe every
``--probe-every`` seconds among them. A kafka-python consumer reads ``NS.alerts.v1``; a
probe's latency is the time from its send to the first change published for its group, split
at the change's Kafka timestamp (the worker's publish time).

(2) Evaluation cost on the worker's path. A real worker counts ``--groups`` distinct tag
sets (two usage events each over the last five days, GPU utilization samples, faults) into
Redis, and ``--rules`` rules of every kind are generated with lines around the 99th
percentile of each grouping's spend. They are evaluated in full, every rule, the way the
worker does (``RedisState``, ``KeptAnswers``): the first evaluation (nothing kept), the tick
(every rule, past hours kept), the tick after ``--fresh`` events of new tag sets (new jobs),
and the evaluations data triggers (after ``--fresh`` new events each, idle findings reused),
``--repeats`` times each; one quiet budget rule is timed beside them. ``--profile`` profiles
the data-driven ones with pyinstrument. With ``--memory`` the generated rules are also timed
one by one on an ``InMemoryState`` for up to ``--eval-budget`` seconds (``--full``: in full).

Nothing is asserted. Every namespace is deleted at the end. Progress goes to stderr; the
figures (or ``--json``) to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import signal
import statistics
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.common import (  # noqa: E402 - needs REPO on the path
    child_figures,
    forget_namespace,
    log,
    redis_client,
    service_options,
    vm_status,
    wait_counted,
    worker_cpu_seconds,
    worker_metrics,
)
from bench.datasets import DAY_S, RESOURCES  # noqa: E402
from tests.integration.streamkit import Worker, worker_env  # noqa: E402

PROBE_RULES = """\
rules:
  - name: probe-budget
    kind: budget
    match: {probe: "?*"}
    group_by: [probe]
    period: day
    limit: 0.000001
"""
QUIET_RULE = """\
rules:
  - name: quiet-team-monthly
    kind: budget
    match: {env: prod}
    group_by: [team]
    period: month
    limit: 100000000
"""


def reset_peak_rss() -> bool:
    """Start a new VmHWM period for this process (Linux ``clear_refs`` 5)."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def mib(kib: int | None) -> float | None:
    return None if kib is None else round(kib / 1024, 1)


def percentiles(values: Sequence[float]) -> dict[str, Any]:
    """n, p50, p90, p99 and max of a sample (nearest rank), in its own unit."""
    if not values:
        return {"n": 0}
    ordered = sorted(values)

    def rank(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]

    return {"n": len(ordered), "p50": rank(0.50), "p90": rank(0.90), "p99": rank(0.99),
            "max": ordered[-1], "mean": statistics.fmean(ordered)}


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "loadavg_1m": round(os.getloadavg()[0], 2)}


# ======================================================================================
# Namespaces and the worker
# ======================================================================================


@dataclass
class Namespace:
    """Topics, consumer groups and Redis keys of one run, deleted by ``cleanup``."""

    name: str
    bootstrap: str
    redis_url: str
    partitions: int

    def topic(self, short: str) -> str:
        return f"{self.name}.{short}.v1"

    @property
    def settings(self) -> Any:
        from costline.streams.settings import Settings

        return Settings(kafka_bootstrap=self.bootstrap, redis_url=self.redis_url,
                        namespace=self.name, partitions=self.partitions)

    def create_topics(self) -> None:
        from costline.streams.topics import create_topics

        create_topics(self.settings)

    def wait_counted(self, redis: Any, worker: Worker, timeout: float = 600) -> float:
        """Until everything produced is counted; returns when (``time.time()``)."""
        return wait_counted(self.settings, redis, [worker], timeout)

    def start_worker(self, rules: Path, workdir: Path) -> Worker:
        env = worker_env(self.name, self.bootstrap, self.redis_url, COSTLINE_RULES=str(rules),
                         COSTLINE_PARTITIONS=str(self.partitions),
                         COSTLINE_STATE_DIR=str(workdir / "state"))
        env.pop("SLACK_BOT_TOKEN", None)
        worker = Worker(env, workdir / f"worker-{self.name}.log")
        worker.start()
        wait_ready(worker)
        return worker

    def cleanup(self) -> None:
        forget_namespace(self.bootstrap, self.redis_url, self.name)
        log(f"cleaned up namespace {self.name}")


def tail(worker: Worker) -> str:
    try:
        return "\n".join(worker.log.read_text(errors="replace").splitlines()[-25:])
    except OSError:
        return ""


def rules_loaded(worker: Worker) -> int | None:
    """How many rules the worker's /healthz says it loaded (None while it does not answer)."""
    url = f"http://127.0.0.1:{worker.env['COSTLINE_WEB_PORT']}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            text = answer.read().decode()
    except urllib.error.HTTPError as exc:  # 503 still carries the report
        text = exc.read().decode()
    except OSError:
        return None
    try:
        loaded = json.loads(text).get("rules", {}).get("loaded")
    except ValueError:
        return None
    return loaded if isinstance(loaded, int) else None


def wait_ready(worker: Worker, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while rules_loaded(worker) is None:
        if not worker.alive():
            raise RuntimeError(f"the worker exited:\n{tail(worker)}")
        if time.time() > deadline:
            raise RuntimeError(f"the worker did not load its rules in {timeout}s")
        time.sleep(0.5)


# ======================================================================================
# (1) End-to-end latency
# ======================================================================================


class AlertWatcher(threading.Thread):
    """Reads ``NS.alerts.v1`` from its start; keeps the first change per probe group."""

    def __init__(self, ns: Namespace) -> None:
        super().__init__(daemon=True)
        from kafka import KafkaConsumer, TopicPartition

        self.consumer = KafkaConsumer(bootstrap_servers=ns.bootstrap, enable_auto_commit=False)
        topic = ns.topic("alerts")
        parts = sorted(self.consumer.partitions_for_topic(topic) or ())
        self.consumer.assign([TopicPartition(topic, p) for p in parts])
        self.consumer.seek_to_beginning()
        self.first: dict[str, tuple[float, float, str]] = {}
        self.changes = 0
        self.halt = threading.Event()
        self.lock = threading.Lock()

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                for records in self.consumer.poll(timeout_ms=100).values():
                    received = time.time()
                    for record in records:
                        change = json.loads(record.value)
                        probe = (change.get("group") or {}).get("probe")
                        with self.lock:
                            self.changes += 1
                            if probe and probe not in self.first:
                                self.first[probe] = (received, record.timestamp / 1000,
                                                     change["state"])
        finally:
            self.consumer.close()

    def seen(self, probe: str) -> bool:
        with self.lock:
            return probe in self.first


@dataclass
class Sender:
    """Background usage events and probes, one event per message."""

    ns: Namespace
    rng: random.Random = field(default_factory=lambda: random.Random(11))
    tagsets: int = 2000
    sent: int = 0
    probes: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from costline.connectors.kafka import producer

        self.producer = producer(self.ns.bootstrap, client_id="costline-bench-latency",
                                 linger_ms=5)
        self.topic = self.ns.topic("usage")

    def background(self) -> None:
        i = self.sent
        tagset = self.rng.randrange(self.tagsets)
        resource_type = ("gpu.h100", "gpu.h100", "storage.ssd", "logs.ingest")[tagset % 4]
        event = {
            "event_id": f"{self.ns.name}-b{i}", "kind": "usage", "ts": round(time.time(), 3),
            "resource_id": f"node-{tagset % 256}", "resource_type": resource_type,
            "quantity": round(self.rng.uniform(0.01, 2.0), 4),
            "unit": RESOURCES[resource_type],
            "tags": {"team": f"team-{tagset % 20:02d}", "project": f"proj-{tagset % 150:03d}",
                     "env": ("prod", "dev")[tagset % 2], "job": f"job-{tagset:05d}"},
        }
        self.producer.send(self.topic, value=json.dumps(event).encode(),
                           key=event["tags"]["job"].encode())
        self.sent += 1

    def probe(self, name: str) -> None:
        event = {
            "event_id": f"{self.ns.name}-{name}", "kind": "usage", "ts": round(time.time(), 3),
            "resource_id": "probe-node", "resource_type": "gpu.h100", "quantity": 0.001,
            "unit": "gpu_hour", "tags": {"probe": name},
        }
        value = json.dumps(event).encode()
        self.probes[name] = time.time()
        self.producer.send(self.topic, value=value, key=name.encode())

    def close(self) -> None:
        self.producer.flush()
        self.producer.close()


def measure_maximum(ns: Namespace, worker: Worker, sender: Sender, burst: int) -> dict[str, Any]:
    """Produce ``burst`` messages as fast as possible; the worker's rate is the burst over
    the time until all of it was counted."""
    redis = redis_client(ns.redis_url)
    try:
        started = time.time()
        for _ in range(burst):
            sender.background()
        sender.producer.flush()
        produced = time.time()
        done = ns.wait_counted(redis, worker)
    finally:
        redis.close()
    took = done - started
    return {"messages": burst, "seconds": round(took, 2),
            "worker_msgs_per_s": round(burst / took),
            "producer_msgs_per_s": round(burst / (produced - started)),
            "producer_bound": (produced - started) > 0.9 * took}


def run_e2e(a: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    ns = Namespace("lat" + secrets.token_hex(4), a.bootstrap, a.redis_url, a.partitions)
    rules = workdir / "probe-rules.yaml"
    rules.write_text(PROBE_RULES)
    ns.create_topics()
    watcher = AlertWatcher(ns)
    watcher.start()
    sender = Sender(ns, tagsets=a.tagsets)
    result: dict[str, Any] = {"namespace": ns.name, "partitions": a.partitions,
                              "rule": "budget, group_by [probe], limit 0.000001 (one per probe)"}
    worker: Worker | None = None
    try:
        worker = ns.start_worker(rules, workdir)
        log("worker up; waiting for a first probe alert (leader elected, evaluating)")
        started = time.time()
        sender.probe("warmup")
        sender.producer.flush()
        while not watcher.seen("warmup"):
            if time.time() - started > 180 or not worker.alive():
                raise RuntimeError(f"no alert for the warm-up probe:\n{tail(worker)}")
            time.sleep(0.1)
        result["first_alert_s"] = round(time.time() - started, 2)
        sender.probes.clear()

        if a.rate:
            rate = a.rate
            result["maximum"] = None
        else:
            log(f"measuring the worker's maximum with a burst of {a.burst:,} messages")
            result["maximum"] = measure_maximum(ns, worker, sender, a.burst)
            rate = max(1, result["maximum"]["worker_msgs_per_s"] // 2)
        log(f"background at {rate:,} messages/s for {a.seconds}s, a probe every {a.probe_every}s")
        metrics_before = worker_metrics(worker)
        assert worker.proc is not None
        cpu_before = worker_cpu_seconds(worker.proc.pid)
        run = pace(sender, rate, a.seconds, a.probe_every)
        flushed = time.time()
        deadline = flushed + 30
        while time.time() < deadline and not all(watcher.seen(p) for p in sender.probes):
            time.sleep(0.1)
        metrics_after = worker_metrics(worker)
        redis = redis_client(ns.redis_url)
        try:
            caught_up = ns.wait_counted(redis, worker, timeout=120)
        finally:
            redis.close()
        result.update(run)
        result["background_msgs_per_s"] = rate
        result["caught_up_after_last_send_s"] = round(max(0.0, caught_up - flushed), 2)
        result.update(_latencies(sender.probes, watcher))
        result["worker"] = _worker_figures(worker, metrics_before, metrics_after, cpu_before,
                                           a.seconds)
    finally:
        watcher.halt.set()
        sender.close()
        if worker is not None:
            worker.stop()
        watcher.join(5)
        ns.cleanup()
    return result


def pace(sender: Sender, rate: int, seconds: float, probe_every: float) -> dict[str, Any]:
    """Background messages at ``rate``/s with probes interleaved, for ``seconds``."""
    started = time.perf_counter()
    first = sender.sent
    next_probe = probe_every / 2
    n_probe = 0
    behind = 0.0
    while True:
        elapsed = time.perf_counter() - started
        if elapsed >= seconds:
            break
        due = first + int(elapsed * rate)
        if due - sender.sent > rate * 0.5:
            behind = max(behind, (due - sender.sent) / rate)
        while sender.sent < due:
            sender.background()
        if elapsed >= next_probe:
            sender.probe(f"p{n_probe:05d}")
            n_probe += 1
            next_probe += probe_every
        time.sleep(0.0005)
    sender.producer.flush()
    took = time.perf_counter() - started
    return {"seconds": round(took, 1), "background_sent": sender.sent - first,
            "probes_sent": n_probe, "producer_fell_behind_s": round(behind, 2)}


def _latencies(probes: Mapping[str, float], watcher: AlertWatcher) -> dict[str, Any]:
    """Latency figures; each probe leaves an alert firing for the rest of the day, so the
    first and last thirds of the run are also shown apart."""
    to_consumer, to_publish, states = [], [], Counter()
    for name, sent in sorted(probes.items()):
        found = watcher.first.get(name)
        if found is None:
            continue
        received, published, state = found
        to_consumer.append(received - sent)
        to_publish.append(published - sent)
        states[state] += 1
    third = len(to_consumer) // 3
    return {"probes_answered": len(to_consumer), "first_states": dict(states),
            "latency_s": _rounded(percentiles(to_consumer)),
            "to_publish_s": _rounded(percentiles(to_publish)),
            "latency_first_third_s": _rounded(percentiles(to_consumer[:third])),
            "latency_last_third_s": _rounded(percentiles(to_consumer[-third:] if third else []))}


def _rounded(figures: dict[str, Any]) -> dict[str, Any]:
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in figures.items()}


def _worker_figures(worker: Worker, before: Mapping[str, float], after: Mapping[str, float],
                    cpu_before: float, seconds: float) -> dict[str, Any]:
    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    evaluations = delta("costline_evaluation_seconds_count")
    spent = delta("costline_evaluation_seconds_sum")
    assert worker.proc is not None
    status = vm_status(worker.proc.pid)
    evaluator = child_figures(worker.proc.pid)
    return {
        "evaluations": int(evaluations),
        "evaluation_mean_s": round(spent / evaluations, 3) if evaluations else None,
        "evaluation_share_of_run": round(spent / seconds, 3),
        "cpu_share": round((worker_cpu_seconds(worker.proc.pid) - cpu_before) / seconds, 2),
        "peak_rss_mib": mib(status.get("VmHWM")),
        "evaluator_peak_rss_mib": mib(evaluator.get("evaluator_VmHWM")),
    }


# ======================================================================================
# (2) Evaluation cost
# ======================================================================================


def tags_of(i: int) -> dict[str, str]:
    """Tag set ``i`` of the evaluation data set: a job of a project of a team."""
    return {
        "team": f"team-{i % 40:02d}",
        "project": f"proj-{i % 400:03d}",
        "env": ("prod", "staging", "dev")[i % 3],
        "stage": ("pretrain", "posttrain", "eval", "dev")[i % 4],
        "owner": f"user{i % 1500:04d}",
        "job": f"job-{i:06d}",
    }


# Six in ten tag sets meter GPUs; the rest storage, egress and (twice as often) logs.
_RESOURCE_CYCLE = (
    ("gpu.h100",) * 6 + ("storage.ssd", "network.egress") + ("logs.ingest",) * 2
)


def dataset(groups: int, now: float, seed: int, gpus_sampled: int, faults: int
            ) -> Iterator[dict[str, Any]]:
    """The evaluation data set as contract events: per tag set two usage events at random
    times of the last five days; utilization samples every five minutes over the last two
    hours for ``gpus_sampled`` GPUs (a fifth of them idle); ``faults`` faults over the last
    two days."""
    rng = random.Random(seed)
    for i in range(groups):
        resource_type = _RESOURCE_CYCLE[i % len(_RESOURCE_CYCLE)]
        for n in range(2):
            ts = now - rng.uniform(0, 5 * DAY_S)
            yield {"event_id": f"u{i}-{n}", "kind": "usage", "ts": round(ts, 3),
                   "resource_id": f"{tags_of(i)['job']}/r", "resource_type": resource_type,
                   "quantity": round(rng.lognormvariate(0.5, 1.0), 4),
                   "unit": RESOURCES[resource_type], "tags": tags_of(i)}
    for g in range(gpus_sampled):
        idle = g % 5 == 0
        tags = tags_of(g * 7 % groups)
        for k in range(25):
            value = rng.uniform(0.0, 0.03) if idle else rng.uniform(0.4, 1.0)
            yield {"event_id": f"m{g}-{k}", "kind": "utilization",
                   "ts": round(now - 2 * 3600 + k * 300, 3), "resource_id": f"gpu-{g:05d}",
                   "resource_type": "gpu.h100", "metric": "gpu_util", "value": round(value, 4),
                   "tags": tags}
    for f in range(faults):
        ts = round(now - rng.uniform(0, 2 * DAY_S), 3)
        yield {"event_id": f"f{f}", "kind": "fault", "ts": ts,
               "fault": rng.choice(["node_failure", "comm_timeout", "oom", "preemption"]),
               "resource_type": "gpu.h100", "units": rng.choice([8, 64, 512]),
               "lost_seconds": rng.randrange(60, 3600), "recovery_seconds": rng.randrange(60, 1800),
               "tags": tags_of(rng.randrange(groups))}


def build_memory_state(a: argparse.Namespace, now: float) -> tuple[Any, dict[str, Any]]:
    from costline.rules.events import parse_message
    from costline.rules.memory_state import InMemoryState
    from costline.rules.prices import PriceBook
    from costline.streams.settings import DEFAULT_PRICES

    found = InMemoryState(PriceBook.load(DEFAULT_PRICES))
    started = time.perf_counter()
    events = Counter()
    chunk: list[dict[str, Any]] = []

    def flush() -> None:
        verdict = parse_message(json.dumps(chunk).encode())
        batch = getattr(verdict, "events", None)
        if batch is None:
            raise RuntimeError(f"the generated events were refused: {verdict}")
        for event in batch:
            found.add(event)
            events[event.kind] += 1
        chunk.clear()

    for event in dataset(a.groups, now, a.seed, a.gpus_sampled, a.faults):
        chunk.append(event)
        if len(chunk) == 5000:
            flush()
    if chunk:
        flush()
    return found, {"events": dict(events), "build_s": round(time.perf_counter() - started, 1)}


RULE_SHAPES = {  # kind -> share of the generated rules
    "budget": 0.40, "growth": 0.15, "log_explosion": 0.15, "fault_waste": 0.15, "idle": 0.15,
}
# group_by -> share of the rules; a per-job rule always matches one team (2,500 jobs of 100k)
GROUPINGS = [(("team",), 0.35), (("project",), 0.30), (("team", "env"), 0.15), ((), 0.12),
             (("job",), 0.08)]
MATCHES = [({}, 0.35), ({"env": "prod"}, 0.2), ({"team": "team-0*"}, 0.15),
           ({"resource_type": "gpu.*"}, 0.15), ({"stage": "pretrain"}, 0.15)]
ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata"]


def _pick(rng: random.Random, options: Sequence[tuple[Any, float]]) -> Any:
    return rng.choices([o for o, _ in options], [w for _, w in options])[0]


def calibrate(state: Any, now: float) -> dict[tuple[str, ...], float]:
    """Per grouping, the 99th percentile of a group's spend per day in the data set (USD):
    the scale the generated lines are set against."""
    scale = {}
    for grouping, _ in GROUPINGS:
        match = {"team": "team-07"} if grouping == ("job",) else {}
        per_group = sorted(state.totals("cost", match, grouping, now - 6 * DAY_S, now + 300)
                           .values())
        p99 = per_group[min(len(per_group) - 1, int(len(per_group) * 0.99))]
        scale[grouping] = p99 / 1e6 / 5
    return scale


def generate_rules(n: int, seed: int, scale: Mapping[tuple[str, ...], float]) -> str:
    """``n`` rules of every kind as one YAML rule file, in shuffled order. Lines sit around
    the 99th percentile of each grouping's spend, so most rules find nothing and a few find
    a handful of groups, as in a real rule set."""
    rng = random.Random(seed)
    kinds = [k for k, share in RULE_SHAPES.items() for _ in range(round(n * share))][:n]
    kinds += ["budget"] * (n - len(kinds))
    rng.shuffle(kinds)
    lines = ["rules:"]
    for i, kind in enumerate(kinds):
        grouping = _pick(rng, GROUPINGS)
        if kind == "fault_waste" and grouping == ("job",):
            grouping = ("team",)
        match = {"team": f"team-{rng.randrange(40):02d}"} if grouping == ("job",) else _pick(
            rng, MATCHES)
        rule: dict[str, Any] = {"name": f"r{i:04d}-{kind.replace('_', '-')}", "kind": kind,
                                "match": match, "group_by": list(grouping)}
        per_day = scale[grouping]
        if kind == "budget":
            period = rng.choice(["day", "week", "month"])
            days = {"day": 1, "week": 5, "month": 5}[period]
            rule.update(period=period, timezone=rng.choice(ZONES),
                        limit=round(per_day * days * rng.uniform(1.0, 3.0), 2),
                        warn_at=[0.5, 0.8], forecast=rng.random() < 0.3)
        elif kind == "growth":
            rule.update(metric="cost", window=rng.choice(["1h", "6h"]),
                        baseline=rng.choice(["1d", "3d"]), ratio=round(rng.uniform(2, 5), 1),
                        min_baseline=round(per_day * 0.1, 2))
        elif kind == "log_explosion":
            rule.update(window=rng.choice(["15m", "1h"]), baseline="1d",
                        ratio=round(rng.uniform(3, 10), 1),
                        max_rate=round(per_day / 24 * rng.uniform(4, 20), 2))
        elif kind == "fault_waste":
            rule.update(period=rng.choice(["day", "week"]),
                        max_waste=round(per_day * rng.uniform(0.5, 3), 2))
            if rng.random() < 0.5:
                rule["max_share"] = round(rng.uniform(0.2, 0.5), 2)
        else:
            rule.update(metric="gpu_util", below=round(rng.uniform(0.05, 0.2), 2),
                        **{"for": rng.choice(["30m", "1h"])}, mode="dry_run")
        lines.append("  - " + json.dumps(rule))
    return "\n".join(lines) + "\n"


@dataclass
class StateClock:
    """A ``StateView`` proxy that times every read and names the function that asked."""

    inner: Any
    calls: Counter = field(default_factory=Counter)
    seconds: defaultdict = field(default_factory=lambda: defaultdict(float))

    def _timed(self, method: str, *args: Any) -> Any:
        key = f"{method} from {sys._getframe(2).f_code.co_name}"
        started = time.perf_counter()
        try:
            return getattr(self.inner, method)(*args)
        finally:
            self.calls[key] += 1
            self.seconds[key] += time.perf_counter() - started

    def totals(self, *args: Any) -> Any:
        return self._timed("totals", *args)

    def samples(self, *args: Any) -> Any:
        return self._timed("samples", *args)

    def earliest(self, *args: Any) -> Any:
        return self._timed("earliest", *args)

    def faults(self, *args: Any) -> Any:
        return self._timed("faults", *args)

    def report(self, total_s: float) -> dict[str, Any]:
        spent = sum(self.seconds.values())
        return {
            "calls": sum(self.calls.values()),
            "seconds": round(spent, 2),
            "share": round(spent / total_s, 3) if total_s else None,
            "by_caller": {key: {"calls": self.calls[key], "s": round(self.seconds[key], 2)}
                          for key, _ in sorted(self.seconds.items(), key=lambda kv: -kv[1])},
        }


def timed_evaluations(engine: Any, state: Any, now: float, repeats: int
                      ) -> tuple[list[float], Any, int | None]:
    """``repeats`` evaluations, each on the book the previous one left; the peak RSS (KiB)."""
    from costline.rules.alerts import AlertBook

    book = AlertBook()
    took: list[float] = []
    reset = reset_peak_rss()
    evaluation = None
    for _ in range(repeats):
        started = time.perf_counter()
        evaluation = engine.evaluate(state, now, book)
        took.append(time.perf_counter() - started)
        book = evaluation.book
    peak = vm_status().get("VmHWM") if reset else None
    return took, evaluation, peak


class RuleTimeout(Exception):
    """A rule ran past ``--rule-timeout`` and was stopped."""


def _stop_rule(signum: int, frame: Any) -> None:
    raise RuleTimeout


def per_rule(rules: Sequence[Any], state: Any, now: float, budget_s: float, rule_timeout: float,
             profile: bool = False) -> dict[str, Any]:
    """Evaluate the rules one by one (findings and their payloads) until ``budget_s`` is spent;
    a rule still running after ``rule_timeout`` is stopped and counted at that time, so the
    estimate is then a lower bound."""
    from costline.rules.engine import payload

    clock = StateClock(state)
    by_kind: dict[str, list[float]] = defaultdict(list)
    findings: Counter = Counter()
    slowest: list[tuple[float, str]] = []
    stopped: list[str] = []
    profiler = None
    if profile:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.005)
        profiler.start()
    previous = signal.signal(signal.SIGALRM, _stop_rule)
    reset = reset_peak_rss()
    started = time.perf_counter()
    for rule in rules:
        if time.perf_counter() - started > budget_s:
            break
        t0 = time.perf_counter()
        found: list[Any] = []
        signal.setitimer(signal.ITIMER_REAL, rule_timeout)
        try:
            found = rule.evaluate(clock, now)
            for finding in found:
                payload(rule, finding, "USD")
        except RuleTimeout:
            stopped.append(rule.name)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        took = time.perf_counter() - t0
        by_kind[rule.kind].append(took)
        findings[rule.kind] += len(found)
        what = "stopped" if rule.name in stopped[-1:] else f"findings={len(found)}"
        slowest.append((took, f"{rule.name} group_by={list(rule.group_by)} "
                              f"match={dict(rule.match)} {what}"))
    elapsed = time.perf_counter() - started
    signal.signal(signal.SIGALRM, previous)
    peak = vm_status().get("VmHWM") if reset else None
    profile_text = None
    if profiler is not None:
        profiler.stop()
        profile_text = profiler.output_text(unicode=False, color=False, show_all=False)
    every = [t for ts in by_kind.values() for t in ts]
    mean = statistics.fmean(every) if every else 0.0
    return {
        "measured_rules": len(every),
        "measured_s": round(elapsed, 1),
        "mean_per_rule_s": round(mean, 3),
        "median_per_rule_s": round(statistics.median(every), 3) if every else None,
        "estimated_full_s": round(mean * len(rules), 1),
        "stopped_rules": stopped,
        "estimate_is_lower_bound": bool(stopped),
        "by_kind": {k: {"rules": len(v), "mean_s": round(statistics.fmean(v), 3),
                        "max_s": round(max(v), 3), "findings": findings[k]}
                    for k, v in sorted(by_kind.items())},
        "slowest": [f"{t:.2f}s {what}" for t, what in sorted(slowest, reverse=True)[:6]],
        "state_reads": clock.report(elapsed),
        "peak_rss_mib": mib(peak),
        "profile": profile_text,
    }


def run_memory_eval(a: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """The generated rules one by one on an ``InMemoryState`` (``--memory``)."""
    from costline.rules.engine import Engine
    from costline.rules.loader import RuleSet, load_rule_text

    now = time.time()
    log(f"building an InMemoryState of {a.groups:,} tag sets")
    reset_peak_rss()
    state, built = build_memory_state(a, now)
    built["rss_mib"] = mib(vm_status().get("VmRSS"))
    log(f"built in {built['build_s']}s: {built['events']}, RSS {built['rss_mib']} MiB")

    scale = calibrate(state, now)
    log("lines set against the 99th percentile of spend per group and day: "
        + ", ".join(f"{list(g)} {v:,.2f}" for g, v in scale.items()))
    text = generate_rules(a.rules, a.seed, scale)
    (workdir / "generated-rules.yaml").write_text(text)
    started = time.perf_counter()
    ruleset = load_rule_text(text, file="generated-rules.yaml")
    load_s = time.perf_counter() - started
    shapes = Counter(rule.kind for rule in ruleset)
    log(f"{len(ruleset)} rules loaded in {load_s:.2f}s: {dict(shapes)}")

    baseline_rule = load_rule_text(QUIET_RULE).rules
    log(f"one quiet budget rule, {a.repeats} evaluations")
    took, evaluation, peak = timed_evaluations(Engine(RuleSet(baseline_rule), "USD"), state, now,
                                               a.repeats)
    baseline = {"rule": "budget quiet-team-monthly, env=prod by team, never reached",
                "p50_s": round(statistics.median(took), 3), "runs_s": [round(t, 3) for t in took],
                "changes": len(evaluation.changes), "peak_rss_mib": mib(peak)}
    log(f"one quiet rule p50 {baseline['p50_s']}s")

    result: dict[str, Any] = {"groups": a.groups, "state": built, "rules": len(ruleset),
                              "args_rule_timeout": a.rule_timeout,
                              "kinds": dict(shapes), "load_s": round(load_s, 2),
                              "baseline": baseline}
    if a.full:
        log(f"full evaluation of {len(ruleset)} rules, {a.repeats} times")
        took, evaluation, peak = timed_evaluations(Engine(ruleset, "USD"), state, now, a.repeats)
        result["full"] = {"p50_s": round(statistics.median(took), 2),
                          "runs_s": [round(t, 2) for t in took],
                          "changes_first": len(evaluation.changes), "peak_rss_mib": mib(peak)}
    log(f"the {len(ruleset)} rules one by one (for up to {a.eval_budget}s, "
        f"at most {a.rule_timeout}s per rule)")
    result["per_rule"] = per_rule(ruleset.rules, state, now, a.eval_budget, a.rule_timeout,
                                  a.profile)
    return result


def run_worker_eval(a: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """The data set aggregated into Redis by a real worker; the generated rules evaluated as
    the worker evaluates them (``RedisState``, ``KeptAnswers``, idle findings reused between
    ticks), every rule of every evaluation."""
    from costline.connectors.redis_state import RedisState
    from costline.rules.engine import Engine
    from costline.rules.kept_answers import KeptAnswers
    from costline.rules.loader import RuleSet, load_rule_text
    from costline.streams.worker import collector

    ns = Namespace("latev" + secrets.token_hex(3), a.bootstrap, a.redis_url, a.partitions)
    empty = workdir / "no-rules.yaml"
    empty.write_text("rules: []\n")
    ns.create_topics()
    out: dict[str, Any] = {"namespace": ns.name, "groups": a.groups}
    redis = redis_client(a.redis_url)
    worker: Worker | None = None
    try:
        worker = ns.start_worker(empty, workdir)
        now = time.time()
        out["aggregated"] = fill_redis(ns, worker, redis, a, now)
        state = RedisState(redis_client(a.redis_url), ns.name, "UTC")
        scale = calibrate(state, now)
        text = generate_rules(a.rules, a.seed, scale)
        (workdir / "generated-rules.yaml").write_text(text)
        ruleset = load_rule_text(text, file="generated-rules.yaml")
        out["rules"] = len(ruleset)
        out["kinds"] = dict(Counter(rule.kind for rule in ruleset))
        log(f"{len(ruleset)} rules: {out['kinds']}")

        baseline = Engine(RuleSet(load_rule_text(QUIET_RULE).rules), "USD")
        took, _, _ = timed_evaluations(baseline, state, time.time(), a.repeats)
        out["baseline_p50_s"] = round(statistics.median(took), 3)
        log(f"one quiet rule (nothing kept) p50 {out['baseline_p50_s']}s")
        # The collector tuned as in the worker's evaluation process
        # (costline.streams.worker.collector).
        collector.settle()
        out.update(evaluation_cost(Engine(ruleset, "USD"), state, KeptAnswers(),
                                   FreshSpend(ns, a.seed), ns, worker, redis, a))
    finally:
        if worker is not None:
            worker.stop()
        redis.close()
        ns.cleanup()
    return out


def fill_redis(ns: Namespace, worker: Worker, redis: Any, a: argparse.Namespace, now: float
               ) -> dict[str, Any]:
    """The evaluation data set through Kafka and the worker, 1,000 events per message."""
    from costline.connectors.kafka import producer

    prod = producer(a.bootstrap, client_id="costline-bench-latency")
    started = time.time()
    chunks: dict[str, list[dict[str, Any]]] = {"usage": [], "faults": []}
    count = 0

    def send(topic: str) -> None:
        prod.send(ns.topic(topic), value=json.dumps(chunks[topic]).encode(),
                  key=str(count).encode())
        chunks[topic].clear()

    for event in dataset(a.groups, now, a.seed, a.gpus_sampled, a.faults):
        topic = "faults" if event["kind"] == "fault" else "usage"
        chunks[topic].append(event)
        count += 1
        if len(chunks[topic]) == 1000:
            send(topic)
    for topic in chunks:
        if chunks[topic]:
            send(topic)
    prod.flush()
    prod.close()
    done = ns.wait_counted(redis, worker)
    log(f"Redis filled by the worker: {count:,} events in {done - started:.0f}s")
    return {"events": count, "seconds": round(done - started, 1)}


@dataclass
class FreshSpend:
    """Usage events of now for random tag sets of the data set: what moves between two
    data-driven evaluations."""

    ns: Namespace
    seed: int
    sent: int = 0

    def send(self, groups: int, events: int, new_tagsets: bool = False) -> None:
        """``events`` events of tag sets of the data set (``new_tagsets``: of tag sets not
        seen before, one each, as new jobs start)."""
        from costline.connectors.kafka import producer

        rng = random.Random(self.seed + self.sent)
        batch = []
        for _ in range(events):
            i = groups + self.sent if new_tagsets else rng.randrange(groups)
            resource_type = _RESOURCE_CYCLE[i % len(_RESOURCE_CYCLE)]
            batch.append({"event_id": f"fresh-{self.sent}", "kind": "usage",
                          "ts": round(time.time(), 3), "resource_id": f"{tags_of(i)['job']}/r",
                          "resource_type": resource_type, "quantity": 0.5,
                          "unit": RESOURCES[resource_type], "tags": tags_of(i)})
            self.sent += 1
        prod = producer(self.ns.bootstrap, client_id="costline-bench-latency")
        prod.send(self.ns.topic("usage"), value=json.dumps(batch).encode(),
                  key=str(self.sent).encode())
        prod.flush()
        prod.close()


def evaluation_cost(engine: Any, state: Any, kept: Any, fresh: FreshSpend, ns: Namespace,
                    worker: Worker, redis: Any, a: argparse.Namespace) -> dict[str, Any]:
    """Every rule evaluated on the worker's path: the first evaluation (nothing kept: a
    worker's start or a rule reload), the tick (every rule, past hours kept), the tick after
    events of new tag sets, and the evaluations data triggers (``--fresh`` new events each,
    idle findings reused)."""
    from costline.rules.alerts import AlertBook

    book = AlertBook()
    out: dict[str, Any] = {}
    profiler = None
    if a.profile:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.005)
    reset_peak_rss()

    def timed(label: str, reuse: Any = None) -> Any:
        nonlocal book
        profiled = profiler is not None and reuse is not None
        if profiled:
            profiler.start()
        started = time.perf_counter()
        evaluation = engine.evaluate(state, time.time(), book, kept=kept, reuse=reuse)
        took = time.perf_counter() - started
        if profiled:
            profiler.stop()
        book = evaluation.book
        found = sum(len(f) for f in evaluation.findings.values())
        log(f"{label}: {took:.2f}s, {found} findings, {len(evaluation.changes)} changes, "
            f"{len(kept)} answers kept")
        return took, evaluation

    log(f"first evaluation of {len(engine.rules)} rules (nothing kept)")
    out["first_s"] = round(timed("first")[0], 2)
    ticks = [timed("tick")[0] for _ in range(a.repeats)]
    out["tick_s"] = _rounded(percentiles(ticks))
    # New jobs start all the time: the tag sets' first buckets change before most ticks.
    churned = []
    for _ in range(a.repeats):
        fresh.send(a.groups, a.fresh, new_tagsets=True)
        ns.wait_counted(redis, worker)
        churned.append(timed(f"tick after {a.fresh} events of new tag sets")[0])
    out["tick_new_tagsets_s"] = _rounded(percentiles(churned))
    driven, evaluation = [], None
    for _ in range(a.repeats):
        fresh.send(a.groups, a.fresh)
        ns.wait_counted(redis, worker)
        last = evaluation
        reuse = None if last is None else {r.name: last.findings[r.name] for r in engine.rules
                                           if not r.data_driven}
        took, evaluation = timed(f"after {a.fresh} fresh events", reuse)
        driven.append(took)
    out["data_driven_s"] = _rounded(percentiles(driven))
    out["fresh_events"] = a.fresh
    out["peak_rss_mib"] = mib(vm_status().get("VmHWM"))
    if profiler is not None:
        out["profile"] = profiler.output_text(unicode=False, color=False, show_all=False)
    return out


# ======================================================================================
# Report
# ======================================================================================


def print_report(result: dict[str, Any]) -> None:
    print(f"costline alert latency and evaluation cost — {time.strftime('%Y-%m-%d %H:%M')} "
          f"— {result['machine']['cpus']} CPUs, load {result['machine']['loadavg_1m']} at start")
    if result.get("e2e_error"):
        print(f"\n(1) end to end failed: {result['e2e_error']}")
    e2e = result.get("e2e")
    if e2e:
        print("\n(1) end to end: probe produced → first change for its group on NS.alerts.v1")
        maximum = e2e.get("maximum")
        if maximum:
            bound = " (the producer was the limit: a lower bound)" if maximum["producer_bound"] \
                else ""
            print(f"  worker maximum      {maximum['worker_msgs_per_s']:>8,} msg/s over a burst of "
                  f"{maximum['messages']:,} single-event messages{bound}")
        print(f"  background          {e2e['background_msgs_per_s']:>8,} msg/s for "
              f"{e2e['seconds']}s ({e2e['background_sent']:,} messages)")
        print(f"  probes              {e2e['probes_answered']}/{e2e['probes_sent']} answered, "
              f"first states {e2e['first_states']}")
        for label, key in (("to the consumer", "latency_s"), ("to publish", "to_publish_s")):
            s = e2e[key]
            if s.get("n"):
                print(f"  latency {label:<16} p50 {s['p50']:.3f}s  p90 {s['p90']:.3f}s  "
                      f"p99 {s['p99']:.3f}s  max {s['max']:.3f}s")
        early, late = e2e["latency_first_third_s"], e2e["latency_last_third_s"]
        if early.get("n") and late.get("n"):
            print(f"  p50 first third {early['p50']:.3f}s, last third {late['p50']:.3f}s "
                  f"(every probe leaves a firing alert the evaluation revisits)")
        w = e2e["worker"]
        print(f"  worker              {w['evaluations']} evaluations, mean "
              f"{w['evaluation_mean_s']}s each; CPU {w['cpu_share']} cores (with its "
              f"evaluation process); peak RSS {w['peak_rss_mib']} MiB, evaluation process "
              f"{w['evaluator_peak_rss_mib']} MiB")
        print(f"  first alert after start {e2e['first_alert_s']}s; caught up "
              f"{e2e['caught_up_after_last_send_s']}s after the last send")
    worker_eval = result.get("worker_eval")
    if worker_eval:
        print_worker_eval(worker_eval)
    ev = result.get("eval")
    if ev:
        print(f"\n(2) one evaluation over an InMemoryState of {ev['groups']:,} tag sets "
              f"({ev['state']['events']}, built in {ev['state']['build_s']}s, "
              f"RSS {ev['state']['rss_mib']} MiB)")
        b = ev["baseline"]
        print(f"  one quiet rule      p50 {b['p50_s']}s  runs {b['runs_s']}  "
              f"peak RSS {b['peak_rss_mib']} MiB")
        print(f"  {ev['rules']} rules loaded in {ev['load_s']}s: {ev['kinds']}")
        if "full" in ev:
            f = ev["full"]
            print(f"  full: {ev['rules']} rules p50 {f['p50_s']}s  runs {f['runs_s']}  "
                  f"peak RSS {f['peak_rss_mib']} MiB")
        p = ev["per_rule"]
        print(f"  rule by rule        {p['measured_rules']} of {ev['rules']} rules in "
              f"{p['measured_s']}s: mean {p['mean_per_rule_s']}s per rule → one evaluation of "
              f"all {ev['rules']} ≈ {p['estimated_full_s']}s ({_how(p, ev['rules'])})")
        if p["stopped_rules"]:
            print(f"                      stopped after {ev['args_rule_timeout']}s: "
                  f"{', '.join(p['stopped_rules'])}")
        print(f"                      peak RSS {p['peak_rss_mib']} MiB")
        for kind, k in p["by_kind"].items():
            print(f"    {kind:<14} {k['rules']:>4} rules  mean {k['mean_s']:.3f}s  "
                  f"max {k['max_s']:.3f}s  findings {k['findings']}")
        reads = p["state_reads"]
        print(f"  StateView reads     {reads['calls']} calls, {reads['seconds']}s "
              f"({reads['share']} of the time); by method and caller:")
        for caller, c in reads["by_caller"].items():
            print(f"    {caller:<34} {c['calls']:>7} calls  {c['s']:>8.2f}s")
        print("  slowest rules:")
        for line in p["slowest"]:
            print(f"    {line}")
        if p.get("profile"):
            print("\n  profile of the rule-by-rule pass (pyinstrument):")
            print(p["profile"])


def print_worker_eval(w: Mapping[str, Any]) -> None:
    agg = w["aggregated"]
    print(f"\n(2) evaluation cost: {w['rules']} rules {w['kinds']} over {w['groups']:,} tag sets, "
          f"as the worker evaluates (RedisState filled by a worker: {agg['events']:,} events "
          f"in {agg['seconds']}s)")
    print(f"  one quiet rule      p50 {w['baseline_p50_s']}s (nothing kept)")
    print(f"  first evaluation    {w['first_s']}s: every rule, nothing kept (start, rule reload)")
    says = {
        "tick_s": ("tick", "(every rule, past hours kept)"),
        "tick_new_tagsets_s": ("tick, new tag sets", f"(the same, after {w['fresh_events']} "
                                                     "events of new tag sets each)"),
        "data_driven_s": ("data-driven", f"(after {w['fresh_events']} fresh events each; idle "
                                         "findings reused)"),
    }
    for key, (label, how) in says.items():
        t = w[key]
        print(f"  {label:<19} p50 {t['p50']:.2f}s  max {t['max']:.2f}s over {t['n']} {how}")
    print(f"  peak RSS            {w['peak_rss_mib']} MiB (this process)")
    if w.get("profile"):
        print("\n  profile of the data-driven evaluations (pyinstrument):")
        print(w["profile"])


def _how(timed: Mapping[str, Any], rules: int) -> str:
    if timed["measured_rules"] == rules and not timed["stopped_rules"]:
        return "measured rule by rule"
    return "estimated, a lower bound" if timed["stopped_rules"] else "estimated"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--rate", type=int, default=0,
                        help="background messages/s (default: half the measured maximum)")
    parser.add_argument("--seconds", type=float, default=60.0, help="length of the latency run")
    parser.add_argument("--probe-every", type=float, default=1.0, help="seconds between probes")
    parser.add_argument("--burst", type=int, default=20_000,
                        help="messages of the burst that measures the maximum")
    parser.add_argument("--tagsets", type=int, default=2000, help="background tag sets")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--groups", type=int, default=100_000, help="tag sets of the state")
    parser.add_argument("--rules", type=int, default=1000, help="generated rules")
    parser.add_argument("--repeats", type=int, default=5, help="evaluations per timing")
    parser.add_argument("--eval-budget", type=float, default=240.0,
                        help="seconds for evaluating the generated rules one by one")
    parser.add_argument("--rule-timeout", type=float, default=60.0,
                        help="seconds after which one rule is stopped and counted as that long")
    parser.add_argument("--full", action="store_true",
                        help="evaluate the whole generated rule set --repeats times (slow)")
    parser.add_argument("--fresh", type=int, default=1000,
                        help="fresh events before each data-driven evaluation")
    parser.add_argument("--memory", action="store_true",
                        help="also time the rules one by one on an InMemoryState")
    parser.add_argument("--gpus-sampled", type=int, default=2000)
    parser.add_argument("--faults", type=int, default=500)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--profile", action="store_true",
                        help="profile the rule-by-rule pass with pyinstrument")
    parser.add_argument("--skip-e2e", action="store_true")
    parser.add_argument("--skip-eval", action="store_true")
    parser.add_argument("--skip-redis", action="store_true")
    service_options(parser)
    a = parser.parse_args()

    result: dict[str, Any] = {"machine": machine(), "args": vars(a)}
    with tempfile.TemporaryDirectory(prefix="costline-latency-") as tmp:
        workdir = Path(tmp)
        if not a.skip_e2e:
            try:
                result["e2e"] = run_e2e(a, workdir)
            except Exception as exc:  # noqa: BLE001 - keep going to the evaluation part
                log(f"the end-to-end part failed: {exc!r}")
                result["e2e_error"] = repr(exc)
        if not a.skip_eval:
            if not a.skip_redis:
                result["worker_eval"] = run_worker_eval(a, workdir)
            if a.memory:
                result["eval"] = run_memory_eval(a, workdir)
    result["machine"]["loadavg_1m_end"] = round(os.getloadavg()[0], 2)
    if a.json:
        print(json.dumps(result, indent=2))
    else:
        print_report(result)


if __name__ == "__main__":
    main()
