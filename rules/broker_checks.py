"""What exact counting asks of a Kafka broker, judged from what a probe of it saw.

costline counts through the Kafka protocol alone, and a broker that speaks the protocol may
still answer some requests in its own way. ``costline topics check`` writes a known sequence
of records to a topic of its own (``costline.connectors.broker_probe``) and these checks say,
each from what was read back, whether the broker keeps to what costline relies on, and what
a user loses where it does not: money (events counted that should not be, or not counted)
or only progress (lag, and waits for everything to be counted, read wrong).

The probe's topic holds, in order: a plain record; ``BATCH`` records sent as one batch; a
transaction that is aborted; a plain record; a transaction left open; a plain record after
it. The open transaction is committed after the first read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

BATCH = 5
BEFORE, ABORTED, AFTER_ABORT, OPEN, AFTER_OPEN = (
    b"before", b"aborted", b"after-abort", b"open", b"after-open")
BATCHED = tuple(b"batch-%d" % n for n in range(BATCH))
COMMITTED = (BEFORE, *BATCHED, AFTER_ABORT)
"""What a read-committed consumer should give while the second transaction is open."""
GROUP_OFFSET = 3
"""The offset the probe commits for its group, and expects to read back."""

Affects = Literal["money", "progress"]


@dataclass(frozen=True)
class Probe:
    """What the probe saw."""

    batch_offsets: tuple[int, ...]
    """The offsets a fetch gave the ``BATCH`` records sent as one batch."""
    batch_end: int
    """Where ListOffsets said the log ends, right after that batch."""
    transactions: bool
    """The broker offers the transaction APIs (InitProducerId, AddPartitionsToTxn, EndTxn);
    without them no producer can write in transactions, and their checks do not apply."""
    committed_reads: tuple[bytes, ...] = ()
    """What a read-committed consumer got while the second transaction was open."""
    stable_end: int | None = None
    """Where ListOffsets said the committed log ends then (isolation read committed)."""
    stable_position: int | None = None
    """Where that consumer stood after reading everything it was given."""
    after_commit: tuple[bytes, ...] = ()
    """What a read-committed consumer got, from the start, after it committed."""
    group_offset: int | None = None
    """The offset read back after committing ``GROUP_OFFSET`` for a group."""


@dataclass(frozen=True)
class Verdict:
    name: str
    ok: bool | None
    """None: does not apply to this broker (it runs no transactions)."""
    saw: str
    affects: Affects
    otherwise: str
    """What a user loses where the check fails."""


Decide = Callable[[Probe], tuple[bool, str]]


@dataclass(frozen=True)
class Check:
    name: str
    affects: Affects
    otherwise: str
    decide: Decide
    transactional: bool
    """Judges transactions: does not apply to a broker that runs none."""


CHECKS: list[Check] = []


def check(name: str, affects: Affects, otherwise: str, *, transactional: bool = False
          ) -> Callable[[Decide], Decide]:
    """Register a check: it decides ok or not, and says what it saw."""
    def register(decide: Decide) -> Decide:
        CHECKS.append(Check(name, affects, otherwise, decide, transactional))
        return decide
    return register


def verdicts_of(probe: Probe) -> list[Verdict]:
    """Every check, in the order they are registered."""
    return [Verdict(c.name, None, "the broker runs no transactions", c.affects, c.otherwise)
            if c.transactional and not probe.transactions
            else Verdict(c.name, *c.decide(probe), c.affects, c.otherwise)
            for c in CHECKS]


def failed(verdicts: list[Verdict]) -> list[Verdict]:
    return [v for v in verdicts if v.ok is False]


def _shown(values: tuple[bytes, ...]) -> str:
    return ", ".join(v.decode(errors="replace") for v in values) or "nothing"


@check("log_end", "progress",
       "lag read by other tools, which take ListOffsets' answer, shows the input as shorter "
       "than it is; costline checks that answer with a fetch, and counting is not affected")
def _log_end(probe: Probe) -> tuple[bool, str]:
    if len(probe.batch_offsets) != BATCH:
        return False, f"a fetch gave {len(probe.batch_offsets)} of the {BATCH} records sent"
    last = probe.batch_offsets[-1]
    return (probe.batch_end == last + 1,
            f"ListOffsets ends the log at {probe.batch_end}; the batch's last record is at "
            f"{last}")


@check("committed_given", "money",
       "committed events are not counted, or not in the order they were written",
       transactional=True)
def _committed_given(probe: Probe) -> tuple[bool, str]:
    given = tuple(v for v in probe.committed_reads if v != ABORTED)[:len(COMMITTED)]
    if given != COMMITTED:
        return False, (f"read committed gave {_shown(probe.committed_reads)}, not the "
                       "committed records before the open transaction")
    return True, "read committed gave every committed record before the open transaction"


@check("aborted_hidden", "money",
       "the events of a transaction its producer aborts are counted", transactional=True)
def _aborted_hidden(probe: Probe) -> tuple[bool, str]:
    if ABORTED in probe.committed_reads:
        return False, f"read committed gave the aborted record: {_shown(probe.committed_reads)}"
    return True, "read committed skipped the aborted record"


@check("open_held", "money",
       "the events of a transaction still open are counted before it commits, and stay "
       "counted if it is aborted", transactional=True)
def _open_held(probe: Probe) -> tuple[bool, str]:
    early = [v for v in (OPEN, AFTER_OPEN) if v in probe.committed_reads]
    if early:
        return False, ("read committed gave, before the transaction committed: "
                       + _shown(tuple(early)))
    return True, "read committed stopped before the open transaction"


@check("committed_delivered", "money",
       "the events of a transaction are never counted once it commits", transactional=True)
def _committed_delivered(probe: Probe) -> tuple[bool, str]:
    missing = [v for v in (OPEN, AFTER_OPEN) if v not in probe.after_commit]
    if missing:
        return False, "after the commit, read committed never gave: " + _shown(tuple(missing))
    return True, "after the commit, read committed gave the transaction and what followed it"


@check("stable_end", "progress",
       "while a producer's transaction is open, lag read by other tools is wrong, and "
       "waiting for everything to be counted lasts until it ends; counting is not affected",
       transactional=True)
def _stable_end(probe: Probe) -> tuple[bool, str]:
    return (probe.stable_end is not None and probe.stable_end == probe.stable_position,
            f"ListOffsets (read committed) ends the committed log at {probe.stable_end}; "
            f"read committed stopped at {probe.stable_position}")


@check("group_offsets", "money",
       "a restarted worker reads its input again from the start, and events older than the "
       "dedup horizon are counted again")
def _group_offsets(probe: Probe) -> tuple[bool, str]:
    return (probe.group_offset == GROUP_OFFSET,
            f"committed {GROUP_OFFSET} for a group, read back {probe.group_offset}")
