"""Throughput of costline's workers beside the ceiling of reading and parsing the same topic,
measured in one run, on two data sets.

    .venv/bin/python bench/throughput.py [--events N] [--tagsets N] [--partitions N]
        [--data jobs,uniform] [--scale 1,2,3] [--rounds N] [--folding inline|process]
        [--bootstrap HOST:PORT] [--redis-url URL] [--json]

Each data set (``bench/datasets.py``: ``jobs``, each input partition holding its own jobs and
messages keyed by job; ``uniform``, each 100-event message spanning about 100 tag sets, keyed
at random) is produced once into an input topic of ``--partitions`` partitions. Then, each
round (``--rounds``):

(a) the ceiling: a plain aiokafka consumer, alone in a process of its own, reads every
    message of the topic and calls ``costline.rules.events.parse_message`` on it; timed from
    its first fetch to its last message.
(c) costline: N real workers (``costline worker``, with ``COSTLINE_FOLDING`` from
    ``--folding``) for each N of ``--scale``, on a fresh namespace state (no consumer groups,
    no ledger, no Redis keys). The workers start, join both consumer groups (intake's and the
    aggregation's) and wait until the groups have split the partitions; they are then let go
    all at once (before that a worker has fetched one take, and priced nothing). Timed from
    the go until ``costline.streams.progress.behind`` says every message is counted, to the
    moment the last home partition's watermark reached its end.

It prints, per data set, the events/s and CPU-µs per event of (a) and of (c) (the worker's
own process, its pricing processes and its rules' evaluation apart), the ratio c/a (with the
first N of ``--scale``), a row per N (speed-up, the workers' CPU with their child processes,
the Redis server's CPU, all its clients' work included, how busy the machine was, which
input and home partitions each worker owned), after the first run of the data set the Redis
memory of the namespace per distinct tag set and the bytes of dedup memory per remembered
event (``MEMORY USAGE`` of every ``*:dd:*`` key over the events its sets hold), and Redis's
total beside the generator's (``PriceBook.charge``), which must agree to the micro-unit in
every run: the exit status is 1 otherwise. With ``--rounds N`` rates and ratios are the median
(lowest–highest) of the rounds, each ratio from its own round.

``--redis-url`` may name a node of a Redis Cluster: the bench's own reads go through a
cluster client, the workers get the URL as it is. Every run uses namespaces ``tp<hex><j|u>``
and deletes their topics, consumer groups and keys at the end. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.common import (  # noqa: E402 - needs REPO on the path
    busy_share,
    child_figures,
    cpu_by_role,
    forget_kafka,
    forget_namespace,
    is_cluster,
    log,
    machine_jiffies,
    namespace_memory,
    produce,
    redis_client,
    redis_cpu_s,
    redis_total,
    service_options,
    unlink_namespaces,
    vm_status,
    wait_counted,
    worker_series,
)
from bench.datasets import DATA_SETS, DAY_S, generate  # noqa: E402
from tests.integration.streamkit import Worker, end_offsets, worker_env  # noqa: E402

# ── the processes measured (``--role``) ─────────────────────────────────────────────────


async def ceiling(topic: str, ends: dict[int, int], bootstrap: str) -> dict[str, Any]:
    """(a): read every message of ``topic`` up to ``ends`` and parse it."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from costline.rules.events import Rejection, parse_message

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                group_id=None, auto_offset_reset="earliest")
    await consumer.start()
    missing = {p for p, end in ends.items() if end > 0}
    messages = events = rejected = 0
    started = cpu = 0.0
    try:
        tps = [TopicPartition(topic, p) for p in ends]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        while missing:
            batch = await consumer.getmany(timeout_ms=1000)
            for tp, records in batch.items():
                if not records:
                    continue
                if not started:
                    started, cpu = time.perf_counter(), time.process_time()
                for record in records:
                    verdict = parse_message(record.value)
                    if isinstance(verdict, Rejection):
                        rejected += 1
                    else:
                        events += len(verdict.events)
                messages += len(records)
                if records[-1].offset >= ends[tp.partition] - 1:
                    missing.discard(tp.partition)
    finally:
        await consumer.stop()
    return {"elapsed_s": time.perf_counter() - started, "cpu_s": time.process_time() - cpu,
            "messages": messages, "events": events, "rejected": rejected, **vm_status()}


