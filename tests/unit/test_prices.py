"""The price book: exact money, charges, fault waste and positioned load errors."""

from __future__ import annotations

import json
from decimal import ROUND_HALF_EVEN, Decimal, localcontext
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from costline import rules
from costline.rules.events import Category, FaultEvent, Parsed, UsageEvent, parse_message
from costline.rules.prices import (
    Billing,
    PriceBook,
    PriceBookModel,
    PricingError,
    exact,
    format_micro,
    product_micro,
    to_micro,
)
from costline.rules.yaml_source import SourceInvalid

EXAMPLE = Path(rules.__file__).parent / "prices" / "example.yaml"
NOW = 1_796_025_600
MICRO_D = Decimal(1_000_000)


@pytest.fixture(scope="module")
def book() -> PriceBook:
    return PriceBook.load(EXAMPLE)


def make_book(prices: dict[str, dict[str, Any]]) -> PriceBook:
    return PriceBook(PriceBookModel.model_validate({"currency": "USD", "prices": prices}))


def parse_one(event: dict[str, Any]) -> Any:
    parsed = parse_message(json.dumps(event).encode(), now=NOW)
    assert isinstance(parsed, Parsed), parsed
    return parsed.events[0]


def usage(**changes: Any) -> UsageEvent:
    event = {"event_id": "u-1", "kind": "usage", "ts": NOW, "resource_id": "node-1",
             "resource_type": "gpu.h100", "quantity": 8.0, "unit": "gpu_hour"}
    event.update(changes)
    return parse_one(event)


def fault(**changes: Any) -> FaultEvent:
    event = {"event_id": "f-3", "kind": "fault", "ts": NOW, "fault": "node_failure",
             "resource_type": "gpu.h100", "units": 512, "lost_seconds": 1800,
             "recovery_seconds": 900}
    event.update(changes)
    return parse_one(event)


# --- exact arithmetic -----------------------------------------------------------------------


def test_a_tenth_of_an_h100_hour_costs_exactly_249000_micro(book):
    charge = book.charge(usage(quantity=0.1))
    assert charge.cost_micro == 249_000
    assert charge.category is Category.compute
    assert charge.billing is Billing.elastic


def test_eight_h100_hours_cost_19_92(book):
    assert format_micro(book.charge(usage(quantity=8.0)).cost_micro) == "19.920000"


def test_summing_three_times_a_tenth_ten_thousand_times_has_no_drift():
    priced = make_book({"thing": {"unit": "each", "price": "0.1", "category": "other"}})
    event = usage(resource_type="thing", unit="each", quantity=3)
    total = sum(priced.charge(event).cost_micro for _ in range(10_000))
    assert total == 3_000_000_000
    assert format_micro(total) == "3000.000000"


def test_summing_a_stated_cost_of_a_tenth_has_no_drift(book):
    event = usage(cost=0.1)
    total = sum(book.charge(event).cost_micro for _ in range(30_000))
    assert total == 3_000_000_000


def test_the_price_written_in_the_book_is_used_exactly(book):
    assert book.charge(usage(resource_type="storage.archive", unit="gb_hour",
                             quantity=1_000_000)).cost_micro == 1_370_000
    assert book.charge(usage(resource_type="storage.object", unit="gb_hour",
                             quantity=0.1)).cost_micro == 3


@pytest.mark.parametrize(
    ("quantity", "micro"),
    [(0.5, 0), (1.5, 2), (2.5, 2), (3.5, 4), (0.49, 0), (0.51, 1), (2.500001, 3)],
)
def test_cost_is_rounded_half_to_even_at_the_micro_unit(quantity, micro):
    priced = make_book({"tick": {"unit": "each", "price": "0.000001", "category": "other"}})
    assert priced.charge(usage(resource_type="tick", unit="each",
                               quantity=quantity)).cost_micro == micro


def exact_product_micro(number: float, per_unit_micro: Decimal) -> int:
    """What ``product_micro`` must give: the exact decimal product, rounded half to even."""
    return int((exact(number) * per_unit_micro).to_integral_value(ROUND_HALF_EVEN))


