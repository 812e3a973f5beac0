"""FOCUS 1.0 billing exports → costline usage events (README, Events).

FOCUS, the FinOps Open Cost and Usage Specification, is the billing export that AWS, Google
Cloud, Microsoft and Oracle share. Importing it puts the clouds' own invoice lines beside the
cluster's telemetry, so budgets watch what is billed rather than an estimate.

Each row becomes one usage event whose ``cost`` is the row's EffectiveCost (or BilledCost) and
whose ``quantity`` is the same amount. The events use nine resource types, ``focus.<category>``,
priced at 1 per currency unit (unit ``usd`` for a USD book): the price book needs no entry per
cloud SKU, the worker's unit check still holds, and the explicit cost is what is counted.

A row that cannot be an event is skipped and counted by reason. Events carry costs ≥ 0, so a
credit or a negative correction is reported with its amount and never subtracted: spend is the
gross of what was consumed, which errs on the side of alerting early. ``docs/FOCUS.md`` gives
every mapping below in a table.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
import re
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from functools import lru_cache
from pathlib import Path
from typing import IO, Any, cast

from costline.rules.events import MAX_FUTURE_S, MAX_TAGS, Category, UsageEvent
from costline.rules.prices import MICRO, Billing, Price, PriceBook, format_micro, to_micro

MAX_TAG_VALUE = 256
MAX_RESOURCE_ID = 256
MAX_COST = Decimal(10**9)
_NULLS = frozenset({"", "NULL", "null"})


class CostBasis(StrEnum):
    """Which FOCUS cost column becomes the event's cost."""

    effective = "effective"  # amortised: commitments spread over the usage they cover
    billed = "billed"  # as invoiced: a commitment's purchase counts when it is bought

    @property
    def column(self) -> str:
        return "EffectiveCost" if self is CostBasis.effective else "BilledCost"


# FOCUS 1.0 ServiceCategory → costline category. Unknown values count as ``other``.
SERVICE_CATEGORIES: dict[str, Category] = {
    "ai and machine learning": Category.compute,
    "analytics": Category.database,
    "business applications": Category.other,
    "compute": Category.compute,
    "databases": Category.database,
    "developer tools": Category.operations,
    "identity": Category.security,
    "integration": Category.other,
    "internet of things": Category.other,
    "management and governance": Category.observability,
    "media": Category.other,
    "migration": Category.migration,
    "mobile": Category.other,
    "multicloud": Category.operations,
    "networking": Category.network,
    "security": Category.security,
    "storage": Category.storage,
    "web": Category.compute,
    "other": Category.other,
}

# FOCUS column → costline tag, in the order they claim one of the 32 tag places.
COLUMN_TAGS: tuple[tuple[str, str], ...] = (
    ("ProviderName", "provider"),
    ("ServiceName", "service"),
    ("SubAccountId", "sub_account"),
    ("SubAccountName", "sub_account_name"),
    ("BillingAccountId", "billing_account"),
    ("RegionId", "region"),
    ("ChargeCategory", "charge_category"),
    ("ChargeClass", "charge_class"),
)

# The columns that say which charge a row is, without its amounts: a row re-exported with a
# revised amount or a re-import under the other cost basis keeps its event id, so nothing
# counts twice. Tags are left out too (a tag activated later must not duplicate old rows).
IDENTITY_COLUMNS: tuple[str, ...] = (
    "BillingAccountId", "SubAccountId", "ProviderName", "PublisherName", "InvoiceIssuerName",
    "ChargePeriodStart", "ChargePeriodEnd", "ChargeCategory", "ChargeClass", "ChargeFrequency",
    "ChargeDescription", "ServiceName", "ResourceId", "RegionId", "AvailabilityZone", "SkuId",
    "SkuPriceId", "PricingCategory", "PricingUnit", "ConsumedUnit", "CommitmentDiscountId",
    "CommitmentDiscountStatus",
)
_TIME_INDEXES = tuple(IDENTITY_COLUMNS.index(c) for c in ("ChargePeriodStart", "ChargePeriodEnd"))
REQUIRED_COLUMNS = ("ChargePeriodStart", "ServiceCategory", "BillingCurrency")


class FocusFormatError(ValueError):
    """The file is not a FOCUS export costline can read (the message says why)."""


