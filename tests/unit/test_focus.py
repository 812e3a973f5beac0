"""FOCUS rows → usage events, without a broker: costs, charges, currencies, spreading, skips,
ids, tags, files, batching.

Part of these tests run on real billing data: the FinOps Foundation's FOCUS 1.0 sample
(``FOCUS-Sample-Data``, ``FOCUS-1.0/focus_sample.csv``, 1,000 anonymized rows from AWS, Google
Cloud, Microsoft and Oracle), licensed CC BY 4.0: https://creativecommons.org/licenses/by/4.0/
— see ``/work/shared/data/focus/README.md`` and ``LICENSE.md``.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from costline.connectors.focus import (
    Converted,
    CostBasis,
    FocusConverter,
    Skipped,
    SkipReason,
    focus_prices,
    merge_tags,
    missing_prices,
    price_book_lines,
    tag_key,
)
from costline.connectors.focus_file import FocusFormatError, open_focus, read_rows
from costline.connectors.focus_spread import hours_of, split_micro
from costline.connectors.focus_tally import ImportTally
from costline.connectors.focus_vocabulary import charge_of
from costline.rules.events import ChargeKind, Parsed, parse_message
from costline.rules.prices import PriceBook, PriceBookModel
from costline.rules.rates import RateEntry, RateTable
from costline.streams.cli.import_cmd import PartitionBatcher, partition_of

SAMPLE = Path("/work/shared/data/focus/focus_1.0_sample_1000.csv")
REPO = Path(__file__).resolve().parents[2]
NOW = 1795852800.0  # 2026-11-28T08:00:00Z
needs_sample = pytest.mark.skipif(not SAMPLE.is_file(), reason=f"no FOCUS sample at {SAMPLE}")


def row(**cells: str) -> dict[str, str | None]:
    """A FOCUS row with what an event needs; ``cells`` override."""
    base: dict[str, str | None] = {
        "BilledCost": "12.5", "EffectiveCost": "10.25", "BillingCurrency": "USD",
        "ChargePeriodStart": "2024-09-18 22:00:00", "ChargePeriodEnd": "2024-09-18 23:00:00",
        "ChargeCategory": "Usage", "ChargeClass": "NULL", "ServiceCategory": "Compute",
        "ServiceName": "Amazon Elastic Compute Cloud", "ProviderName": "AWS",
        "SubAccountId": "123456789012", "SubAccountName": "research", "RegionId": "us-east-1",
        "BillingAccountId": "999", "ResourceId": "i-0abc", "Tags": '{"team": "pretrain"}',
    }
    base.update(cells)
    return base


RATES = RateTable({"EUR": [RateEntry.model_validate({"from": "2024-01-01", "rate": "1.1"}),
                            RateEntry.model_validate({"from": "2024-09-18", "rate": "1.25"})]})


def convert(basis: CostBasis = CostBasis.effective, **cells: str) -> Converted | Skipped:
    return FocusConverter(basis, "USD", now=NOW, rates=RATES).convert(row(**cells))


def converted(**cells: str) -> Converted:
    outcome = convert(**cells)
    assert isinstance(outcome, Converted), outcome
    return outcome


# -- costs ------------------------------------------------------------------------------------


def test_a_usage_row_becomes_a_usage_event_with_its_cost_at_price_one() -> None:
    event = converted().event
    assert (event.kind, event.ts, event.resource_id) == ("usage", "2024-09-18T22:00:00Z", "i-0abc")
    assert (event.resource_type, event.unit, event.category) == ("focus.compute", "usd", "compute")
    assert event.cost == event.quantity == 10.25
    assert event.tags == {"provider": "AWS", "service": "Amazon Elastic Compute Cloud",
                          "sub_account": "123456789012", "sub_account_name": "research",
                          "billing_account": "999", "region": "us-east-1",
                          "charge_category": "Usage", "team": "pretrain"}


def test_billed_basis_takes_billed_cost() -> None:
    outcome = convert(CostBasis.billed)
    assert isinstance(outcome, Converted) and outcome.event.cost == 12.5


@pytest.mark.parametrize(("cells", "reason", "micro", "currency"), [
    ({"EffectiveCost": "NULL"}, SkipReason.null_cost, 0, "USD"),
    ({"EffectiveCost": ""}, SkipReason.null_cost, 0, "USD"),
    ({"EffectiveCost": "twelve"}, SkipReason.bad_cost, 0, "USD"),
    ({"EffectiveCost": "NaN"}, SkipReason.bad_cost, 0, "USD"),
    ({"EffectiveCost": "1e400"}, SkipReason.bad_cost, 0, "USD"),
    ({"ChargePeriodStart": "NULL"}, SkipReason.bad_timestamp, 10_250_000, "USD"),
    ({"ChargePeriodStart": "18/09/2024"}, SkipReason.bad_timestamp, 10_250_000, "USD"),
    ({"ChargePeriodStart": "2027-01-01 00:00:00"}, SkipReason.future, 10_250_000, "USD"),
    ({"BillingCurrency": "GBP"}, SkipReason.no_rate, 10_250_000, "GBP"),
    ({"BillingCurrency": "EUR", "ChargePeriodStart": "2023-12-31 23:00:00"},
     SkipReason.no_rate, 10_250_000, "EUR"),  # before the first rate held
    ({"BillingCurrency": "EUR", "EffectiveCost": "999999999"}, SkipReason.bad_cost,
     999_999_999_000_000, "EUR"),  # a billion or more once converted
])
def test_rows_that_cannot_be_events_are_skipped_with_reason_and_amount(
    cells: dict[str, str], reason: SkipReason, micro: int, currency: str,
) -> None:
    assert convert(**cells) == Skipped(reason, micro, currency)


# -- charges: every row counts, with its sign ---------------------------------------------------


@pytest.mark.parametrize(("category", "negative", "charge", "known"), [
    ("Usage", False, ChargeKind.usage, True),
    ("Purchase", False, ChargeKind.purchase, True),
    ("Tax", False, ChargeKind.tax, True),
    ("Credit", False, ChargeKind.credit, True),  # a credit taken back adds to gross spend
    ("Adjustment", False, ChargeKind.adjustment, True),
    ("Credit", True, ChargeKind.credit, True),
    ("credit", True, ChargeKind.credit, True),
    ("Usage", True, ChargeKind.adjustment, True),  # a refund or a reversal
    ("Tax", True, ChargeKind.adjustment, True),
    ("Purchase", True, ChargeKind.adjustment, True),
    ("Adjustment", True, ChargeKind.adjustment, True),
    ("Rebate", False, ChargeKind.usage, False),
    ("Rebate", True, ChargeKind.adjustment, False),
    (None, False, ChargeKind.usage, False),
])
def test_the_charge_follows_the_charge_category_and_the_sign(
    category: str | None, negative: bool, charge: ChargeKind, known: bool,
) -> None:
    assert charge_of(category, negative) == (charge, known)


def test_a_credit_is_an_event_with_a_negative_cost_and_no_quantity() -> None:
    outcome = converted(EffectiveCost="-3", ChargeCategory="Credit", ResourceId="NULL")
    event = outcome.event
    assert (event.cost, event.quantity, event.charge, outcome.micro) == (
        -3.0, 0.0, ChargeKind.credit, -3_000_000)
    assert event.tags["charge_category"] == "Credit"


def test_a_negative_usage_row_is_an_adjustment_that_keeps_focus_words_in_its_tags() -> None:
    event = converted(EffectiveCost="-0.00000764078", ChargeClass="Correction").event
    assert (event.cost, event.charge) == (-0.000008, ChargeKind.adjustment)
    assert (event.tags["charge_category"], event.tags["charge_class"]) == ("Usage", "Correction")


def test_negative_events_are_priced_by_the_worker_with_their_sign() -> None:
    book = PriceBook(PriceBookModel(currency="USD", prices=focus_prices("USD")))
    for cells in ({"EffectiveCost": "-3", "ChargeCategory": "Credit"},
                  {"EffectiveCost": "-0.149", "ChargeCategory": "Usage"},
                  {"EffectiveCost": "-1.5", "ChargeCategory": "Tax"}):
        outcome = converted(**cells)
        parsed = parse_message(outcome.event.model_dump_json(exclude_none=True).encode(), now=NOW)
        assert isinstance(parsed, Parsed)
        assert book.charge(parsed.events[0]).cost_micro == outcome.micro  # type: ignore[arg-type]


def test_an_unknown_charge_category_counts_and_is_a_warning() -> None:
    converter = FocusConverter(CostBasis.effective, "USD", now=NOW)
    outcome = converter.convert(row(ChargeCategory="Rebate"))
    assert isinstance(outcome, Converted) and outcome.event.charge is ChargeKind.usage
    assert converter.warnings == {"unmapped_charge_category": 1}


def test_a_positive_correction_counts_and_says_so() -> None:
    event = converted(EffectiveCost="0.75", ChargeClass="Correction").event
    assert (event.cost, event.tags["charge_class"]) == (0.75, "Correction")


# -- currencies ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("start", "cost", "micro"), [
    ("2024-09-17 23:00:00", "10.25", 11_275_000),  # 1.1
    ("2024-09-18 00:00:00", "10.25", 12_812_500),  # 1.25 from that date on
    ("2024-09-18 00:00:00", "-0.0000015", -2),  # exact product, rounded once, half to even
    ("2024-09-18 00:00:00", "0.0000003", 0),
])
def test_a_row_in_another_currency_is_converted_with_the_rate_of_its_date(
    start: str, cost: str, micro: int,
) -> None:
    outcome = converted(BillingCurrency="EUR", ChargePeriodStart=start, EffectiveCost=cost)
    assert outcome.micro == micro
    assert outcome.event.cost == micro / 1_000_000
    assert outcome.event.tags["billing_currency"] == "EUR"
    assert "billing_currency" not in converted().event.tags


def test_zero_cost_rows_are_sent_they_are_usage_that_cost_nothing() -> None:
    assert converted(EffectiveCost="0.00000000000").event.cost == 0.0


def test_costs_reach_the_worker_rounded_once_half_to_even() -> None:
    """The float on the wire is the micro-unit amount exactly, whatever digits the row had."""
    book = PriceBook(PriceBookModel(currency="USD", prices=focus_prices("USD")))
    for text, micro in [("0.0000005", 0), ("0.0000015", 2), ("0.00001605990", 16),
                        ("123456789.1234565", 123456789123456), ("7", 7_000_000),
                        ("999999999.9999995", 1_000_000_000_000_000)]:
        outcome = converted(EffectiveCost=text)
        assert outcome.micro == micro
        parsed = parse_message(outcome.event.model_dump_json(exclude_none=True).encode(),
                               now=NOW)
        assert isinstance(parsed, Parsed)
        assert book.charge(parsed.events[0]).cost_micro == micro  # type: ignore[arg-type]


# -- spreading ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("micro", "parts", "shares"), [
    (10, 3, [3, 3, 4]),
    (-10, 3, [-3, -3, -4]),
    (2, 3, [0, 0, 2]),
    (744_000_001, 744, [1_000_000] * 743 + [1_000_001]),
    (5, 1, [5]),
    (0, 4, [0, 0, 0, 0]),
])
def test_an_amount_splits_into_equal_micro_units_with_the_remainder_last(
    micro: int, parts: int, shares: list[int],
) -> None:
    assert split_micro(micro, parts) == shares
    assert sum(shares) == micro


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.mark.parametrize(("start", "end", "count"), [
    ("2024-09-01T00:00:00", "2024-10-01T00:00:00", 720),
    ("2024-09-01T00:00:00", "2024-09-02T00:00:00", 24),
    ("2024-09-01T00:00:00", "2024-09-01T01:00:00", 1),
    ("2024-09-01T00:30:00", "2024-09-01T02:00:00", 2),  # a started hour is an hour
    ("2024-09-01T00:00:00", "2024-09-01T00:00:00", 1),
])
def test_the_hours_of_a_charge_period_are_counted_from_its_start(
    start: str, end: str, count: int,
) -> None:
    hours = hours_of(at(start), at(end))
    assert len(hours) == count and hours[0] == at(start)
    assert all(b - a == timedelta(hours=1) for a, b in zip(hours, hours[1:], strict=False))


def spread(**cells: str) -> Converted | Skipped:
    return FocusConverter(CostBasis.effective, "USD", now=NOW, rates=RATES,
                          spread=True).convert(row(**cells))


def test_a_monthly_fee_spread_is_one_event_per_hour_exactly() -> None:
    outcome = spread(ChargePeriodStart="2024-09-01 00:00:00",
                     ChargePeriodEnd="2024-10-01 00:00:00", EffectiveCost="100")
    assert isinstance(outcome, Converted) and len(outcome.events) == 720
    costs = [round(e.cost * 1_000_000) for e in outcome.events if e.cost is not None]
    assert costs == [138_888] * 719 + [100_000_000 - 719 * 138_888]
    assert sum(costs) == outcome.micro == 100_000_000
    assert [e.quantity for e in outcome.events] == [e.cost for e in outcome.events]
    first, last = outcome.events[0], outcome.events[-1]
    assert (first.ts, last.ts) == ("2024-09-01T00:00:00Z", "2024-09-30T23:00:00Z")
    assert last.event_id == outcome.event.event_id + "/719"
    assert len({e.event_id for e in outcome.events}) == 720


def test_a_spread_credit_stays_a_credit_in_every_hour() -> None:
    outcome = spread(ChargePeriodStart="2024-09-01 00:00:00", ChargeCategory="Credit",
                     ChargePeriodEnd="2024-09-02 00:00:00", EffectiveCost="-1")
    assert isinstance(outcome, Converted) and len(outcome.events) == 24
    assert {(e.charge, e.quantity) for e in outcome.events} == {(ChargeKind.credit, 0.0)}
    assert sum(round((e.cost or 0) * 1_000_000) for e in outcome.events) == -1_000_000


def test_an_hourly_charge_is_not_spread() -> None:
    outcome = spread()
    assert isinstance(outcome, Converted) and outcome.events == (outcome.event,)
    assert not outcome.event.event_id.endswith("/0")


@pytest.mark.parametrize(("cells", "reason"), [
    ({"ChargePeriodEnd": "NULL"}, SkipReason.bad_timestamp),
    ({"ChargePeriodEnd": "2024-09-18 21:00:00"}, SkipReason.bad_timestamp),  # before start
    ({"ChargePeriodStart": "2026-11-01 00:00:00", "ChargePeriodEnd": "2026-12-01 00:00:00",
      "ChargeFrequency": "Recurring"}, SkipReason.future),  # a fee's last hours are ahead
    ({"ChargePeriodStart": "2026-11-01 00:00:00", "ChargePeriodEnd": "2026-12-01 00:00:00",
      "ChargeFrequency": "usage-based"}, SkipReason.open),  # usage still accruing: held
])
def test_a_charge_that_cannot_be_spread_is_skipped(
    cells: dict[str, str], reason: SkipReason,
) -> None:
    outcome = spread(**cells)
    assert isinstance(outcome, Skipped) and outcome.reason is reason


def test_spreading_needs_the_charge_period_end_column(tmp_path: Path) -> None:
    path = tmp_path / "no-end.csv"
    path.write_text(csv_text([{k: v for k, v in row().items() if k != "ChargePeriodEnd"}]))
    with open_focus(path) as (text, _), pytest.raises(FocusFormatError, match="ChargePeriodEnd"):
        list(read_rows(text, CostBasis.effective, spread=True))


# -- charges still accruing ------------------------------------------------------------------------

# NOW is 2026-11-28T08:00:00Z: a daily row of the 28th is not over.
TODAY = {"ChargePeriodStart": "2026-11-28 00:00:00", "ChargePeriodEnd": "2026-11-29 00:00:00"}


@pytest.mark.parametrize(("cells", "held"), [
    (TODAY, True),                                                     # a usage-based charge
    ({**TODAY, "ChargeFrequency": "Usage-Based"}, True),
    ({**TODAY, "ChargeFrequency": "Recurring"}, False),                # a fee is stated whole
    ({**TODAY, "ChargeFrequency": "One-Time"}, False),
    ({**TODAY, "ChargePeriodEnd": "2026-11-28 08:00:00"}, False),     # over, just now
    ({**TODAY, "ChargePeriodEnd": "NULL"}, False),                     # judged by its start
])
def test_a_usage_based_charge_whose_period_is_not_over_is_held(
    cells: dict[str, str], held: bool,
) -> None:
    outcome = convert(**cells)
    if held:
        assert outcome == Skipped(SkipReason.open, 10_250_000, "USD")
    else:
        assert isinstance(outcome, Converted)


def test_a_held_row_counts_with_its_final_amount_when_imported_after_its_period() -> None:
    """A month-to-date export imported daily: the row of the day still running is held, so the
    id it will have is not spent on a partial amount; the next day's export counts it whole."""
    partial = FocusConverter(CostBasis.effective, "USD", now=NOW).convert(
        row(**TODAY, EffectiveCost="3.10"))
    final = FocusConverter(CostBasis.effective, "USD", now=NOW + 86400).convert(
        row(**TODAY, EffectiveCost="24.00"))
    assert isinstance(partial, Skipped) and partial.reason is SkipReason.open
    assert isinstance(final, Converted) and final.micro == 24_000_000
    tally = ImportTally()
    tally.count(partial)
    assert tally.invalid_rows == 0  # held is not a fault: the import does not fail for it
    assert tally.as_dict()["skipped"] == {"open": {"rows": 1, "cost": {"USD": "3.100000"}}}


