"""Answers about past hours, kept from one evaluation to the next.

Fresh spend lands in the buckets of the last hour or two; everything before ``hot_from`` only
moves when an event arrives late. The worker evaluates several times a second, so answers
about those cold hours are kept and dropped exactly when the state's ``HourMarks`` say
something was counted in an hour they cover. A state without hour marks keeps nothing.

Marks are read at the start of an evaluation, before any cell: an event counted after that
moves a mark that the next evaluation reads, so a kept answer is never older than the data
it missed by more than one evaluation.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass

from costline.rules.first_buckets import FirstBuckets
from costline.rules.state import FirstsLog, Group, HourMarks, Measure, StateView

HOUR_S = 3600
HOT_S = 3600
"""Event time this close to now is read afresh by every evaluation (events a few minutes
late are the rule, not the exception); hours before it are kept."""

FIRSTS_READ_S = 3600
"""How long kept first buckets are only brought up to date with their changes before they are
read in full again: whatever changed them unlogged (a worker from before the log writing
between two logged writes, or one from before tokens writing at all) is seen within this
time."""

FIRST_MARKED_S = 35 * 86_400
"""How far back the first evaluation reads hour marks, so that it keeps its answers already:
every calendar period and window fits (hourly buckets are kept 35 days)."""

Question = tuple[Measure, tuple[tuple[str, str], ...], tuple[str, ...], float, float]


@dataclass
class _Kept:
    answer: dict[Group, int]
    start: float
    end: float
    by_group: dict[Group, dict[Group, int]] | None = None  # split for contributors, once


class KeptAnswers:
    """``totals`` answers about intervals ending at or before ``hot_from``."""

    def __init__(self) -> None:
        self.hot_from = 0
        self._answers: dict[Question, _Kept] = {}
        self._marks: dict[int, int] = {}
        self._marked_from: int | None = None  # marks are known for [marked_from, hot_from)
        self._wanted_from: int | None = None  # the oldest hour the last evaluation asked about
        self._asked: set[Question] = set()
        self._latest: dict[tuple[object, ...], Question] = {}  # question but its end → question
        self.enabled = False
        self.firsts = FirstBuckets()
        """The tag sets' first buckets, brought up to date with the state's ``FirstsLog``
        changes on a full evaluation and after a late event (read in full again only when it
        cannot tell them): between ticks only a new group can appear, and fresh data never
        makes a group's history reach back over a baseline."""
        self._firsts_at: Hashable | None = None  # where the state's first buckets stood
        self._firsts_read = 0.0  # when they were last read in full

    def begin(self, state: StateView, now: float, full: bool = True) -> None:
        """Start an evaluation at ``now`` (``full``: of every rule, on the tick): move the hot
        boundary, drop what late events changed."""
        self.enabled = isinstance(state, HourMarks)
        self.hot_from = int(now - HOT_S) // HOUR_S * HOUR_S
        if not self.enabled:
            self.clear()
            return
        if full:
            self._check_firsts(state, now)
        assert isinstance(state, HourMarks)
        # Answers the last evaluation did not ask for belong to rules or periods gone by.
        self._answers = {q: k for q, k in self._answers.items() if q in self._asked}
        self._latest = {q[:4]: q for q in self._answers}
        self._asked = set()
        wanted, self._wanted_from = self._wanted_from, None
        if wanted is None:  # nothing asked yet: mark as far back as hourly buckets are kept
            wanted = self.hot_from - FIRST_MARKED_S
        if wanted >= self.hot_from:
            self._marked_from = self.hot_from
            return
        hours = list(range(wanted, self.hot_from, HOUR_S))
        marks = state.hour_marks(hours)
        moved = [h for h in hours if h in self._marks and marks.get(h, 0) != self._marks[h]]
        self._drop_overlapping(moved)
        if moved and not full:
            self._check_firsts(state, now)
        self._marks = {h: marks.get(h, 0) for h in hours}
        self._marked_from = wanted

    def split(self, question: Question, width: int) -> dict[Group, dict[Group, int]] | None:
        """A kept answer split by its first ``width`` dimensions (made once, kept with it)."""
        kept = self._answers.get(question) if self.enabled else None
        if kept is None:
            return None
        if kept.by_group is None:
            kept.by_group = split_rows(kept.answer, width)
        return kept.by_group

    def get(self, question: Question) -> dict[Group, int] | None:
        self._asked.add(question)
        first_hour = int(question[3]) // HOUR_S * HOUR_S
        if self._wanted_from is None or first_hour < self._wanted_from:
            self._wanted_from = first_hour
        kept = self._answers.get(question) if self.enabled else None
        return None if kept is None else kept.answer

    def keep(self, question: Question, answer: dict[Group, int]) -> None:
        """Keep an answer (just asked with ``get``) about [start, end) with end ≤ hot_from, if
        the marks of its hours were read before its cells."""
        start, end = question[3], question[4]
        first_hour = int(start) // HOUR_S * HOUR_S
        if not self.enabled or self._marked_from is None or first_hour < self._marked_from:
            return  # marks of these hours were not read before the cells: keep it next time
        self._answers[question] = _Kept(answer, start, end)
        self._latest[question[:4]] = question

    def prior(self, question: Question) -> tuple[float, dict[Group, int]] | None:
        """A kept answer to the same question ending earlier, and where it ends: when the hot
        boundary moves on, only the hour between is read, not the whole interval again."""
        latest = self._latest.get(question[:4]) if self.enabled else None
        kept = self._answers.get(latest) if latest is not None else None
        if kept is None or kept.end >= question[4]:
            return None
        return kept.end, kept.answer

    def clear(self) -> None:
        self._answers.clear()
        self._latest.clear()
        self._marks.clear()
        self._forget_firsts()

    def __len__(self) -> int:
        return len(self._answers)

    def _check_firsts(self, state: StateView, now: float) -> None:
        """Fold the state's ``FirstsLog`` changes into the kept first buckets, or drop them
        when it cannot tell the changes. Asked only on a tick or after a late event (a
        data-driven evaluation keeps them without asking), and before any first bucket is
        read: a change after this is told next time."""
        if not isinstance(state, FirstsLog):
            self._forget_firsts()
            return
        at = self._firsts_at if abs(now - self._firsts_read) < FIRSTS_READ_S else None
        stands, changes = state.firsts_changes(at)
        if changes is None:
            self._forget_firsts(stands, now)
            return
        self.firsts.lower(changes)
        self._firsts_at = stands

    def _forget_firsts(self, stands: Hashable | None = None, now: float = 0.0) -> None:
        """Drop the first buckets; those read next are the state's as it ``stands``."""
        self.firsts.clear()
        self._firsts_at, self._firsts_read = stands, now

    def _drop_overlapping(self, hours: list[int]) -> None:
        if not hours:
            return
        for question, kept in list(self._answers.items()):
            if any(kept.start < h + HOUR_S and h < kept.end for h in hours):
                del self._answers[question]


def split_rows(rows: Mapping[Group, int], width: int) -> dict[Group, dict[Group, int]]:
    """Rows keyed by group and contributor, as group → contributor → value."""
    out: dict[Group, dict[Group, int]] = {}
    for row, value in rows.items():
        out.setdefault(row[:width], {})[row[width:]] = value
    return out