class SkipReason(StrEnum):
    """Why a row produced no event."""

    credit = "credit"  # negative amount, ChargeCategory Credit
    correction = "correction"  # negative amount, ChargeClass Correction
    negative_cost = "negative_cost"  # any other negative amount (a refund, a reversal)
    null_cost = "null_cost"
    bad_cost = "bad_cost"
    bad_timestamp = "bad_timestamp"
    future = "future"  # ChargePeriodStart more than 10 minutes ahead: the worker refuses it
    other_currency = "other_currency"  # BillingCurrency is not the price book's currency


# Skips that are the importer's rules rather than faults in the file.
BY_DESIGN = frozenset({SkipReason.credit, SkipReason.correction, SkipReason.negative_cost})


# -- the price book entries the events need ------------------------------------------------


def resource_type_of(category: Category) -> str:
    return f"focus.{category.value}"


def unit_of(currency: str) -> str:
    """The unit of the ``focus.*`` types: the currency itself, in lower case (``usd``)."""
    return currency.lower()


def focus_prices(currency: str) -> dict[str, Price]:
    """One resource type per category, 1 per currency unit: quantity and cost are the amount."""
    return {
        resource_type_of(category): Price(unit=unit_of(currency), price=Decimal(1),
                                          category=category, billing=Billing.elastic)
        for category in Category
    }


def price_book_lines(currency: str, names: set[str] | None = None) -> list[str]:
    """The ``prices:`` entries to add to a price book, as YAML lines."""
    lines = []
    for name, price in focus_prices(currency).items():
        if names is None or name in names:
            lines.append(f"  {name + ':':<20} {{unit: {price.unit}, price: 1, "
                         f"category: {price.category.value}, billing: {price.billing.value}}}")
    return lines


def missing_prices(book: PriceBook) -> set[str]:
    """The ``focus.*`` types the book lacks or prices in another unit (the worker would refuse
    their events)."""
    return {
        name for name, wanted in focus_prices(book.currency).items()
        if (have := book.prices.get(name)) is None or have.unit != wanted.unit
    }


# -- tags -----------------------------------------------------------------------------------

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_NOT_KEY = re.compile(r"[^a-z0-9]+")


@lru_cache(maxsize=4096)
def tag_key(raw: str) -> str | None:
    """A foreign tag key in costline's ``[a-z][a-z0-9_]{0,62}``: ``CostCenter`` → ``cost_center``,
    ``ms:Department`` → ``ms_department``; ``None`` when nothing usable is left."""
    key = _NOT_KEY.sub("_", _CAMEL.sub("_", raw.strip()).lower()).strip("_")
    if not key:
        return None
    if not key[0].isalpha():
        key = "tag_" + key
    return key[:63].rstrip("_")


def tag_value(raw: object) -> str | None:
    """Text of at most 256 characters; ``None`` for nothing (a tag value is never empty)."""
    if raw is None:
        return None
    text = raw if isinstance(raw, str) else json.dumps(raw, separators=(",", ":"))
    return text[:MAX_TAG_VALUE] if text.strip() else None


def merge_tags(fixed: Mapping[str, str], foreign: Mapping[str, object]
               ) -> tuple[dict[str, str], Counter[str]]:
    """``fixed`` tags, then foreign ones while places remain; returns the tags and the foreign
    ones left out, counted by why.

    A fixed tag wins over a foreign one of the same key. Of two foreign keys that normalise
    alike (``org`` and `` org``), the one already in costline's form wins, then the first in
    sorted order, so the choice never depends on the row's key order.
    """
    tags = dict(fixed)
    dropped: Counter[str] = Counter()
    ordered = sorted(foreign.items(), key=lambda item: (tag_key(item[0]) != item[0], item[0]))
    for raw_key, raw_value in ordered:
        key, value = tag_key(raw_key), tag_value(raw_value)
        if key is None or value is None:
            dropped["tag_unusable"] += 1
        elif key in tags:
            dropped["tag_key_clash"] += 1
        elif len(tags) >= MAX_TAGS:
            dropped["tags_over_limit"] += 1
        else:
            tags[key] = value
    return tags, dropped


# -- one row ----------------------------------------------------------------------------------


Row = Mapping[str, str | None]


