"""costline's buckets → FOCUS 1.0 rows (``costline export focus``), for chargeback.

A FinOps tool that reads FOCUS gets costline's spend as the clouds' bills come: one row per
tag set, hour and side of the money. A tag set names one resource type and one charge (they
are dimensions of every tag set), so a row is one tag set × hour × resource type × charge
category; the gross spend and the credits of a tag set in an hour are two rows, the credits
negative, so the file keeps what the bill keeps apart. The import reads such a file back into
the same tag sets: every grouping's totals come back to the micro-unit.

costline keeps one amount per charge, priced with the price book: BilledCost, EffectiveCost,
ListCost and ContractedCost are that amount. ``docs/FOCUS.md`` gives every column. Nothing
here performs I/O: rows are made from cells already read.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal

from costline.connectors.focus_vocabulary import (
    CHARGE_CATEGORIES,
    CHARGE_CATEGORY_OF,
    COLUMN_TAGS,
    SERVICE_CATEGORY_OF,
)
from costline.rules.events import Category, ChargeKind
from costline.rules.prices import PriceBook, format_micro
from costline.rules.state import PSEUDO_TAGS, USAGE_CHARGE, Dimensions, Measure

# Every FOCUS 1.0 column, in the specification's order.
FOCUS_COLUMNS: tuple[str, ...] = (
    "AvailabilityZone", "BilledCost", "BillingAccountId", "BillingAccountName",
    "BillingCurrency", "BillingPeriodEnd", "BillingPeriodStart", "ChargeCategory", "ChargeClass",
    "ChargeDescription", "ChargeFrequency", "ChargePeriodEnd", "ChargePeriodStart",
    "CommitmentDiscountCategory", "CommitmentDiscountId", "CommitmentDiscountName",
    "CommitmentDiscountStatus", "CommitmentDiscountType", "ConsumedQuantity", "ConsumedUnit",
    "ContractedCost", "ContractedUnitPrice", "EffectiveCost", "InvoiceIssuerName", "ListCost",
    "ListUnitPrice", "PricingCategory", "PricingQuantity", "PricingUnit", "ProviderName",
    "PublisherName", "RegionId", "RegionName", "ResourceId", "ResourceName", "ResourceType",
    "ServiceCategory", "ServiceName", "SkuId", "SkuPriceId", "SubAccountId", "SubAccountName",
    "Tags",
)
# The measures a row is made of.
MEASURES: tuple[Measure, ...] = ("gross", "credits", "quantity")
# Who issued the charge when the tags do not say: costline priced it.
DEFAULT_PROVIDER = "costline"

Cells = Mapping[Dimensions, Mapping[Measure, int]]


@dataclass(frozen=True)
class Interval:
    """A charge period: an hour, or the part of one inside the exported period."""

    start: float
    end: float


def timestamp(ts: float) -> str:
    """FOCUS date-times: ISO 8601 in UTC, ``2024-09-01T00:00:00Z``."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def billing_period(ts: float) -> tuple[str, str]:
    """The UTC calendar month holding ``ts``: the invoice period of its charge."""
    moment = datetime.fromtimestamp(ts, UTC)
    start = moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = start.replace(year=start.year + start.month // 12, month=start.month % 12 + 1)
    return (start.strftime("%Y-%m-%dT%H:%M:%SZ"), end.strftime("%Y-%m-%dT%H:%M:%SZ"))


def charge_category(charge: str, tags: Mapping[str, str]) -> str:
    """FOCUS's ChargeCategory: the one the tags carry (a row imported from FOCUS keeps its
    own), else the one of costline's charge."""
    named = CHARGE_CATEGORIES.get(tags.get("charge_category", "").casefold())
    if named is not None:
        return named
    try:
        return CHARGE_CATEGORY_OF[ChargeKind(charge)]
    except ValueError:
        return "Usage"


def service_category(category: str) -> str:
    try:
        return SERVICE_CATEGORY_OF[Category(category)]
    except ValueError:
        return SERVICE_CATEGORY_OF[Category.other]


@dataclass(frozen=True)
class _Side:
    """One row's money: the gross side of a tag set's hour, or its credits."""

    micro: int
    quantity: int
    credits: bool


def _sides(sums: Mapping[Measure, int]) -> list[_Side]:
    """A cell's rows: the gross (also when nothing was spent: usage that cost nothing is still
    usage), unless the cell holds credits alone; and the credits, negative, if any."""
    gross, credits, quantity = (sums.get(m, 0) for m in MEASURES)
    sides = []
    if gross or quantity or not credits:
        sides.append(_Side(gross, quantity, False))
    if credits:
        sides.append(_Side(-credits, 0, True))
    return sides


@dataclass
class FocusRows:
    """Makes the rows of cells; counts what it made (the export's summary)."""

    book: PriceBook
    account: str  # BillingAccountId of tag sets that do not name one
    rows: int = 0
    gross_micro: int = 0
    credits_micro: int = 0
    tag_sets: set[Dimensions] = field(default_factory=set)

    def of(self, interval: Interval, cells: Cells) -> Iterator[dict[str, str]]:
        """The rows of one charge period, in the order of their dimensions."""
        period = (timestamp(interval.start), timestamp(interval.end))
        billing = billing_period(interval.start)
        for dims in sorted(cells):
            for side in _sides(cells[dims]):
                self.rows += 1
                self.tag_sets.add(dims)
                if side.credits:
                    self.credits_micro -= side.micro
                else:
                    self.gross_micro += side.micro
                yield self._row(dict(dims), side, period, billing)

    def _row(self, dims: dict[str, str], side: _Side, period: tuple[str, str],
             billing: tuple[str, str]) -> dict[str, str]:
        resource_type = dims.get("resource_type", "")
        charge = dims.get("charge", USAGE_CHARGE)
        tags = {k: v for k, v in dims.items() if k not in PSEUDO_TAGS}
        category = charge_category(charge, tags)
        provider = tags.get("provider", DEFAULT_PROVIDER)
        price = self.book.prices.get(resource_type)
        priced = category in ("Usage", "Purchase") and price is not None
        consumed = category == "Usage" and price is not None
        amount = format_micro(side.micro)
        quantity = format_micro(side.quantity)
        row = dict.fromkeys(FOCUS_COLUMNS, "")
        row.update({
            "BilledCost": amount,
            "BillingAccountId": tags.get("billing_account", self.account),
            "BillingCurrency": self.book.currency,
            "BillingPeriodStart": billing[0],
            "BillingPeriodEnd": billing[1],
            "ChargeCategory": category,
            "ChargeClass": tags.get("charge_class", ""),
            "ChargeDescription": f"{resource_type}: {charge}"
                                 + (", taken off" if side.credits else ""),
            "ChargeFrequency": "One-Time" if category == "Purchase" else "Usage-Based",
            "ChargePeriodStart": period[0],
            "ChargePeriodEnd": period[1],
            "ConsumedQuantity": quantity if consumed else "",
            "ConsumedUnit": price.unit if consumed and price else "",
            "ContractedCost": amount,
            "ContractedUnitPrice": _price(price.price) if priced and price else "",
            "EffectiveCost": amount,
            "InvoiceIssuerName": provider,
            "ListCost": amount,
            "ListUnitPrice": _price(price.price) if priced and price else "",
            "PricingQuantity": quantity if priced else "",
            "PricingUnit": price.unit if priced and price else "",
            "ProviderName": provider,
            "PublisherName": provider,
            "RegionId": tags.get("region", ""),
            "ResourceType": resource_type,
            "ServiceCategory": service_category(dims.get("category", "")),
            "ServiceName": tags.get("service", resource_type),
            "SkuId": resource_type if priced else "",
            "SkuPriceId": resource_type if priced else "",
            "SubAccountId": tags.get("sub_account", ""),
            "SubAccountName": tags.get("sub_account_name", ""),
            "Tags": _tags_json(tags),
        })
        return row


_COLUMN_TAG_KEYS = frozenset(key for _, key in COLUMN_TAGS)


def _tags_json(tags: Mapping[str, str]) -> str:
    """The tags no column carries, as a JSON object (empty: NULL)."""
    rest = {k: v for k, v in sorted(tags.items()) if k not in _COLUMN_TAG_KEYS}
    return json.dumps(rest, ensure_ascii=False, separators=(",", ":")) if rest else ""


def _price(price: Decimal) -> str:
    """A unit price as written in the book, without an exponent."""
    return format(price.normalize(), "f")


def hours_in(start: float, end: float) -> list[Interval]:
    """The UTC hours of [start, end), the first and last cut at its edges (a day in a zone
    of a half-hour offset starts mid-hour), so no row holds spend from outside the period."""
    first = int(start) // 3600 * 3600
    return [Interval(max(t, start), min(t + 3600, end)) for t in range(first, int(end), 3600)
            if min(t + 3600, end) > max(t, start)]


def days_of(intervals: list[Interval], size: int = 24) -> Iterable[list[Interval]]:
    """The intervals in runs of ``size``: a day of hours is read at a time."""
    for index in range(0, len(intervals), size):
        yield intervals[index:index + size]
