"""Where the aggregation's time goes, stage by stage, without Kafka or Faust in the way.

    .venv/bin/python bench/stages.py [--events N] [--tagsets N] [--partitions N]
        [--window N] [--batch-size N] [--take N] [--redis-url URL] [--json]

The data set of ``bench/throughput.py`` (same generator, same seed), in 100-event batch
messages, goes through the worker's hot path in this one process, partition by partition and
window by window as the worker folds it: ``parse_message``, ``Folder.price``, ``Folder.fold``,
then ``BatchWriter.apply`` (building the script's argument, the round trip and the script
itself) against a real Redis. It prints CPU-µs per event of each stage, the Redis server's CPU
per event (``INFO cpu``), cells per window, and checks that Redis's total equals the
generator's.

Baselines, measured in the same run on the same messages: ``json.loads`` and pydantic's
compiled validator alone (what parsing cannot go below).

Then the same messages in takes of ``--take`` messages, as a folding process gets them:
``costline.streams.worker.folding.screen`` (each message parsed, priced and folded before the
next), beside
the take parsed whole, then priced, then folded (every event of the take alive at once), with
Python's cyclic collector on and off.

Uses the namespace ``stages<hex>`` and deletes its keys at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import secrets
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.common import data_set_options, vm_status  # noqa: E402 - needs REPO on the path
from bench.throughput import (  # noqa: E402
    generate,
    log,
    redis_info,
    redis_total,
    unlink_namespaces,
)

STAGES = ("parse", "price", "fold", "write")


def floor_baselines(messages: list[bytes], events: int) -> dict[str, float]:
    """µs per event of the two parsers a message goes through at the least."""
    from costline.rules.events import _validate_batch

    out = {}
    for name, parse in (("json.loads", json.loads),
                        ("pydantic core validate_json", _validate_batch)):
        started = time.process_time()
        for message in messages:
            parse(message)
        out[name] = (time.process_time() - started) / events * 1e6
    return out


async def run_stages(parts: list[list[bytes]], ns: str, redis_url: str, window: int
                     ) -> dict[str, Any]:
    from redis.asyncio import Redis

    from costline.connectors.redis_apply import Applied, BatchWriter
    from costline.connectors.redis_keys import Calendar, slot_tag
    from costline.rules.events import Parsed, parse_message
    from costline.rules.prices import PriceBook
    from costline.rules.tally import Folder, Tally
    from costline.streams.settings import DEFAULT_PRICES
    from costline.streams.worker.collector import settle

    folder = Folder(PriceBook.load(DEFAULT_PRICES))
    redis = Redis.from_url(redis_url)
    writer = BatchWriter(redis, ns, Calendar("UTC"), 7 * 86400)
    spent = dict.fromkeys(STAGES, 0.0)
    clock = time.process_time
    events = cells = windows = 0
    settle()  # as the worker does once started
    cpu0 = redis_info(redis_url)["cpu_s"]
    for partition, messages in enumerate(parts):
        slot = slot_tag(ns, "usage", partition)
        await writer.register_slots([slot])
        applied, tally = -1, Tally()
        for offset, message in enumerate(messages):
            t0 = clock()
            parsed = parse_message(message)
            t1 = clock()
            assert isinstance(parsed, Parsed), parsed
            priced = folder.price(parsed.events, parsed.times)
            t2 = clock()
            folder.fold(tally, priced)
            spent["parse"] += t1 - t0
            spent["price"] += t2 - t1
            spent["fold"] += clock() - t2
            if tally.events >= window or offset == len(messages) - 1:
                t3 = clock()
                outcome = await writer.apply(slot, applied, offset, tally)
                spent["write"] += clock() - t3
                assert isinstance(outcome, Applied), outcome
                events, cells, windows = events + tally.events, cells + len(tally.sums), windows + 1
                applied, tally = offset, Tally()
        log(f"partition {partition}: {len(messages):,} messages applied")
    redis_s = redis_info(redis_url)["cpu_s"] - cpu0
    await redis.aclose()
    return {"events": events, "windows": windows, "cells_per_window": cells / windows,
            "us_per_event": {k: v / events * 1e6 for k, v in spent.items()},
            "redis_server_us_per_event": redis_s / events * 1e6}


def take_screening(parts: list[list[bytes]], take: int) -> dict[str, float]:
    """CPU-µs per event of screening takes of ``take`` messages: as a folding process does,
    and with the whole take parsed before anything is priced (the collector on, then off).
    Two passes over the takes, each running the ways in turn; the second is reported (the first
    warms each way's own folder). Runs after ``run_stages``, so the collector is tuned as in a
    folding process."""
    from costline.rules.events import Parsed, parse_message
    from costline.rules.prices import PriceBook
    from costline.rules.tally import Folder, Tally
    from costline.streams.settings import DEFAULT_PRICES
    from costline.streams.worker.folding import screen

    def parsed_first(folder: Folder, values: list[bytes]) -> Tally:
        verdicts = [parse_message(value) for value in values]
        priced = [p for v in verdicts if isinstance(v, Parsed)
                  for p in folder.price(v.events, v.times)]
        tally = Tally()
        folder.fold(tally, priced)
        return tally

    def parsed_first_uncollected(folder: Folder, values: list[bytes]) -> Tally:
        gc.disable()  # what the take would cost if the collector never walked it
        try:
            return parsed_first(folder, values)
        finally:
            gc.enable()

    ways = {"screen, message by message": lambda f, v: screen(f, v).tally,
            "baseline: the take parsed first": parsed_first,
            "  the same, the collector off": parsed_first_uncollected}
    folders = {name: Folder(PriceBook.load(DEFAULT_PRICES)) for name in ways}
    spent, events = dict.fromkeys(ways, 0.0), dict.fromkeys(ways, 0)
    takes = [part[i:i + take] for part in parts for i in range(0, len(part), take)]
    for _ in range(2):
        for name, way in ways.items():
            spent[name], events[name] = 0.0, 0
            for values in takes:
                started = time.process_time()
                tally = way(folders[name], values)
                spent[name] += time.process_time() - started
                events[name] += tally.events
    return {name: spent[name] / events[name] * 1e6 for name in ways}


def report(figures: dict[str, Any]) -> str:
    stages = figures["us_per_event"]
    worker = sum(stages.values())
    lines = [
        f"costline aggregation stages: {figures['events']:,} events, "
        f"{figures['tagsets']:,} tag sets, {figures['partitions']} partitions, "
        f"windows of {figures['window']:,} events ({figures['windows']} written, "
        f"{figures['cells_per_window']:,.0f} cells each)",
        "",
        f"{'CPU-µs per event':40s}{'':>10s}",
    ]
    for name, value in figures["baselines"].items():
        lines.append(f"  baseline: {name:30s}{value:10.2f}")
    for name in STAGES:
        lines.append(f"  {name:40s}{stages[name]:10.2f}")
    lines += [
        f"  {'worker, all stages':40s}{worker:10.2f}",
        f"  {'Redis server (INFO cpu)':40s}{figures['redis_server_us_per_event']:10.2f}",
        "",
        f"{'a take of ' + str(figures['take']) + ' messages, CPU-µs per event':40s}",
        *(f"  {name:40s}{value:10.2f}" for name, value in figures["takes"].items()),
        "",
        f"this process's peak RSS: {figures['peak_rss_mib']:.0f} MiB",
        f"total check (Redis == generator): {'OK' if figures['total_ok'] else 'MISMATCH'}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    data_set_options(p)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--window", type=int, default=10_000,
                   help="events folded per Redis write (the worker's COSTLINE_WINDOW_EVENTS)")
    p.add_argument("--batch-size", type=int, default=100, help="events per message")
    p.add_argument("--zipf", type=float, default=1.1)
    p.add_argument("--take", type=int, default=100,
                   help="messages per take (as many as the worker takes at once, "
                   "COSTLINE_BATCH_MESSAGES)")
    a = p.parse_args(argv)

    ns = "stages" + secrets.token_hex(3)
    data = generate(a.events, a.tagsets, a.partitions, a.zipf, a.seed, ns)
    parts = data.batches(a.batch_size)
    flat = [m for part in parts for m in part]
    try:
        figures = asyncio.run(run_stages(parts, ns, a.redis_url, a.window))
        figures["baselines"] = floor_baselines(flat, figures["events"])
        figures["takes"] = take_screening(parts, a.take)
        total = redis_total(a.redis_url, ns, data.ts_min, data.ts_max)
    finally:
        unlink_namespaces(a.redis_url, [ns])
    figures.update(namespace=ns, tagsets=a.tagsets, partitions=a.partitions, window=a.window,
                   take=a.take,
                   total_ok=total == data.expected_cost_micro,
                   peak_rss_mib=vm_status().get("VmHWM", 0) / 1024)
    print(json.dumps(figures, indent=2) if a.json else report(figures))
    return 0 if figures["total_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
