"""What crosses between the worker and its folding process: everything a take's answer holds."""

from __future__ import annotations

import asyncio
import json

from costline.rules.prices import PriceBook
from costline.rules.tally import Folder, Tally
from costline.streams.settings import DEFAULT_PRICES
from costline.streams.worker.folding import (
    FoldingPool,
    ProcessFolding,
    Screened,
    _pack_answer,
    _unpack_answer,
    screen,
)

T0 = 1_796_025_600


def message(**event: object) -> bytes:
    return json.dumps(event).encode()


def take() -> list[bytes]:
    usage = {"kind": "usage", "ts": T0, "resource_id": "n1", "resource_type": "gpu.h100",
             "quantity": 8, "unit": "gpu_hour", "tags": {"team": "a", "env": "prod"}}
    return [
        message(event_id="u1", **usage),
        json.dumps([{**usage, "event_id": "u2", "ts": T0 + 400},
                    {**usage, "event_id": "u1"}]).encode(),  # a resend within the take
        b"not json",
        message(event_id="f1", kind="fault", ts=T0, fault="node_failure",
                resource_type="gpu.h100", units=8, lost_seconds=600, recovery_seconds=60,
                tags={"team": "a"}),
        message(event_id="m1", kind="utilization", ts=T0, resource_id="n1",
                resource_type="gpu.h100", metric="gpu_util", value=0.02, tags={"team": "a"}),
        message(event_id="x1", **{**usage, "unit": "gb"}),  # the book prices gpu_hour
    ]


def same(a: Tally, b: Tally) -> bool:
    return (a.sums, a.tagsets, a.digests, a.seen, a.samples, a.latest, a.faults, a.events) == (
        b.sums, b.tagsets, b.digests, b.seen, b.samples, b.latest, b.faults, b.events)


def test_an_answer_crosses_whole():
    screened = screen(Folder(PriceBook.load(DEFAULT_PRICES)), take())
    assert [code for _, code, _ in screened.refused] == ["invalid_json", "unit_mismatch"]
    assert screened.tally.events == 4 and screened.tally.samples and screened.tally.faults
    [back] = _unpack_answer(_pack_answer([screened]))
    assert back.refused == screened.refused
    assert same(back.tally, screened.tally)


def test_a_message_the_book_cannot_price_adds_nothing_of_itself():
    """Messages are folded one by one as they are priced: a batch whose second event cannot be
    priced adds not even its first, and the messages around it are counted."""
    folder = Folder(PriceBook.load(DEFAULT_PRICES))
    usage = {"kind": "usage", "ts": T0, "resource_id": "n1", "resource_type": "gpu.h100",
             "quantity": 1, "unit": "gpu_hour", "tags": {"team": "a"}}
    values = [message(event_id="u1", **usage),
              json.dumps([{**usage, "event_id": "u2"},
                          {**usage, "event_id": "u3", "unit": "gb"}]).encode(),
              message(event_id="u4", **usage)]
    screened = screen(folder, values)
    assert [(index, code) for index, code, _ in screened.refused] == [(1, "unit_mismatch")]
    assert "event 1" in screened.refused[0][2]
    alone = screen(folder, [values[0], values[2]])
    assert screened.tally.events == 2
    assert same(screened.tally, alone.tally)


def test_a_sum_beyond_64_bits_crosses_exactly():
    # The aggregation refuses it when adding it to Redis: it must arrive as it was summed.
    tally = Tally()
    tally.add("t1", T0, "c", 2**70 + 1)
    tally.add("t2", T0, "c", -5)
    [back] = _unpack_answer(_pack_answer([Screened([], tally)]))
    assert back.tally.sums == {("t1", T0): {"c": 2**70 + 1}, ("t2", T0): {"c": -5}}


def usage_takes(count: int) -> list[list[bytes]]:
    return [[message(event_id=f"e{i}", kind="usage", ts=T0 + i * 300, resource_id="n1",
                     resource_type="gpu.h100", quantity=i + 1, unit="gpu_hour",
                     tags={"team": f"t{i % 3}"})] for i in range(count)]


async def test_a_pool_of_folding_processes_answers_every_take_in_its_place():
    """Takes the first process cannot keep up with spill over to the second; each answer is
    the one its own take gets inline."""
    prices = PriceBook.load(DEFAULT_PRICES)
    pool = FoldingPool([ProcessFolding(prices), ProcessFolding(prices)], depth=4)
    try:
        assert pool.depth == 4
        takes = usage_takes(6)
        answers = [pool.submit([values]) for values in takes]  # none answered yet
        assert [member.in_hand for member in pool.members] == [3, 3]
        pids = pool.pids
        assert len(set(pids)) == 2 and None not in pids  # both started, distinct
        got = await asyncio.wait_for(asyncio.gather(*answers), timeout=60)
        inline = Folder(prices)
        for values, [screened] in zip(takes, got, strict=True):
            assert same(screened.tally, screen(inline, values).tally)
    finally:
        pool.close()


async def test_a_pool_whose_first_process_keeps_up_leaves_the_others_idle():
    prices = PriceBook.load(DEFAULT_PRICES)
    pool = FoldingPool([ProcessFolding(prices), ProcessFolding(prices)], depth=4)
    try:
        for values in usage_takes(4):  # each answered before the next is taken
            await asyncio.wait_for(pool.submit([values]), timeout=60)
        assert pool.pids[0] is not None and pool.pids[1] is None  # never needed
    finally:
        pool.close()
