"""What the leader's evaluation process costs on many tag sets, while new ones keep coming.

    .venv/bin/python bench/evaluation.py [--events N] [--tagsets N] [--new-tagsets N]
        [--ticks N] [--redis-url URL] [--json]

The ``jobs`` data set (``bench/datasets.py``, the generator and seed of ``bench/throughput.py``)
is written into a namespace of its own through a worker's stages (``bench/stages.py``). Then
a fresh process
evaluates the shipped rules the way the worker's evaluation process does (``RedisState`` and
``KeptAnswers``): the first evaluation (nothing kept: a start or a rule reload), then
``--ticks`` ticks (every rule), each after ``--new-tagsets`` new tag sets were written, as new
jobs start. It prints the CPU-seconds of each and the process's peak RSS.

Baseline, measured in the same run on the same state: the same process with a state that
cannot tell what changed in the tag sets' first buckets, so that every tick reads and groups
all of them again. Uses the namespace ``evalbench<hex>`` and deletes its keys at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import subprocess
import sys
import time
import uuid
from collections.abc import Hashable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.common import (  # noqa: E402 - needs REPO on the path
    data_set_options,
    log,
    redis_client,
    unlink_namespaces,
    vm_status,
)
from bench.datasets import generate  # noqa: E402
from bench.stages import run_stages, write_events  # noqa: E402

PARTITIONS = 4

MODES = {"log": "first buckets kept, changes from their log",
         "full": "baseline: all first buckets read each tick"}


def start_jobs(ns: str, redis_url: str, count: int) -> None:
    """``count`` usage events of as many tag sets never seen before, as new jobs start."""
    from costline.rules.events import UsageEvent

    ts = time.time() - 120
    events = [UsageEvent(event_id=uuid.uuid4().hex, kind="usage", ts=ts, resource_id="new/r",
                         resource_type="gpu.h100", quantity=1.0, unit="gpu_hour",
                         tags={"team": "new-jobs", "job": uuid.uuid4().hex[:12]})
              for _ in range(count)]
    asyncio.run(write_events(events, ns, redis_url, PARTITIONS))


def child(ns: str, redis_url: str, mode: str, ticks: int, new_tagsets: int) -> dict[str, Any]:
    """One evaluation process's figures (runs in a process of its own)."""
    from costline.connectors.alert_store import AlertStore
    from costline.connectors.plugins import PLUGINS
    from costline.connectors.redis_state import RedisState
    from costline.rules.engine import Engine
    from costline.rules.prices import PriceBook
    from costline.streams.settings import DEFAULT_PRICES, DEFAULT_RULES
    from costline.streams.worker import collector
    from costline.streams.worker.evaluator import InlineRunner

    class Untold(RedisState):
        """Cannot tell what changed in the first buckets: they are read again every tick."""

        def firsts_changes(self, since: Hashable | None) -> tuple[None, None]:
            return None, None

    redis = redis_client(redis_url)
    state = (RedisState if mode == "log" else Untold)(redis, ns, "UTC")
    runner = InlineRunner(state, AlertStore(redis, ns))
    engine = Engine.load([DEFAULT_RULES], PriceBook.load(DEFAULT_PRICES), plugins=PLUGINS)
    collector.settle()  # as the evaluation process does once started

    def timed() -> float:
        started = time.process_time()
        runner.evaluate(engine, time.time(), True)
        return time.process_time() - started

    first = timed()
    tick_s = []
    for _ in range(ticks):
        start_jobs(ns, redis_url, new_tagsets)
        tick_s.append(timed())
    return {"first_s": first, "tick_s": tick_s,
            "peak_rss_mib": vm_status().get("VmHWM", 0) / 1024}


def run_child(a: argparse.Namespace, ns: str, mode: str) -> dict[str, Any]:
    log(f"evaluating in a fresh process: {MODES[mode]}")
    done = subprocess.run(
        [sys.executable, __file__, "--child", ns, "--mode", mode, "--ticks", str(a.ticks),
         "--new-tagsets", str(a.new_tagsets), "--redis-url", a.redis_url],
        check=True, capture_output=True, text=True)
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def report(figures: dict[str, Any]) -> str:
    lines = [
        f"costline evaluation cost: shipped rules over {figures['tagsets']:,} tag sets "
        f"({figures['events']:,} events), {figures['ticks']} ticks after "
        f"{figures['new_tagsets']} new tag sets each",
        "",
        f"{'':46s}{'first s':>9s}{'tick s (each)':>24s}{'peak RSS':>10s}",
    ]
    for mode, label in MODES.items():
        f = figures[mode]
        ticks = " ".join(f"{t:.2f}" for t in f["tick_s"])
        lines.append(f"  {label:44s}{f['first_s']:9.2f}{ticks:>24s}"
                     f"{f['peak_rss_mib']:7.0f} MiB")
    lines.append("(CPU-seconds of the evaluating process; peak RSS is its VmHWM)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    data_set_options(p, events=300_000)
    p.add_argument("--new-tagsets", type=int, default=10, help="new tag sets before each tick")
    p.add_argument("--ticks", type=int, default=3)
    p.add_argument("--child", metavar="NAMESPACE", help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=MODES, default="log", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.child, a.redis_url, a.mode, a.ticks, a.new_tagsets)))
        return 0

    ns = "evalbench" + secrets.token_hex(3)
    data = generate("jobs", a.events, a.tagsets, PARTITIONS, a.seed, run_id=ns)
    try:
        asyncio.run(run_stages(data, ns, a.redis_url))
        figures: dict[str, Any] = {mode: run_child(a, ns, mode) for mode in MODES}
    finally:
        unlink_namespaces(a.redis_url, [ns])
    figures.update(events=a.events, tagsets=a.tagsets, ticks=a.ticks,
                   new_tagsets=a.new_tagsets, namespace=ns)
    print(json.dumps(figures, indent=2) if a.json else report(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