def without_nulls(row: Row) -> dict[str, str]:
    """The row's cells that hold a value: FOCUS writes NULL as ``NULL`` or leaves it empty."""
    return {column: value for column, value in row.items()
            if value is not None and value.strip() not in _NULLS}


def parse_time(text: str) -> datetime:
    """FOCUS date-times are UTC; exports write ``2024-09-01 00:00:00`` or ``…T00:00:00Z``."""
    moment = datetime.fromisoformat(text.strip())
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def rfc3339(moment: datetime) -> str:
    text = moment.astimezone(UTC).isoformat()
    return text.removesuffix("+00:00") + "Z"


def parse_cost(text: str | None) -> Decimal | SkipReason:
    """The amount; a billion or more is refused with the garbage, as no row is that large and
    an event's float carries micro-units exactly only below it."""
    if text is None:
        return SkipReason.null_cost
    try:
        amount = Decimal(text.strip())
    except InvalidOperation:
        return SkipReason.bad_cost
    if not amount.is_finite() or abs(amount) >= MAX_COST:
        return SkipReason.bad_cost
    return amount


@dataclass(frozen=True, slots=True)
class Converted:
    event: UsageEvent
    micro: int


@dataclass(frozen=True, slots=True)
class Skipped:
    reason: SkipReason
    micro: int = 0  # the row's amount when it had one (a credit's is negative)


def negative_reason(row: Mapping[str, str]) -> SkipReason:
    if (row.get("ChargeCategory") or "").casefold() == "credit":
        return SkipReason.credit
    if (row.get("ChargeClass") or "").casefold() == "correction":
        return SkipReason.correction
    return SkipReason.negative_cost


@lru_cache(maxsize=8192)
def canonical_time(text: str) -> str:
    """One spelling per moment, so two exports that write times differently agree on ids."""
    with suppress(ValueError):
        return rfc3339(parse_time(text))
    return text


def identity(row: Mapping[str, str]) -> str:
    """The row's identity columns as one string (timestamps in one canonical form)."""
    values = [row.get(column, "") for column in IDENTITY_COLUMNS]
    for index in _TIME_INDEXES:
        if values[index]:
            values[index] = canonical_time(values[index])
    return "\x1f".join(values)


def resource_id_of(row: Mapping[str, str]) -> str:
    """ResourceId; rows without one (taxes, support, some data transfer) get a per-service id."""
    found = row.get("ResourceId") or row.get("ResourceName")
    if found is None:
        found = "/".join(row.get(c) or "-" for c in ("ProviderName", "SubAccountId",
                                                       "ServiceName"))
    return found[:MAX_RESOURCE_ID]


@dataclass
class FocusConverter:
    """Turns rows into events; remembers identities seen so far in this file.

    Two rows with the same identity are distinct charges (FOCUS allows split lines): the n-th
    gets ``:n`` after its id, so the same file imported again yields the same ids.
    """

    basis: CostBasis
    currency: str
    now: float = field(default_factory=time.time)
    warnings: Counter[str] = field(default_factory=Counter)
    _seen: Counter[str] = field(default_factory=Counter)

    def convert(self, raw: Row) -> Converted | Skipped:
        row = without_nulls(raw)
        amount = parse_cost(row.get(self.basis.column))
        if isinstance(amount, SkipReason):
            return Skipped(amount)
        micro = to_micro(amount)
        if (row.get("BillingCurrency") or self.currency).upper() != self.currency:
            return Skipped(SkipReason.other_currency, micro)
        if amount < 0:
            return Skipped(negative_reason(row), micro)
        start = row.get("ChargePeriodStart")
        try:
            moment = parse_time(start or "")
        except ValueError:
            return Skipped(SkipReason.bad_timestamp, micro)
        if moment.timestamp() > self.now + MAX_FUTURE_S:
            return Skipped(SkipReason.future, micro)
        return Converted(self._event(row, moment, micro), micro)

    def _event(self, row: Mapping[str, str], moment: datetime, micro: int) -> UsageEvent:
        # Micro-units as a float with at most 15 significant digits: its JSON is the exact
        # decimal, so the worker's rounding finds the same micro-units.
        amount = micro / MICRO
        category = self._category(row)
        return UsageEvent(
            event_id=self._event_id(row), kind="usage", ts=rfc3339(moment),
            resource_id=resource_id_of(row), resource_type=resource_type_of(category),
            quantity=amount, unit=unit_of(self.currency), cost=amount, category=category,
            tags=self._tags(row),
        )

    def _event_id(self, row: Mapping[str, str]) -> str:
        digest = hashlib.sha256(identity(row).encode()).hexdigest()[:32]
        self._seen[digest] += 1
        count = self._seen[digest]
        return f"focus:{digest}" + (f":{count}" if count > 1 else "")

    def _category(self, row: Mapping[str, str]) -> Category:
        name = (row.get("ServiceCategory") or "").strip().casefold()
        category = SERVICE_CATEGORIES.get(name)
        if category is None:
            self.warnings["unmapped_service_category"] += 1
            return Category.other
        return category

    def _tags(self, row: Mapping[str, str]) -> dict[str, str]:
        fixed = {}
        for column, key in COLUMN_TAGS:
            value = tag_value(row.get(column))
            if value is not None:
                fixed[key] = value
        tags, dropped = merge_tags(fixed, self._row_tags(row))
        self.warnings.update(dropped)
        return tags

    def _row_tags(self, row: Mapping[str, str]) -> dict[str, object]:
        text = row.get("Tags")
        if text is None:
            return {}
        try:
            found = json.loads(text)
        except ValueError:
            found = None
        if not isinstance(found, dict):
            self.warnings["bad_tags"] += 1
            return {}
        return found


