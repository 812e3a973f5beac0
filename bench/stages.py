"""CPU per event of each stage of a worker's path, in one process, without Kafka or Faust.

    .venv/bin/python bench/stages.py [--events N] [--tagsets N] [--partitions N]
        [--data jobs|uniform] [--take N] [--window N] [--redis-url URL] [--json]

A data set of ``bench/datasets.py`` (the same generator and seed as ``bench/throughput.py``)
goes through the stages a worker runs, on the same messages:

* parse: ``parse_message`` on each input message;
* price + route + encode: ``Intake.take`` on takes of ``--take`` messages of one input
  partition (``COSTLINE_BATCH_MESSAGES``), which parses each message again, prices and routes
  its events to their home partitions and encodes the ledger records; its parse is taken off
  with the figure of the stage above;
* decode + fold: each home partition's records, in order, through ``Record.decode`` and
  ``Tally.fold`` into windows of ``--window`` events (``COSTLINE_WINDOW_EVENTS``);
* write: ``BatchWriter.apply`` of each window against a real Redis (the script's argument,
  the round trip and the script), the server's own CPU (``INFO cpu``) apart;
* the usage fields each window writes per event, at each bucket size (a cell is a field of
  its 5-minute bucket, and a tag set's cells share their hour's and their day's);
* and beside them, what compressing the ledger records costs the worker's Kafka producer
  with each codec aiokafka writes (``aiokafka.codec``; lz4 is always level 9 there), and how
  small each makes them (``WORKER_COMPRESSION`` is the codec the worker uses).

``json.loads`` of the same messages is printed as a floor for parsing. Redis's total must
equal the generator's to the micro-unit (exit status 1 otherwise). Uses the namespace
``stages<hex>`` and deletes its keys at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.common import (  # noqa: E402 - needs REPO on the path
    async_redis_client,
    data_set_options,
    log,
    redis_client,
    redis_cpu_s,
    redis_total,
    unlink_namespaces,
    vm_status,
)
from bench.datasets import DATA_SETS, DAY_S, DataSet, generate  # noqa: E402
from costline.connectors.kafka import WORKER_COMPRESSION  # noqa: E402

STAGES = ("parse", "price + route + encode", "decode + fold", "write")
# bucket sizes as keys name them (``bucket_key``) → as the report names them
BUCKET_SIZES = {"5m": "5-minute", "1h": "hourly", "1d": "daily"}
# The level aiokafka's producer compresses at, where it fixes one.
LEVELS = {"lz4": " (level 9)", "zstd": " (level 3)"}


async def run_stages(data: DataSet, ns: str, redis_url: str, take: int = 100,
                     window: int = 10_000) -> dict[str, Any]:
    """Every message of ``data`` through the worker's stages into Redis under ``ns``; the
    CPU seconds of each stage and what was written."""
    from costline.connectors.redis_apply import Applied, BatchWriter
    from costline.connectors.redis_keys import Calendar, slot_tag
    from costline.rules.events import parse_message
    from costline.rules.ledger import Intake, Record
    from costline.rules.prices import PriceBook
    from costline.rules.tally import Tally
    from costline.streams.settings import DEFAULT_PRICES
    from costline.streams.worker.collector import settle

    partitions = data.partitions
    intake = Intake(PriceBook.load(DEFAULT_PRICES), partitions)
    clock = time.process_time
    spent = dict.fromkeys((*STAGES, "take"), 0.0)
    ledger: list[list[bytes]] = [[] for _ in range(partitions)]
    settle()  # the collector as a worker tunes it once started
    for values in data.by_partition():
        for first in range(0, len(values), take):
            chunk = values[first:first + take]
            t0 = clock()
            for value in chunk:
                parse_message(value)
            t1 = clock()
            taken = intake.take(chunk)
            spent["take"] += clock() - t1
            spent["parse"] += t1 - t0
            assert not taken.refused, taken.refused[:3]
            for home, records in taken.records.items():
                ledger[home] += records
    spent["price + route + encode"] = spent["take"] - spent["parse"]
    log(f"{data.name}: priced into {sum(map(len, ledger)):,} ledger records")
    codecs = codec_costs([raw for records in ledger for raw in records])

    redis = async_redis_client(redis_url)
    writer = BatchWriter(redis, ns, Calendar("UTC"), 7 * 86400)
    sync = redis_client(redis_url)
    redis0 = redis_cpu_s(sync)
    events = windows = cells = 0
    fields = dict.fromkeys(BUCKET_SIZES.values(), 0)
    try:
        await writer.register_slots([slot_tag(ns, home) for home in range(partitions)])
        for home, records in enumerate(ledger):
            slot, applied, tally = slot_tag(ns, home), -1, Tally()
            for offset, raw in enumerate(records):
                t0 = clock()
                tally.fold((Record.decode(raw),))
                spent["decode + fold"] += clock() - t0
                if tally.events >= window or offset == len(records) - 1:
                    t0 = clock()
                    outcome = await writer.apply(slot, applied, offset, tally)
                    spent["write"] += clock() - t0
                    assert isinstance(outcome, Applied), outcome
                    events, windows = events + tally.events, windows + 1
                    cells += len(tally.usage)
                    for size, count in bucket_fields(writer, slot, tally).items():
                        fields[size] += count
                    applied, tally = offset, Tally()
        redis_s = redis_cpu_s(sync) - redis0
    finally:
        await redis.aclose()
        sync.close()
    return {"events": events, "windows": windows, "cells_per_window": cells / max(1, windows),
            "ledger_records": sum(map(len, ledger)),
            "bucket_fields_per_event": {size: n / max(1, events) for size, n in fields.items()},
            "us_per_event": {k: spent[k] / events * 1e6 for k in STAGES},
            "take_us_per_event": spent["take"] / events * 1e6,
            "codecs": {name: {"us_per_event": cpu / events * 1e6, "ratio": ratio}
                       for name, (cpu, ratio) in codecs.items()},
            "redis_server_us_per_event": redis_s / events * 1e6}


def bucket_fields(writer: Any, slot: str, tally: Any) -> dict[str, int]:
    """The usage fields one window writes at each bucket size, counted in the script's
    argument the writer builds for it (its 7th item: key, ttl, usage fields in fours, waste
    fields in pairs, ...)."""
    import msgpack

    from costline.connectors.redis_keys import bucket_key

    packed, _ = writer.payload(slot, -1, 0, tally, [])
    buckets = msgpack.unpackb(packed, raw=False)[6]
    counts = dict.fromkeys(BUCKET_SIZES.values(), 0)
    for at in range(0, len(buckets), 4):
        for size, name in BUCKET_SIZES.items():
            if buckets[at].startswith(bucket_key(slot, size, "")):
                counts[name] += len(buckets[at + 2]) // 4
    return counts


async def write_events(events: list[Any], ns: str, redis_url: str, partitions: int) -> None:
    """Parsed events into Redis as a worker counts them: priced and routed to their home
    partitions (``Intake.records``), each home's record folded and written after what its
    slot holds."""
    from costline.connectors.redis_apply import Applied, BatchWriter
    from costline.connectors.redis_keys import Calendar, slot_tag
    from costline.rules.ledger import Intake
    from costline.rules.prices import PriceBook
    from costline.rules.tally import tally_of
    from costline.streams.settings import DEFAULT_PRICES

    redis = async_redis_client(redis_url)
    writer = BatchWriter(redis, ns, Calendar("UTC"), 7 * 86400)
    try:
        records = Intake(PriceBook.load(DEFAULT_PRICES), partitions).records(events)
        await writer.register_slots([slot_tag(ns, home) for home in records])
        for home, record in records.items():
            slot = slot_tag(ns, home)
            applied = await writer.watermark(slot)
            outcome = await writer.apply(slot, applied, applied + 1, tally_of([record]))
            assert isinstance(outcome, Applied), outcome
    finally:
        await redis.aclose()


def codec_costs(records: list[bytes]) -> dict[str, tuple[float, float]]:
    """Per codec aiokafka's producer writes: CPU seconds to compress ``records`` (each on its
    own, as a producer batch of one take's record for a home partition) and the compressed
    size over the raw one."""
    from aiokafka import codec

    encoders = {"lz4": codec.lz4_encode, "zstd": codec.zstd_encode,
                "snappy": codec.snappy_encode, "gzip": codec.gzip_encode}
    raw = sum(map(len, records))
    found = {}
    for name, encode in encoders.items():
        started, size = time.process_time(), 0
        for record in records:
            size += len(encode(record))
        found[name] = (time.process_time() - started, size / max(1, raw))
    return found


def json_floor(data: DataSet) -> float:
    """CPU-µs per event of ``json.loads`` on every message."""
    started = time.process_time()
    for _, _, value in data.messages:
        json.loads(value)
    return (time.process_time() - started) / data.events * 1e6


def report(figures: dict[str, Any]) -> str:
    stages = figures["us_per_event"]
    lines = [
        f"costline worker stages: {figures['events']:,} events of the {figures['data']} data "
        f"set, {figures['tagsets']:,} tag sets, {figures['partitions']} partitions; takes of "
        f"{figures['take']} messages, {figures['ledger_records']:,} ledger records, "
        f"{figures['windows']:,} windows of up to {figures['window']:,} events "
        f"({figures['cells_per_window']:,.0f} cells each)",
        "bucket fields written per event: " + ", ".join(
            f"{size} {n:.2f}" for size, n in figures["bucket_fields_per_event"].items())
        + f" ({sum(figures['bucket_fields_per_event'].values()):.2f} in all)",
        "",
        f"{'CPU-µs per event':44s}",
        f"  {'floor: json.loads':42s}{figures['json_floor_us_per_event']:8.2f}",
    ]
    lines += [f"  {name:42s}{stages[name]:8.2f}" for name in STAGES]
    lines += [
        f"  {'all stages (a worker and its pricers)':42s}{sum(stages.values()):8.2f}",
        f"  {'Redis server (INFO cpu)':42s}{figures['redis_server_us_per_event']:8.2f}",
        "",
        f"{'compressing the ledger records':44s}{'CPU-µs/ev':>9s}  {'size':>5s}",
    ]
    for name, c in figures["codecs"].items():
        label = name + LEVELS.get(name, "") + (" (the worker)" if name == WORKER_COMPRESSION
                                               else "")
        lines.append(f"  {label:42s}{c['us_per_event']:9.2f}  {c['ratio']:5.0%}")
    lines += [
        "",
        f"this process's peak RSS: {figures['peak_rss_mib']:.0f} MiB",
        f"total: generator {figures['expected_cost_micro']:,} micro-units, Redis "
        f"{figures['total_micro']:,}: {'OK' if figures['total_ok'] else 'MISMATCH'}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    data_set_options(p, events=300_000)
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--data", choices=DATA_SETS, default="jobs")
    p.add_argument("--take", type=int, default=100, help="messages per take")
    p.add_argument("--window", type=int, default=10_000, help="most events per Redis write")
    a = p.parse_args(argv)

    ns = "stages" + secrets.token_hex(3)
    data = generate(a.data, a.events, a.tagsets, a.partitions, a.seed, run_id=ns)
    try:
        figures = asyncio.run(run_stages(data, ns, a.redis_url, a.take, a.window))
        total = redis_total(a.redis_url, ns, data.ts_min - DAY_S, data.ts_max + DAY_S)
    finally:
        unlink_namespaces(a.redis_url, [ns])
    figures.update(namespace=ns, data=a.data, tagsets=data.tagsets, partitions=a.partitions,
                   take=a.take, window=a.window, json_floor_us_per_event=json_floor(data),
                   expected_cost_micro=data.expected_micro, total_micro=total,
                   total_ok=total == data.expected_micro,
                   peak_rss_mib=vm_status().get("VmHWM", 0) / 1024)
    print(json.dumps(figures, indent=2) if a.json else report(figures))
    return 0 if figures["total_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
