"""What later imports send for a bill row an earlier one counted, and the row memory written
ahead: whatever Kafka acknowledges or not, in whatever order the exports come, what a worker
that counts each event id once ends up with is the latest export's amount."""

from __future__ import annotations

from typing import Any

import pytest

from costline.connectors.focus import Converted, CostBasis, FocusConverter
from costline.connectors.focus_revision import RowState, next_step, unfinished
from costline.connectors.focus_shape import shape
from costline.connectors.focus_tally import ImportTally
from costline.rules.events import ChargeKind, Parsed, UsageEvent, dump_event, parse_message
from costline.streams.cli.focus_delivery import Delivery, Recording
from costline.streams.cli.produce_cmd import Summary
from tests.unit.test_focus import NOW, row

EFFECTIVE = CostBasis.effective


def converted(cost: str = "10.25", spread: bool = False, **cells: str) -> Converted:
    outcome = FocusConverter(EFFECTIVE, "USD", now=NOW, spread=spread).convert(
        row(EffectiveCost=cost, **cells))
    assert isinstance(outcome, Converted)
    return outcome


def micro_of(event: UsageEvent) -> int:
    parsed = parse_message(dump_event(event), now=NOW)  # what the worker reads
    assert isinstance(parsed, Parsed)
    return round(parsed.events[0].cost * 1_000_000)  # type: ignore[union-attr]


def test_the_states_round_trip() -> None:
    for state in (RowState("effective", None, 0, 5), RowState("billed", -3, 2, None),
                  RowState("billed", 4, 1, None, "", "ab12"),
                  RowState("billed", 4, 1, 6, "sc", "ab12", "cd34")):
        assert RowState.decode(state.encode()) == state
    # States written before the export or the shape were kept read as not knowing them.
    assert RowState.decode("billed:4:1:") == RowState("billed", 4, 1)
    assert RowState.decode("billed:4:1::sc") == RowState("billed", 4, 1, scope="sc")


def test_a_new_row_is_sent_whole_and_the_same_again_sends_nothing() -> None:
    first = converted()
    (sent,), ahead, done = next_step(first, "effective", None, {})  # type: ignore[misc]
    assert sent is first and done == RowState("effective", 10_250_000, shape=shape(first).id)
    assert ahead == RowState("effective", None, pending=10_250_000, to=shape(first).id)
    assert next_step(converted(), "effective", done, {}) is None
    assert next_step(converted(), "billed", done, {}) is None  # the first basis stays


@pytest.mark.parametrize(("before", "now", "delta"), [
    ("3.10", "24.00", 20_900_000),     # a month-to-date row that grew
    ("24.00", "23.50", -500_000),      # revised down after the day ended
    ("-2.00", "-2.50", -500_000),      # a credit that grew
])
def test_a_revised_row_sends_its_difference_as_an_adjustment(
        before: str, now: str, delta: int) -> None:
    first = converted(before)
    step = next_step(converted(now), "effective",
                     RowState("effective", first.micro, 3, shape=shape(first).id), {})
    assert step is not None
    (sent,), _, done = step
    assert (sent.micro, done) == (delta, RowState("effective", first.micro + delta, 4,
                                                  shape=shape(first).id))
    assert (sent.event.event_id, sent.event.charge) == (first.event.event_id + ":r4",
                                                        ChargeKind.adjustment)
    assert (sent.event.ts, sent.event.tags, len(sent.events)) == (first.event.ts,
                                                                  first.event.tags, 1)
    assert micro_of(sent.event) == delta


def test_an_unfinished_step_is_sent_again_as_it_was() -> None:
    """The export changed since (15), but what was set out (12) goes again, under its ids."""
    now = converted("15", spread=True, ChargePeriodEnd="2024-09-19 00:00:00")
    (whole,), done = unfinished(now, RowState("effective", None, 0, 12_000_000), {})
    assert [e.event_id for e in whole.events] == [e.event_id for e in now.events]
    assert sum(micro_of(e) for e in whole.events) == 12_000_000
    assert done == RowState("effective", 12_000_000, shape=shape(now).id, hours=len(now.pieces))
    (again,), done = unfinished(now, RowState("effective", 10_000_000, 2, 12_000_000), {})
    assert (again.event.event_id, micro_of(again.event)) == (now.event.event_id + ":r3",
                                                             2_000_000)
    assert [e.event_id for e in again.events] == \
        [f"{now.event.event_id}:r3/{i}" for i in range(len(now.events))]
    assert sum(micro_of(e) for e in again.events) == 2_000_000
    assert done == RowState("effective", 12_000_000, 3, shape=shape(now).id,
                            hours=len(now.pieces))


