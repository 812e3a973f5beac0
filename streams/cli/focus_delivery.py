"""Where ``costline import focus`` takes converted bill rows: to Kafka with the row memory
written ahead (``Delivery``), or, with ``--record-only``, into the row memory alone
(``Recording``). Both take rows a chunk at a time: one round trip to Redis for a chunk's
states, one for what it writes, and the memory keeps the shape each row is counted under
(``focus_shape``). Rows are named under their export (``focus_withdrawal``): those
counted anew, revised or found on another bill than before, and with ``--record-only`` or
``--complete`` every row not named yet; a complete delivery then withdraws the rows its exports
no longer hold."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import NamedTuple, Protocol

from costline.connectors.focus import Converted, CostBasis, in_form
from costline.connectors.focus_ledger import RowLedger
from costline.connectors.focus_revision import Change, RowState, next_step, unfinished
from costline.connectors.focus_shape import Shape, reshaped, shape
from costline.connectors.focus_tally import ImportTally
from costline.connectors.focus_withdrawal import (
    attribution,
    form_of,
    missing,
    rebuilt,
    shape_of,
)
from costline.rules.events import UsageEvent
from costline.streams.cli.produce_cmd import Summary

CHUNK_ROWS = 2000

Key = tuple[str, str]  # a row's place in the memory: (month, row id)
Named = tuple[Converted, Key, Shape]  # a row to name under its export, and its shape


class Step(NamedTuple):
    """A row's next step as it is delivered: the row's place, the step, and the shapes its
    states name (kept before it is set out, so that it can be sent again as it was)."""

    key: Key
    change: Change
    keep: tuple[Shape, ...]


def _step(key: Key, change: Change, own: Shape, shapes: Mapping[str, str]) -> Step:
    """The step, with the shapes to keep: the row's own (where it goes), and the one a move
    takes it from (whose text may have come from another row of the chunk)."""
    ahead = change.ahead
    moved = (Shape(ahead.shape, shapes[ahead.shape]),) \
        if ahead.moving and ahead.shape in shapes else ()
    return Step(key, change, (own, *moved))


class Stream(Protocol):
    """The usage topic (``import_cmd.UsageStream``)."""

    def emit(self, event: UsageEvent) -> None: ...

    def flush(self, timeout_s: float = 60.0) -> None: ...


def row_key(row: Converted) -> tuple[str, str]:
    """The row's place in the memory: the month of its time, and its id."""
    return str(row.event.ts)[:7], row.event.event_id


def on_another_bill(row: Converted, state: RowState | None) -> bool:
    """A row the memory knows, on another export's bill than the one that last held it: that
    export's now (to name it under, and to withdraw it should it go missing)."""
    return state is not None and bool(row.scope) and state.scope != row.scope


class Chunks:
    """What the import hands converted rows to: gathered into chunks of ``CHUNK_ROWS``, each
    full chunk flushed at once, the last one by the caller."""

    def __init__(self, tally: ImportTally, basis: CostBasis) -> None:
        self.tally, self.basis = tally, basis.value
        self.pending: list[Converted] = []

    def add(self, row: Converted) -> None:
        self.pending.append(row)
        if len(self.pending) >= CHUNK_ROWS:
            self.flush()

    def take(self) -> tuple[list[Converted], list[tuple[str, str]]]:
        """The chunk's rows and their places in the memory; the next chunk starts empty."""
        rows, self.pending = self.pending, []
        return rows, [row_key(row) for row in rows]

    def flush(self) -> None:
        raise NotImplementedError


