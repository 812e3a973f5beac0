"""Refused money: a refused message is tallied by the hour of its events and its reason, and
priced when the tally is read, with the price book of that moment."""

from __future__ import annotations

import json

from costline.rules.prices import PriceBook, PriceBookModel
from costline.rules.refusals import (
    Refused,
    by_reason,
    hourly_counts,
    negated,
    priced,
    refused_lines,
)

T0 = 1_796_025_600  # 2026-11-30T08:00:00Z
BOOK = PriceBook(PriceBookModel.model_validate({"currency": "USD", "prices": {
    "gpu.h100": {"unit": "gpu_hour", "price": "2.49", "category": "compute"}}}))
FIXED = PriceBook(PriceBookModel.model_validate({"currency": "USD", "prices": {
    "gpu.h100": {"unit": "gpu_hour", "price": "2.49", "category": "compute"},
    "gpu.h200": {"unit": "gpu_hour", "price": "3.79", "category": "compute"}}}))


def usage(event_id: str, ts: float, resource_type: str = "gpu.h200", quantity: float = 8.0,
          **extra: object) -> dict[str, object]:
    return {"event_id": event_id, "kind": "usage", "ts": ts, "resource_id": "n1",
            "resource_type": resource_type, "quantity": quantity, "unit": "gpu_hour",
            "tags": {"team": "pretrain"}, **extra}


def fields_of(counts: dict[int, dict[str, int]]) -> list[tuple[str, int]]:
    return [(name, value) for fields in counts.values() for name, value in fields.items()]


def test_a_batch_is_one_message_and_each_event_counts_in_its_own_hour() -> None:
    batch = json.dumps([usage("a", T0 + 10), usage("b", T0 + 3700, cost=5.5),
                        usage("c", T0 + 3800, "gpu.h100", 2)]).encode()
    counts = hourly_counts(batch, "unknown_resource_type", T0 + 4000)
    assert counts == {
        T0: {"unknown_resource_type\tm": 1, "unknown_resource_type\te": 1,
             "unknown_resource_type\tq\tgpu.h200\tgpu_hour": 8_000_000},
        T0 + 3600: {"unknown_resource_type\te": 2, "unknown_resource_type\tc": 5_500_000,
                    "unknown_resource_type\tq\tgpu.h100\tgpu_hour": 2_000_000},
    }


def test_an_unreadable_message_counts_in_the_hour_it_was_refused() -> None:
    assert hourly_counts(b"{not json", "invalid_json", T0 + 5000) == {
        T0 + 3600: {"invalid_json\tm": 1}}


def test_what_a_tally_is_worth_follows_the_price_book_of_the_moment() -> None:
    counts = hourly_counts(json.dumps(usage("a", T0)).encode(), "unknown_resource_type", T0)
    refused = by_reason(fields_of(counts))["unknown_resource_type"]
    assert (refused.messages, refused.events) == (1, 1)
    assert priced(refused, BOOK).amount == 0
    assert priced(refused, BOOK).unpriced == {("gpu.h200", "gpu_hour"): 8_000_000}
    assert priced(refused, FIXED).amount == 30_320_000  # 8 × 3.79
    assert priced(refused, FIXED).unpriced == {}


def test_a_unit_the_book_does_not_price_stays_unpriced() -> None:
    event = usage("a", T0, "gpu.h100", 90, unit="gpu_minute")
    refused = by_reason(fields_of(hourly_counts(json.dumps(event).encode(), "unit_mismatch",
                                                T0)))["unit_mismatch"]
    assert priced(refused, FIXED).unpriced == {("gpu.h100", "gpu_minute"): 90_000_000}
    line, = refused_lines({"unit_mismatch": refused}, FIXED)
    assert ("unit_mismatch: 1 message(s), 1 event(s): 90 gpu_minute of gpu.h100 (priced per "
            "gpu_hour, not per gpu_minute); see") in line
    assert "costline dead-letters list --reason unit_mismatch" in line


def test_a_replay_takes_exactly_its_counts_back_out() -> None:
    counts = hourly_counts(json.dumps(usage("a", T0, cost=3)).encode(), "x", T0)
    summed = fields_of(counts) + fields_of(negated(counts))
    assert by_reason(summed) == {}


def test_the_warning_names_the_money_for_people() -> None:
    refused = Refused(messages=2, events=3, stated=1_500_000,
                      quantities={("gpu.h200", "gpu_hour"): 10_000_000})
    line, = refused_lines({"unknown_resource_type": refused}, BOOK)
    assert line.startswith("warning: refused input in this period, not in the totals: "
                           "unknown_resource_type: 2 message(s), 3 event(s): $1.50 at "
                           "today's prices, plus 10 gpu_hour of gpu.h200 (not in the price "
                           "book)")


def test_an_unreadable_message_has_no_amount() -> None:
    line, = refused_lines({"invalid_json": Refused(messages=1)}, BOOK)
    assert "invalid_json: 1 message(s): amount unknown (not readable as events)" in line
