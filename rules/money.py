"""Money for people: ``$1,804.92``, ``-$12.50``, ``1,804.92 CHF``.

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
    """``$8,123.45``: two decimals, except that a nonzero amount under one unit keeps the
    digits it needs not to read as zero (``$0.0002``)."""
    magnitude = abs(amount)
    if 0 < magnitude < 1 and magnitude != magnitude.quantize(_CENT):
        digits = f"{magnitude.normalize():f}"
        number = digits if len(digits) <= 8 else f"{magnitude:.4f}"
    else:
        number = f"{magnitude.quantize(_CENT, rounding=ROUND_HALF_UP):,}"
    sign = "-" if amount < 0 and number.strip("0.") else ""
    symbol = CURRENCY_SYMBOLS.get(currency)
    return f"{sign}{symbol}{number}" if symbol else f"{sign}{number} {currency}"


def money_micro(micro: int, currency: str) -> str:
    """An amount held in micro-units (``format_micro``'s input), for people."""
    return money(Decimal(micro) / MICRO, currency)
