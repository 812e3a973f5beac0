"""How long ``GET /api/v1/spend`` takes to answer over many tag sets.

    .venv/bin/python bench/api.py [--tagsets N] [--requests N] [--redis-url URL] [--json]

``--tagsets`` tag sets (100,000 by default: ``team`` × ``project`` × a ``job`` of their own),
one usage event each in the current month, are written into a namespace of its own as the
worker writes them (``costline.rules.ledger.Intake``, ``costline.rules.tally.tally_of``,
``costline.connectors.redis_apply.BatchWriter``, one window per home partition and 10,000
events). Then ``costline serve`` answers ``--requests`` requests of each question, one at a
time over one kept-alive connection, after one request that warms its reader (the first reads
every tag set's dimensions, as each ``costline spend`` does; the server keeps them). Each
answer's total is checked against what was written. Prints p50, p99 and the slowest, in ms.

Uses the namespace ``apibench<hex>`` and deletes its keys at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.common import DEFAULT_REDIS  # noqa: E402 - needs REPO on the path
from bench.throughput import log, unlink_namespaces  # noqa: E402
from tests.integration.streamkit import free_port  # noqa: E402

PARTITIONS = 6
WINDOW = 10_000
QUESTIONS = ("by=team", "by=project&where=team=t3", "by=team,category&where=env=prod",
             "by=job&where=project=p17")


def events(count: int, now: float) -> list[Any]:
    """One usage event per tag set, spread over the hours of this month before now."""
    from costline.rules.durations import period_bounds
    from costline.rules.events import UsageEvent

    start, _ = period_bounds(now, "month", "UTC")
    span = max(1.0, now - 60 - start)
    return [UsageEvent.model_validate({
        "event_id": f"b{i}", "kind": "usage", "ts": start + span * i / count,
        "resource_id": f"node-{i % 512}", "resource_type": "gpu.h100", "unit": "gpu_hour",
        "quantity": 1 + i % 8, "tags": {"team": f"t{i % 20}", "project": f"p{i % 200}",
                                        "job": f"j{i}", "env": ("prod", "dev")[i % 2]}})
        for i in range(count)]


async def write(redis_url: str, namespace: str, found: list[Any]) -> int:
    """Write the events as the worker does; returns their cost in micro-units."""
    from costline.connectors import bucket_zone
    from costline.connectors.redis_apply import Applied, BatchWriter
    from costline.connectors.redis_client import connect, connect_async
    from costline.connectors.redis_keys import Calendar, slot_tag
    from costline.rules.ledger import Intake
    from costline.rules.prices import PriceBook
    from costline.rules.tally import tally_of
    from costline.streams.settings import DEFAULT_PRICES

    with connect(redis_url) as sync:
        bucket_zone.claim(sync, namespace, "UTC")
    client = connect_async(redis_url)
    writer = BatchWriter(client, namespace, Calendar("UTC"), dedup_ttl=86400)
    intake = Intake(PriceBook.load(DEFAULT_PRICES), PARTITIONS)
    marks: dict[str, int] = {}
    total = 0
    try:
        for first in range(0, len(found), WINDOW):
            for home, record in intake.records(found[first:first + WINDOW]).items():
                slot = slot_tag(namespace, home)
                await writer.register_slots([slot])
                mark = marks.get(slot, -1)
                assert await writer.apply(slot, mark, mark + 1, tally_of([record])) == Applied()
                marks[slot] = mark + 1
                total += sum(entry[4] for entry in record.entries)
    finally:
        await client.aclose()
    return total


def serve(redis_url: str, namespace: str, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "COSTLINE_REDIS_URL": redis_url, "COSTLINE_NAMESPACE": namespace}
    env.pop("COSTLINE_API_TOKEN", None)
    process = subprocess.Popen([sys.executable, "-m", "costline.streams", "serve", "--host",
                                "127.0.0.1", "--port", str(port)], cwd=REPO, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            http.client.HTTPConnection("127.0.0.1", port, timeout=1).request("GET", "/healthz")
            return process
        except OSError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit("costline serve did not start")


def measure(port: int, query: str, requests: int) -> tuple[list[float], dict[str, Any]]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    times, answer = [], {}
    for _ in range(requests + 1):
        started = time.perf_counter()
        connection.request("GET", f"/api/v1/spend?{query}")
        response = connection.getresponse()
        body = response.read()
        times.append(time.perf_counter() - started)
        assert response.status == 200, body[:300]
        answer = json.loads(body)
    connection.close()
    return times[1:], answer  # the first warmed the server's reader


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(share * len(ordered))) - 1))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tagsets", type=int, default=100_000)
    p.add_argument("--requests", type=int, default=100)
    p.add_argument("--redis-url", default=os.environ.get("COSTLINE_REDIS_URL", DEFAULT_REDIS))
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    a = p.parse_args(argv)

    namespace = "apibench" + secrets.token_hex(3)
    port = free_port()
    figures: dict[str, Any] = {"tagsets": a.tagsets, "requests": a.requests, "questions": {}}
    process = None
    try:
        log(f"writing {a.tagsets:,} tag sets into {namespace}")
        expected = asyncio.run(write(a.redis_url, namespace, events(a.tagsets, time.time())))
        process = serve(a.redis_url, namespace, port)
        for query in QUESTIONS:
            times, answer = measure(port, query, a.requests)
            whole = "where" not in query
            cost = sum(int(Decimal(row["cost"]) * 1_000_000) for row in answer["rows"])
            figures["questions"][query] = {
                "rows": len(answer["rows"]), "p50_ms": statistics.median(times) * 1000,
                "p99_ms": percentile(times, 0.99) * 1000, "max_ms": max(times) * 1000,
                "total_ok": cost == expected if whole else None}
            log(f"{query}: done")
    finally:
        if process is not None:
            process.terminate()
            process.wait(20)
        unlink_namespaces(a.redis_url, [namespace])
    if a.json:
        print(json.dumps(figures, indent=2))
    else:
        print(f"GET /api/v1/spend on costline serve: {a.tagsets:,} tag sets, {a.requests} "
              f"requests per question, one at a time")
        print(f"  {'query':40s}{'rows':>8s}{'p50 ms':>10s}{'p99 ms':>10s}{'max ms':>10s}")
        for query, f in figures["questions"].items():
            print(f"  {query:40s}{f['rows']:>8,}{f['p50_ms']:10.1f}{f['p99_ms']:10.1f}"
                  f"{f['max_ms']:10.1f}")
    ok = all(f["total_ok"] is not False for f in figures["questions"].values())
    if not a.json:
        print(f"total check (each answer without a filter == what was written): "
              f"{'OK' if ok else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