def gated_worker(go: str) -> None:
    """``costline worker``, whose intake prices nothing before the file ``go`` exists: its
    consumer joins the group and holds its first take until then."""
    from costline.streams.cli.root import main
    from costline.streams.worker.input_takes import InputTakes

    takes = InputTakes.takes

    async def takes_after_go(self: InputTakes) -> Any:
        async with contextlib.aclosing(takes(self)) as inner:
            async for take in inner:
                while not os.path.exists(go):
                    await asyncio.sleep(0.01)
                yield take

    InputTakes.takes = takes_after_go  # type: ignore[method-assign]
    sys.argv = ["costline", "worker", "--loglevel", "warning"]
    main()


# ── the parent ──────────────────────────────────────────────────────────────────────────


def spawn(argv: list[str]) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), *argv]


def run_ceiling(a: argparse.Namespace, topic: str, ends: dict[int, int], folder: Path
                ) -> dict[str, Any]:
    import subprocess

    out = folder / f"ceiling-{secrets.token_hex(2)}.json"
    log(f"(a) ceiling on {topic}")
    subprocess.run(spawn(["--role", "ceiling", "--topic", topic, "--ends", json.dumps(ends),
                          "--out", str(out), "--bootstrap", a.bootstrap]),
                   check=True, timeout=a.timeout, cwd=REPO)
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def groups_of(bootstrap: str, groups: list[str]) -> dict[str, dict[str, Any]]:
    """State and member assignments of consumer groups (empty for an unknown group)."""
    from costline.connectors.kafka import admin

    client = admin(bootstrap, timeout_s=10)
    try:
        described = client.describe_groups(groups)
    finally:
        client.close()
    out = {}
    for group in groups:
        found = described.get(group) or {}
        members = found.get("members") or []
        out[group] = {"state": found.get("group_state") or found.get("state"),
                      "members": {m.get("member_id"): repr(m.get("member_assignment"))
                                  for m in members}}
    return out


def formed(found: dict[str, dict[str, Any]], workers: int) -> bool:
    return all(g["state"] == "Stable" and len(g["members"]) == workers for g in found.values())