class Delivery(Chunks):
    """Converted rows to Kafka a chunk at a time, with the row memory written ahead
    (``focus_revision``): first the steps an earlier import left unacknowledged, sent again
    as they were; then what changed since, marked pending before it is sent and counted once
    Kafka has acknowledged it. A dry run (no stream) reads the memory, when there is one, and
    tallies what the import would send, writing nothing and sending nothing."""

    def __init__(self, tally: ImportTally, basis: CostBasis, stream: Stream | None = None,
                 ledger: RowLedger | None = None, summary: Summary | None = None,
                 complete: bool = False) -> None:
        super().__init__(tally, basis)
        self.stream, self.ledger, self.summary = stream, ledger, summary
        self.complete = complete
        self.held: set[Key] = set()  # with --complete, every row the files hold

    def flush(self) -> None:
        rows, keys = self.take()
        if self.complete:
            self.held.update(keys)
        self.deliver(rows, keys)

    def withdraw(self, scopes: Mapping[str, str], skipped_ids: set[str],
                 max_percent: float = 100.0) -> None:
        """``--complete``: withdraw every row named under ``scopes`` (scope → label) that no
        chunk held (nor the files skipped), a chunk at a time, written ahead as any step is.
        A scope missing more than ``max_percent`` of its named rows withdraws none: files
        cut short look like that. A dry run that read the memory tallies what it would do.
        Only a complete delivery keeps the rows held, so only it withdraws."""
        if self.ledger is None or not self.complete:
            return
        for scope, label in sorted(scopes.items()):
            named = self.ledger.scope_rows(scope)
            gone = missing(named, self.held, skipped_ids)
            if 100 * len(gone) > max_percent * len(named):
                self.tally.withdrawals_refused.append((label, len(gone), len(named)))
                continue
            self.tally.missing_rows += len(gone)
            for start in range(0, len(gone), CHUNK_ROWS):
                keys = gone[start:start + CHUNK_ROWS]
                kept = [(key, text) for key, text in
                        zip(keys, self.ledger.attributions(scope, keys), strict=True) if text]
                shapes = self.ledger.shapes(scope, [shape_of(text) for _, text in kept])
                kept = [(key, text) for key, text in kept if shape_of(text) in shapes]
                self._withdraw([rebuilt(key[1], text, shapes, scope) for key, text in kept],
                               [key for key, _ in kept], scope)

    def deliver(self, rows: list[Converted], keys: list[Key]) -> None:
        """Each row's next step, and its name under the export that holds it now."""
        now = [shape(row) for row in rows]
        before, shapes, adopted = self._known(rows, keys, self._states(keys), now)
        states = self._send_unfinished(rows, keys, before, shapes)
        steps: list[Step] = []
        named: list[Named] = []  # as this import has them
        renamed: list[Named] = []  # named there unless they are
        unnamed: list[Named] = []  # with --complete, named unless they are
        noted: list[tuple[Key, RowState]] = []  # states written without sending anything
        gone: list[tuple[str, Key]] = []  # (the export that held it before, row)
        for index, (row, key, was, state, own) in enumerate(
                zip(rows, keys, before, states, now, strict=True)):
            if state is not None and state.pending is not None:  # still unacknowledged
                self.tally.count_unsent()
                continue
            change = next_step(row, self.basis, state, shapes, own)
            self.tally.count(None if change is None else change.sent, revised=state is not None,
                             moved=change is not None and change.ahead.moving
                             and change.ahead.shape in shapes)
            elsewhere = on_another_bill(row, was)
            if elsewhere and was is not None and was.scope:
                gone.append((was.scope, key))  # taken from under the export that held it
            if change is not None:
                ahead = change.ahead.held_by(row.scope)
                if ahead is not change.ahead:
                    change = change._replace(ahead=ahead)
                steps.append(_step(key, change, own, shapes))
                named.append((in_form(row, change.done.hours), key, own))
                continue
            # an adopted state resent just now was written then
            if state is not None and (elsewhere or (index in adopted and state is was)):
                noted.append((key, state.held_by(row.scope) if elsewhere else state))
            # named in the form it is counted in (the first form stays)
            form = row if state is None else in_form(row, state.hours)
            if elsewhere and state is not None:
                renamed.append((form, key, own))
            else:
                unnamed.append((form, key, own))
            if state is not None and state.basis != self.basis:
                self.tally.other_basis_rows += 1
        if self.stream is None:
            return
        if self.ledger is not None:  # named before anything is sent: a row counted can
            self._name(named, replace=True)  # always be withdrawn
            self._name(renamed + (unnamed if self.complete else []), replace=False)
            self.ledger.keep_shapes((key[0], Shape(state.shape, shapes[state.shape]))
                                    for key, state in noted if state.shape in shapes)
            self._write(noted)
            self.ledger.unname(gone)
        self._send_steps(steps)

    def _withdraw(self, rows: list[Converted], keys: list[Key], scope: str) -> None:
        """Missing rows, rebuilt at zero: each one's withdrawal. A row withdrawn, or with
        nothing to withdraw here, is no longer named under ``scope``; one whose withdrawal
        Kafka did not acknowledge stays named, for the next import to finish."""
        before = self._states(keys)
        # Nothing counted, or on another export's bill now: nothing to withdraw here.
        here = [i for i, state in enumerate(before)
                if state is not None and state.scope in ("", scope)]
        kept = set(here)
        left = [key for i, key in enumerate(keys) if i not in kept]
        rows, keys = [rows[i] for i in here], [keys[i] for i in here]
        now = [shape(row) for row in rows]
        before, shapes, _ = self._known(rows, keys, [before[i] for i in here], now)
        states = self._send_unfinished(rows, keys, before, shapes)
        steps: list[Step] = []
        for row, key, state, own in zip(rows, keys, states, now, strict=True):
            if state is not None and state.pending is not None:
                self.tally.count_unsent(read=False)
                continue
            change = next_step(row, self.basis, state, shapes, own)
            self.tally.count_withdrawn(None if change is None else change.sent)
            if change is None:
                left.append(key)
            else:
                steps.append(_step(key, change, own, shapes))
        if self.stream is None or self.ledger is None:
            return
        self.ledger.unname((scope, key) for key in left)
        if self._send_steps(steps):
            self.ledger.unname((scope, step.key) for step in steps)

    def _states(self, keys: list[Key]) -> list[RowState | None]:
        return self.ledger.states(keys) if self.ledger else [None] * len(keys)

    def _known(self, rows: list[Converted], keys: list[Key], states: list[RowState | None],
               now: list[Shape]) -> tuple[list[RowState | None], dict[str, str], set[int]]:
        """The rows' states, states from before shapes were kept given one (``_adopt``); the
        texts of the shapes those name, by id (the rows' own, and what the memory kept); and
        the indexes of the states given one."""
        states = list(states)
        shapes = {own.id: own.text for own in now}
        adopted = self._adopt(rows, keys, states, now, shapes)
        wanted = {(key[0], named) for key, state in zip(keys, states, strict=True)
                  if state is not None
                  for named in (state.shape, state.to) if named and named not in shapes}
        if self.ledger is not None and wanted:
            shapes.update(self.ledger.counted_shapes(wanted))
        return states, shapes, adopted

    def _adopt(self, rows: list[Converted], keys: list[Key], states: list[RowState | None],
               now: list[Shape], shapes: dict[str, str]) -> set[int]:
        """States written before shapes were kept take the shape and the form their export
        last named the row in (its attribution: those of the last step sent for it), or
        without one this export's: as far as anything says, what they counted is there. A
        step they left pending goes there too. Changes ``states`` and ``shapes``; returns
        the indexes it changed."""
        legacy = {index: state for index, state in enumerate(states) if state is not None and (
            not state.to if state.pending is not None  # resent whatever its basis
            else not state.shape and state.basis == self.basis)}
        named = self._named_shapes([(state.scope or rows[index].scope, keys[index])
                                    for index, state in legacy.items()])
        for (index, state), found in zip(legacy.items(), named, strict=True):
            taken, hours = found or (now[index], len(rows[index].pieces))
            shapes[taken.id] = taken.text
            states[index] = replace(state, to=taken.id, hours=hours) \
                if state.pending is not None else replace(state, shape=taken.id, hours=hours)
        return set(legacy)

    def _named_shapes(self, rows: list[tuple[str, Key]]) -> list[tuple[Shape, int] | None]:
        """The shape and the hours each row is named under in its export: (scope, row)."""
        found: list[tuple[Shape, int] | None] = [None] * len(rows)
        if self.ledger is None or not rows:
            return found
        by_scope: dict[str, list[int]] = {}
        for index, (scope, _) in enumerate(rows):
            if scope:
                by_scope.setdefault(scope, []).append(index)
        for scope, indexes in by_scope.items():
            texts = self.ledger.attributions(scope, [rows[i][1] for i in indexes])
            kept = self.ledger.shapes(scope, [shape_of(text) for text in texts if text])
            for index, text in zip(indexes, texts, strict=True):
                if text and shape_of(text) in kept:
                    found[index] = (reshaped(kept[shape_of(text)]), form_of(text))
        return found

    def _send_unfinished(self, rows: list[Converted], keys: list[Key],
                         states: list[RowState | None], shapes: Mapping[str, str]
                         ) -> list[RowState | None]:
        """Send again what earlier imports set out and did not see acknowledged, as it was;
        the states once Kafka has it."""
        again = {index: unfinished(rows[index], state, shapes)
                 for index, state in enumerate(states)
                 if state is not None and state.pending is not None}
        if not again or (self.stream is not None and not self._sent(
                [part for sent, _ in again.values() for part in sent])):
            return states
        if self.ledger is not None and self.stream is not None:
            self.ledger.keep_shapes((keys[index][0], Shape(done.shape, shapes[done.shape]))
                                    for index, (_, done) in again.items()
                                    if done.shape in shapes)
        self._write((keys[index], done) for index, (_, done) in again.items())
        self.tally.resent_rows += len(again)
        return [again[index][1] if index in again else state
                for index, state in enumerate(states)]

    def _send_steps(self, steps: list[Step]) -> bool:
        """Keep the shapes each step's states name, mark the step pending, send it, and count
        it once Kafka has acknowledged it."""
        if not steps:
            return True
        if self.ledger is not None and self.stream is not None:
            self.ledger.keep_shapes((step.key[0], kept) for step in steps for kept in step.keep)
        self._write((step.key, step.change.ahead) for step in steps)
        if not self._sent([part for step in steps for part in step.change.sent]):
            return False
        self._write((step.key, step.change.done) for step in steps)
        return True

    def _name(self, rows: list[Named], replace: bool) -> None:
        if self.ledger is not None:
            self.ledger.attribute([(row.scope, key, attribution(row, own))
                                   for row, key, own in rows if row.scope], replace=replace)

    def _sent(self, rows: list[Converted]) -> bool:
        """Send the rows' events; True once Kafka has acknowledged every one of them."""
        if self.stream is None or self.summary is None:
            return False
        failed = self.summary.failed_messages
        for row in rows:
            for event in row.events:
                self.stream.emit(event)
        self.stream.flush()
        return self.summary.failed_messages == failed

    def _write(self, states: Iterable[tuple[tuple[str, str], RowState]]) -> None:
        if self.ledger is not None and self.stream is not None:  # a dry run writes nothing
            self.ledger.write(states)


