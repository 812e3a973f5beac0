"""What a bill row's money is counted under: its shape, everything its events say but their
ids, times, resource and amounts (its tags, the service among them, its kind, category,
resource type and unit).

A provider may restate a row under other tags (a cost allocation tag backfilled, a label
corrected), another service category or sub-account name, without changing which charge it
is: the row keeps its id (``focus.identity`` leaves these columns out). A revision of its
amount alone would leave what was counted under the old shape there and count only the
difference under the new one, so the row memory keeps the shape each row's money sits under,
and a later export that restates the shape moves the money (``focus_revision``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from costline.connectors.focus import Converted
from costline.rules.events import UsageEvent

# What a row's own events say apart from its shape: the charge follows the amount's sign (a
# credit is negative usage), and every revision is an adjustment whatever it was.
_OWN = {"event_id", "ts", "resource_id", "cost", "quantity", "charge"}
# The shape: every other field (naming them is faster than leaving the others out).
_SHAPE = set(UsageEvent.model_fields) - _OWN
# Stand-ins for the own fields, to read a shape alone (``reshaped``).
_PLACEHOLDER_OWN = {"event_id": "shape", "ts": 0, "resource_id": "shape", "cost": 0.0,
                    "quantity": 0.0}


@dataclass(frozen=True, slots=True)
class Shape:
    """A shape as JSON (``text``) and its digest (``id``), which the row memory keeps."""

    id: str
    text: str


def shape(row: Converted) -> Shape:
    return _of(row.event)


def reshaped(text: str) -> Shape:
    """A shape as this version writes it, from one kept by any version (an earlier one kept
    the charge in it)."""
    return _of(event_in(text, _PLACEHOLDER_OWN))


def _of(event: UsageEvent) -> Shape:
    text = event.model_dump_json(exclude_none=True, include=_SHAPE)
    return Shape(hashlib.blake2b(text.encode(), digest_size=8).hexdigest(), text)


def event_in(text: str, own: Mapping[str, Any]) -> UsageEvent:
    """The event of the shape ``text`` with its own id, time, resource and amounts."""
    return UsageEvent.model_validate_json(json.dumps({**json.loads(text), **own}))


def row_in(text: str, row: Converted) -> Converted:
    """``row`` under the shape ``text``: the same ids, times and amounts, hour by hour."""
    return Converted(event_in(text, _own(row.event)), row.micro,
                     tuple(event_in(text, _own(piece)) for piece in row.pieces), row.scope)


def _own(event: UsageEvent) -> dict[str, Any]:
    return event.model_dump(mode="json", include=_OWN)