quantities = st.floats(min_value=0, max_value=1e9, allow_nan=False, allow_infinity=False)
# Prices as a book may write them: up to twelve decimal places.
prices = st.decimals(min_value=0, max_value=100_000, places=12, allow_nan=False,
                     allow_infinity=False)


@given(quantities, prices)
@example(2.5, Decimal("0.000001"))  # exactly half a micro-unit: rounds to even
@example(0.1, Decimal("2.49"))  # 0.1 is not 0.1 in binary; the book's product is 249000
@example(0.00015, Decimal("0.01"))  # 1.5 micro-units as written, 1.4999999999999998 in floats
@example(1e9, Decimal("99999.999999999999"))  # past 2^52 micro-units: the exact path
@example(0.30000000000000004, Decimal("0.0000005"))
def test_the_float_shortcut_rounds_every_product_as_decimal_arithmetic_does(number, price):
    # The hot path multiplies floats and falls back to Decimal only near a half: for any
    # quantity and any price it must give the exact decimal rounding, never a micro-unit off.
    per_unit = price * MICRO_D
    with localcontext() as ctx:
        ctx.prec = 60
        expected = exact_product_micro(number, per_unit)
    assert product_micro(number, per_unit, float(per_unit)) == expected


@given(st.integers(min_value=0, max_value=10**8), st.integers(min_value=0, max_value=6))
def test_products_that_land_on_a_half_micro_unit_round_to_even(whole, places):
    # A quantity such as 0.5005 at 1,000 micro-units a unit is 500.5 micro-units exactly as
    # written, but 500.49999999999994 in floats: the float product alone rounds it the wrong
    # way. Every product here is exactly a whole number and a half.
    quantity = Decimal(2 * whole + 1) / Decimal(2 * 10**places)
    number = float(quantity)
    assert exact(number) == quantity  # the quantity as the producer wrote it
    per_unit = Decimal(10**places)
    expected = whole if whole % 2 == 0 else whole + 1
    assert exact_product_micro(number, per_unit) == expected
    assert product_micro(number, per_unit, float(per_unit)) == expected


@pytest.mark.parametrize(
    ("cost", "micro"),
    [(0.0000005, 0), (0.0000015, 2), (0.0000025, 2), (0.0000035, 4), (12.345678, 12_345_678)],
)
def test_a_stated_cost_is_rounded_half_to_even_at_the_micro_unit(book, cost, micro):
    assert book.charge(usage(cost=cost)).cost_micro == micro


def test_a_stated_cost_overrides_the_price(book):
    assert book.charge(usage(quantity=8.0, cost=5.0)).cost_micro == 5_000_000
    assert book.charge(usage(quantity=8.0, cost=0)).cost_micro == 0


@pytest.mark.parametrize("charge", ["credit", "refund", "adjustment"])
def test_a_credit_refund_or_adjustment_may_be_negative(book, charge):
    priced = book.charge(usage(quantity=0.0, cost=-12.345678, charge=charge))
    assert priced.cost_micro == -12_345_678
    assert priced.charge.value == charge


@pytest.mark.parametrize("charge", [None, "usage", "tax", "purchase"])
def test_a_negative_cost_of_metered_usage_a_tax_or_a_purchase_is_refused(book, charge):
    changes: dict[str, object] = {"cost": -0.01}
    if charge is not None:
        changes["charge"] = charge
    with pytest.raises(PricingError) as caught:
        book.charge(usage(**changes))
    assert caught.value.code == "negative_cost"
    assert caught.value.reason.startswith(f"field cost: -0.01 is negative, but charge is "
                                          f"{charge or 'usage'}")


def test_a_negative_amount_is_bounded_like_a_positive_one(book):
    with pytest.raises(PricingError) as caught:
        book.charge(usage(cost=-2e9, charge="credit"))
    assert caught.value.code == "out_of_range"


