"""Where a home partition of the ledger stands, and what each answer of Redis means.

Redis holds, with a home partition's sums and dedup memory, the offset of the last ledger
record applied to them: its *watermark*. Every write carries the watermark the worker expects
and the new one, and Redis applies it only if the expected one is what it holds (one atomic
script). Redis's watermark is the truth; Kafka's committed offsets are only a hint.

The worker keeps, per partition it owns, a ``Position``: the watermark it last saw Redis hold
(``applied``) and the last offset it has folded into a window (``folded``, never below
``applied``). These functions are the whole bookkeeping, without I/O; the shell
(``costline.streams.worker.aggregation``) fetches, writes and seeks as they say.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

NOTHING = -1  # the watermark of a partition nothing was applied to


@dataclass(frozen=True, slots=True)
class Position:
    applied: int = NOTHING
    folded: int = NOTHING
    # Raised on every seek back: windows folded before it are dropped, as their records are
    # read again.
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class SeekBack:
    """Redis lost writes (it restarted from an older snapshot, or was emptied): read the
    partition again from ``offset``."""

    offset: int


@dataclass(frozen=True, slots=True)
class Adopt:
    """Another worker applied records up to ``stored`` (a rebalance moved the partition away
    and back): records up to it are counted; go on after it."""

    stored: int


def resumed(stored: int) -> tuple[Position, int]:
    """A partition just assigned: its position and the offset to fetch from."""
    return Position(stored, stored), stored + 1


def admits(position: Position, offset: int) -> bool:
    """Whether a fetched record is new: at or below what was folded it is a replay (Kafka
    delivers again what a worker had fetched before a restart or a seek)."""
    return offset > position.folded


def folded(position: Position, offset: int) -> Position:
    return replace(position, folded=max(position.folded, offset))


def written(position: Position, last: int) -> Position:
    """Redis applied a window up to ``last``."""
    return replace(position, applied=last, folded=max(position.folded, last))


def mismatch(position: Position, stored: int) -> tuple[Position, SeekBack | Adopt]:
    """Redis refused a write: it holds ``stored``, not the expected ``position.applied``."""
    if stored < position.applied:
        return Position(stored, stored, position.epoch + 1), SeekBack(stored + 1)
    return replace(position, applied=stored, folded=max(position.folded, stored)), Adopt(stored)


def verified(position: Position, stored: int) -> tuple[Position, SeekBack | None]:
    """An idle partition's watermark read again: Redis may have lost its last writes while
    nothing new arrived to find out."""
    if stored < position.applied:
        return Position(stored, stored, position.epoch + 1), SeekBack(stored + 1)
    return position, None


def to_write(offsets: list[int], position: Position) -> list[int]:
    """The records of a window still to write: those above what Redis holds."""
    return [offset for offset in offsets if offset > position.applied]


def expired(start: int, kept_from: int) -> int:
    """How many records from ``start`` on a log no longer holds (``kept_from`` is its first
    kept offset): its retention removed them before they were counted (the ledger's before
    Redis applied them, an input topic's before intake priced them)."""
    return max(0, kept_from - start)
