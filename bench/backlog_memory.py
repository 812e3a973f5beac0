"""A worker's memory on a backlog over many partitions while Redis stops writing for a while.

    .venv/bin/python bench/backlog_memory.py [--events N] [--tagsets N] [--partitions N]
        [--pause-s S] [--bootstrap HOST:PORT] [--redis-url URL] [--json]

``COSTLINE_WINDOW_EVENTS`` bounds what one partition holds folded and not yet written; a worker
owning many partitions of a backlog, while Redis is behind, could hold that much for each of
them. ``COSTLINE_UNWRITTEN_EVENTS`` bounds all of them together. This bench measures both
ways in one run, on the same data set (``bench/throughput.py``'s generator, 100-event
messages, each copy on a topic of ``--partitions`` partitions):

  bounded:   a real ``costline worker`` with the default ``COSTLINE_UNWRITTEN_EVENTS``;
  baseline:  the same worker with the bound set out of reach (only the per-partition one).

Each worker starts on its backlog; once it has taken messages, Redis is made to hold every
write (``CLIENT PAUSE … WRITE``) for ``--pause-s`` seconds, then lets them through. It prints
the most events the worker held unwritten (its ``costline_unwritten_events`` gauge, read every
0.2 s), the peak RSS of the worker and of its folding processes (summed), how long the backlog took
from start to the last watermark, and checks that Redis's total equals the generator's.
Uses the namespaces ``backlog<hex>b`` and ``backlog<hex>u`` and deletes them at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
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
    data_set_options,
    free_port,
    vm_status,
)
from bench.throughput import (  # noqa: E402
    DEFAULT_BOOTSTRAP,
    delete_namespace,
    end_offsets,
    generate,
    log,
    produce,
    redis_total,
    scrape_metrics,
    watermarks,
)

OUT_OF_REACH = 10**9
# case → (its namespace's suffix, COSTLINE_UNWRITTEN_EVENTS)
CASES = {"bounded": ("b", None), "baseline": ("u", OUT_OF_REACH)}


def start_worker(a: argparse.Namespace, ns: str, port: int, unwritten: int | None,
                 rules: str, logfile: Any) -> subprocess.Popen[bytes]:
    env = dict(os.environ, COSTLINE_NAMESPACE=ns, COSTLINE_KAFKA_BOOTSTRAP=a.bootstrap,
               COSTLINE_REDIS_URL=a.redis_url, COSTLINE_PARTITIONS=str(a.partitions),
               COSTLINE_WEB_PORT=str(port), COSTLINE_RULES=rules)
    if unwritten is not None:
        env["COSTLINE_UNWRITTEN_EVENTS"] = str(unwritten)
    costline = Path(sys.executable).with_name("costline")
    return subprocess.Popen([str(costline), "worker"], cwd=REPO, env=env, stdout=logfile,
                            stderr=subprocess.STDOUT)


def run_case(a: argparse.Namespace, ns: str, unwritten: int | None, ends: dict[int, int],
             rules: str, workdir: str) -> dict[str, Any]:
    from redis import Redis

    r = Redis.from_url(a.redis_url)
    port = free_port()
    with open(Path(workdir) / f"{ns}.log", "wb") as logfile:
        worker = start_worker(a, ns, port, unwritten, rules, logfile)
        started = time.perf_counter()
        held = peak_rss = 0
        paused_at: float | None = None
        try:
            while True:
                if worker.poll() is not None:
                    raise RuntimeError(f"the worker exited ({worker.returncode}); "
                                       f"see {logfile.name}")
                figures = scrape_metrics(port)  # logs until its web server answers
                held = max(held, int(figures.get("costline_unwritten_events", 0)))
                peak_rss = max(peak_rss, vm_status(worker.pid).get("VmHWM", 0))
                if paused_at is None and figures.get("costline_messages_total", 0) > 0:
                    r.execute_command("CLIENT", "PAUSE", int(a.pause_s * 1000), "WRITE")
                    paused_at = time.perf_counter()
                    log(f"{ns}: Redis holds writes for {a.pause_s:.0f}s")
                marks = watermarks(r, ns, a.partitions)
                if all(marks[p] >= end - 1 for p, end in ends.items()):
                    break
                time.sleep(0.2)
            took = time.perf_counter() - started
            children = child_figures(worker.pid)
            peak_rss = max(peak_rss, vm_status(worker.pid).get("VmHWM", 0))
        finally:
            r.execute_command("CLIENT", "UNPAUSE")
            worker.terminate()
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
            r.close()
    return {"unwritten_events_setting": unwritten, "held_events_max": held,
            "worker_peak_rss_mib": peak_rss / 1024,
            "folder_peak_rss_mib": children.get("folder_VmHWM", 0) / 1024,
            "seconds": took}


def report(figures: dict[str, Any]) -> str:
    lines = [
        f"costline worker on a backlog: {figures['events']:,} events in 100-event messages, "
        f"{figures['tagsets']:,} tag sets, {figures['partitions']} partitions, Redis holding "
        f"writes for {figures['pause_s']:.0f} s",
        "",
        f"{'':34s}{'unwritten bound':>16s}{'most held':>12s}{'worker RSS':>12s}"
        f"{'folder RSS':>12s}{'took':>8s}  total",
    ]
    for name, case in figures["cases"].items():
        bound = case["unwritten_events_setting"]
        shown = "default" if bound is None else ("none" if bound >= OUT_OF_REACH else f"{bound:,}")
        lines.append(
            f"  {name:32s}{shown:>16s}{case['held_events_max']:>12,}"
            f"{case['worker_peak_rss_mib']:>9.0f} MiB{case['folder_peak_rss_mib']:>9.0f} MiB"
            f"{case['seconds']:>7.1f}s  {'OK' if case['total_ok'] else 'MISMATCH'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    data_set_options(p, events=600_000)
    p.add_argument("--partitions", type=int, default=48)
    p.add_argument("--pause-s", type=float, default=8.0,
                   help="how long Redis holds writes (under the worker's 10 s socket timeout)")
    p.add_argument("--bootstrap", default=DEFAULT_BOOTSTRAP)
    a = p.parse_args(argv)

    from costline.streams.settings import Settings
    from costline.streams.topics import create_topics

    run_id = "backlog" + secrets.token_hex(3)
    data = generate(a.events, a.tagsets, a.partitions, 1.1, a.seed, run_id)
    parts = data.batches(100)
    namespaces = {case: run_id + suffix for case, (suffix, _) in CASES.items()}
    figures: dict[str, Any] = {"events": a.events, "tagsets": data.tagsets,
                               "partitions": a.partitions, "pause_s": a.pause_s, "cases": {}}
    try:
        with tempfile.TemporaryDirectory(prefix="costline-backlog-") as workdir:
            rules = Path(workdir) / "rules"
            rules.mkdir()  # no rules: the worker's memory is the aggregation's
            for case, (_, unwritten) in CASES.items():
                ns = namespaces[case]
                settings = Settings(kafka_bootstrap=a.bootstrap, namespace=ns,
                                    partitions=a.partitions)
                create_topics(settings)
                produce(a.bootstrap, settings.topic("usage"), parts, case)
                ends = end_offsets(a.bootstrap, settings.topic("usage"), a.partitions)
                log(f"{case}: starting the worker")
                result = run_case(a, ns, unwritten, ends, str(rules), workdir)
                total = redis_total(a.redis_url, ns, data.ts_min, data.ts_max)
                result["total_ok"] = total == data.expected_cost_micro
                figures["cases"][case] = result
                log(f"{case}: {result}")
    finally:
        delete_namespace(a.bootstrap, a.redis_url, list(namespaces.values()))
    print(json.dumps(figures, indent=2) if a.json else report(figures))
    return 0 if all(c["total_ok"] for c in figures["cases"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
