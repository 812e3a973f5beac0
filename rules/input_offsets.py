"""Which input offsets intake may commit: the position after a take, once it and every take
fetched before it are delivered.

Intake fetches takes in order and delivers them side by side, so they finish out of order.
Committing a take's position while an earlier take is still in flight would lose that take's
messages if the worker died then; so a take's positions become committable only when every take
before it is done. Positions, not the last message's offset + 1: a read-committed consumer's
position moves past the transaction markers and aborted records it skips, which no message
ever names, so a partition whose last record is a marker is still committed to its end.

A rebalance starts a new generation: takes fetched before it may still finish, but their
positions are never committed afterwards (a partition may have gone to another worker and
come back, already committed further on).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Mapping, Set
from dataclasses import dataclass, field


@dataclass(eq=False)
class Fetched:
    """A take as the offsets see it: the positions it moved, in its generation."""

    positions: Mapping[Hashable, int]
    generation: int
    done: bool = False


@dataclass
class InputOffsets:
    """Takes in the order fetched; positions safe to commit; positions already committed."""

    generation: int = 0
    pending: deque[Fetched] = field(default_factory=deque)
    safe: dict[Hashable, int] = field(default_factory=dict)
    committed: dict[Hashable, int] = field(default_factory=dict)

    def fetched(self, positions: Mapping[Hashable, int]) -> Fetched:
        """A new take, after every take fetched before it."""
        take = Fetched(dict(positions), self.generation)
        self.pending.append(take)
        return take

    def delivered(self, take: Fetched) -> None:
        """A take's records are all in Kafka: it, and the done takes after it once every
        take before them is done, make their positions safe."""
        take.done = True
        while self.pending and self.pending[0].done:
            first = self.pending.popleft()
            if first.generation == self.generation:
                self.safe.update(first.positions)

    def to_commit(self, owned: Set[Hashable]) -> dict[Hashable, int]:
        """Safe positions of owned partitions that are past what was committed."""
        return {tp: offset for tp, offset in self.safe.items()
                if tp in owned and offset > self.committed.get(tp, -1)}

    def was_committed(self, offsets: Mapping[Hashable, int]) -> None:
        self.committed.update(offsets)

    def rebalanced(self) -> None:
        """Partitions move: nothing fetched before may be committed from now on."""
        self.generation += 1
        self.safe.clear()
        self.committed.clear()