class Bench:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.run_id = "tp" + secrets.token_hex(3)
        self.folder = Path(tempfile.mkdtemp(prefix=f"costline-{self.run_id}-"))
        self.namespaces: list[str] = []
        self.workers: list[Any] = []

    def run(self) -> dict[str, Any]:
        a = self.a
        report: dict[str, Any] = {
            "run_id": self.run_id, "cpus": os.cpu_count(), "loadavg_start": os.getloadavg(),
            "events": a.events, "batch": a.batch, "tagsets": a.tagsets, "partitions": a.partitions,
            "folding": a.folding, "scale": a.scale, "rounds": a.rounds,
            "redis_cluster": self.cluster(), "files": str(self.folder), "data_sets": {}}
        for name in a.data:
            report["data_sets"][name] = self.data_set(name)
        report["ok"] = all(r["c"][n]["total_ok"] for d in report["data_sets"].values()
                           for r in d["rounds"] for n in r["c"])
        return report

    def cluster(self) -> bool:
        client = redis_client(self.a.redis_url)
        try:
            return is_cluster(client)
        finally:
            client.close()

    def data_set(self, name: str) -> dict[str, Any]:
        from costline.streams.settings import Settings
        from costline.streams.topics import INPUTS, create_topics

        a = self.a
        ns = f"{self.run_id}{name[0]}"
        self.namespaces.append(ns)
        data = generate(name, a.events, a.tagsets, a.partitions, a.seed, batch=a.batch,
                        run_id=ns)
        settings = Settings(kafka_bootstrap=a.bootstrap, redis_url=a.redis_url, namespace=ns,
                            partitions=a.partitions)
        create_topics(settings)
        topic = settings.topic("usage")
        produce(a.bootstrap, topic, data.messages, name)
        ends = end_offsets(a.bootstrap, topic)
        assert sum(ends.values()) == len(data.messages), (ends, len(data.messages))
        found: dict[str, Any] = {"summary": data.summary(), "rounds": []}
        window = (data.ts_min - DAY_S, data.ts_max + DAY_S)
        del data.messages
        inputs = [settings.topic(n) for n in INPUTS]
        for number in range(1, a.rounds + 1):
            log(f"{name}: round {number} of {a.rounds}")
            ceiling_run = rate(run_ceiling(a, topic, ends, self.folder), data.events)
            if ceiling_run["events"] != data.events or ceiling_run["rejected"]:
                raise RuntimeError(f"the ceiling parsed {ceiling_run['events']} events, "
                                   f"{ceiling_run['rejected']} refused: the data set is bad")
            runs = {}
            for workers in a.scale:
                forget_kafka(a.bootstrap, ns, keep=inputs)
                unlink_namespaces(a.redis_url, [ns])
                run = rate(self.run_workers(settings, workers), data.events)
                total = redis_total(a.redis_url, ns, *window)
                run.update(total_micro=total, total_ok=total == data.expected_micro)
                log(f"{name}: {workers} worker(s) {run['events_per_s']:,.0f} events/s, "
                    f"Redis total {total:,} µ, generator {data.expected_micro:,} µ: "
                    f"{'OK' if run['total_ok'] else 'MISMATCH'}")
                if "memory" not in found:
                    found["memory"] = namespace_memory(a.redis_url, ns)
                runs[str(workers)] = run
            one = runs[str(a.scale[0])]
            found["rounds"].append({"a": ceiling_run, "c": runs,
                                    "c_over_a": one["events_per_s"] / ceiling_run["events_per_s"]})
        found["median"] = medians(found["rounds"])
        return found

    def run_workers(self, settings: Any, count: int) -> dict[str, Any]:
        """``count`` workers on the namespace, from the go until every message is counted."""
        a, ns = self.a, settings.namespace
        step = f"{ns}-w{count}-{secrets.token_hex(2)}"
        go = self.folder / f"{step}.go"
        workers = []
        for i in range(count):
            state = self.folder / f"{step}-{i}"
            state.mkdir()
            env = worker_env(ns, a.bootstrap, a.redis_url, COSTLINE_PARTITIONS=str(a.partitions),
                             COSTLINE_FOLDING=a.folding, COSTLINE_STATE_DIR=str(state))
            worker = Worker(env, self.folder / f"{step}-{i}.log",
                            command=spawn(["--role", "worker", "--go", str(go)]))
            worker.start()
            workers.append(worker)
        self.workers = workers
        groups = [f"{ns}-intake", f"{ns}-ledger"]
        log(f"(c) {count} worker(s): waiting for both consumer groups to split the partitions")
        self.wait(workers, lambda: formed(groups_of(a.bootstrap, groups), count), 300,
                  "the consumer groups to form")
        at_go = groups_of(a.bootstrap, groups)
        redis = redis_client(a.redis_url)
        try:
            pids = [w.proc.pid for w in workers]
            cpu0 = [cpu_by_role(pid) for pid in pids]
            redis0, jiffies0 = redis_cpu_s(redis), machine_jiffies()
            go.touch()
            started = time.time()
            moved = wait_counted(settings, redis, workers, a.timeout, started)
            roles: dict[str, float] = {}
            for pid, before in zip(pids, cpu0, strict=True):
                for role, seconds in cpu_by_role(pid).items():
                    roles[role] = roles.get(role, 0.0) + seconds - before[role]
            figures = {
                "workers": count, "elapsed_s": moved - started,
                "cpu_s": sum(roles.values()), "cpu_s_by_role": roles,
                "redis_cpu_s": redis_cpu_s(redis) - redis0,
                "machine_busy": busy_share(jiffies0, machine_jiffies()),
                "rebalanced_while_timed": groups_of(a.bootstrap, groups) != at_go,
                "each": [self.worker_figures(w, settings) for w in workers],
            }
        finally:
            redis.close()
            for worker in workers:
                worker.stop()
            self.workers = []
        return figures

    def worker_figures(self, worker: Any, settings: Any) -> dict[str, Any]:
        """What one worker owned (its lag series), counted and cost, before it stops."""
        found = worker_series(worker)
        counters: dict[str, float] = {}
        for name, _, value in found:
            counters[name] = counters.get(name, 0.0) + value

        def owned(gauge: str, topic: str) -> list[int]:
            return sorted({int(labels["partition"]) for name, labels, _ in found
                           if name == f"costline_{gauge}" and labels.get("topic") == topic})

        pid = worker.proc.pid
        return {"input_partitions": owned("input_lag", settings.topic("usage")),
                "ledger_partitions": owned("consumer_lag", settings.topic("ledger")),
                "events": counters.get("costline_events_total", 0.0),
                "entries": counters.get("costline_entries_total", 0.0),
                **vm_status(pid), **child_figures(pid)}

    def wait(self, workers: list[Any], done: Callable[[], bool], timeout: float,
             what: str) -> None:
        deadline = time.time() + timeout
        while True:
            try:
                if done():
                    return
            except Exception as exc:  # noqa: BLE001 - a group not known yet
                log(f"waiting for {what}: {type(exc).__name__}: {exc}")
            for worker in workers:
                if not worker.alive():
                    raise RuntimeError(f"a worker exited; see {worker.log}")
            if time.time() > deadline:
                raise RuntimeError(f"waited {timeout}s for {what}; see {self.folder}")
            time.sleep(0.25)

    def cleanup(self) -> None:
        for worker in self.workers:
            worker.stop()
        for ns in self.namespaces:
            forget_namespace(self.a.bootstrap, self.a.redis_url, ns)


