"""Redis's CPU per event for each part of the batch script, on the windows a worker writes.

    .venv/bin/python bench/script_parts.py [--events N] [--tagsets N] [--data jobs|uniform]
        [--window N] [--runs N] [--redis-url URL] [--json]

A data set of ``bench/datasets.py`` is priced onto one home partition and folded into windows
of ``--window`` events, as a worker's aggregation folds them. Each variant of the script then
applies every window, in order, to a namespace of its own, and Redis's own CPU (``INFO cpu``)
is divided by the events:

* the whole script;
* the whole script without one of its parts (its dedup memory, its buckets, its tag sets
  with their first buckets): the part's argument is still sent and decoded, but the part
  reads and writes nothing, and no other part reads its keys, so the rest does the same work
  as in the whole script; the difference is the part's cost;
* the script stopped right after it decoded its argument and checked the watermark (each call
  is preceded by a ``SET`` of the watermark it expects).

The variants run in turn, ``--runs`` times. Uses namespaces ``parts<hex>`` and deletes them.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.common import (  # noqa: E402 - needs REPO on the path
    data_set_options,
    redis_client,
    redis_cpu_s,
    unlink_namespaces,
)
from bench.datasets import DATA_SETS, generate  # noqa: E402
from costline.connectors.redis_apply import _SCRIPT  # noqa: E402


def replaced(old: str, new: str) -> str:
    """The script with ``old`` (which must be in it once) replaced."""
    if _SCRIPT.count(old) != 1:
        raise RuntimeError(f"the batch script no longer has {old!r} once: bench out of date")
    return _SCRIPT.replace(old, new)


# The parts are switched off by giving them an empty list instead of their argument.
WHOLE = "whole script"
VARIANTS = {
    WHOLE: _SCRIPT,
    "without its dedup memory": replaced("local dd = a[6]\n", "local dd = {}\n"),
    "without its buckets": replaced("local b = a[7]\n", "local b = {}\n"),
    "without its tag sets and first buckets": replaced("local tagsets = a[8]\n",
                                                       "local tagsets = {}\n"),
    "only the argument and the watermark check": replaced(
        "local TTL, LOAD = a[4], a[5]\n", "do return {2} end\n"),
}


def windows(name: str, events: int, tagsets: int, seed: int, size: int) -> list[Any]:
    """The data set's tallies on one home partition, ``size`` events at most each."""
    from costline.rules.ledger import Intake, Record
    from costline.rules.prices import PriceBook
    from costline.rules.tally import Tally
    from costline.streams.settings import DEFAULT_PRICES
    from costline.streams.worker.collector import settle

    data = generate(name, events, tagsets, 1, seed, run_id="parts")
    intake = Intake(PriceBook.load(DEFAULT_PRICES), 1)
    settle()
    out, tally = [], Tally()
    values = [value for _, _, value in data.messages]
    for first in range(0, len(values), 100):
        for raw in intake.take(values[first:first + 100]).records.get(0, []):
            tally.fold((Record.decode(raw),))
            if tally.events >= size:
                out.append(tally)
                tally = Tally()
    return out + ([tally] if tally.events else [])


def payloads(redis: Any, tallies: list[Any], ns: str) -> list[bytes]:
    """Each window's script argument, naming the tag sets a writer would send with it."""
    from costline.connectors.redis_apply import BatchWriter, _new_tagsets
    from costline.connectors.redis_keys import Calendar, slot_tag

    writer = BatchWriter(redis, ns, Calendar("UTC"), 7 * 86400)
    slot, known, out = slot_tag(ns, 0), {}, []
    for offset, tally in enumerate(tallies):
        fresh = _new_tagsets(tally, known)
        out.append(writer.payload(slot, offset - 1, offset, tally, fresh)[0])
        known.update({tsid: first for tsid, _, first in fresh})
    return out


def run_variant(redis_url: str, script: str, tallies: list[Any]) -> tuple[float, str]:
    """Redis CPU-µs per event of applying every window with ``script``, and the namespace."""
    from costline.connectors.redis_keys import slot_tag, wm_key

    ns = "parts" + secrets.token_hex(3)
    key = wm_key(slot_tag(ns, 0))
    redis = redis_client(redis_url)
    try:
        calls = payloads(redis, tallies, ns)
        sha = redis.script_load(script)
        before = redis_cpu_s(redis)
        for offset, payload in enumerate(calls):
            redis.set(key, offset - 1)
            reply = redis.evalsha(sha, 1, key, payload)
            assert int(reply[0]) == 2, f"window {offset} not applied: {reply!r:.200}"
        used = redis_cpu_s(redis) - before
    finally:
        redis.close()
    return used / sum(t.events for t in tallies) * 1e6, ns


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    data_set_options(p, events=400_000)
    p.set_defaults(tagsets=40_000)
    p.add_argument("--data", choices=DATA_SETS, default="jobs")
    p.add_argument("--window", type=int, default=10_000, help="most events per script call")
    p.add_argument("--runs", type=int, default=2, help="runs of each variant")
    a = p.parse_args(argv)

    tallies = windows(a.data, a.events, a.tagsets, a.seed, a.window)
    figures: dict[str, list[float]] = {name: [] for name in VARIANTS}
    namespaces: list[str] = []
    try:
        for _ in range(a.runs):
            for name, script in VARIANTS.items():
                us, ns = run_variant(a.redis_url, script, tallies)
                figures[name].append(us)
                namespaces.append(ns)
    finally:
        unlink_namespaces(a.redis_url, namespaces)
    if a.json:
        print(json.dumps({"events": a.events, "tagsets": a.tagsets, "data": a.data,
                          "window": a.window, "calls": len(tallies),
                          "redis_us_per_event": figures, "namespaces": namespaces}, indent=2))
        return 0
    print(f"batch script parts: {a.events:,} events of the {a.data} data set, {a.tagsets:,} "
          f"tag sets, windows of {a.window:,} events ({len(tallies)} calls); Redis CPU-µs per "
          "event, each run")
    whole = figures[WHOLE]
    for name, runs in figures.items():
        line = f"  {name:44s} " + "  ".join(f"{us:5.2f}" for us in runs)
        if name.startswith("without"):
            line += "   the part: " + "  ".join(f"{w - us:5.2f}"
                                                for w, us in zip(whole, runs, strict=True))
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
