"""Pricing takes of input messages in a pool of child processes, and in the worker's own."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from costline.rules.ledger import Intake, Record
from costline.rules.prices import PriceBook
from costline.streams.settings import DEFAULT_PRICES
from costline.streams.worker.pricing import InlinePricing, PoolPricing

PRICES = PriceBook.load(DEFAULT_PRICES)


def message(n: int, size: int = 10) -> bytes:
    return json.dumps([{"event_id": f"e{n}-{i}", "kind": "usage", "ts": 1_700_000_000,
                        "resource_id": "n", "resource_type": "gpu.h100", "quantity": 1,
                        "unit": "gpu_hour", "tags": {"team": "a"}} for i in range(size)]).encode()


def entries(taken) -> list:  # noqa: ANN001
    return sorted(e for raws in taken.records.values() for raw in raws
                  for e in Record.decode(raw).entries)


@pytest.fixture
def pool():
    pricing = PoolPricing(DEFAULT_PRICES, 4, 2, Intake(PRICES, 4))
    yield pricing
    pricing.close()


async def test_the_pool_prices_a_take_as_the_worker_would(pool):
    values = [message(0), b"{oops", message(1)]
    here = await InlinePricing(Intake(PRICES, 4)).submit(values)
    there = await pool.submit(values)
    assert there.refused == here.refused == [(1, "invalid_json", here.refused[0][2])]
    assert there.events == here.events == 20
    assert entries(there) == entries(here)


async def test_takes_priced_side_by_side_each_get_their_own_answer(pool):
    answers = await asyncio.gather(*(pool.submit([message(n)]) for n in range(6)))
    assert [entries(a) for a in answers] == [
        entries(Intake(PRICES, 4).take([message(n)])) for n in range(6)]


def pricers() -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(os.getpid()), "-x", "costline-pricer"],
                           capture_output=True, text=True).stdout.split()
    return [int(pid) for pid in found]


async def test_the_pool_starts_every_process_before_the_first_take(pool):
    before = set(pricers())  # another test's pool may still be ending
    await pool.start()
    # Both are spawned; the one that answered first may have answered both warm-up calls
    # while the other was still starting.
    deadline = time.monotonic() + 20
    while len(set(pricers()) - before) < 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert len(set(pricers()) - before) == 2
    assert (await pool.submit([message(0)])).events == 10


async def test_a_pricing_process_that_dies_is_replaced_and_no_take_is_lost(pool):
    await pool.submit([message(0)])
    first = pricers()
    assert first
    for pid in first:
        os.kill(pid, signal.SIGKILL)
    answer = await asyncio.wait_for(pool.submit([message(1)]), timeout=60)
    assert answer.events == 10
    assert set(pricers()).isdisjoint(first)


async def test_pricing_processes_ignore_sigterm_and_end_with_the_pool(pool):
    await pool.submit([message(0)])
    pids = pricers()
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    assert (await pool.submit([message(1)])).events == 10  # still there
    pool.close()
    deadline = time.monotonic() + 20
    while pricers() and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert pricers() == []


def running(pid: str) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def test_pricing_processes_end_when_the_worker_is_killed(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(f"""
import asyncio, os, sys
sys.path.insert(0, {str(os.getcwd())!r})
from costline.rules.ledger import Intake
from costline.rules.prices import PriceBook
from costline.streams.settings import DEFAULT_PRICES
from costline.streams.worker.pricing import PoolPricing
async def main():
    pool = PoolPricing(DEFAULT_PRICES, 2, 2, Intake(PriceBook.load(DEFAULT_PRICES), 2))
    await pool.submit([b"[]"])
    print("ready", flush=True)
    await asyncio.sleep(600)
if __name__ == "__main__":
    asyncio.run(main())
""")
    worker = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout is not None and worker.stdout.readline().strip() == "ready"
        children = subprocess.run(["pgrep", "-P", str(worker.pid), "-x", "costline-pricer"],
                                  capture_output=True, text=True).stdout.split()
        assert children
        worker.kill()
        worker.wait(10)
        deadline = time.monotonic() + 20
        alive = children
        while alive and time.monotonic() < deadline:
            alive = [pid for pid in children if running(pid)]
            time.sleep(0.1)
        assert alive == []
    finally:
        if worker.poll() is None:
            worker.kill()
