"""Where ``costline import focus`` takes converted bill rows: to Kafka with the row memory
written ahead (``Delivery``), or, with ``--record-only``, into the row memory alone
(``Recording``). Both take rows a chunk at a time: one round trip to Redis for a chunk's
states, one for what it writes. Rows are named under their export (``focus_withdrawal``): those
counted anew, revised or found on another bill than before, and with ``--record-only`` or
``--complete`` every row not named yet; a complete delivery then withdraws the rows its exports
no longer hold."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from costline.connectors.focus import Converted, CostBasis
from costline.connectors.focus_ledger import RowLedger
from costline.connectors.focus_revision import RowState, next_step, unfinished
from costline.connectors.focus_tally import ImportTally
from costline.connectors.focus_withdrawal import attribution, missing, rebuilt, shape_of
from costline.rules.events import UsageEvent
from costline.streams.cli.produce_cmd import Summary

CHUNK_ROWS = 2000


class Stream(Protocol):
    """The usage topic (``import_cmd.UsageStream``)."""

    def emit(self, event: UsageEvent) -> None: ...

    def flush(self, timeout_s: float = 60.0) -> None: ...


def row_key(row: Converted) -> tuple[str, str]:
    """The row's place in the memory: the month of its time, and its id."""
    return str(row.event.ts)[:7], row.event.event_id


class Chunks:
    """What the import hands converted rows to: gathered into chunks of ``CHUNK_ROWS``, each
    full chunk flushed at once, the last one by the caller."""

    def __init__(self, tally: ImportTally, basis: CostBasis) -> None:
        self.tally, self.basis = tally, basis.value
        self.pending: list[Converted] = []
        self.held: set[tuple[str, str]] = set()  # every row taken: what --complete keeps

    def add(self, row: Converted) -> None:
        self.pending.append(row)
        if len(self.pending) >= CHUNK_ROWS:
            self.flush()

    def take(self) -> tuple[list[Converted], list[tuple[str, str]]]:
        """The chunk's rows and their places in the memory; the next chunk starts empty."""
        rows, self.pending = self.pending, []
        keys = [row_key(row) for row in rows]
        self.held.update(keys)
        return rows, keys

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

    def flush(self) -> None:
        self.deliver(*self.take())

    def withdraw(self, scopes: Mapping[str, str], skipped_ids: set[str],
                 max_share: float = 1.0) -> None:
        """``--complete``: withdraw every row named under ``scopes`` (scope → label) that no
        chunk held (nor the files skipped), a chunk at a time, written ahead as any step is.
        A scope missing more than ``max_share`` of its named rows withdraws none: files cut
        short look like that. A dry run that read the memory tallies what it would do."""
        if self.ledger is None:
            return
        for scope, label in sorted(scopes.items()):
            named = self.ledger.scope_rows(scope)
            gone = missing(named, self.held, skipped_ids)
            if len(gone) > max_share * len(named):
                self.tally.withdrawals_refused.append((label, len(gone), len(named)))
                continue
            self.tally.missing_rows += len(gone)
            for start in range(0, len(gone), CHUNK_ROWS):
                keys = gone[start:start + CHUNK_ROWS]
                kept = [(key, text) for key, text in
                        zip(keys, self.ledger.attributions(scope, keys), strict=True) if text]
                shapes = self.ledger.shapes(scope, [shape_of(text) for _, text in kept])
                kept = [(key, text) for key, text in kept if shape_of(text) in shapes]
                self.deliver([rebuilt(key[1], text, shapes, scope) for key, text in kept],
                             [key for key, _ in kept], withdrawing=True)

    def deliver(self, rows: list[Converted], keys: list[tuple[str, str]],
                withdrawing: bool = False) -> None:
        """Each row's next step; ``withdrawing``: rows rebuilt at zero, missing from the
        export, which are not rows read."""
        states: list[RowState | None] = \
            self.ledger.states(keys) if self.ledger else [None] * len(rows)
        if withdrawing:  # nothing counted, or on another billing period's export now: left
            kept = [index for index, state in enumerate(states)
                    if state is not None and state.scope in ("", rows[index].scope)]
            rows, keys = [rows[i] for i in kept], [keys[i] for i in kept]
            states = [states[i] for i in kept]
        again = {index: unfinished(rows[index], state) for index, state in enumerate(states)
                 if state is not None and state.pending is not None}
        if again and (self.stream is None or self._sent([sent for sent, _ in again.values()])):
            self._write((keys[index], done) for index, (_, done) in again.items())
            for index, (_, done) in again.items():
                states[index] = done
            self.tally.resent_rows += len(again)
        steps = []
        named: list[tuple[Converted, tuple[str, str]]] = []  # as this import has them
        unnamed: list[tuple[Converted, tuple[str, str]]] = []  # named only if they are not
        rescoped: list[tuple[tuple[str, str], RowState]] = []
        moved: list[tuple[str, tuple[str, str]]] = []  # (the export that held it, row)
        for index, (row, state) in enumerate(zip(rows, states, strict=True)):
            if state is not None and state.pending is not None:  # still unacknowledged
                self.tally.count_unsent(read=not withdrawing)
                continue
            step = next_step(row, self.basis, state)
            if withdrawing:
                self.tally.count_withdrawn(None if step is None else step[0])
            else:
                self.tally.count(None if step is None else step[0], revised=state is not None)
            if step is not None:
                other = state or RowState(self.basis, None)
                steps.append((keys[index], other.sending(row.micro), *step))
                named.append((row, keys[index]))
                continue
            if state is not None and row.scope and state.scope != row.scope:
                rescoped.append((keys[index], state.held_by(row.scope)))  # its latest export
                named.append((row, keys[index]))
                if state.scope:
                    moved.append((state.scope, keys[index]))
            else:
                unnamed.append((row, keys[index]))
            if state is not None and state.basis != self.basis and not withdrawing:
                self.tally.other_basis_rows += 1
        if self.stream is None:
            return
        if not withdrawing:
            # Named before anything is sent: a row counted can always be withdrawn. Rows
            # counted anew or revised, or held by another export than before, are named as
            # this import has them.
            self._name(named, replace=True)
            if self.complete:  # rows held as they were: named if they were not
                self._name(unnamed, replace=False)
            self._write(rescoped)
            if moved and self.ledger is not None:
                self.ledger.unname(moved)
        if not steps:
            return
        self._write((key, ahead) for key, ahead, _, _ in steps)
        if self._sent([sent for _, _, sent, _ in steps]):
            self._write((key, done) for key, _, _, done in steps)

    def _name(self, rows: list[tuple[Converted, tuple[str, str]]], replace: bool) -> None:
        if self.ledger is not None:
            self.ledger.attribute([(row.scope, key, attribution(row))
                                   for row, key in rows if row.scope], replace=replace)

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
        self.ledger.attribute([(row.scope, key, attribution(row))
                               for row, key in zip(rows, keys, strict=True) if row.scope],
                              replace=False)
        new = [(key, RowState(self.basis, row.micro, scope=row.scope))
               for key, row, state in zip(keys, rows, self.ledger.states(keys), strict=True)
               if state is None]
        self.ledger.write(new)
        self.tally.rows += len(rows)
        self.tally.recorded_rows += len(new)
        self.tally.unchanged_rows += len(rows) - len(new)