def test_recording_takes_a_row_still_accruing_as_it_stood() -> None:
    """Imports before the row memory counted such rows at once: ``--record-only`` records
    them at their amount, and a later import sends the difference to the final one."""
    recorded = FocusConverter(CostBasis.effective, "USD", now=NOW, hold=False).convert(
        row(**TODAY, EffectiveCost="3.10"))
    assert isinstance(recorded, Converted) and recorded.micro == 3_100_000


# -- the tally ------------------------------------------------------------------------------------


def test_skipped_amounts_are_told_in_their_own_currency() -> None:
    tally = ImportTally()
    for outcome in (convert(BillingCurrency="GBP"), convert(BillingCurrency="GBP"),
                    convert(EffectiveCost="NULL"), convert(ChargePeriodStart="soon"),
                    convert(EffectiveCost="-2", ChargeCategory="Credit"), convert()):
        tally.count(outcome)
    assert (tally.rows, tally.events, tally.invalid_rows) == (6, 2, 4)
    assert tally.as_dict()["skipped"] == {
        "bad_timestamp": {"rows": 1, "cost": {"USD": "10.250000"}},
        "no_rate": {"rows": 2, "cost": {"GBP": "20.500000"}},
        "null_cost": {"rows": 1, "cost": {"USD": "0.000000"}},
    }
    assert tally.skipped_text(SkipReason.no_rate) == "£20.50"
    assert (tally.as_dict()["cost_total"], tally.as_dict()["gross_total"],
            tally.as_dict()["credits_total"]) == ("8.250000", "10.250000", "2.000000")


