"""The price book (``rules/prices/example.yaml`` is one) and the arithmetic of money.

Money is an integer number of micro-units of the book's currency. An event's cost is rounded
once, half to even, from the exact decimal value of the numbers the producer wrote; totals are
sums of those integers, so they never drift however many events are added.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Context, Decimal
from enum import StrEnum
from pathlib import Path
from typing import Annotated

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticCustomError

from costline.rules.events import SIGNED_CHARGES, Category, ChargeKind, FaultEvent, UsageEvent
from costline.rules.rates import CurrencyCode, RateList, RateTable
from costline.rules.yaml_source import SourceInvalid, load_document

MICRO = 1_000_000
# The most one event may add, in micro-units (a billion of the currency, or of a unit): sums
# of thousands of such amounts stay within Redis's 64-bit integers, and an absurd amount is
# refused instead of poisoning a total.
MAX_EVENT_MICRO = 10**15
_CTX = Context(prec=40, rounding=ROUND_HALF_EVEN)
_MICRO_D = Decimal(MICRO)
_HOUR_D = Decimal(3600)


class Billing(StrEnum):
    """Fixed spend is committed whether used or not; elastic spend follows usage."""

    fixed = "fixed"
    elastic = "elastic"


def exact(number: float | int | str | Decimal) -> Decimal:
    """The decimal a person wrote: ``0.1`` is 0.1, not the binary float nearest to it."""
    if isinstance(number, Decimal):
        return number
    if isinstance(number, float):
        return Decimal(repr(number))
    return Decimal(number)


def to_micro(amount: Decimal) -> int:
    """Round an amount of currency to whole micro-units, half to even."""
    return int(_CTX.multiply(amount, _MICRO_D).to_integral_value(ROUND_HALF_EVEN))


def product_micro(number: float, per_unit_micro: Decimal, per_unit_float: float) -> int:
    """``number`` × a per-unit amount in micro-units, rounded half to even, exactly.

    The float product is within a few parts in 10^16 of the exact decimal one, so unless it
    lies that close to a half (where the rounding direction could differ) its rounding is the
    exact rounding; only then is the product recomputed in decimal. This keeps the hot path
    of the aggregation free of ``Decimal`` arithmetic without giving up exactness.
    """
    product = number * per_unit_float
    if abs(product) < 2**52:
        whole = math.floor(product)
        fraction = product - whole
        if abs(fraction - 0.5) > abs(product) * 2e-15 + 1e-9:
            return int(whole) + (fraction > 0.5)
    exact_product = _CTX.multiply(exact(number), per_unit_micro)
    return int(exact_product.to_integral_value(ROUND_HALF_EVEN))


def format_micro(micro: int) -> str:
    """Micro-units as a decimal string with six places: ``1234567890`` → ``"1234.567890"``."""
    sign = "-" if micro < 0 else ""
    whole, frac = divmod(abs(micro), MICRO)
    return f"{sign}{whole}.{frac:06d}"


PositivePrice = Annotated[Decimal, Field(ge=0, max_digits=30, decimal_places=12)]
Unit = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_.-]{0,63}$")]


class Price(BaseModel):
    """What one unit of a resource type costs, and how its spend is reported."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    unit: Unit
    price: PositivePrice
    category: Category
    billing: Billing = Billing.elastic

    @property
    def hourly(self) -> bool:
        """Priced per unit-hour (``gpu_hour``, ``gb_hour``): the only kind fault waste can use."""
        return self.unit.endswith("_hour")


ResourceTypeKey = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9._-]{0,127}$")]


class PriceBookModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    currency: CurrencyCode
    prices: Annotated[dict[ResourceTypeKey, Price], Field(min_length=1)]
    # Dated exchange rates into ``currency`` (``costline.rules.rates``): billing data in
    # another currency is converted with them.
    rates: dict[CurrencyCode, RateList] = Field(default_factory=dict)

    @field_validator("rates")
    @classmethod
    def _not_own(cls, rates: dict[str, RateList], info: ValidationInfo) -> dict[str, RateList]:
        own = info.data.get("currency")
        if own in rates:
            raise PydanticCustomError(
                "own_currency", "{code} is the book's own currency: it needs no rate",
                {"code": own})
        return rates