def test_a_stated_category_overrides_the_book_but_billing_stays(book):
    charge = book.charge(usage(resource_type="gpu.h100.reserved", category="operations"))
    assert charge.category is Category.operations
    assert charge.billing is Billing.fixed
    assert charge.cost_micro == 14_800_000


def test_an_unknown_resource_type_is_refused(book):
    with pytest.raises(PricingError) as caught:
        book.charge(usage(resource_type="gpu.b300"))
    assert caught.value.code == "unknown_resource_type"
    assert caught.value.reason == "field resource_type: 'gpu.b300' is not in the price book"


@pytest.mark.parametrize("cost", [None, 1.0])
def test_a_unit_other_than_the_books_is_refused_even_with_a_stated_cost(book, cost):
    changes = {"unit": "gpu_minute"} if cost is None else {"unit": "gpu_minute", "cost": cost}
    with pytest.raises(PricingError) as caught:
        book.charge(usage(**changes))
    assert caught.value.code == "unit_mismatch"
    assert caught.value.reason == "field unit: 'gpu_minute' but gpu.h100 is priced per 'gpu_hour'"


# --- fault waste ----------------------------------------------------------------------------


def test_fault_waste_of_the_contract_example_is_956_16(book):
    waste = book.waste(fault())
    assert waste == 956_160_000
    assert format_micro(waste) == "956.160000"


def test_fault_waste_counts_lost_and_recovery_seconds_per_unit():
    priced = make_book({"gpu.x": {"unit": "gpu_hour", "price": "3.6", "category": "compute"}})
    assert priced.waste(fault(resource_type="gpu.x", units=1, lost_seconds=1,
                              recovery_seconds=0)) == 1_000
    assert priced.waste(fault(resource_type="gpu.x", units=10, lost_seconds=0.5,
                              recovery_seconds=0.25)) == 7_500
    assert priced.waste(fault(resource_type="gpu.x", units=3, lost_seconds=0,
                              recovery_seconds=0)) == 0


def test_fault_waste_is_rounded_once_half_to_even():
    priced = make_book({"gpu.x": {"unit": "gpu_hour", "price": "0.0018", "category": "compute"}})
    # 1 unit × 1 s / 3600 × 0.0018 = 0.0000005 exactly: half a micro-unit, rounds to even 0
    assert priced.waste(fault(resource_type="gpu.x", units=1, lost_seconds=1,
                              recovery_seconds=0)) == 0
    # 3 s: 0.0000015 → 2
    assert priced.waste(fault(resource_type="gpu.x", units=1, lost_seconds=2,
                              recovery_seconds=1)) == 2


def test_fault_waste_works_for_any_hourly_unit(book):
    waste = book.waste(fault(resource_type="storage.ssd", units=1000, lost_seconds=3600,
                             recovery_seconds=0))
    assert waste == 200_000


@pytest.mark.parametrize("resource_type", ["network.egress", "storage.requests"])
def test_fault_waste_is_refused_for_a_price_that_is_not_hourly(book, resource_type):
    with pytest.raises(PricingError) as caught:
        book.waste(fault(resource_type=resource_type))
    assert caught.value.code == "not_hourly"
    assert caught.value.reason.startswith(f"field resource_type: {resource_type} is priced per ")
    assert "needs a per-hour price" in caught.value.reason


def test_fault_waste_of_an_unknown_resource_type_is_refused(book):
    with pytest.raises(PricingError) as caught:
        book.waste(fault(resource_type="gpu.b300"))
    assert caught.value.code == "unknown_resource_type"


@pytest.mark.parametrize(
    ("units", "lost_seconds", "recovery_seconds", "field"),
    [
        (1, 1e15, 900, "lost_seconds"),
        (1, 900, 1e15, "recovery_seconds"),
        (1, 6e14, 5e14, "lost_seconds"),  # both too much for one unit: the larger is named
        (1_000_000, 1e11, 0, "units"),  # 1e11 s of one unit is within the limit, a million not
        (1_000_000, 0, 1e11, "units"),
    ],
)
def test_fault_waste_beyond_one_events_limit_names_the_field_that_made_it_too_large(
        units, lost_seconds, recovery_seconds, field):
    priced = make_book({"gpu.x": {"unit": "gpu_hour", "price": "3.6", "category": "compute"}})
    event = fault(resource_type="gpu.x", units=units, lost_seconds=lost_seconds,
                  recovery_seconds=recovery_seconds)
    with pytest.raises(PricingError) as caught:
        priced.waste(event)
    assert caught.value.code == "out_of_range"
    assert caught.value.reason.startswith(f"field {field}: the event would add ")