# -- the real sample --------------------------------------------------------------------------


def convert_sample(basis: CostBasis) -> tuple[list[Converted], ImportTally, FocusConverter]:
    converter = FocusConverter(basis, "USD", now=NOW)
    tally, events = ImportTally(), []
    with open_focus(SAMPLE) as (text, _):
        for raw in read_rows(text, basis):
            outcome = converter.convert(raw)
            tally.count(outcome)
            if isinstance(outcome, Converted):
                events.append(outcome)
    return events, tally, converter


@needs_sample
@pytest.mark.parametrize("basis", list(CostBasis))
def test_every_row_of_the_sample_counts_and_sums_to_the_csv_per_category(
    basis: CostBasis,
) -> None:
    category = {"Compute": "compute", "AI and Machine Learning": "compute",
                "Databases": "database", "Storage": "storage", "Networking": "network",
                "Management and Governance": "observability", "Identity": "security",
                "Security": "security", "Integration": "other", "Other": "other"}
    expected: Counter[str] = Counter()
    negative = 0
    with SAMPLE.open(newline="") as handle:
        for line in csv.DictReader(handle):
            amount = Decimal(line[basis.column])
            micro = int((amount * 1_000_000).quantize(Decimal(1), ROUND_HALF_EVEN))
            negative += micro < 0
            expected[category[line["ServiceCategory"]]] += micro
    events, tally, converter = convert_sample(basis)
    assert tally.rows == tally.events == len(events) == 1000
    assert tally.invalid_rows == 0 and not tally.skipped_rows
    assert dict(tally.by_category) == dict(expected)
    assert sum(e.event.charge is not ChargeKind.usage for e in events) == negative + 2
    assert len({e.event.event_id for e in events}) == len(events)
    assert converter.warnings["tag_key_clash"] > 0  # " org" beside "org" in the sample