class Recording(Chunks):
    """``--record-only``: rows an import counted before the row memory existed are recorded
    as counted at their amount in this export, and nothing is sent. A row the memory already
    knows stays as it is (counted, revised or pending)."""

    def __init__(self, tally: ImportTally, basis: CostBasis, ledger: RowLedger) -> None:
        super().__init__(tally, basis)
        self.ledger = ledger

    def flush(self) -> None:
        rows, keys = self.take()
        states = self.ledger.states(keys)
        now = [shape(row) for row in rows]
        self.ledger.attribute([(row.scope, key, attribution(row, own))
                               for row, key, own in zip(rows, keys, now, strict=True)
                               if row.scope], replace=False)
        new = [(key, row, own) for key, row, state, own in zip(keys, rows, states, now,
                                                               strict=True) if state is None]
        self.ledger.keep_shapes((key[0], own) for key, _, own in new)
        elsewhere = [(key, row, state) for key, row, state in zip(keys, rows, states, strict=True)
                     if state is not None and on_another_bill(row, state)]
        self.ledger.write([*((key, RowState(self.basis, row.micro, scope=row.scope,
                                            shape=own.id, hours=len(row.pieces)))
                             for key, row, own in new),
                           *((key, state.held_by(row.scope)) for key, row, state in elsewhere)])
        self.ledger.unname((state.scope, key) for key, _, state in elsewhere if state.scope)
        self.tally.rows += len(rows)
        self.tally.recorded_rows += len(new)
        self.tally.unchanged_rows += len(rows) - len(new)
