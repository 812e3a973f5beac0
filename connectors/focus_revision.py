"""What an import sends for a bill row, given what the row memory (``focus_ledger``) holds of
it: the row whole the first time, then each change of its amount as one ``adjustment`` of the
difference, and nothing while it stays the same. A row restated under another shape (other
tags: ``focus_shape``) moves: minus what it counted under the shape it is counted under, and
its amount under the new one, two adjustments of one step.

Exports restate rows: a month-to-date export grows every day, and providers revise a day's
usage after it ends. Counting a row again by its id would be dropped by the worker's dedup
memory (within its horizon) or counted twice (after it); sending only the differences makes
spend follow the latest export whenever it is imported.

The memory is written ahead. Before an import sends a row's next step, the memory says which
amount it sets out to send (``pending``); once Kafka has acknowledged it, the step is counted.
An import that stopped in between (Kafka or Redis away, the process killed) leaves the step
pending, and the next import first sends that step again as the state says it was (the same
ids, amounts, shapes and form, one event or one per hour: counted once by the worker within
its dedup horizon) before it compares the export with what was counted. Revision ``k`` of a
row has the id ``<row id>:r<k>``, so a row that goes back and forth gets a new id each time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import NamedTuple

from costline.connectors.focus import Converted, in_form
from costline.connectors.focus_shape import Shape, row_in, shape
from costline.connectors.focus_spread import split_micro
from costline.rules.events import ChargeKind, UsageEvent
from costline.rules.prices import MICRO


@dataclass(frozen=True)
class RowState:
    """What the row memory holds of one bill row: on which cost basis it was counted, the
    amount Kafka acknowledged (``None`` before the row itself was), the revisions acknowledged,
    the amount an import set out to send and did not see acknowledged, the export (billing
    scope) that last held it, the shape (``focus_shape``) its counted amount sits under,
    while a step is pending the shape that step sends the row to, and the form its amount is
    counted and sent in: the hours it is spread over (0: one event). A state written before
    shapes were kept has no shape (``""``), nor a form."""

    basis: str
    micro: int | None
    step: int = 0
    pending: int | None = None
    scope: str = ""
    shape: str = ""
    to: str = ""
    hours: int = 0

    def encode(self) -> str:
        parts = [self.basis, _text(self.micro), str(self.step), _text(self.pending),
                 self.scope, self.shape, self.to, str(self.hours or "")]
        while len(parts) > 4 and not parts[-1]:
            parts.pop()
        return ":".join(parts)

    @classmethod
    def decode(cls, text: str) -> RowState:
        basis, micro, step, pending, *rest = text.split(":")
        scope, shape, to, hours = (*rest, "", "", "", "")[:4]
        return cls(basis, _number(micro), int(step), _number(pending), scope, shape, to,
                   int(hours or 0))

    def sending(self, row: Converted, to: str) -> RowState:
        """This state while ``row``'s amount is being sent, in the row's form, under the shape
        ``to``."""
        return replace(self, pending=row.micro, to=to, hours=len(row.pieces))

    @property
    def moving(self) -> bool:
        """While a step is pending: it moves what was counted from the shape it is under to
        another (a revision of its amount alone otherwise)."""
        return self.pending is not None and self.micro is not None \
            and self.shape not in ("", self.to) and self.to != ""

    def held_by(self, scope: str) -> RowState:
        """This state, the row last held by the export ``scope`` (kept when ``""``)."""
        return self if scope in ("", self.scope) else replace(self, scope=scope)


Sent = tuple[Converted, ...]  # what a step sends: the row, a revision, or a move's two parts


class Change(NamedTuple):
    """A row's next step: what is sent, the state while it is, and the state once Kafka has
    it."""

    sent: Sent
    ahead: RowState
    done: RowState


def next_step(row: Converted, basis: str, state: RowState | None,
              shapes: Mapping[str, str], now: Shape | None = None) -> Change | None:
    """What to send for ``row`` now; ``None`` when nothing changed, or when the row was counted
    on the other cost basis (the first basis stays). ``state`` has no pending step
    (``unfinished`` went first); ``shapes`` holds the texts of the shapes it names, as the
    memory kept them; ``now`` is the row's shape, when the caller has it already.

    A row counted under another shape than this export's moves: one adjustment of minus what
    was counted, under the shape it was counted under, and one of the row's amount under its
    own. A row of no amount moves nothing: it stays where it is until it has one. A row is
    revised in the form it was counted in, whatever this import's ``--spread`` (the first
    form stays, as the first basis does): each of its hours follows the bill."""
    now = now or shape(row)
    if state is None:
        ahead = RowState(basis, None, pending=row.micro, scope=row.scope, to=now.id,
                         hours=len(row.pieces))
        return Change((row,), ahead, _done(ahead, row.scope))
    if state.basis != basis:
        return None
    row = in_form(row, state.hours)
    moves = state.shape not in ("", now.id)
    if state.micro == row.micro and (not moves or row.micro == 0):
        return None
    ahead = state.sending(row, now.id)
    return Change(_parts(row, ahead, shapes), ahead, _done(ahead, row.scope))


def unfinished(row: Converted, state: RowState, shapes: Mapping[str, str]
               ) -> tuple[Sent, RowState]:
    """The step an earlier import set out to send and did not see acknowledged, as the state
    says it was: the same ids, amounts and shapes (``shapes`` holds the texts of those it
    names), in the form it was set out in (one event, or spread over its hours: whatever
    this import's ``--spread``), at the row's times as this export gives them; and the state
    once Kafka has it. A step set out before shapes and forms were kept goes under the row's
    shape now, in this import's form."""
    assert state.pending is not None
    ahead = state if state.to else replace(state, to=shape(row).id, hours=len(row.pieces))
    row = in_form(row, ahead.hours)
    there = row_in(shapes[ahead.to], row) if ahead.to in shapes else row
    return _parts(there, ahead, shapes), _done(ahead, row.scope)


def _parts(row: Converted, ahead: RowState, shapes: Mapping[str, str]) -> Sent:
    """What the step ``ahead`` sends, ``row`` being under its target shape: the row whole,
    the difference, or a move. A part of no amount sends nothing. Should the memory have
    lost the text of the shape a move starts from, its first part goes under the target
    too: the ids stay those of a move, so a step sent before is not counted twice."""
    assert ahead.pending is not None
    if ahead.micro is None:
        return (_whole(row, ahead.pending),)
    if not ahead.moving:
        return (_revision(row, ahead.step + 1, ahead.pending - ahead.micro),)
    counted = shapes.get(ahead.shape)
    parts = (_revision(row if counted is None else row_in(counted, row), ahead.step + 1,
                       -ahead.micro),
             _revision(row, ahead.step + 2, ahead.pending))
    return tuple(part for part in parts if part.micro)


def _done(ahead: RowState, scope: str) -> RowState:
    """The state once Kafka has acknowledged the step ``ahead`` sets out."""
    assert ahead.pending is not None
    steps = 0 if ahead.micro is None else 2 if ahead.moving else 1
    return RowState(ahead.basis, ahead.pending, ahead.step + steps, scope=scope or ahead.scope,
                    shape=ahead.to, hours=ahead.hours)


def _amount(micro: int) -> dict[str, object]:
    return {"cost": micro / MICRO, "quantity": micro / MICRO if micro > 0 else 0.0}


def _whole(row: Converted, micro: int) -> Converted:
    """The row with another amount, under its own ids (spread pieces as it was spread)."""
    if micro == row.micro:
        return row
    pieces: tuple[UsageEvent, ...] = tuple(
        piece.model_copy(update=_amount(share))
        for piece, share in zip(row.pieces, split_micro(micro, len(row.pieces)), strict=True)
    ) if row.pieces else ()
    return Converted(row.event.model_copy(update=_amount(micro)), micro, pieces, row.scope)


def _revision(row: Converted, step: int, delta: int) -> Converted:
    """Revision ``step`` of the row: one adjustment of ``delta`` at the row's time, with the
    id ``<row id>:r<step>``; a spread row's is spread as the row is, over the same hours
    (``<row id>:r<step>/<hour>``), so each hour follows the bill. An hour whose share is less
    than a micro-unit gets no event."""
    event_id = f"{row.event.event_id}:r{step}"
    adjustment = row.event.model_copy(update={
        "event_id": event_id, "charge": ChargeKind.adjustment, **_amount(delta)})
    pieces = tuple(
        piece.model_copy(update={"event_id": f"{event_id}/{index}",
                                 "charge": ChargeKind.adjustment, **_amount(share)})
        for index, (piece, share) in enumerate(
            zip(row.pieces, split_micro(delta, len(row.pieces)), strict=True))
        if share
    ) if row.pieces else ()
    return Converted(adjustment, delta, pieces, row.scope)


def _text(number: int | None) -> str:
    return "" if number is None else str(number)


def _number(text: str) -> int | None:
    return None if text == "" else int(text)
