"""Withdrawing bill rows a later export no longer holds (``costline import focus --complete``).

Providers restate a billing period until it closes, and a restatement may drop a row: a
charge taken back without a credit line, a line regrouped under another SKU or description,
a split line fewer. Its identity is gone, so no later row revises it (``focus_revision``), and
what an import counted for it would stay counted for good.

An import told that its files are the whole export of their billing periods (``--complete``)
takes every row the memory names under the same provider, billing account and billing period
(``focus.billing_scope``) that the files do not hold, and withdraws it: the row's next
revision takes its amount to zero, an ``adjustment`` of minus what was counted, at the row's
own time and tags (spread over its hours when it was spread), written ahead as every revision
is. Should the row come back in a later export it is counted again from zero.

A row the files hold but skip (a bad cost, a currency without a rate, an open charge) is not
missing. A row a later import found on another billing period's bill is that export's to
withdraw (its state names the export that last held it). A row the memory names without an
attribution cannot be rebuilt and is left.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from costline.connectors.focus import Converted, in_form
from costline.connectors.focus_shape import Shape, event_in, shape

Row = tuple[str, str]  # (month YYYY-MM, row id), as in focus_ledger


@dataclass(frozen=True)
class Attribution:
    """What the memory keeps to rebuild a row: ``text`` under the row, ``shape`` (JSON)
    under its digest ``shape_id``, both in the row's scope. What most rows of an export
    share is their shape (``focus_shape``), kept once per scope."""

    text: str
    shape_id: str
    shape: str


def attribution(row: Converted, own: Shape | None = None) -> Attribution:
    """What to keep of ``row`` (whose shape is ``own``, when the caller has it)."""
    event, own = row.event, own or shape(row)
    return Attribution(f"{len(row.pieces)}\t{event.ts}\t{own.id}\t{event.resource_id}",
                       own.id, own.text)


def shape_of(text: str) -> str:
    """The shape id an attribution's text names."""
    return text.split("\t", 3)[2]


def form_of(text: str) -> int:
    """The form of the row an attribution's text names: the hours it is counted over (0: one
    event)."""
    return int(text.split("\t", 1)[0])


def rebuilt(row_id: str, text: str, shapes: Mapping[str, str], scope: str) -> Converted:
    """The row ``attribution`` kept, as an export holding it at zero would convert it: its
    event and, when spread, one piece per hour under the same ids."""
    hours, ts, shape_id, resource_id = text.split("\t", 3)
    event = event_in(shapes[shape_id], {"event_id": row_id, "ts": ts,
                                        "resource_id": resource_id, "cost": 0.0,
                                        "quantity": 0.0})
    return in_form(Converted(event, 0, (), scope), int(hours))


def missing(named: Iterable[Row], held: set[Row], skipped_ids: set[str]) -> list[Row]:
    """The rows named under a scope that the files neither hold nor skipped, in order."""
    return sorted(row for row in named if row not in held and row[1] not in skipped_ids)
