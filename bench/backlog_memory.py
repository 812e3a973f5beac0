"""A worker's memory on a backlog over many partitions while Redis stops writing for a while.

    .venv/bin/python bench/backlog_memory.py [--events N] [--tagsets N] [--partitions N]
        [--pause-s S] [--bootstrap HOST:PORT] [--redis-url URL] [--json]

``COSTLINE_WINDOW_EVENTS`` bounds what one home partition holds folded and not yet written;
a worker owning many partitions of a backlog, while Redis is behind, could hold that much for
each of them. ``COSTLINE_UNWRITTEN_EVENTS`` bounds all of them together. This bench measures
both ways in one run, on the same messages (the ``jobs`` data set of ``bench/datasets.py``,
100-event messages, each copy on topics of ``--partitions`` partitions):

  bounded:   a real ``costline worker`` with the default ``COSTLINE_UNWRITTEN_EVENTS``;
  baseline:  the same worker with the bound set out of reach (only the per-partition one).

Each worker starts on its backlog; once it has taken messages, Redis is made to hold every
write (``CLIENT PAUSE … WRITE``) for ``--pause-s`` seconds, then lets them through. It prints
the most events the worker held unwritten (its ``costline_unwritten_events`` gauge, read every
0.2 s), the peak RSS of the worker and of its pricing processes (summed), how long the backlog
took from the start until ``costline.streams.progress.behind`` said everything was counted,
and checks that Redis's total equals the generator's. Uses the namespaces ``backlog<hex>b``
and ``backlog<hex>u`` and deletes them at the end.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.common import (  # noqa: E402 - needs REPO on the path
    child_figures,
    counted,
    data_set_options,
    forget_namespace,
    log,
    produce,
    redis_client,
    redis_total,
    vm_status,
    worker_metrics,
)
from bench.datasets import DAY_S, generate  # noqa: E402
from tests.integration.streamkit import Worker, worker_env  # noqa: E402

OUT_OF_REACH = 10**9
# case → (its namespace's suffix, COSTLINE_UNWRITTEN_EVENTS)
CASES = {"bounded": ("b", None), "baseline": ("u", OUT_OF_REACH)}


def run_case(a: argparse.Namespace, settings: Any, unwritten: int | None, rules: str,
             folder: Path) -> dict[str, Any]:
    extra = {"COSTLINE_PARTITIONS": str(a.partitions), "COSTLINE_RULES": rules,
             "COSTLINE_STATE_DIR": str(folder / settings.namespace)}
    if unwritten is not None:
        extra["COSTLINE_UNWRITTEN_EVENTS"] = str(unwritten)
    worker = Worker(worker_env(settings.namespace, a.bootstrap, a.redis_url, **extra),
                    folder / f"{settings.namespace}.log")
    redis = redis_client(a.redis_url)
    worker.start()
    assert worker.proc is not None
    started = time.perf_counter()
    held = peak_rss = 0
    paused = False
    asked = 0.0
    try:
        while True:
            if not worker.alive():
                raise RuntimeError(f"the worker exited; see {worker.log}")
            figures = worker_metrics(worker)
            held = max(held, int(figures.get("costline_unwritten_events", 0)))
            peak_rss = max(peak_rss, vm_status(worker.proc.pid).get("VmHWM", 0))
            if not paused and figures.get("costline_messages_total", 0) > 0:
                redis.execute_command("CLIENT", "PAUSE", int(a.pause_s * 1000), "WRITE")
                paused = True
                log(f"{settings.namespace}: Redis holds writes for {a.pause_s:.0f}s")
            if paused and time.perf_counter() - asked > 1.0:
                asked = time.perf_counter()
                if counted(settings, redis):
                    break
            time.sleep(0.2)
        took = time.perf_counter() - started
        children = child_figures(worker.proc.pid)
        peak_rss = max(peak_rss, vm_status(worker.proc.pid).get("VmHWM", 0))
    finally:
        redis.execute_command("CLIENT", "UNPAUSE")
        redis.close()
        worker.stop()
    return {"unwritten_events_setting": unwritten, "held_events_max": held,
            "worker_peak_rss_mib": peak_rss / 1024,
            "pricer_peak_rss_mib": children.get("pricer_VmHWM", 0) / 1024, "seconds": took}


def report(figures: dict[str, Any]) -> str:
    lines = [
        f"costline worker on a backlog: {figures['events']:,} events in 100-event messages, "
        f"{figures['tagsets']:,} tag sets, {figures['partitions']} partitions, Redis holding "
        f"writes for {figures['pause_s']:.0f} s",
        "",
        f"{'':14s}{'unwritten bound':>16s}{'most held':>12s}{'worker RSS':>12s}"
        f"{'pricers RSS':>13s}{'took':>8s}  total",
    ]
    for name, case in figures["cases"].items():
        bound = case["unwritten_events_setting"]
        shown = "default" if bound is None else ("none" if bound >= OUT_OF_REACH else f"{bound:,}")
        lines.append(
            f"  {name:12s}{shown:>16s}{case['held_events_max']:>12,}"
            f"{case['worker_peak_rss_mib']:>8.0f} MiB{case['pricer_peak_rss_mib']:>9.0f} MiB"
            f"{case['seconds']:>7.1f}s  {'OK' if case['total_ok'] else 'MISMATCH'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    data_set_options(p, events=600_000, kafka=True)
    p.add_argument("--partitions", type=int, default=48)
    p.add_argument("--pause-s", type=float, default=8.0,
                   help="how long Redis holds writes (under the worker's 10 s socket timeout)")
    a = p.parse_args(argv)

    from costline.streams.settings import Settings
    from costline.streams.topics import create_topics

    run_id = "backlog" + secrets.token_hex(3)
    data = generate("jobs", a.events, a.tagsets, a.partitions, a.seed, run_id=run_id)
    figures: dict[str, Any] = {"events": a.events, "tagsets": data.tagsets,
                               "partitions": a.partitions, "pause_s": a.pause_s, "cases": {}}
    namespaces = [run_id + suffix for suffix, _ in CASES.values()]
    try:
        with tempfile.TemporaryDirectory(prefix="costline-backlog-") as workdir:
            folder = Path(workdir)
            rules = folder / "rules"
            rules.mkdir()  # no rules: the worker's memory is the aggregation's
            for ns, (case, (_, unwritten)) in zip(namespaces, CASES.items(), strict=True):
                settings = Settings(kafka_bootstrap=a.bootstrap, redis_url=a.redis_url,
                                    namespace=ns, partitions=a.partitions)
                create_topics(settings)
                produce(a.bootstrap, settings.topic("usage"), data.messages, case)
                log(f"{case}: starting the worker")
                result = run_case(a, settings, unwritten, str(rules), folder)
                total = redis_total(a.redis_url, ns, data.ts_min - DAY_S, data.ts_max + DAY_S)
                result["total_ok"] = total == data.expected_micro
                figures["cases"][case] = result
                log(f"{case}: {result}")
    finally:
        for ns in namespaces:
            forget_namespace(a.bootstrap, a.redis_url, ns)
    print(json.dumps(figures, indent=2) if a.json else report(figures))
    return 0 if all(c["total_ok"] for c in figures["cases"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