def rate(run: dict[str, Any], events: int) -> dict[str, Any]:
    run["events_per_s"] = events / run["elapsed_s"]
    run["cpu_us_per_event"] = 1e6 * run["cpu_s"] / events
    if "redis_cpu_s" in run:
        run["redis_us_per_event"] = 1e6 * run["redis_cpu_s"] / events
    return run


def spread(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "low": min(values), "high": max(values)}


def medians(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and range over the rounds of each rate and of c/a (each from its own round)."""
    return {
        "a": spread([r["a"]["events_per_s"] for r in rounds]),
        "c": {n: spread([r["c"][n]["events_per_s"] for r in rounds]) for n in rounds[0]["c"]},
        "c_over_a": spread([r["c_over_a"] for r in rounds]),
    }


# ── the report ──────────────────────────────────────────────────────────────────────────


def shown(figure: dict[str, float], form: str) -> str:
    """A median, with its range when the rounds differ."""
    text = format(figure["median"], form)
    if figure["low"] != figure["high"]:
        text += f" ({format(figure['low'], form)}–{format(figure['high'], form)})"
    return text


def print_report(rep: dict[str, Any]) -> None:
    rounds = rep["rounds"]
    print(f"costline throughput: {rep['events']:,} usage events in {rep['batch']}-event messages, "
          f"{rep['tagsets']:,} tag sets, {rep['partitions']} partitions, folding "
          f"{rep['folding']}, Redis {'Cluster' if rep['redis_cluster'] else 'single'}; "
          f"{rep['cpus']} CPUs, load {rep['loadavg_start'][0]:.1f} at the start"
          + (f"; median (lowest–highest) of {rounds} rounds" if rounds > 1 else ""))
    for name, d in rep["data_sets"].items():
        s, m, first = d["summary"], d["median"], d["rounds"][0]
        print(f"\n{name}: {s['messages']:,} messages, events per partition "
              f"{', '.join(f'{n:,}' for n in s['events_by_partition'])}, the 1% most used tag "
              f"sets hold {s['top1pct_share']:.0%} of the events")
        one = str(rep["scale"][0])
        c_one = first["c"][one]
        by_role = ", ".join(f"{role} {1e6 * seconds / s['events']:.1f}"
                            for role, seconds in c_one["cpu_s_by_role"].items() if seconds)
        print(f"  {'(a) ceiling: aiokafka + parse_message':40s}{shown(m['a'], ',.0f')} events/s, "
              f"{first['a']['cpu_us_per_event']:.1f} CPU-µs/event")
        print(f"  {f'(c) costline, {one} worker(s)':40s}{shown(m['c'][one], ',.0f')} events/s, "
              f"{c_one['cpu_us_per_event']:.1f} CPU-µs/event ({by_role})")
        print(f"  {'c/a':40s}{shown(m['c_over_a'], '.3f')}")
        print(f"  {'workers':>9}{'events/s':>12}{'speed-up':>10}{'worker µs/ev':>14}"
              f"{'Redis µs/ev':>13}{'busy':>6}  input / ledger partitions per worker")
        base = m["c"][one]["median"]
        for n, figure in m["c"].items():
            run = first["c"][n]
            owned = "; ".join(f"{w['input_partitions']} / {w['ledger_partitions']}"
                              for w in run["each"])
            moved = " (rebalanced while timed)" if run["rebalanced_while_timed"] else ""
            print(f"  {n:>9}{figure['median']:>12,.0f}{figure['median'] / base:>9.2f}x"
                  f"{run['cpu_us_per_event']:>14.1f}{run['redis_us_per_event']:>13.1f}"
                  f"{run['machine_busy']:>6.0%}  {owned}{moved}")
        mem = d["memory"]
        dedup = mem["by_kind"].get("dedup", 0)
        print(f"  Redis: {mem['bytes'] / max(1, mem['tagsets']):,.0f} bytes per tag set "
              f"({(mem['bytes'] - dedup) / max(1, mem['tagsets']):,.0f} without the dedup "
              f"memory; {mem['tagsets']:,} tag sets, held {mem['tagset_entries']:,} times "
              f"over the home partitions; {mem['bytes'] / 2**20:,.1f} MiB: "
              + ", ".join(f"{k} {v / 2**20:,.1f}" for k, v in sorted(mem["by_kind"].items()))
              + ")")
        print(f"  dedup memory: {dedup / max(1, mem['dedup_events']):.2f} bytes per remembered "
              f"event ({mem['dedup_events']:,} events in {mem['keys_by_kind'].get('dedup', 0):,}"
              f" keys)")
        runs = [c for r in d["rounds"] for c in r["c"].values()]
        found = sorted({c["total_micro"] for c in runs})
        verdict = "OK" if all(c["total_ok"] for c in runs) else "MISMATCH"
        print(f"  total: Redis {', '.join(f'{t:,}' for t in found)} in {len(runs)} run(s), "
              f"generator {s['expected_cost_micro']:,} micro-units: {verdict}")
    print(f"\nlogs: {rep['files']}")


# ── command line ────────────────────────────────────────────────────────────────────────


def counts(text: str) -> list[int]:
    found = [int(x) for x in text.split(",") if x.strip()]
    if not found or any(n < 1 for n in found):
        raise argparse.ArgumentTypeError("worker counts are positive integers")
    return found


def names(text: str) -> list[str]:
    found = [x.strip() for x in text.split(",") if x.strip()]
    if not found or set(found) - set(DATA_SETS):
        raise argparse.ArgumentTypeError(f"data sets are {', '.join(DATA_SETS)}")
    return found


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--tagsets", type=int, default=100_000)
    p.add_argument("--batch", type=int, default=100,
                   help="events per input message (1: every event a message of its own)")
    p.add_argument("--partitions", type=int, default=6,
                   help="of the input topics and the ledger (6: even for 1, 2 and 3 workers)")
    p.add_argument("--data", type=names, default=list(DATA_SETS), metavar="jobs,uniform")
    p.add_argument("--scale", type=counts, default=[1, 2, 3], metavar="N,N,...",
                   help="worker counts; c/a is taken with the first (default 1,2,3)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--folding", choices=("inline", "process"), default="process",
                   help="COSTLINE_FOLDING of the workers")
    p.add_argument("--seed", type=int, default=20261130)
    p.add_argument("--timeout", type=float, default=900, help="seconds per measured run")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    service_options(p)
    # the processes measured
    p.add_argument("--role", choices=("ceiling", "worker"), help=argparse.SUPPRESS)
    p.add_argument("--topic", help=argparse.SUPPRESS)
    p.add_argument("--ends", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--go", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.role == "ceiling":
        ends = {int(p): int(o) for p, o in json.loads(a.ends).items()}
        Path(a.out).write_text(json.dumps(asyncio.run(ceiling(a.topic, ends, a.bootstrap))))
        return 0
    if a.role == "worker":
        gated_worker(a.go)
        return 0
    bench = Bench(a)
    try:
        report = bench.run()
    except RuntimeError as exc:  # a worker that exited, a run that never finished
        log(f"failed: {exc}")
        return 2
    finally:
        bench.cleanup()
    if a.json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
