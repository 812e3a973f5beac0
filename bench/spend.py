"""How long ``costline spend`` takes to answer over many tag sets.

    .venv/bin/python bench/spend.py [--events N] [--tagsets N] [--repeats N]
        [--redis-url URL] [--json]

The ``jobs`` data set (``bench/datasets.py``, the generator and seed of ``bench/throughput.py``:
two days of events) is written into a namespace of its own through a worker's stages
(``bench/stages.py``). Then
``spend_report``, what ``costline spend --json`` prints without the command's start-up, answers
a few questions over the days the data set covers: first with a fresh ``RedisState`` (it reads
every tag set's dimensions, as each ``costline spend`` does), then again on the same one (the
dimensions kept, as in the worker's evaluation process). Medians of ``--repeats``.

Baseline, measured in the same run: reading the same buckets and tag sets raw (HGETALL of each,
nothing decoded), what any reader of this key layout pays before adding anything up. Uses the
namespace ``spendbench<hex>`` and deletes its keys at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import sys
import time
from collections.abc import Callable
from decimal import Decimal
from functools import partial
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
)
from bench.datasets import DAY_S, generate  # noqa: E402
from bench.stages import run_stages  # noqa: E402

PARTITIONS = 4
# (label, --by, --where, --peaks): a few groups, one row per job, peaks, and a filter.
QUESTIONS: tuple[tuple[str, list[str], dict[str, str], bool], ...] = (
    ("--by team", ["team"], {}, False),
    ("--by job", ["job"], {}, False),
    ("--by team,category --peaks", ["team", "category"], {}, True),
    ("--by project --where env=prod", ["project"], {"env": "prod"}, False),
)


def timed(call: Callable[[], Any]) -> tuple[float, float, Any]:
    """(wall s, CPU s of this process, the call's result)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = call()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def raw_read(redis: Any, state: Any, start: float, end: float) -> int:
    """Every bucket and tag set a question over [start, end) reads, fetched and not decoded;
    returns the number of fields."""
    from costline.connectors.redis_keys import bucket_key, cover, tagsets_key

    buckets = list(cover(start, end, state.calendar))
    fields = 0
    for slot in state.slots():
        pipe = redis.pipeline(transaction=False)
        for size, label in buckets:
            pipe.hgetall(bucket_key(slot, size, label))
        pipe.hgetall(tagsets_key(slot))
        fields += sum(len(found) for found in pipe.execute())
    return fields


def measure(ns: str, redis_url: str, start: float, end: float, repeats: int
            ) -> dict[str, Any]:
    from costline.connectors.redis_state import RedisState
    from costline.streams.cli.spend_cmd import parse_filters, spend_report

    redis = redis_client(redis_url)
    out: dict[str, Any] = {}
    baseline = [timed(lambda: raw_read(redis, RedisState(redis, ns, "UTC"), start, end))
                for _ in range(repeats)]
    out["raw read (baseline)"] = {"fields": baseline[0][2], **_medians(baseline)}
    for label, by, where, peaks in QUESTIONS:
        filters = parse_filters([f"{k}={v}" for k, v in where.items()])
        first, again = [], []
        for _ in range(repeats):
            ask = partial(spend_report, RedisState(redis, ns, "UTC"), "USD", by, filters,
                          start, end, peaks)
            first.append(timed(ask))
            again.append(timed(ask))
            assert first[-1][2] == again[-1][2], f"{label}: a second answer differs"
        out[label] = {"rows": len(first[0][2]["rows"]), "first": _medians(first),
                      "again": _medians(again), "cost_micro": _cost_micro(first[0][2])}
        log(f"{label}: {out[label]['rows']:,} rows")
    redis.close()
    return out


def _cost_micro(answer: dict[str, Any]) -> int:
    """The answer's spend over all its rows, in micro-units."""
    return sum(int(Decimal(row["cost"]) * 1_000_000) for row in answer["rows"])


def _medians(runs: list[tuple[float, float, Any]]) -> dict[str, float]:
    return {"wall_s": statistics.median(r[0] for r in runs),
            "cpu_s": statistics.median(r[1] for r in runs)}


def report(figures: dict[str, Any]) -> str:
    lines = [
        f"costline spend: {figures['tagsets']:,} tag sets ({figures['events']:,} events), "
        f"{figures['days']} days of daily buckets, median of {figures['repeats']}",
        "",
        f"{'':38s}{'rows':>8s}{'first s':>10s}{'CPU s':>8s}{'again s':>10s}{'CPU s':>8s}",
    ]
    for label, f in figures["questions"].items():
        if "rows" not in f:
            lines.append(f"  {label:36s}{f['fields']:>8,}{f['wall_s']:10.3f}{f['cpu_s']:8.3f}"
                         "   (fields; the buckets and tag sets, fetched undecoded)")
            continue
        lines.append(f"  {label:36s}{f['rows']:>8,}{f['first']['wall_s']:10.3f}"
                     f"{f['first']['cpu_s']:8.3f}{f['again']['wall_s']:10.3f}"
                     f"{f['again']['cpu_s']:8.3f}")
    lines.append("(first: a fresh state reads every tag set's dimensions, as each command "
                 "does; again: kept)")
    lines.append(f"total check (each answer without a filter == generator): "
                 f"{'OK' if figures['total_ok'] else 'MISMATCH'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    data_set_options(p)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)

    ns = "spendbench" + secrets.token_hex(3)
    data = generate("jobs", a.events, a.tagsets, PARTITIONS, a.seed, run_id=ns)
    # Whole UTC days around the data set: read from daily buckets, as a month would be.
    start = data.ts_min // DAY_S * DAY_S
    end = (data.ts_max // DAY_S + 1) * DAY_S
    try:
        asyncio.run(run_stages(data, ns, a.redis_url))
        questions = measure(ns, a.redis_url, start, end, a.repeats)
    finally:
        unlink_namespaces(a.redis_url, [ns])
    # Every question without a filter sums every event: each must equal the generator's total.
    whole = [label for label, _, where, _ in QUESTIONS if not where]
    figures = {"events": a.events, "tagsets": a.tagsets, "repeats": a.repeats,
               "days": int((end - start) // DAY_S), "namespace": ns, "questions": questions,
               "expected_cost_micro": data.expected_micro,
               "total_ok": all(questions[label]["cost_micro"] == data.expected_micro
                               for label in whole)}
    print(json.dumps(figures, indent=2) if a.json else report(figures))
    return 0 if figures["total_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
