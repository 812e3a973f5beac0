"""Spreading a charge over the hours of its charge period (``costline import focus --spread``).

A bill states a monthly fee, a support plan or a daily storage charge once, for its whole
period. Counted at the period's start it is a spike in the first hour that no budget forecast
or growth rule should read as a burn rate; spread, it is what it is: so much per hour.
Spreading is exact: the amount is split in micro-units, each hour gets the same share, and
the remainder of the division goes to the last hour, so the pieces add up to the amount.
"""

from __future__ import annotations

from datetime import datetime, timedelta

HOUR = timedelta(hours=1)


def hours_of(start: datetime, end: datetime) -> list[datetime]:
    """The start of every hour of [start, end), counted from ``start``: one hour-long piece
    per started hour (a period of 90 minutes has two). A period that is not longer than an
    hour, or that ends before it starts, has the one piece at ``start``."""
    count = max(1, -(-(end - start) // HOUR))
    return [start + i * HOUR for i in range(count)]


def split_micro(micro: int, parts: int) -> list[int]:
    """``micro`` in ``parts`` equal shares of whole micro-units, the remainder in the last:
    ``split_micro(10, 3) == [3, 3, 4]``; a negative amount splits as its size does
    (``[-3, -3, -4]``)."""
    if parts < 1:
        raise ValueError(f"cannot split into {parts} parts")
    sign = -1 if micro < 0 else 1
    share = abs(micro) // parts
    return [sign * share] * (parts - 1) + [micro - sign * share * (parts - 1)]
