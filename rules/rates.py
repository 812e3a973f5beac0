"""Dated exchange rates of the price book: money billed in another currency is converted, with
the rate of the day it was charged, never dropped.

```yaml
currency: USD
rates:
  EUR:                              # 1 EUR in USD, from each date (UTC) until the next one
    - {from: 2024-01-01, rate: 1.0931}
    - {from: 2024-07-01, rate: 1.0712}
```

A rate holds from its date (the day's first instant, UTC) until the next entry's date; the last
one holds from then on. A charge dated before a currency's first entry has no rate and is
refused with the rest of what cannot be converted, so nothing is ever converted with a rate
that did not hold yet. Rates are exact decimals: an amount is multiplied exactly and rounded
once to micro-units, like every other cost.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from datetime import UTC, date, datetime
from decimal import Context, Decimal
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints
from pydantic_core import PydanticCustomError

CurrencyCode = Annotated[str, StringConstraints(pattern=r"^[A-Z]{3}$")]
Rate = Annotated[Decimal, Field(gt=0, max_digits=30, decimal_places=12)]
# Wide enough that the product of any amount and any rate is exact (30 digits each at most).
_EXACT = Context(prec=80)


class RateEntry(BaseModel):
    """One currency unit in the book's currency, from ``from`` on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    since: date = Field(alias="from")
    rate: Rate


def _dated(entries: tuple[RateEntry, ...]) -> tuple[RateEntry, ...]:
    """At least one rate, by date. (Checked after the entries, so that a bad entry is
    reported alone rather than also as a list too short.)"""
    if not entries:
        raise PydanticCustomError("rates_empty", "a currency needs at least one dated rate")
    if any(b.since <= a.since for a, b in zip(entries, entries[1:], strict=False)):
        raise PydanticCustomError(
            "rates_order", "rates must be listed by their from date, ascending, each date once")
    return entries


RateList = Annotated[tuple[RateEntry, ...], AfterValidator(_dated)]


class RateTable:
    """The rates of every currency, looked up by the moment of a charge."""

    def __init__(self, rates: Mapping[str, Sequence[RateEntry]]) -> None:
        self._dates = {code: [entry.since for entry in entries] for code, entries in rates.items()}
        self._rates = {code: [entry.rate for entry in entries] for code, entries in rates.items()}

    @property
    def currencies(self) -> list[str]:
        return sorted(self._rates)

    def rate(self, currency: str, moment: datetime) -> Decimal | None:
        """One unit of ``currency`` in the book's currency at ``moment``; ``None`` when the
        table has no rate for it then (an unknown currency, or a moment before its first
        date)."""
        dates = self._dates.get(currency)
        if dates is None:
            return None
        index = bisect.bisect_right(dates, moment.astimezone(UTC).date()) - 1
        return self._rates[currency][index] if index >= 0 else None

    def convert(self, amount: Decimal, currency: str, moment: datetime) -> Decimal | None:
        """``amount`` of ``currency`` charged at ``moment``, exactly, in the book's currency."""
        rate = self.rate(currency, moment)
        return None if rate is None else _EXACT.multiply(amount, rate)
