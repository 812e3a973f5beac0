"""costline's cells → FOCUS 1.0 rows, without Redis: the columns, gross and credits apart, the
hours, and the round trip through the import (the sample exported and read back gives every tag
set's money in every hour)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from costline.connectors.focus import Converted, CostBasis, FocusConverter
from costline.connectors.focus_export import (
    FOCUS_COLUMNS,
    MEASURES,
    FocusRows,
    Interval,
    billing_period,
    hours_in,
)
from costline.connectors.focus_file import open_focus, read_rows
from costline.rules.events import AnyEvent
from costline.rules.memory_state import InMemoryState
from costline.rules.prices import PriceBook
from costline.rules.state import Dimensions, Group, Measure
from costline.streams.cli.export_cmd import write_rows

REPO = Path(__file__).resolve().parents[2]
BOOK = PriceBook.load(REPO / "rules" / "prices" / "example.yaml")
SAMPLE = Path("/work/shared/data/focus/focus_1.0_sample_1000.csv")
needs_sample = pytest.mark.skipif(not SAMPLE.is_file(), reason=f"no FOCUS sample at {SAMPLE}")


def unix(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


HOUR = Interval(unix("2024-09-18T22:00:00"), unix("2024-09-18T23:00:00"))


def dims(**pairs: str) -> Dimensions:
    base = {"resource_type": "gpu.h100", "category": "compute", "billing": "elastic",
            "charge": "usage"}
    return tuple(sorted({**base, **pairs}.items()))


def rows_of(cells: Mapping[Dimensions, Mapping[Measure, int]], interval: Interval = HOUR
            ) -> list[dict[str, str]]:
    return list(FocusRows(BOOK, account="costline-prod").of(interval, cells))


# -- rows -----------------------------------------------------------------------------------------


def test_gross_and_credits_of_a_tag_set_are_two_rows_the_credits_negative() -> None:
    cells = {dims(team="a", charge="adjustment"): {"gross": 5_000_000, "credits": 2_000_000,
                                                   "quantity": 2_000_000}}
    gross, credits = rows_of(cells)
    assert (gross["BilledCost"], credits["BilledCost"]) == ("5.000000", "-2.000000")
    assert gross["EffectiveCost"] == gross["ListCost"] == gross["ContractedCost"] == "5.000000"
    assert (gross["ChargeCategory"], credits["ChargeCategory"]) == ("Adjustment", "Adjustment")
    assert credits["ChargeDescription"] == "gpu.h100: adjustment, taken off"


def test_a_metered_usage_row_says_what_was_consumed_at_which_price() -> None:
    [row] = rows_of({dims(team="a"): {"gross": 19_920_000, "quantity": 8_000_000}})
    assert (row["ConsumedQuantity"], row["ConsumedUnit"]) == ("8.000000", "gpu_hour")
    assert (row["PricingQuantity"], row["PricingUnit"]) == ("8.000000", "gpu_hour")
    assert (row["ListUnitPrice"], row["ContractedUnitPrice"]) == ("2.49", "2.49")
    assert (row["SkuId"], row["ResourceType"], row["ServiceName"]) == ("gpu.h100",) * 3
    assert (row["ChargeCategory"], row["ChargeFrequency"]) == ("Usage", "Usage-Based")


def test_periods_are_the_hour_and_the_utc_month_in_focus_time_format() -> None:
    [row] = rows_of({dims(): {"gross": 1}})
    assert (row["ChargePeriodStart"], row["ChargePeriodEnd"]) == (
        "2024-09-18T22:00:00Z", "2024-09-18T23:00:00Z")
    assert (row["BillingPeriodStart"], row["BillingPeriodEnd"]) == (
        "2024-09-01T00:00:00Z", "2024-10-01T00:00:00Z")
    assert billing_period(unix("2024-12-31T23:00:00")) == (
        "2024-12-01T00:00:00Z", "2025-01-01T00:00:00Z")


def test_tags_fill_their_focus_columns_and_the_rest_is_json() -> None:
    [row] = rows_of({dims(provider="AWS", service="Amazon EC2", sub_account="1234",
                          sub_account_name="research", billing_account="999",
                          region="us-east-1", charge_class="Correction", team="pretrain",
                          job="run-42"): {"gross": 1}})
    assert (row["ProviderName"], row["PublisherName"], row["InvoiceIssuerName"]) == ("AWS",) * 3
    assert (row["ServiceName"], row["SubAccountId"], row["SubAccountName"]) == (
        "Amazon EC2", "1234", "research")
    assert (row["BillingAccountId"], row["RegionId"], row["ChargeClass"]) == (
        "999", "us-east-1", "Correction")
    assert json.loads(row["Tags"]) == {"job": "run-42", "team": "pretrain"}


def test_a_tag_set_that_names_no_account_or_provider_is_costlines() -> None:
    [row] = rows_of({dims(): {"gross": 1}})
    assert (row["ProviderName"], row["BillingAccountId"], row["Tags"]) == (
        "costline", "costline-prod", "")
    assert row["BillingCurrency"] == "USD"


@pytest.mark.parametrize(("charge", "tag", "category"), [
    ("usage", None, "Usage"), ("purchase", None, "Purchase"), ("tax", None, "Tax"),
    ("credit", None, "Credit"), ("refund", None, "Credit"), ("adjustment", None, "Adjustment"),
    ("adjustment", "Usage", "Usage"),  # a refund imported from FOCUS keeps FOCUS's own word
    ("usage", "nonsense", "Usage"),
])
def test_the_charge_category_is_the_bills_own_or_that_of_the_charge(
    charge: str, tag: str | None, category: str,
) -> None:
    extra = {"charge_category": tag} if tag else {}
    [row] = rows_of({dims(charge=charge, **extra): {"gross": 1}})
    assert row["ChargeCategory"] == category


def test_only_usage_rows_say_what_was_consumed_and_only_usage_and_purchases_a_price() -> None:
    for charge, consumed, priced in [("usage", True, True), ("purchase", False, True),
                                     ("tax", False, False), ("credit", False, False)]:
        [row] = rows_of({dims(charge=charge): {"gross": 1, "quantity": 1}})
        assert bool(row["ConsumedQuantity"]) is consumed and bool(row["ConsumedUnit"]) is consumed
        assert bool(row["PricingQuantity"]) is priced and bool(row["SkuId"]) is priced


@pytest.mark.parametrize(("category", "service"), [
    ("compute", "Compute"), ("storage", "Storage"), ("network", "Networking"),
    ("database", "Databases"), ("observability", "Management and Governance"),
    ("security", "Security"), ("operations", "Developer Tools"), ("migration", "Migration"),
    ("other", "Other"), ("", "Other"),
])
def test_the_service_category_maps_back_to_the_category(category: str, service: str) -> None:
    [row] = rows_of({dims(category=category): {"gross": 1}})
    assert row["ServiceCategory"] == service


@pytest.mark.parametrize(("sums", "amounts"), [
    ({"gross": 0, "quantity": 0}, ["0.000000"]),  # usage that cost nothing is still usage
    ({"credits": 3_000_000}, ["-3.000000"]),  # a credit alone
    ({"gross": 0, "credits": 0}, ["0.000000"]),
])
def test_the_rows_of_a_cell(sums: dict[Measure, int], amounts: list[str]) -> None:
    assert [row["BilledCost"] for row in rows_of({dims(): sums})] == amounts


def test_the_tally_counts_rows_tag_sets_gross_and_credits() -> None:
    rows = FocusRows(BOOK, account="x")
    cells = {dims(team="a"): {"gross": 5, "credits": 2}, dims(team="b"): {"gross": 1}}
    assert len(list(rows.of(HOUR, cells))) == 3
    assert (rows.rows, len(rows.tag_sets), rows.gross_micro, rows.credits_micro) == (3, 2, 6, 2)


def test_hours_are_utc_hours_cut_at_the_period_edges() -> None:
    start, end = unix("2025-01-01T18:30:00"), unix("2025-01-02T18:30:00")  # a day in Kolkata
    hours = hours_in(start, end)
    assert len(hours) == 25
    assert (hours[0].start, hours[0].end) == (start, unix("2025-01-01T19:00:00"))
    assert (hours[-1].start, hours[-1].end) == (unix("2025-01-02T18:00:00"), end)
    assert len(hours_in(unix("2024-09-01T00:00:00"), unix("2024-10-01T00:00:00"))) == 720


# -- the round trip -------------------------------------------------------------------------------


class Reader(InMemoryState):
    """The in-memory store answering what the export reads of Redis (``keys``: every
    dimension its events have)."""

    keys: list[str] = []

    def interval_cells(self, measures: Sequence[Measure], intervals: Sequence[tuple[float, float]]
                       ) -> list[dict[Dimensions, dict[Measure, int]]]:
        keys = self.keys
        out: list[dict[Dimensions, dict[Measure, int]]] = []
        for start, end in intervals:
            cells: dict[Dimensions, dict[Measure, int]] = {}
            for measure in measures:
                for group, value in self.totals(measure, {}, keys, start, end).items():
                    found = tuple((k, v) for k, v in zip(keys, group, strict=True) if v)
                    cells.setdefault(found, {})[measure] = value
            out.append(cells)
        return out

    def totals_each(self, measures: Sequence[Measure], match: Mapping[str, str],
                    group_by: Sequence[str], start: float, end: float
                    ) -> dict[Measure, dict[Group, int]]:
        return {m: self.totals(m, match, group_by, start, end) for m in measures}


def reader_of(events: list[AnyEvent]) -> Reader:
    reader = Reader(BOOK)
    reader.add_all(events)
    reader.keys = sorted({*(k for e in events for k in e.tags),
                          "resource_type", "category", "billing", "charge"})
    return reader


def imported(text: Any) -> list[AnyEvent]:
    converter = FocusConverter(CostBasis.effective, "USD", now=2e9)
    events: list[AnyEvent] = []
    for row in read_rows(text, CostBasis.effective):
        outcome = converter.convert(row)
        assert isinstance(outcome, Converted), outcome
        events.extend(outcome.events)
    return events


def nonzero(cells: list[dict[Dimensions, dict[Measure, int]]]) -> list[dict[Any, Any]]:
    return [{d: {m: v for m, v in s.items() if v} for d, s in c.items()} for c in cells]


@needs_sample
def test_the_sample_exported_and_imported_again_has_every_tag_sets_money_in_every_hour() -> None:
    with open_focus(SAMPLE) as (text, _):
        original = reader_of(imported(text))
    hours = hours_in(unix("2024-09-01T00:00:00"), unix("2024-10-01T00:00:00"))
    rows = FocusRows(BOOK, account="costline")
    out = io.StringIO()
    write_rows(original, rows, hours, out, lambda _: None)
    assert (rows.gross_micro, rows.credits_micro) == (18_138_486, 3_161_972)
    out.seek(0)
    assert tuple(csv.DictReader(io.StringIO(out.getvalue())).fieldnames or ()) == FOCUS_COLUMNS
    copy = reader_of(imported(out))
    spans = [(h.start, h.end) for h in hours]
    before, after = original.interval_cells(MEASURES, spans), copy.interval_cells(MEASURES, spans)
    assert nonzero(after) == nonzero(before)
    assert sum(len(cells) for cells in before) > 500


# -- the command -----------------------------------------------------------------------------------


def export(reader: Reader, monkeypatch: pytest.MonkeyPatch, *args: str) -> Any:
    import costline.connectors.redis_client
    import costline.connectors.redis_state
    from costline.streams.cli.root import _register, app

    monkeypatch.setattr(costline.connectors.redis_client, "connect", lambda *_, **__: None)
    monkeypatch.setattr(costline.connectors.redis_state, "RedisState", lambda *_: reader)
    _register()
    return CliRunner().invoke(app, ["--prices", str(REPO / "rules/prices/example.yaml"),
                                    "export", "focus", "--period", "day", "--at",
                                    "2024-09-18T12:00:00Z", "--tz", "UTC", *args])


def gpu_hours(ts: float, quantity: float, **tags: str) -> AnyEvent:
    from costline.rules.events import UsageEvent

    return UsageEvent(event_id=f"u-{ts}-{quantity}", kind="usage", ts=ts, resource_id="n1",
                      resource_type="gpu.h100", quantity=quantity, unit="gpu_hour", tags=tags)


def test_the_command_writes_the_file_and_says_what_it_holds(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    reader = reader_of([gpu_hours(unix("2024-09-18T10:05:00"), 8, team="a"),
                        gpu_hours(unix("2024-09-18T11:05:00"), 1, team="b")])
    path = tmp_path / "day.csv.gz"
    result = export(reader, monkeypatch, "-o", str(path), "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert (summary["rows"], summary["tag_sets"], summary["hours"]) == (2, 2, 24)
    assert (summary["cost_total"], summary["complete"]) == ("22.410000", True)
    with open_focus(path) as (text, _):
        assert [row["BilledCost"] for row in csv.DictReader(text)] == ["19.920000", "2.490000"]
    assert not list(tmp_path.glob(".*partial"))


def test_an_export_that_does_not_add_up_to_the_period_exits_1(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """As when hourly buckets have expired and the daily ones remain."""
    reader = reader_of([gpu_hours(unix("2024-09-18T10:05:00"), 8, team="a")])
    monkeypatch.setattr(Reader, "interval_cells",
                        lambda self, measures, intervals: [{} for _ in intervals])
    result = export(reader, monkeypatch, "-o", str(tmp_path / "day.csv"))
    assert result.exit_code == 1
    assert "the file's gross is 0.000000 USD but the period's is 19.920000 USD" in \
        " ".join(result.output.split())


def test_a_period_still_running_is_exported_to_the_start_of_the_current_hour(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """A FOCUS row states a whole hour: the hour now is in is left for a later export."""
    import costline.streams.cli.export_cmd as export_cmd

    reader = reader_of([gpu_hours(unix("2024-09-18T10:05:00"), 8, team="a"),
                        gpu_hours(unix("2024-09-18T12:10:00"), 1, team="a")])
    monkeypatch.setattr(export_cmd.time, "time", lambda: unix("2024-09-18T12:30:00"))
    result = export(reader, monkeypatch, "-o", str(tmp_path / "today.csv"), "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert (summary["until"], summary["hours"], summary["gross_total"], summary["complete"]) == (
        "2024-09-18T12:00:00Z", 12, "19.920000", True)
    assert summary["period"] == {"start": "2024-09-18T00:00:00Z", "end": "2024-09-19T00:00:00Z"}


def test_totals_that_move_while_the_file_is_written_are_said_to_have_moved(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """A late event for an hour already written: not blamed on the buckets' retention."""
    reader = reader_of([gpu_hours(unix("2024-09-18T10:05:00"), 8, team="a")])
    read = Reader.interval_cells

    def then_a_late_event(self: Reader, measures: Any, intervals: Any) -> Any:
        cells = read(self, measures, intervals)
        self.add_all([gpu_hours(unix("2024-09-18T10:20:00"), 1, team="a")])
        return cells

    monkeypatch.setattr(Reader, "interval_cells", then_a_late_event)
    result = export(reader, monkeypatch, "-o", str(tmp_path / "day.csv"))
    assert result.exit_code == 1
    assert "changed while they were read (events still arriving for them): export again" in \
        " ".join(result.output.split())


def test_the_summary_as_json_needs_a_file(monkeypatch: pytest.MonkeyPatch) -> None:
    result = export(reader_of([]), monkeypatch, "--json")
    assert result.exit_code == 2 and "give the file with -o" in result.output
