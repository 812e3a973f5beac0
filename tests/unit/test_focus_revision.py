"""What a later import sends for a bill row an earlier one counted: a table of cases."""

from __future__ import annotations

import pytest

from costline.connectors.focus import Converted, CostBasis, FocusConverter
from costline.connectors.focus_ledger import Counted
from costline.connectors.focus_revision import revision
from costline.rules.events import ChargeKind, Parsed, dump_event, parse_message
from tests.unit.test_focus import NOW, row

EFFECTIVE = CostBasis.effective.value


def converted(cost: str = "10.25", **cells: str) -> Converted:
    outcome = FocusConverter(CostBasis.effective, "USD", now=NOW).convert(
        row(EffectiveCost=cost, **cells))
    assert isinstance(outcome, Converted)
    return outcome


def test_a_row_never_counted_is_sent_whole() -> None:
    first = converted()
    assert revision(first, EFFECTIVE, None) is first


@pytest.mark.parametrize("counted", [Counted(EFFECTIVE, 10_250_000),  # the same amount
                                     Counted("billed", 12_500_000)])  # the other basis stays
def test_a_row_counted_as_it_is_sends_nothing(counted: Counted) -> None:
    assert revision(converted(), EFFECTIVE, counted) is None


@pytest.mark.parametrize(("before", "now", "delta"), [
    ("3.10", "24.00", 20_900_000),     # a month-to-date row that grew
    ("24.00", "23.50", -500_000),      # revised down after the day ended
    ("-2.00", "-2.50", -500_000),      # a credit that grew
])
def test_a_revised_row_sends_its_difference_as_an_adjustment(
        before: str, now: str, delta: int) -> None:
    first, later = converted(before), converted(now)
    sent = revision(later, EFFECTIVE, Counted(EFFECTIVE, first.micro))
    assert sent is not None and sent.micro == delta and len(sent.events) == 1
    event = sent.event
    assert (event.charge, event.ts, event.tags) == (ChargeKind.adjustment, first.event.ts,
                                                   first.event.tags)
    assert event.event_id.startswith(first.event.event_id + ":r")
    # what the worker reads: the difference to the micro-unit, a negative one allowed
    parsed = parse_message(dump_event(event), now=NOW)
    assert isinstance(parsed, Parsed) and round(parsed.events[0].cost * 1_000_000) == delta  # type: ignore[union-attr]
    again = revision(later, EFFECTIVE, Counted(EFFECTIVE, first.micro))
    assert again is not None and again.event.event_id == event.event_id  # sent again: once


def test_each_step_of_a_row_revised_twice_has_an_id_of_its_own() -> None:
    a, b, c = converted("1.00"), converted("2.00"), converted("3.00")
    first = revision(b, EFFECTIVE, Counted(EFFECTIVE, a.micro))
    second = revision(c, EFFECTIVE, Counted(EFFECTIVE, b.micro))
    assert first is not None and second is not None
    assert first.event.event_id != second.event.event_id
