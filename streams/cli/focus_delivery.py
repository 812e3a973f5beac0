"""Where ``costline import focus`` takes converted bill rows: to Kafka with the row memory
written ahead (``Delivery``), or, with ``--record-only``, into the row memory alone
(``Recording``). Both take rows a chunk at a time: one round trip to Redis for a chunk's
states, one for what it writes. Rows are named under their export (``focus_withdrawal``): those
counted anew, revised or found on another bill than before, and with ``--record-only`` or
``--complete`` every row not named yet; a complete delivery then withdraws the rows its exports
no longer hold."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Protocol

from costline.connectors.focus import Converted, CostBasis
from costline.connectors.focus_ledger import RowLedger
from costline.connectors.focus_revision import RowState, Sent, next_step, unfinished
from costline.connectors.focus_shape import Shape, shape
from costline.connectors.focus_tally import ImportTally
from costline.connectors.focus_withdrawal import attribution, missing, rebuilt, shape_of
from costline.rules.events import UsageEvent
from costline.streams.cli.produce_cmd import Summary

CHUNK_ROWS = 2000

Key = tuple[str, str]  # a row's place in the memory: (month, row id)
# (row, its state while the step is sent, what is sent, its state once Kafka has it, and
# the shape it is counted under then)
Step = tuple[Key, RowState, Sent, RowState, Shape]
Named = tuple[Converted, Key, Shape]  # a row to name under its export, and its shape


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
        before = self._states(keys)
        now = [shape(row) for row in rows]
        shapes = self._counted_shapes(keys, before, now)
        states = self._send_unfinished(rows, keys, before, shapes)
        steps: list[Step] = []
        named: list[Named] = []  # as this import has them
        renamed: list[Named] = []  # named there unless they are
        unnamed: list[Named] = []  # with --complete, named unless they are
        rescoped: list[tuple[Key, RowState]] = []  # states noted without sending anything
        noted: list[tuple[str, Shape]] = []  # the shapes those name
        gone: list[tuple[str, Key]] = []  # (the export that held it before, row)
        for row, key, was, state, own in zip(rows, keys, before, states, now, strict=True):
            if state is not None and state.pending is not None:  # still unacknowledged
                self.tally.count_unsent()
                continue
            step = next_step(row, self.basis, state, shapes, own)
            self.tally.count(None if step is None else step[0], revised=state is not None,
                             moved=step is not None and step[1].moving)
            elsewhere = on_another_bill(row, was)
            if was is not None and elsewhere and was.scope:
                gone.append((was.scope, key))  # taken from under the export that held it
            if step is not None:
                sent, ahead, done = step
                steps.append((key, ahead.held_by(row.scope), sent, done, own))
                named.append((row, key, own))
                continue
            if state is not None:
                kept = state.held_by(row.scope) if elsewhere else state
                if not state.shape and state.basis == self.basis:
                    # A state from before shapes were kept: as far as anything says, what
                    # it counted is under this export's shape.
                    kept = replace(kept, shape=own.id)
                    noted.append((key[0], own))
                if kept is not state:
                    rescoped.append((key, kept))
            if elsewhere and state is not None:
                renamed.append((row, key, own))
            else:
                unnamed.append((row, key, own))
            if state is not None and state.basis != self.basis:
                self.tally.other_basis_rows += 1
        if self.stream is None:
            return
        if self.ledger is not None:  # named before anything is sent: a row counted can
            self._name(named, replace=True)  # always be withdrawn
            self._name(renamed + (unnamed if self.complete else []), replace=False)
            self.ledger.keep_shapes(noted)
            self._write(rescoped)
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
        before = [before[i] for i in here]
        now = [shape(row) for row in rows]
        shapes = self._counted_shapes(keys, before, now)
        states = self._send_unfinished(rows, keys, before, shapes)
        steps: list[Step] = []
        for row, key, state, own in zip(rows, keys, states, now, strict=True):
            if state is not None and state.pending is not None:
                self.tally.count_unsent(read=False)
                continue
            step = next_step(row, self.basis, state, shapes, own)
            self.tally.count_withdrawn(None if step is None else step[0])
            if step is None:
                left.append(key)
            else:
                steps.append((key, step[1], step[0], step[2], own))
        if self.stream is None or self.ledger is None:
            return
        self.ledger.unname((scope, key) for key in left)
        if self._send_steps(steps):
            self.ledger.unname((scope, step[0]) for step in steps)

    def _states(self, keys: list[Key]) -> list[RowState | None]:
        return self.ledger.states(keys) if self.ledger else [None] * len(keys)

    def _counted_shapes(self, keys: list[Key], states: list[RowState | None],
                        now: list[Shape]) -> dict[str, str]:
        """The texts of the shapes the rows are under, may move from, or a pending step sends
        them to (what their states name, read from the memory)."""
        known = {own.id: own.text for own in now}
        wanted = {(key[0], named) for key, state in zip(keys, states, strict=True)
                  if state is not None
                  for named in (state.shape, state.to) if named and named not in known}
        if self.ledger is not None and wanted:
            known.update(self.ledger.counted_shapes(wanted))
        return known

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
        self._write((keys[index], done) for index, (_, done) in again.items())
        self.tally.resent_rows += len(again)
        return [again[index][1] if index in again else state
                for index, state in enumerate(states)]

    def _send_steps(self, steps: list[Step]) -> bool:
        """Keep the shape each step counts its row under, mark the step pending, send it, and
        count it once Kafka has acknowledged it."""
        if not steps:
            return True
        if self.ledger is not None and self.stream is not None:
            self.ledger.keep_shapes((key[0], own) for key, _, _, _, own in steps)
        self._write((key, ahead) for key, ahead, _, _, _ in steps)
        if not self._sent([part for _, _, sent, _, _ in steps for part in sent]):
            return False
        self._write((key, done) for key, _, _, done, _ in steps)
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
                                            shape=own.id)) for key, row, own in new),
                           *((key, state.held_by(row.scope)) for key, row, state in elsewhere)])
        self.ledger.unname((state.scope, key) for key, _, state in elsewhere if state.scope)
        self.tally.rows += len(rows)
        self.tally.recorded_rows += len(new)
        self.tally.unchanged_rows += len(rows) - len(new)