def test_a_spread_rows_difference_is_spread_over_its_hours() -> None:
    """Each hour of the period follows the bill: the difference is split as the row is."""
    day = {"ChargePeriodStart": "2024-09-18 00:00:00", "ChargePeriodEnd": "2024-09-19 00:00:00"}
    before = converted("24", spread=True, **day)
    now = converted("48.000024", spread=True, **day)
    assert len(now.events) == 24
    (sent,), _, _ = next_step(now, "effective",  # type: ignore[misc]
                              RowState("effective", before.micro, hours=24), {})
    assert [(e.ts, e.charge) for e in sent.events] == \
        [(e.ts, ChargeKind.adjustment) for e in now.events]
    hourly = [micro_of(a) + micro_of(b) for a, b in zip(before.events, sent.events, strict=True)]
    assert hourly == [micro_of(e) for e in now.events]  # 2.000001 an hour
    # A difference smaller than a micro-unit an hour lands where the split puts it.
    (tiny,), _, _ = next_step(now, "effective",  # type: ignore[misc]
                              RowState("effective", now.micro - 5, hours=24), {})
    assert [(e.event_id, micro_of(e)) for e in tiny.events] == \
        [(f"{now.event.event_id}:r1/23", 5)]


class Memory:
    """The row memory, as dicts: states by row, attributions by scope and row."""

    def __init__(self) -> None:
        self.held: dict[tuple[str, str], RowState] = {}
        self.named: dict[str, dict[tuple[str, str], str]] = {}
        self.shaped: dict[str, dict[str, str]] = {}
        self.counted: dict[tuple[str, str], str] = {}  # (month, shape id) → its text

    def keep_shapes(self, shapes: Any) -> None:
        for month, kept in shapes:
            self.counted[month, kept.id] = kept.text

    def counted_shapes(self, wanted: Any) -> dict[str, str]:
        return {shape_id: self.counted[month, shape_id] for month, shape_id in wanted
                if (month, shape_id) in self.counted}

    def states(self, rows: list[tuple[str, str]]) -> list[RowState | None]:
        return [self.held.get(key) for key in rows]

    def write(self, states: Any) -> None:
        self.held.update(dict(states))

    def attribute(self, rows: Any, replace: bool = True) -> None:
        for scope, key, named in rows:
            if replace or key not in self.named.get(scope, {}):
                self.named.setdefault(scope, {})[key] = named.text
            self.shaped.setdefault(scope, {})[named.shape_id] = named.shape

    def shapes(self, scope: str, shape_ids: list[str]) -> dict[str, str]:
        return {i: self.shaped[scope][i] for i in shape_ids}

    def unname(self, rows: Any) -> None:
        for scope, key in rows:
            self.named.get(scope, {}).pop(key, None)

    def scope_rows(self, scope: str) -> list[tuple[str, str]]:
        return list(self.named.get(scope, {}))

    def attributions(self, scope: str, rows: list[tuple[str, str]]) -> list[str | None]:
        return [self.named.get(scope, {}).get(row) for row in rows]


class Kafka:
    """Takes events and, on flush, hands them to a worker that counts each id once (keeping
    the first copy's tags), or fails them all (``down``), or counts them and fails to say so
    (``unanswered``: the broker took them, the acknowledgement was lost)."""

    def __init__(self, summary: Summary) -> None:
        self.summary, self.down, self.unanswered = summary, False, False
        self.flight: list[UsageEvent] = []
        self.counted: dict[str, int] = {}
        self.tags: dict[str, dict[str, str]] = {}

    def emit(self, event: UsageEvent) -> None:
        self.flight.append(event)

    def flush(self, timeout_s: float = 60.0) -> None:
        for event in self.flight:
            if not self.down:
                self.counted.setdefault(event.event_id, micro_of(event))
                self.tags.setdefault(event.event_id, dict(event.tags))
            if self.down or self.unanswered:
                self.summary.failed(ConnectionError("broker away"))
        self.flight = []

    def by(self, tag: str) -> dict[str, int]:
        """What the worker counted by the value of ``tag`` (``""``: without it), zeros left
        out."""
        totals: dict[str, int] = {}
        for event_id, micro in self.counted.items():
            value = self.tags[event_id].get(tag, "")
            totals[value] = totals.get(value, 0) + micro
        return {value: micro for value, micro in sorted(totals.items()) if micro}


