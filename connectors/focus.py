"""FOCUS 1.0 billing exports → costline usage events (README, Events).

FOCUS, the FinOps Open Cost and Usage Specification, is the billing export that AWS, Google
Cloud, Microsoft and Oracle share. Importing it puts the clouds' own invoice lines beside the
cluster's telemetry, so budgets watch what is billed rather than an estimate.

Each row becomes one usage event whose ``cost`` is the row's EffectiveCost (or BilledCost),
signed, with the ``charge`` its ChargeCategory says (a credit, a refund or a correction is
negative money on the bill, and spend must equal the bill). The events use nine resource types,
``focus.<category>``, priced at 1 per currency unit (unit ``usd`` for a USD book): the price
book needs no entry per cloud SKU, the worker's unit check still holds, and the explicit cost
is what is counted. A row in another currency is converted with the price book's dated rates;
with ``spread`` a charge over more than an hour becomes one event per hour.

Only a row that cannot be an event is skipped, counted by reason with its amount: a NULL or
non-numeric cost, a bad time, a currency without a rate. A usage-based charge whose period is
not over is held (``open``): its amount still grows. ``docs/FOCUS.md`` gives every mapping
below in a table.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections import Counter
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from functools import lru_cache

from costline.connectors.focus_spread import HOUR, hours_of, split_micro
from costline.connectors.focus_vocabulary import (
    COLUMN_TAGS,
    CURRENCY_TAG,
    SERVICE_CATEGORIES,
    accrues,
    charge_of,
)
from costline.rules.events import MAX_FUTURE_S, MAX_TAGS, Category, ChargeKind, UsageEvent
from costline.rules.prices import MICRO, Billing, Price, PriceBook, to_micro
from costline.rules.rates import RateTable

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


class SkipReason(StrEnum):
    """Why a row produced no event: a fault in the row, except ``open`` (``HELD``)."""

    null_cost = "null_cost"
    bad_cost = "bad_cost"
    bad_timestamp = "bad_timestamp"
    future = "future"  # an hour of the charge starts more than 10 minutes ahead: refused
    no_rate = "no_rate"  # another currency, and the price book has no rate for it then
    # A usage-based charge whose period is not over: what the provider states is only what it
    # came to so far. Held, not faulty: the first import after its period ends counts it, and
    # a later revision of it is sent as the difference (focus_revision).
    open = "open"


HELD = frozenset({SkipReason.open})
"""Skips that are no fault of the row: they do not fail the import."""


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


_KEY = re.compile(r"[a-z][a-z0-9_]{0,62}")


@lru_cache(maxsize=4096)
def tag_key(raw: str) -> str | None:
    """A foreign tag key in costline's ``[a-z][a-z0-9_]{0,62}``: ``CostCenter`` → ``cost_center``,
    ``ms:Department`` → ``ms_department``; ``None`` when nothing usable is left. A key already
    in that form is kept as it is, so costline's own tags come back unchanged from an export."""
    if _KEY.fullmatch(raw):
        return raw
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
    """A row's events: one, or one per hour of its charge period when spread (``pieces``)."""

    event: UsageEvent
    micro: int  # the row's amount in the book's currency (a credit's is negative)
    pieces: tuple[UsageEvent, ...] = ()
    scope: str = ""  # its export (``billing_scope``)

    @property
    def events(self) -> tuple[UsageEvent, ...]:
        return self.pieces or (self.event,)


@dataclass(frozen=True, slots=True)
class Skipped:
    reason: SkipReason
    micro: int = 0  # the row's amount when it had one, in its own currency
    currency: str = ""  # that currency


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


def billing_scope(row: Mapping[str, str]) -> str:
    """The export a row belongs to: its provider, billing account and billing period, as a
    digest (``""`` without a BillingPeriodStart; ``focus_withdrawal`` says what it is for)."""
    start = row.get("BillingPeriodStart")
    if not start:
        return ""
    return _scope(row.get("ProviderName", ""), row.get("BillingAccountId", ""), start)


