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

from dataclasses import dataclass, replace

from costline.connectors.focus import Converted
from costline.connectors.focus_spread import split_micro
from costline.rules.events import ChargeKind, UsageEvent
from costline.rules.prices import MICRO


@dataclass(frozen=True)
class RowState:
    """What the row memory holds of one bill row: on which cost basis it was counted, the
    amount Kafka acknowledged (``None`` before the row itself was), the revisions acknowledged,
    the amount an import set out to send and did not see acknowledged, and the export (billing
    scope) that last held it (``""``: none known)."""

    basis: str
    micro: int | None
    step: int = 0
    pending: int | None = None
    scope: str = ""

    def encode(self) -> str:
        parts = [self.basis, _text(self.micro), str(self.step), _text(self.pending)]
        return ":".join([*parts, self.scope] if self.scope else parts)

    @classmethod
    def decode(cls, text: str) -> RowState:
        basis, micro, step, pending, *scope = text.split(":")
        return cls(basis, _number(micro), int(step), _number(pending), "".join(scope))

    def sending(self, micro: int) -> RowState:
        """This state while ``micro`` is being sent."""
        return replace(self, pending=micro)

    def held_by(self, scope: str) -> RowState:
        """This state, the row last held by the export ``scope`` (kept when ``""``)."""
        return replace(self, scope=scope or self.scope)


def unfinished(row: Converted, state: RowState) -> tuple[Converted, RowState]:
    """The step an earlier import set out to send and did not see acknowledged, as it was
    (the same ids and amount, on the row as this export describes it), and the state once
    Kafka has it."""
    assert state.pending is not None
    if state.micro is None:
        return _whole(row, state.pending), RowState(state.basis, state.pending,
                                                    scope=row.scope or state.scope)
    step = state.step + 1
    return (_revision(row, step, state.pending - state.micro),
            RowState(state.basis, state.pending, step, scope=row.scope or state.scope))


def next_step(row: Converted, basis: str, state: RowState | None
              ) -> tuple[Converted, RowState] | None:
    """What to send for ``row`` now, and the state once Kafka has it; ``None`` when nothing
    changed, or when the row was counted on the other cost basis (the first basis stays).
    ``state`` has no pending step (``unfinished`` went first)."""
    if state is None:
        return row, RowState(basis, row.micro, scope=row.scope)
    if state.basis != basis or state.micro == row.micro:
        return None
    before = 0 if state.micro is None else state.micro
    step = state.step + 1
    return (_revision(row, step, row.micro - before),
            RowState(basis, row.micro, step, scope=row.scope or state.scope))


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
