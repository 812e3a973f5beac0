"""Where the batch script's time goes in Redis: the script cut short at each of its parts in
turn, and the whole script without one of its writes, on the same windows.

    .venv/bin/python bench/script_parts.py [--events N] [--tagsets N] [--window N]
        [--runs N] [--redis-url URL] [--json]

The throughput bench's data set (one partition, 100-event messages) is folded into windows of
``--window`` events as the worker folds them; each variant of the script then applies every
window, in order, to a namespace of its own, and Redis's own CPU (``INFO cpu``) is divided by
the events (with one ``SET`` of the watermark before each call, for the variants that stop
before they write it). The whole script, measured in the same run, is the baseline. A variant
cut short writes nothing, so the parts after the cut read empty buckets. Uses namespaces
``parts<hex>`` and deletes them.
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

from bench.common import data_set_options  # noqa: E402 - needs REPO on the path
from bench.throughput import generate, redis_info, unlink_namespaces  # noqa: E402
from costline.connectors.redis_apply import _SCRIPT  # noqa: E402


def cut_after(line: str) -> str:
    """The script returning as if applied right after ``line``."""
    return _SCRIPT.replace(line, line + "do return {2} end\n", 1)


def without(first: str, up_to: str) -> str:
    """The script without the lines from ``first`` up to (not including) ``up_to``."""
    start = _SCRIPT.index(first)
    return _SCRIPT[:start] + _SCRIPT[_SCRIPT.index(up_to, start):]


# Each name says what the script does up to its cut, or what it leaves out.
VARIANTS = {
    "decode the argument, check the watermark": cut_after("local S = a[3]\n"),
    "+ check the dedup memory": cut_after("if #dups > 0 then return {1, dups} end\n"),
    "+ sum cells into their three buckets": cut_after("local plans = {}\n"),
    "+ read bucket fields, plan new values": cut_after("if #over > 0 then return {3, over} end\n"),
    "whole script (baseline)": _SCRIPT,
    "whole script without the dedup writes": without(
        "for i = 1, #seen, 2 do\n  local key = S .. ':seen:'", "local tagsets = a[9]"),
    "whole script without the bucket writes": _SCRIPT
    .replace("  chunked('HSET', key, out, 1, #out)\n  if #big > 0 and EXACT",
             "  if #big > 0 and EXACT", 1)
    .replace("    chunked('HSET', key, out, 1, #out)\n    for j = 1, #big do",
             "    for j = 1, #big do", 1),
}


def windows(data: Any, size: int) -> list[Any]:
    """The data set's tallies as the worker folds them, ``size`` events at most each."""
    from costline.rules.events import Parsed, parse_message
    from costline.rules.prices import PriceBook
    from costline.rules.tally import Folder, Tally
    from costline.streams.settings import DEFAULT_PRICES
    from costline.streams.worker.collector import settle

    folder, out, tally = Folder(PriceBook.load(DEFAULT_PRICES)), [], Tally()
    settle()
    for message in data.batches(100)[0]:
        parsed = parse_message(message)
        assert isinstance(parsed, Parsed), parsed
        folder.fold(tally, folder.price(parsed.events, parsed.times))
        if tally.events >= size:
            out.append(tally)
            tally = Tally()
    return out + ([tally] if tally.events else [])


def run_variant(redis_url: str, script: str, tallies: list[Any]) -> tuple[float, str]:
    """Redis CPU-µs per event of applying every window with ``script``, and the namespace."""
    from redis import Redis

    from costline.connectors.redis_apply import BatchWriter, _new_tagsets
    from costline.connectors.redis_keys import Calendar, slot_tag, wm_key

    redis = Redis.from_url(redis_url)
    ns = "parts" + secrets.token_hex(3)
    writer, slot = BatchWriter(redis, ns, Calendar("UTC"), 7 * 86400), slot_tag(ns, "usage", 0)
    known: dict[str, int] = {}
    payloads = []
    for offset, tally in enumerate(tallies):
        fresh = _new_tagsets(tally, known)
        payloads.append(writer.payload(slot, offset - 1, offset, tally, fresh)[0])
        known.update({tsid: first for tsid, _, first in fresh})
    sha = redis.script_load(script)
    before = redis_info(redis_url)["cpu_s"]
    for offset, payload in enumerate(payloads):
        # A variant cut short does not move the watermark: set it as a whole one would have.
        redis.set(wm_key(slot), offset - 1)
        reply = redis.evalsha(sha, 1, wm_key(slot), payload)
        assert int(reply[0]) == 2, f"window {offset} not applied: {reply!r:.200}"
    used = redis_info(redis_url)["cpu_s"] - before
    redis.close()
    return used / sum(t.events for t in tallies) * 1e6, ns


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    data_set_options(p, events=400_000)
    p.set_defaults(tagsets=40_000)
    p.add_argument("--window", type=int, default=10_000, help="events per script call")
    p.add_argument("--runs", type=int, default=2, help="runs of each variant")
    a = p.parse_args(argv)

    data = generate(a.events, a.tagsets, 1, 1.1, a.seed, "parts")
    tallies = windows(data, a.window)
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
        print(json.dumps({"events": a.events, "tagsets": a.tagsets, "window": a.window,
                          "redis_us_per_event": figures}, indent=2))
        return 0
    print(f"batch script parts: {a.events:,} events, {a.tagsets:,} tag sets, windows of "
          f"{a.window:,} events ({len(tallies)} calls); Redis CPU-µs per event, each run")
    for name, runs in figures.items():
        print(f"  {name:42s} " + "  ".join(f"{us:5.2f}" for us in runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