def test_fault_waste_at_one_events_limit_is_accepted():
    priced = make_book({"gpu.x": {"unit": "gpu_hour", "price": "3.6", "category": "compute"}})
    # 3.6 an hour is 1,000 micro-units a unit-second: 10^12 unit-seconds is exactly the limit.
    assert priced.waste(fault(resource_type="gpu.x", units=1_000_000, lost_seconds=4e5,
                              recovery_seconds=6e5)) == 10**15


# --- helpers --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("micro", "text"),
    [
        (0, "0.000000"),
        (1, "0.000001"),
        (999_999, "0.999999"),
        (1_000_000, "1.000000"),
        (1_234_567_890, "1234.567890"),
        (-1, "-0.000001"),
        (-999_999, "-0.999999"),
        (-1_000_000, "-1.000000"),
        (-1_234_567_890, "-1234.567890"),
        (10**20, "100000000000000.000000"),
    ],
)
def test_format_micro_prints_six_decimals_with_sign(micro, text):
    assert format_micro(micro) == text


def test_exact_reads_a_float_as_the_decimal_it_prints_as():
    assert exact(0.1) == Decimal("0.1")
    assert exact(2.49) == Decimal("2.49")
    assert exact(3) == Decimal(3)
    assert exact("0.000001") == Decimal("0.000001")


@pytest.mark.parametrize(
    ("amount", "micro"),
    [("2.49", 2_490_000), ("0.0000005", 0), ("0.0000025", 2), ("-0.0000025", -2),
     ("-0.0000035", -4), ("0.00000050000001", 1)],
)
def test_to_micro_rounds_half_to_even(amount, micro):
    assert to_micro(Decimal(amount)) == micro


# --- loading books --------------------------------------------------------------------------

GOOD = "  gpu.x: {unit: gpu_hour, price: 2.49, category: compute}\n"
BAD_BOOKS = [
    pytest.param("currency: USD\nprices:\n  gpu.x: {unit: gpu_hour, price: 2.49, category: gpus}\n",
                 3, 40, ["prices.gpu.x.category", "'compute'"], id="unknown-category"),
    pytest.param("currency: USD\nprices:\n  gpu.x:\n    unit: gpu_hour\n    price: -1\n"
                 "    category: compute\n",
                 5, 5, ["prices.gpu.x.price", "greater than or equal to 0"], id="negative-price"),
    pytest.param("currency: USD\nprices:\n  gpu.x: {unit: gpu_hour, price: 2.49, "
                 "category: compute, colour: red}\n",
                 3, 59, ["prices.gpu.x.colour", "Extra inputs are not permitted"], id="extra-key"),
    pytest.param("currency: USD\nprices:\n" + GOOD + GOOD,
                 4, 3, ["duplicate key", "gpu.x"], id="duplicate-key"),
    pytest.param("currency: USD\nprices:\n  gpu.x: &p {unit: gpu_hour, price: 2.49, "
                 "category: compute}\n  gpu.y: *p\n",
                 4, 10, ["aliases are not allowed"], id="alias"),
    pytest.param("currency: USD\nprices:\n  gpu.x: {unit: gpu_hour, price: 2.49, "
                 "category: compute, billing: monthly}\n",
                 3, 59, ["prices.gpu.x.billing", "'fixed'"], id="unknown-billing"),
    pytest.param("currency: USD\nprices:\n  gpu.x: {unit: gpu_hour, price: 0.1234567890123, "
                 "category: compute}\n",
                 3, 27, ["prices.gpu.x.price", "12 decimal places"], id="too-many-decimals"),
    pytest.param("currency: USD\nprices:\n  gpu.x: {unit: gpu_hour, price: .inf, "
                 "category: compute}\n",
                 3, 27, ["prices.gpu.x.price", "finite"], id="infinite-price"),
    pytest.param("currency: USD\nprices:\n  gpu.x: {price: 2.49, category: compute}\n",
                 3, 3, ["prices.gpu.x.unit", "Field required"], id="missing-unit"),
    pytest.param("currency: dollars\nprices:\n" + GOOD,
                 1, 1, ["currency", "pattern"], id="bad-currency"),
    pytest.param("currency: USD\nprices: {}\n",
                 2, 1, ["prices", "at least 1 item"], id="no-prices"),
    pytest.param("currency: USD\nprices:\n  GPU: {unit: gpu_hour, price: 2.49, "
                 "category: compute}\n",
                 3, 3, ["prices.GPU", "pattern"], id="bad-resource-type"),
]