def test_the_worker_ends_with_the_latest_amount_whatever_kafka_did() -> None:
    memory, summary = Memory(), Summary()
    kafka = Kafka(summary)

    def import_(cost: str, down: bool = False) -> ImportTally:
        kafka.down, tally = down, ImportTally()
        delivery = Delivery(tally, EFFECTIVE, kafka, memory, summary)  # type: ignore[arg-type]
        delivery.add(converted(cost))
        delivery.flush()
        return tally

    import_("10")
    assert sum(kafka.counted.values()) == 10_000_000
    for cost in ("12.5", "10", "12.5"):  # back and forth: each step an id of its own
        import_(cost)
        assert sum(kafka.counted.values()) == round(float(cost) * 1_000_000)
    import_("14", down=True)  # set out, never acknowledged
    assert sum(kafka.counted.values()) == 12_500_000
    tally = import_("15")  # the 14 goes again as it was, then 15
    assert (tally.resent_rows, tally.revised_rows) == (1, 1)
    assert sum(kafka.counted.values()) == 15_000_000
    assert import_("16", down=True).unsent_rows == 0
    tally = import_("17", down=True)  # the 16 is still pending: nothing new is set out
    assert (tally.unsent_rows, sum(kafka.counted.values())) == (1, 15_000_000)
    import_("17")
    assert sum(kafka.counted.values()) == 17_000_000


def test_a_new_row_whose_first_send_failed_is_counted_once_at_its_latest_amount() -> None:
    memory, summary = Memory(), Summary()
    kafka = Kafka(summary)
    for cost, down in (("12", True), ("15", False)):
        kafka.down = down
        delivery = Delivery(ImportTally(), EFFECTIVE, kafka, memory, summary)  # type: ignore[arg-type]
        delivery.add(converted(cost))
        delivery.flush()
    assert sum(kafka.counted.values()) == 15_000_000


def test_a_dry_run_tallies_what_the_import_would_send_and_changes_nothing() -> None:
    memory, summary = Memory(), Summary()
    kafka = Kafka(summary)
    kafka.down = True
    delivery = Delivery(ImportTally(), EFFECTIVE, kafka, memory, summary)  # type: ignore[arg-type]
    delivery.add(converted("12"))  # set out, never acknowledged
    delivery.flush()
    held = dict(memory.held)

    tally = ImportTally()
    dry = Delivery(tally, EFFECTIVE, None, memory)  # type: ignore[arg-type]
    dry.add(converted("15"))
    dry.flush()
    # The 12 would go again as it was, then the difference to 15.
    assert (tally.resent_rows, tally.revised_rows, tally.unsent_rows) == (1, 1, 0)
    assert (tally.events, tally.cost_micro + tally.credits_micro) == (1, 3_000_000)
    assert memory.held == held


def test_recording_an_export_counted_before_the_memory_makes_later_imports_send_differences(
) -> None:
    """An upgrade: the export was counted by an import that kept no memory. Recorded, it sends
    nothing again, and a later export sends only what changed."""
    memory, summary = Memory(), Summary()
    kafka = Kafka(summary)
    pending = Delivery(ImportTally(), EFFECTIVE, kafka, memory, summary)  # type: ignore[arg-type]
    kafka.down = True
    pending.add(converted("7", ChargePeriodStart="2024-09-17 22:00:00"))
    pending.flush()  # a row the memory knows, pending: recording leaves it as it is
    known = dict(memory.held)

    tally = ImportTally()
    recording = Recording(tally, EFFECTIVE, memory)  # type: ignore[arg-type]
    for cost, start in (("10", "2024-09-18 22:00:00"), ("9", "2024-09-17 22:00:00")):
        recording.add(converted(cost, ChargePeriodStart=start))
    recording.flush()
    assert (tally.rows, tally.recorded_rows, tally.unchanged_rows, tally.events) == (2, 1, 1, 0)
    assert all(memory.held[key] == state for key, state in known.items())

    kafka.down, later = False, ImportTally()
    delivery = Delivery(later, EFFECTIVE, kafka, memory, summary)  # type: ignore[arg-type]
    delivery.add(converted("12.5", ChargePeriodStart="2024-09-18 22:00:00"))
    delivery.flush()
    assert (later.revised_rows, later.converted_rows) == (1, 0)
    assert sum(kafka.counted.values()) == 2_500_000  # the difference alone