def scope_label(row: Mapping[str, str]) -> str:
    """A scope for people: ``AWS account 1234 period 2024-09-01T00:00:00Z``."""
    return (f"{row.get('ProviderName') or '-'} account {row.get('BillingAccountId') or '-'} "
            f"period {canonical_time(row.get('BillingPeriodStart') or '')}")


@lru_cache(maxsize=1024)
def _scope(provider: str, account: str, start: str) -> str:
    text = "\x1f".join((provider, account, canonical_time(start)))
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def identity_digest(row: Mapping[str, str]) -> str:
    """The digest in a row's event id (``focus:<digest>``, ``:<n>`` after it for split lines)."""
    return hashlib.sha256(identity(row).encode()).hexdigest()[:32]


def pieces_of(event: UsageEvent, hours: list[datetime], micro: int) -> tuple[UsageEvent, ...]:
    """A row's event as one event per hour (ids ``/0``, ``/1``, …), its amount split exactly."""
    return tuple(
        event.model_copy(update={
            "event_id": f"{event.event_id}/{index}", "ts": rfc3339(hour),
            "cost": share / MICRO, "quantity": share / MICRO if share > 0 else 0.0})
        for index, (hour, share) in enumerate(zip(hours, split_micro(micro, len(hours)),
                                                  strict=True))
    )


def in_form(row: Converted, hours: int) -> Converted:
    """``row`` as one event (``hours`` 0) or spread over ``hours`` hours from its time, as an
    import with the other ``--spread`` choice made it: the same ids for the same form."""
    if hours == len(row.pieces):
        return row
    if not hours:
        return Converted(row.event, row.micro, (), row.scope)
    start = parse_time(str(row.event.ts))
    spread = [start + index * HOUR for index in range(hours)]
    return Converted(row.event, row.micro, pieces_of(row.event, spread, row.micro), row.scope)


def resource_id_of(row: Mapping[str, str]) -> str:
    """ResourceId; rows without one (taxes, support, some data transfer) get a per-service id."""
    found = row.get("ResourceId") or row.get("ResourceName")
    if found is None:
        found = "/".join(row.get(c) or "-" for c in ("ProviderName", "SubAccountId",
                                                       "ServiceName"))
    return found[:MAX_RESOURCE_ID]


