"""Progress, checkpoint, restore and run-end events on their way in: what the parser refuses,
what the ledger makes of them (no-cost usage for progress, records for the rest), and that a
resend counts once."""

from __future__ import annotations

import json

import msgpack
import pytest

from costline.rules.events import Parsed, Rejection, parse_message
from costline.rules.ledger import FORMAT, RECORD, RECORDS_FORMAT, USAGE, Intake, Record
from costline.rules.prices import PricingError
from costline.rules.tally import tally_of
from tests.unit.training import PRICES, T0, TB, checkpoint, progress, run_end


def message(**event: object) -> bytes:
    base = {"event_id": "x-1", "ts": T0, "tags": {"job": "run-42"}}
    return json.dumps({**base, **event}).encode()


def test_each_new_kind_is_parsed() -> None:
    for raw in (message(kind="progress", step=10, tokens=4096),
                message(kind="checkpoint", step=10, bytes=TB, tier="storage.hot",
                        location="/ckpt/a", write_seconds=42.5),
                message(kind="restore", location="/ckpt/a"),
                message(kind="run_end", status="failed", reason="NCCL watchdog")):
        assert isinstance(parse_message(raw, now=T0), Parsed), raw


@pytest.mark.parametrize("raw, code, reason", [
    (message(kind="progress", step=1, tokens=5, tags={"team": "x"}), "missing_field",
     "field tags: needs the tag job: it names the run"),
    (message(kind="progress", step=1, tokens=1.5), "bad_type", "field tokens"),
    (message(kind="progress", step=1, tokens=-1), "out_of_range", "field tokens"),
    (message(kind="checkpoint", step=1, bytes=1, tier="storage.hot"), "missing_field",
     "field location: Field required"),
    (message(kind="run_end", status="crashed"), "bad_value", "field status"),
], ids=["no-run", "fractional-tokens", "negative-tokens", "no-location", "unknown-status"])
def test_a_bad_training_event_is_refused_with_its_reason(raw: bytes, code: str,
                                                         reason: str) -> None:
    refused = parse_message(raw, now=T0)
    assert isinstance(refused, Rejection)
    assert refused.code == code and reason in refused.reason


def test_progress_is_usage_with_no_cost_one_entry_per_quantity() -> None:
    event = progress(T0, step=100, tokens=8_000_000, steps=4, samples=2000)
    [record] = Intake(PRICES, 1).records([event]).values()
    assert [(e[0], e[4], e[5]) for e in record.entries] == [
        (USAGE, 0, 8_000_000),     # progress.tokens in Mtok: a micro-unit is a token
        (USAGE, 0, 4_000_000),     # progress.steps: 4 steps
        (USAGE, 0, 2000),          # progress.samples in millions
    ]
    types = sorted(json.loads(t)["resource_type"] for t in record.tagsets.values())
    assert types == ["progress.samples", "progress.steps", "progress.tokens"]
    assert len({e[1] for e in record.entries}) == 3  # each quantity has its own digest


def test_a_resent_progress_event_counts_once() -> None:
    event = progress(T0, step=100, tokens=1000)
    intake = Intake(PRICES, 1)
    first, again = intake.records([event])[0], intake.records([event])[0]
    tally = tally_of([first, again])
    assert sorted(cell.quantity for cell in tally.usage.values()) == [1000, 1_000_000]


def test_checkpoints_restores_and_run_ends_are_records_kept_as_written() -> None:
    events = [checkpoint(T0, step=100, size=2 * TB), run_end(T0 + 60, "failed")]
    [record] = Intake(PRICES, 1).records(events).values()
    assert [e[0] for e in record.entries] == [RECORD, RECORD]
    tally = tally_of([Record.decode(record.encode())])
    [(name, ts, text), (name2, _, text2)] = tally.records
    # 2 TB on storage.hot at $0.0004/GB-hour is $0.80 an hour: kept with the record
    assert (name, ts) == ("checkpoints", T0) and text.startswith("800000|{")
    assert name2 == "runs" and json.loads(text2)["status"] == "failed"
    assert tally.usage == {} and tally.tagsets == {}
    assert tally.events == 2


def test_a_ledger_message_with_records_has_a_format_older_workers_skip() -> None:
    intake = Intake(PRICES, 1)
    plain = intake.records([progress(T0, 1, 10)])[0].encode()
    kept = intake.records([run_end(T0, "succeeded")])[0].encode()
    assert Record.decode(plain) and Record.decode(kept)

    assert msgpack.unpackb(plain)[0] == FORMAT and msgpack.unpackb(kept)[0] == RECORDS_FORMAT


def test_a_checkpoint_on_a_tier_not_priced_per_gb_hour_is_refused() -> None:
    with pytest.raises(PricingError) as refused:
        Intake(PRICES, 1).records([checkpoint(T0, 1, tier="logs.ingest")])
    assert refused.value.code == "not_storage"
    taken = Intake(PRICES, 2).take([message(kind="checkpoint", step=1, bytes=1,
                                            tier="gpu.nope", location="/x")], now=T0)
    assert [code for _, code, _ in taken.refused] == ["unknown_resource_type"]