@pytest.mark.parametrize(("text", "line", "col", "words"), BAD_BOOKS)
def test_a_bad_price_book_reports_file_line_and_column(tmp_path, text, line, col, words):
    path = tmp_path / "prices.yaml"
    path.write_text(text)
    with pytest.raises(SourceInvalid) as caught:
        PriceBook.load(path)
    [error] = caught.value.errors
    assert (error.file, error.line, error.col) == (str(path), line, col)
    assert str(error).startswith(f"{path}:{line}:{col}: ")
    for word in words:
        assert word in error.message


def test_a_price_book_with_several_problems_reports_each(tmp_path):
    path = tmp_path / "prices.yaml"
    path.write_text("currency: USD\nprices:\n"
                    "  a: {unit: gpu_hour, price: -1, category: compute}\n"
                    "  b: {unit: gpu_hour, price: 1, category: gpus}\n")
    with pytest.raises(SourceInvalid) as caught:
        PriceBook.load(path)
    assert [(e.line, e.col) for e in caught.value.errors] == [(3, 23), (4, 33)]


def test_the_contract_price_book_loads_and_prices_as_written(tmp_path):
    path = tmp_path / "prices.yaml"
    path.write_text(
        "currency: USD\n"
        "prices:\n"
        "  gpu.h100:       {unit: gpu_hour, price: 2.49,   category: compute,  billing: elastic}\n"
        "  storage.ssd:    {unit: gb_hour,  price: 0.0002, category: storage,  billing: fixed}\n"
        "  network.egress: {unit: gb,       price: 0.05,   category: network,  billing: elastic}\n"
        "  logs.ingest:    {unit: gb, price: 0.50, category: observability, billing: elastic}\n"
    )
    loaded = PriceBook.load(path)
    assert loaded.currency == "USD"
    assert loaded.price_of("storage.ssd").price == Decimal("0.0002")
    assert loaded.price_of("storage.ssd").billing is Billing.fixed
    assert loaded.charge(usage(resource_type="logs.ingest", unit="gb", quantity=3)).cost_micro \
        == 1_500_000


def test_the_shipped_example_book_covers_every_family_of_spend(book):
    assert book.currency == "USD"
    prices = book.prices
    gpus = [name for name in prices if name.startswith("gpu.")]
    assert len(gpus) >= 3
    assert all(prices[name].unit == "gpu_hour" for name in gpus)
    assert all(prices[name].category is Category.compute for name in gpus)
    assert prices["gpu.h100"].price == Decimal("2.49")
    assert any(p.unit == "vcpu_hour" and p.category is Category.compute for p in prices.values())
    storage = [name for name, p in prices.items()
               if p.category is Category.storage and p.unit == "gb_hour"]
    assert {"storage.ssd", "storage.object", "storage.archive"} <= set(storage)
    assert prices["network.egress"].category is Category.network
    assert prices["network.egress"].unit == "gb"
    assert prices["logs.ingest"].category is Category.observability
    assert any(p.category is Category.database for p in prices.values())
    assert {p.billing for p in prices.values()} == {Billing.fixed, Billing.elastic}
