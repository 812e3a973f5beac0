"""What to send for a bill row that an earlier import counted (``focus_ledger`` remembers how
much): nothing when its amount is the same, else the difference, as one ``adjustment``. A row
counted on the other cost basis is left as it was: the first basis imported stays.

Exports restate rows: a month-to-date export grows every day, and providers revise a day's
usage after it ends. Counting a row again by its id would be dropped by the worker's dedup
memory (within its horizon) or counted twice (after it); sending only the difference makes
spend equal the latest export whenever, and however often, it is imported. A revision's id is
the row's with a digest of the amounts it goes between, so the same revision sent again (an
import that failed half way, run again) counts once.
"""

from __future__ import annotations

import hashlib

from costline.connectors.focus import Converted
from costline.connectors.focus_ledger import Counted
from costline.rules.events import ChargeKind
from costline.rules.prices import MICRO


def revision(row: Converted, basis: str, counted: Counted | None) -> Converted | None:
    """``row`` itself when never counted, ``None`` when counted as it is (or on another
    basis), else an adjustment of the difference at the row's time (a spread row's difference
    lands in its first hour)."""
    if counted is None:
        return row
    if counted.basis != basis or counted.micro == row.micro:
        return None
    delta = row.micro - counted.micro
    step = hashlib.sha256(f"{counted.micro}>{row.micro}".encode()).hexdigest()[:12]
    event = row.event.model_copy(update={
        "event_id": f"{row.event.event_id}:r{step}", "cost": delta / MICRO,
        "quantity": delta / MICRO if delta > 0 else 0.0, "charge": ChargeKind.adjustment})
    return Converted(event, delta)