# -- the file -------------------------------------------------------------------------------


@contextmanager
def open_focus(path: Path) -> Iterator[tuple[IO[str], IO[bytes]]]:
    """The CSV as text (gzip recognised by its magic bytes, a BOM dropped) and the raw file,
    whose position tells how far the import got."""
    with path.open("rb") as raw:
        compressed = raw.read(2) == b"\x1f\x8b"
        raw.seek(0)
        binary: IO[bytes] = raw
        if compressed:
            binary = cast(IO[bytes], gzip.GzipFile(fileobj=raw, mode="rb"))
        text = io.TextIOWrapper(binary, encoding="utf-8-sig", newline="")
        try:
            yield text, raw
        finally:
            text.close()


def read_rows(text: IO[str], basis: CostBasis) -> Iterator[dict[str, str | None]]:
    """The rows of a FOCUS CSV; refuses a file without the columns an event needs."""
    reader = csv.DictReader(text)
    header = set(reader.fieldnames or ())
    missing = [c for c in (*REQUIRED_COLUMNS, basis.column) if c not in header]
    if missing:
        raise FocusFormatError(f"not a FOCUS export: no column {', '.join(missing)}")
    yield from reader


# -- what an import did ------------------------------------------------------------------------


@dataclass
class ImportTally:
    """Rows read, events made, skips by reason with their amounts, warnings: the summary."""

    rows: int = 0
    events: int = 0
    cost_micro: int = 0
    by_category: Counter[str] = field(default_factory=Counter)
    skipped_rows: Counter[SkipReason] = field(default_factory=Counter)
    skipped_micro: Counter[SkipReason] = field(default_factory=Counter)

    def count(self, outcome: Converted | Skipped) -> None:
        self.rows += 1
        if isinstance(outcome, Converted):
            self.events += 1
            self.cost_micro += outcome.micro
            category = outcome.event.category
            self.by_category[category.value if category else "other"] += outcome.micro
        else:
            self.skipped_rows[outcome.reason] += 1
            self.skipped_micro[outcome.reason] += outcome.micro

    @property
    def invalid_rows(self) -> int:
        """Rows skipped for a fault in the data rather than by the import's own rules."""
        return sum(n for reason, n in self.skipped_rows.items() if reason not in BY_DESIGN)

    def as_dict(self) -> dict[str, Any]:
        return {
            "rows_read": self.rows,
            "events": self.events,
            "cost_total": format_micro(self.cost_micro),
            "cost_by_category": {k: format_micro(v) for k, v in sorted(self.by_category.items())},
            "skipped": {
                reason.value: {"rows": n, "cost": format_micro(self.skipped_micro[reason])}
                for reason, n in sorted(self.skipped_rows.items())
            },
        }
