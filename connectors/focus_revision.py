"""What an import sends for a bill row, given what the row memory (``focus_ledger``) holds of
it: the row whole the first time, then each change of its amount as one ``adjustment`` of the
difference, and nothing while it stays the same.

Exports restate rows: a month-to-date export grows every day, and providers revise a day's
usage after it ends. Counting a row again by its id would be dropped by the worker's dedup
memory (within its horizon) or counted twice (after it); sending only the differences makes
spend follow the latest export whenever it is imported.

The memory is written ahead. Before an import sends a row's next step, the memory says which
amount it sets out to send (``pending``); once Kafka has acknowledged it, the step is counted.
An import that stopped in between (Kafka or Redis away, the process killed) leaves the step
pending, and the next import first sends exactly that step again (the same id, the same
amount: counted once by the worker within its dedup horizon) before it compares the export
with what was counted. Revision ``k`` of a row has the id ``<row id>:r<k>``, so a row that goes
back and forth gets a new id each time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from costline.connectors.focus import Converted
from costline.connectors.focus_shape import Shape, row_in, shape
from costline.connectors.focus_spread import split_micro
from costline.rules.events import ChargeKind, UsageEvent
from costline.rules.prices import MICRO


@dataclass(frozen=True)
class RowState:
    """What the row memory holds of one bill row: on which cost basis it was counted, the
    amount Kafka acknowledged (``None`` before the row itself was), the revisions acknowledged,
    the amount an import set out to send and did not see acknowledged, the export (billing
    scope) that last held it, the shape (``focus_shape``) its counted amount sits under, and
    while a step is pending the shape that step sends it to (``""``: not known)."""

    basis: str
    micro: int | None
    step: int = 0
    pending: int | None = None
    scope: str = ""
    shape: str = ""
    to: str = ""

    def encode(self) -> str:
        parts = [self.basis, _text(self.micro), str(self.step), _text(self.pending),
                 self.scope, self.shape, self.to]
        while len(parts) > 4 and not parts[-1]:
            parts.pop()
        return ":".join(parts)

    @classmethod
    def decode(cls, text: str) -> RowState:
        basis, micro, step, pending, *rest = text.split(":")
        scope, shape, to = (*rest, "", "", "")[:3]
        return cls(basis, _number(micro), int(step), _number(pending), scope, shape, to)

    def sending(self, micro: int, to: str) -> RowState:
        """This state while ``micro`` is being sent under the shape ``to``."""
        return replace(self, pending=micro, to=to)

    @property
    def moving(self) -> bool:
        """While a step is pending: it moves the row from the shape it was counted under."""
        return self.pending is not None and self.shape not in ("", self.to)

    def held_by(self, scope: str) -> RowState:
        """This state, the row last held by the export ``scope`` (kept when ``""``)."""
        return replace(self, scope=scope or self.scope)


Sent = tuple[Converted, ...]  # what a step sends: the row, a revision, or a move's two parts


def unfinished(row: Converted, state: RowState, shapes: Mapping[str, str]
               ) -> tuple[Sent, RowState]:
    """The step an earlier import set out to send and did not see acknowledged, as it was:
    the same ids, amounts and shapes (``shapes`` holds the texts of the state's shapes), at
    the row's times as this export gives them; and the state once Kafka has it. A state
    written before shapes were kept sends the row as this export describes it."""
    assert state.pending is not None
    # The shape the step sends to, as kept before it was set out (a lost one, or a state
    # from before shapes were kept: the row's shape now).
    target = state.to if state.to in shapes else shape(row).id
    there = row_in(shapes[target], row) if target in shapes else row
    done = RowState(state.basis, state.pending, state.step, scope=row.scope or state.scope,
                    shape=target)
    if state.micro is None:
        return (_whole(there, state.pending),), done
    return _change(there, state, state.pending, shapes, done)


def next_step(row: Converted, basis: str, state: RowState | None,
              shapes: Mapping[str, str] | None = None, now: Shape | None = None
              ) -> tuple[Sent, RowState, RowState] | None:
    """What to send for ``row`` now, the state while it is sent, and the state once Kafka has
    it; ``None`` when nothing changed, or when the row was counted on the other cost basis
    (the first basis stays). ``state`` has no pending step (``unfinished`` went first);
    ``shapes`` holds the text of its shape when the memory kept it; ``now`` is the row's
    shape, when the caller has it already.

    A row counted under another shape than this export's moves: one adjustment of minus what
    was counted, under the shape it was counted under, and one of the row's amount under its
    own. Without the old shape's text (kept only since this version) only the difference is
    sent, under the row's shape."""
    now = now or shape(row)
    if state is None:
        return ((row,), RowState(basis, None).sending(row.micro, now.id),
                RowState(basis, row.micro, scope=row.scope, shape=now.id))
    if state.basis != basis:
        return None
    shapes = shapes or {}
    if state.micro == row.micro and not _moves(state, now.id, shapes):
        return None
    done = RowState(basis, row.micro, state.step, scope=row.scope or state.scope,
                    shape=now.id)
    sent, done = _change(row, state, row.micro, shapes, done)
    # What the resent step must repeat: a move only if this one is.
    counted = state.shape if _moves(state, now.id, shapes) else ""
    return sent, replace(state.sending(row.micro, now.id), shape=counted), done


def _moves(state: RowState, target: str, shapes: Mapping[str, str]) -> bool:
    """Whether what ``state`` counted is under another shape than ``target``, one whose text
    is known."""
    return state.shape not in ("", target) and state.shape in shapes


def _change(row: Converted, state: RowState, micro: int, shapes: Mapping[str, str],
            done: RowState) -> tuple[Sent, RowState]:
    """The revisions that take what ``state`` counted to ``micro`` under ``done.shape``
    (``row`` is under it already): the difference, or a move. A part of no amount sends
    nothing, so a move of nothing sends nothing."""
    before = 0 if state.micro is None else state.micro
    if not _moves(state, done.shape, shapes):
        step = state.step + 1
        return (_revision(row, step, micro - before),), replace(done, step=step)
    step = state.step + 2
    parts = (_revision(row_in(shapes[state.shape], row), step - 1, -before),
             _revision(row, step, micro))
    return tuple(part for part in parts if part.micro), replace(done, step=step)


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