@needs_sample
def test_the_sample_nets_to_its_bill() -> None:
    """The FOCUS sample's EffectiveCost sums to 14.976514 USD (the bill), 18.138486 before its
    13 negative rows: a credit of 3 and 0.161972 of refunds and reversals (adjustments)."""
    _, tally, _ = convert_sample(CostBasis.effective)
    assert (tally.cost_micro, tally.credits_micro) == (14_976_514, 3_161_972)
    assert tally.by_charge == {"usage": 18_138_486, "adjustment": -161_972, "credit": -3_000_000}


# -- event ids --------------------------------------------------------------------------------


def test_event_ids_ignore_amounts_cost_basis_and_time_spelling() -> None:
    first = converted().event.event_id
    assert first.startswith("focus:") and len(first) == 38
    assert converted(EffectiveCost="99").event.event_id == first
    assert converted(ChargePeriodStart="2024-09-18T22:00:00Z",
                     ChargePeriodEnd="2024-09-18T23:00:00+00:00").event.event_id == first
    outcome = convert(CostBasis.billed)
    assert isinstance(outcome, Converted) and outcome.event.event_id == first
    assert converted(ResourceId="i-0def").event.event_id != first


def test_identical_rows_in_one_file_are_distinct_charges() -> None:
    converter = FocusConverter(CostBasis.effective, "USD", now=NOW)
    ids = []
    for _ in range(3):
        outcome = converter.convert(row())
        assert isinstance(outcome, Converted)
        ids.append(outcome.event.event_id)
    assert ids[1] == ids[0] + ":2" and ids[2] == ids[0] + ":3"