class PricingError(ValueError):
    """An event the book cannot price; the message says which field and why."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


@dataclass(slots=True)  # not frozen: one is built per event, and frozen ones build slowly
class Charge:
    """The priced view of a usage event: its cost (negative for a credit, a refund or a
    downward adjustment) and its quantity, in micro-units."""

    cost_micro: int
    quantity_micro: int
    category: Category
    billing: Billing
    charge: ChargeKind = ChargeKind.usage


class PriceBook:
    """Prices events. Built from YAML with ``PriceBook.load`` or from a model in tests."""

    def __init__(self, model: PriceBookModel) -> None:
        self.currency = model.currency
        self.prices: dict[str, Price] = dict(model.prices)
        self.rates = RateTable(model.rates)
        # Each price with its price per unit in micro-units, exact and as the nearest float
        # (see product_micro): one lookup per event.
        self._rates = {
            name: (p, _CTX.multiply(p.price, _MICRO_D), float(_CTX.multiply(p.price, _MICRO_D)))
            for name, p in self.prices.items()
        }

    @classmethod
    def load(cls, path: Path | str) -> PriceBook:
        doc = load_document(path)
        try:
            return cls(PriceBookModel.model_validate(doc.data))
        except ValidationError as exc:
            raise SourceInvalid(doc.errors_from(exc)) from exc

    def price_of(self, resource_type: str) -> Price:
        price = self.prices.get(resource_type)
        if price is None:
            raise PricingError(
                "unknown_resource_type",
                f"field resource_type: {resource_type!r} is not in the price book",
            )
        return price

    def charge(self, event: UsageEvent) -> Charge:
        """Cost = quantity × price, unless the producer stated the cost itself."""
        rate = self._rates.get(event.resource_type)
        if rate is None:
            self.price_of(event.resource_type)  # raises the unknown resource type
        price, exact_micro, float_micro = rate  # type: ignore[misc]
        if event.unit != price.unit:
            raise PricingError(
                "unit_mismatch",
                f"field unit: {event.unit!r} but {event.resource_type} is priced per "
                f"{price.unit!r}",
            )
        quantity = product_micro(event.quantity, _MICRO_D, 1e6)
        stated = event.cost
        if stated is None:
            cost = product_micro(event.quantity, exact_micro, float_micro)
        else:
            if stated < 0 and event.charge not in SIGNED_CHARGES:
                raise PricingError(
                    "negative_cost",
                    f"field cost: {stated!r} is negative, but charge is {event.charge.value}: "
                    f"only a credit, a refund or an adjustment may be negative",
                )
            cost = product_micro(stated, _MICRO_D, 1e6)
        # One comparison on the hot path; which field overflowed is worked out only then.
        if abs(cost) > MAX_EVENT_MICRO or quantity > MAX_EVENT_MICRO:
            _bounded("quantity", quantity)
            _bounded("quantity" if stated is None else "cost", abs(cost))
        return Charge(cost, quantity, event.category or price.category, price.billing,
                      event.charge)

    def storage_price(self, tier: str) -> Price:
        """The price of a storage tier checkpoints are kept on: per GB-hour, or refused."""
        price = self.price_of(tier)
        if price.unit != "gb_hour":
            raise PricingError(
                "not_storage",
                f"field tier: {tier} is priced per {price.unit!r}; a checkpoint's tier needs a "
                "price per 'gb_hour'",
            )
        return price

    def waste(self, event: FaultEvent) -> int:
        """units × (lost_seconds + recovery_seconds) / 3600 × hourly price, in micro-units."""
        price = self.price_of(event.resource_type)
        if not price.hourly:
            raise PricingError(
                "not_hourly",
                f"field resource_type: {event.resource_type} is priced per {price.unit!r}; "
                "fault waste needs a per-hour price",
            )
        lost, recovery = exact(event.lost_seconds), exact(event.recovery_seconds)
        seconds = _CTX.add(lost, recovery)
        waste = _hourly_micro(_CTX.multiply(Decimal(event.units), seconds), price.price)
        if waste > MAX_EVENT_MICRO:
            _bounded(_waste_culprit(lost, recovery, price.price), waste)
        return waste


def _hourly_micro(unit_seconds: Decimal, hourly_price: Decimal) -> int:
    return to_micro(_CTX.multiply(_CTX.divide(unit_seconds, _HOUR_D), hourly_price))


def _waste_culprit(lost: Decimal, recovery: Decimal, hourly_price: Decimal) -> str:
    """The field to name when fault waste is beyond what one event may add: the larger of
    the two durations if they are too much even for one unit, else the number of units
    (within its own bounds, it is what multiplied a sensible duration past the limit)."""
    if _hourly_micro(_CTX.add(lost, recovery), hourly_price) <= MAX_EVENT_MICRO:
        return "units"
    return "lost_seconds" if lost >= recovery else "recovery_seconds"


def _bounded(field: str, micro: int) -> int:
    if micro > MAX_EVENT_MICRO:
        raise PricingError(
            "out_of_range",
            f"field {field}: the event would add {format_micro(micro)}, more than one event "
            f"may ({format_micro(MAX_EVENT_MICRO)})",
        )
    return micro
