"""What crosses between the worker and its folding process: everything a take's answer holds."""

from __future__ import annotations

import json

from rules.prices import PriceBook
from rules.tally import Folder, Tally
from streams.folding import Screened, _pack_answer, _unpack_answer, screen
from streams.settings import DEFAULT_PRICES

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


def test_a_sum_beyond_64_bits_crosses_exactly():
    # The aggregation refuses it when adding it to Redis: it must arrive as it was summed.
    tally = Tally()
    tally.add("t1", T0, "c", 2**70 + 1)
    tally.add("t2", T0, "c", -5)
    [back] = _unpack_answer(_pack_answer([Screened([], tally)]))
    assert back.tally.sums == {("t1", T0): {"c": 2**70 + 1}, ("t2", T0): {"c": -5}}