# -- tags -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("raw", "key"), [
    ("CostCenter", "cost_center"), ("ms:Department", "ms_department"), (" org", "org"),
    ("aks-managed-poolName", "aks_managed_pool_name"), ("FOCUS-Test", "focus_test"),
    ("2fa", "tag_2fa"), ("___", None), ("x" * 80, "x" * 63), ("business_unit", "business_unit"),
    ("a__b", "a__b"), ("team_", "team_"),  # costline's own keys come back as they were
])
def test_foreign_tag_keys_are_normalised(raw: str, key: str | None) -> None:
    assert tag_key(raw) == key


def test_merge_keeps_fixed_tags_prefers_exact_keys_and_stops_at_32() -> None:
    foreign: dict[str, object] = {" org": "spaced", "org": "exact", "Provider": "mine",
                                  "n": 5, "flag": True, "none": None, "empty": " ",
                                  "long": "v" * 300}
    foreign.update({f"z{i:02d}": "x" for i in range(30)})  # sorted after the others
    tags, dropped = merge_tags({"provider": "AWS"}, foreign)
    assert (tags["provider"], tags["org"], tags["n"], tags["flag"]) == ("AWS", "exact", "5", "true")
    assert len(tags["long"]) == 256 and "none" not in tags and "empty" not in tags
    assert len(tags) == 32
    assert dropped == {"tag_key_clash": 2, "tag_unusable": 2, "tags_over_limit": 3}