@dataclass
class FocusConverter:
    """Turns rows into events; remembers identities seen so far in this import (every part
    file of one export goes through one converter).

    Two rows with the same identity are distinct charges (FOCUS allows split lines): the n-th
    gets ``:n`` after its id, so the same file imported again yields the same ids. A spread
    row's hours get ``/0``, ``/1``, … after the row's id.
    """

    basis: CostBasis
    currency: str
    now: float = field(default_factory=time.time)
    rates: RateTable = field(default_factory=lambda: RateTable({}))
    spread: bool = False
    # Hold usage-based charges whose period is not over (``open``). Off for ``--record-only``,
    # which records what imports counted before they held such rows: the row as it stood.
    hold: bool = True
    warnings: Counter[str] = field(default_factory=Counter)
    # The scopes of every row read, and the event ids of the rows skipped: a row the file
    # holds, counted or not, is never withdrawn as missing from it.
    scopes: dict[str, str] = field(default_factory=dict)  # scope → ``scope_label``
    skipped_ids: set[str] = field(default_factory=set)
    _seen: Counter[str] = field(default_factory=Counter)

    def convert(self, raw: Row) -> Converted | Skipped:
        row = without_nulls(raw)
        scope = billing_scope(row)
        if scope and scope not in self.scopes:
            self.scopes[scope] = scope_label(row)
        elif not scope and "BillingPeriodStart" in raw:  # the column, without a value
            self.warnings["no_billing_period"] += 1
        outcome = self._convert(row, scope)
        if isinstance(outcome, Skipped):  # a split line skipped keeps its number
            self.skipped_ids.add(self._event_id(row))
        return outcome

    def _convert(self, row: Mapping[str, str], scope: str) -> Converted | Skipped:
        currency = (row.get("BillingCurrency") or self.currency).upper()
        amount = parse_cost(row.get(self.basis.column))
        if isinstance(amount, SkipReason):
            return Skipped(amount, 0, currency)
        try:
            hours = self._hours(row)
        except ValueError:
            return Skipped(SkipReason.bad_timestamp, to_micro(amount), currency)
        if currency != self.currency:
            converted = self.rates.convert(amount, currency, hours[0])
            if converted is None:
                return Skipped(SkipReason.no_rate, to_micro(amount), currency)
            if abs(converted) >= MAX_COST:
                return Skipped(SkipReason.bad_cost, to_micro(amount), currency)
            amount = converted
        micro = to_micro(amount)
        ahead = self.now + MAX_FUTURE_S
        if self.hold and hours[0].timestamp() <= ahead and self._still_accruing(row):
            return Skipped(SkipReason.open, micro, self.currency)
        if hours[-1].timestamp() > ahead:  # spread, a fee's last hours are ahead too
            return Skipped(SkipReason.future, micro, self.currency)
        event = self._event(row, hours[0], micro, currency)
        if len(hours) == 1:
            return Converted(event, micro, scope=scope)
        return Converted(event, micro, pieces_of(event, hours, micro), scope)

    def _still_accruing(self, row: Mapping[str, str]) -> bool:
        """A usage-based charge (or one that does not say) whose period ends after now."""
        if not accrues(row.get("ChargeFrequency")):
            return False  # a recurring fee or a one-time charge is stated whole
        try:
            return parse_time(row.get("ChargePeriodEnd") or "").timestamp() > self.now
        except ValueError:  # no end, or not a time: judged by its start alone
            return False

    def _hours(self, row: Mapping[str, str]) -> list[datetime]:
        """When the row's event or events are: its ChargePeriodStart, or with ``spread`` the
        start of every hour of its charge period. Raises ``ValueError`` for a time that is
        missing or not a date-time, or a period that ends before it starts."""
        start = parse_time(row.get("ChargePeriodStart") or "")
        if not self.spread:
            return [start]
        end = parse_time(row.get("ChargePeriodEnd") or "")
        if end < start:
            raise ValueError("the charge period ends before it starts")
        return hours_of(start, end)

    def _event(self, row: Mapping[str, str], moment: datetime, micro: int,
               currency: str) -> UsageEvent:
        # Micro-units as a float with at most 15 significant digits: its JSON is the exact
        # decimal, so the worker's rounding finds the same micro-units. The quantity of a
        # focus.* type is the amount; money taken off the bill consumed nothing.
        amount = micro / MICRO
        category = self._category(row)
        return UsageEvent(
            event_id=self._event_id(row), kind="usage", ts=rfc3339(moment),
            resource_id=resource_id_of(row), resource_type=resource_type_of(category),
            quantity=amount if amount > 0 else 0.0, unit=unit_of(self.currency), cost=amount,
            category=category, charge=self._charge(row, micro), tags=self._tags(row, currency),
        )

    def _charge(self, row: Mapping[str, str], micro: int) -> ChargeKind:
        """By the sign of the amount counted: a negative amount too small to be a micro-unit
        counts as zero, and as the charge of a row that is not negative (so an export of it
        reads back as the same charge)."""
        charge, known = charge_of(row.get("ChargeCategory"), micro < 0)
        if not known:
            self.warnings["unmapped_charge_category"] += 1
        return charge

    def _event_id(self, row: Mapping[str, str]) -> str:
        digest = identity_digest(row)
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

    def _tags(self, row: Mapping[str, str], currency: str) -> dict[str, str]:
        fixed = {}
        for column, key in COLUMN_TAGS:
            value = tag_value(row.get(column))
            if value is not None:
                fixed[key] = value
        if currency != self.currency:
            fixed[CURRENCY_TAG] = currency
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
