"""Money for people: ``$1,804.92``, ``-$12.50``, ``1,804.92 CHF``; and an alert's figure in
its unit (``$42.50/h``, ``$1,024.00/day``, ``$2.00/Mtok``, ``2%``, ``1,200 gb_hour``).

Totals are exact micro-units (``rules.prices``); machines read them as six-place decimal
strings (``--json``, the API). People read currency: the symbol or the code, thousands
separators and cents. Every table, report and Slack message formats amounts here, so an
amount reads the same wherever it is shown.
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

from costline.rules.prices import MICRO

CURRENCY_SYMBOLS = {"USD": "$", "EUR": "€", "GBP": "£", "JPY": "¥"}
"""Currencies written with a symbol before the amount; the others are followed by their
ISO 4217 code."""

_CENT = Decimal("0.01")


def money(amount: Decimal, currency: str) -> str:
    """``$8,123.45``: two decimals, except that a nonzero amount that would round to zero
    keeps the digits it needs not to read as nothing (``$0.0002``)."""
    magnitude = abs(amount)
    cents = magnitude.quantize(_CENT, rounding=ROUND_HALF_UP)
    if magnitude and not cents:
        digits = f"{magnitude.normalize():f}"
        number = digits if len(digits) <= 8 else f"{magnitude:.4f}"
    else:
        number = f"{cents:,}"
    sign = "-" if amount < 0 and number.strip("0.") else ""
    symbol = CURRENCY_SYMBOLS.get(currency)
    return f"{sign}{symbol}{number}" if symbol else f"{sign}{number} {currency}"


def money_micro(micro: int, currency: str) -> str:
    """An amount held in micro-units (``format_micro``'s input), for people."""
    return money(Decimal(micro) / MICRO, currency)


def percent(fraction: Decimal) -> str:
    """A utilization fraction as a whole percentage: ``0.02`` → ``2%``."""
    return f"{(fraction * 100).quantize(Decimal('1'), rounding=ROUND_HALF_UP)}%"


def figure_in(amount: Decimal, unit: str, currency: str) -> str:
    """An amount in its unit: money, money per hour or per day, money per million tokens, a
    utilization fraction as a percentage, or a price book unit (``gb_hour``)."""
    if unit == "fraction":
        return percent(amount)
    if unit == "currency_per_hour":
        return f"{money(amount, currency)}/h"
    if unit == "currency_per_day":
        return f"{money(amount, currency)}/day"
    if unit == "currency_per_mtok":
        return f"{money(amount, currency)}/Mtok"
    if unit == "currency":
        return money(amount, currency)
    return f"{amount.quantize(_CENT, rounding=ROUND_HALF_UP).normalize():,f} {unit}"