def test_tags_that_are_not_a_json_object_are_a_warning_not_a_skip() -> None:
    converter = FocusConverter(CostBasis.effective, "USD", now=NOW)
    outcome = converter.convert(row(Tags="[1, 2]"))
    assert isinstance(outcome, Converted) and "team" not in outcome.event.tags
    assert converter.warnings == {"bad_tags": 1}


def test_an_unknown_service_category_is_other_and_counted() -> None:
    converter = FocusConverter(CostBasis.effective, "USD", now=NOW)
    outcome = converter.convert(row(ServiceCategory="Quantum"))
    assert isinstance(outcome, Converted) and outcome.event.resource_type == "focus.other"
    assert converter.warnings == {"unmapped_service_category": 1}


def test_rows_without_resource_id_get_one_per_service() -> None:
    assert converted(ResourceId="NULL").event.resource_id == \
        "AWS/123456789012/Amazon Elastic Compute Cloud"


# -- files ------------------------------------------------------------------------------------


def csv_text(rows: list[dict[str, str | None]]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def test_gzip_and_a_byte_order_mark_are_read(tmp_path: Path) -> None:
    path = tmp_path / "export.csv.gz"
    path.write_bytes(gzip.compress(b"\xef\xbb\xbf" + csv_text([row(), row()]).encode()))
    with open_focus(path) as (text, raw):
        rows = list(read_rows(text, CostBasis.effective))
        assert raw.tell() == path.stat().st_size
    assert [r["EffectiveCost"] for r in rows] == ["10.25", "10.25"]


def test_a_file_without_the_cost_column_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "not-focus.csv"
    path.write_text("a,b\n1,2\n")
    with open_focus(path) as (text, _), pytest.raises(FocusFormatError, match="EffectiveCost"):
        list(read_rows(text, CostBasis.effective))


# -- the price book -----------------------------------------------------------------------------


def test_the_proposed_price_book_lines_complete_the_example_book(tmp_path: Path) -> None:
    example = REPO / "rules" / "prices" / "example.yaml"
    missing = missing_prices(PriceBook.load(example))
    path = tmp_path / "prices.yaml"
    path.write_text(example.read_text() + "\n".join(price_book_lines("USD", missing)) + "\n")
    book = PriceBook.load(path)
    assert missing_prices(book) == set()
    assert {name: p.category.value for name, p in book.prices.items()
            if name.startswith("focus.")} == {f"focus.{c}": c for c in (
                "compute", "storage", "network", "database", "observability", "security",
                "operations", "migration", "other")}


# -- batching -----------------------------------------------------------------------------------


def test_each_message_holds_events_of_one_partition_and_is_keyed_to_it() -> None:
    batcher = PartitionBatcher(partitions=6, size=4)
    messages = []
    for n in range(50):
        messages += batcher.add(f"focus:{n:032x}", json.dumps({"n": n}).encode())
    messages += batcher.flush()
    assert sum(m.events for m in messages) == 50 and max(m.events for m in messages) == 4
    for message in messages:
        partition = partition_of(message.key.decode(), 6)
        members: list[Any] = json.loads(message.value)
        ids = [f"focus:{m['n']:032x}" for m in members]
        assert {partition_of(i, 6) for i in ids} == {partition}
        assert ids[0] == message.key.decode()


def test_partition_of_agrees_with_kafkas_default_partitioner() -> None:
    from kafka.partitioner.default import DefaultPartitioner

    class Cluster:
        def topics(self) -> set[str]:
            return {"t"}

        def partitions_for_topic(self, topic: str) -> set[int]:
            return set(range(6))

        def available_partitions_for_topic(self, topic: str) -> set[int]:
            return set(range(6))

    chooser = DefaultPartitioner()
    for event_id in ("focus:abc", "slurm:c:42:1795852800:gpu.h100", "prom:1:2", "u-8812"):
        key = event_id.encode()
        assert chooser.partition("t", event_id, key, None, None, Cluster()) == \
            partition_of(event_id, 6)


# -- the command, offline -----------------------------------------------------------------------


# Nothing listens on port 1: a dry run finds no Redis here, and no test reads another's memory.
NO_REDIS = {"COSTLINE_REDIS_URL": "redis://127.0.0.1:1/0"}


def cli(*args: str) -> Any:
    from costline.streams.cli.root import _register, app

    _register()
    return CliRunner().invoke(app, list(args), env=NO_REDIS)


def test_a_record_only_dry_run_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "one.csv"
    path.write_text(csv_text([row()]))
    result = cli("import", "focus", str(path), "--dry-run", "--record-only")
    assert result.exit_code == 2
    assert "give one of them" in result.output


def test_record_only_with_complete_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "one.csv"
    path.write_text(csv_text([row(BillingPeriodStart="2024-09-01 00:00:00")]))
    result = cli("import", "focus", str(path), "--complete", "--record-only")
    assert result.exit_code == 2
    assert "withdraws nothing" in result.output


@needs_sample
def test_dry_run_reports_without_kafka() -> None:
    result = cli("import", "focus", str(SAMPLE), "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["rows_read"], report["sent_events"], report["dry_run"]) == (1000, 0, True)
    assert (report["events"], report["skipped"]) == (1000, {})
    assert (report["cost_total"], report["credits_total"]) == ("14.976514", "3.161972")
    assert report["row_memory"] == "unread"  # no Redis: every row taken as new, and said


@needs_sample
def test_a_dry_run_without_redis_says_it_took_every_row_as_new() -> None:
    result = cli("import", "focus", str(SAMPLE), "--dry-run")
    assert result.exit_code == 0, result.output
    assert "the row memory was not read (Redis at redis://127.0.0.1:1/0: ConnectionError)" \
        in result.stdout


def test_an_import_the_worker_could_not_price_stops_before_sending(tmp_path: Path) -> None:
    example = REPO / "rules/prices/example.yaml"
    if not missing_prices(PriceBook.load(example)):
        pytest.skip("the example price book already prices focus.*")
    path = tmp_path / "one.csv"
    path.write_text(csv_text([row()]))
    result = cli("--prices", str(example), "--kafka-bootstrap", "127.0.0.1:1",
                 "import", "focus", str(path))
    assert result.exit_code == 2
    assert "focus.compute:" in result.output and "unit: usd, price: 1" in result.output


@needs_sample
def test_dry_run_with_spread_counts_an_event_per_hour_of_the_daily_rows() -> None:
    result = cli("import", "focus", str(SAMPLE), "--spread", "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["rows_read"], report["rows_counted"], report["spread"]) == (1000, 1000, True)
    assert report["events"] == 949 + 51 * 24  # the sample's daily rows, spread over 24 hours
    assert report["cost_total"] == "14.976514"


def test_rows_that_cannot_be_counted_make_exit_code_1_and_are_told(tmp_path: Path) -> None:
    path = tmp_path / "bill.csv"
    path.write_text(csv_text([row(), row(BillingCurrency="GBP"), row(EffectiveCost="NULL")]))
    result = cli("import", "focus", str(path), "--dry-run")
    assert result.exit_code == 1, result.output
    assert "skipped 1 row (no_rate): £10.25 not counted" in result.stdout
    assert "skipped 1 row (null_cost): $0.00 not counted" in result.stdout


def test_rows_still_accruing_are_told_as_held_and_do_not_fail_the_import(tmp_path: Path) -> None:
    path = tmp_path / "month-to-date.csv"
    far = {"ChargePeriodStart": "2099-01-01 00:00:00", "ChargePeriodEnd": "2099-01-02 00:00:00"}
    running = {"ChargePeriodStart": "2020-01-01 00:00:00",
               "ChargePeriodEnd": "2099-01-01 00:00:00"}  # started long ago, not over
    path.write_text(csv_text([row(ChargeFrequency="Usage-Based"),
                              row(**running, ResourceId="i-1", ChargeFrequency="Usage-Based"),
                              row(**running, ResourceId="i-2", ChargeFrequency="Recurring")]))
    result = cli("import", "focus", str(path), "--dry-run")
    assert result.exit_code == 0, result.output
    assert "held 1 row (open): $10.25 of usage-based charges whose period is not over" \
        in result.stdout
    assert "dry run: would send 2 events" in result.stdout
    path.write_text(csv_text([row(**far)]))  # a start ahead is still a fault of the row
    assert cli("import", "focus", str(path), "--dry-run").exit_code == 1


def test_the_parts_are_checked_before_anything_is_sent(tmp_path: Path) -> None:
    """The same file twice would be taken for split lines and counted twice; a damaged part
    found after the others were sent would leave half an export counted."""
    good = tmp_path / "part-00000.csv"
    good.write_text(csv_text([row()]))
    copy = tmp_path / "copy-of-part-00000.csv"
    copy.write_bytes(good.read_bytes())
    result = cli("import", "focus", str(good), str(copy), "--dry-run")
    assert result.exit_code == 2
    assert f"{copy}: the same bytes as {good}" in result.output

    truncated = tmp_path / "part-00001.csv.gz"
    truncated.write_bytes(gzip.compress(csv_text([row()] * 50).encode())[:60])
    result = cli("--kafka-bootstrap", "127.0.0.1:1", "import", "focus", str(good),
                 str(truncated))
    assert result.exit_code == 2
    assert str(truncated) in result.output and "Kafka" not in result.output
