"""One evaluation's view of a state: every rule's questions answered from shared reads.

Rules ask many overlapping questions in one evaluation: a thousand rules over a handful of
calendar periods and windows, each by a few dimensions. Within one evaluation the data cannot
change, so

* an identical question is answered once;
* on a state that exposes its cells (``CellView``), an interval's cells are read once and
  summed onto the dimensions a question needs (its ``match`` keys and ``group_by``); such a
  projection is reused by every question about the same interval whose dimensions it holds,
  so a thousand rules cost a few passes over the tag sets per interval, not one each;
* with ``KeptAnswers``, the part of an interval before the hot boundary is answered from the
  previous evaluations, and only the last hour or two is read again.

Everything else goes to the state itself, so the optional ``HistoryView`` and
``FaultHistory`` protocols hold exactly when they hold for the state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from costline.rules.first_buckets import FirstBuckets, earliest_by_group, earliest_by_values
from costline.rules.kept_answers import KeptAnswers, Question, split_rows
from costline.rules.state import (
    CellView,
    Dimensions,
    FirstsLog,
    Group,
    Measure,
    ResourceSamples,
    StateView,
    group_of,
    matches,
    needed_keys,
)

Keys = tuple[str, ...]
Interval = tuple[Measure, float, float]
Projection = dict[tuple[str, ...], int]


class EvaluationView:
    def __init__(self, state: StateView, kept: KeptAnswers | None = None) -> None:
        self._state = state
        self._kept = kept if kept is not None and kept.enabled else None
        self._has_cells = isinstance(state, CellView)  # a protocol check is slow: once
        self._answers: dict[Question, dict[Group, int]] = {}
        self._breakdowns: dict[Question, Contributions] = {}
        self._cells: dict[Interval, Mapping[Dimensions, int]] = {}
        self._projections: dict[Interval, dict[Keys, Projection]] = {}
        self._dicts: dict[Dimensions, dict[str, str]] = {}
        self._firsts = self._kept.firsts if self._kept is not None else FirstBuckets()
        # A state that logs its first buckets' changes keeps one per tag set, whatever the
        # measure (``FirstsLog``): they are read, projected and grouped once for all measures.
        self._firsts_per_measure = not isinstance(state, FirstsLog)
        self._samples: dict[tuple[object, ...], list[ResourceSamples]] = {}

    # -- StateView ------------------------------------------------------------------

    def totals(self, measure: Measure, match: Mapping[str, str], group_by: Sequence[str],
               start: float, end: float) -> dict[Group, int]:
        question = (measure, tuple(sorted(match.items())), tuple(group_by), start, end)
        found = self._answers.get(question)
        if found is None:
            found = self._answers[question] = self._split(question)
        return found

    def breakdown(self, measure: Measure, match: Mapping[str, str], group_by: Sequence[str],
                  key: str, start: float, end: float) -> Contributions:
        """``totals`` by ``group_by`` and ``key``, split by group: every finding of a rule
        asks for its own group's contributors. The kept part is split once and kept."""
        rows = (*group_by, key)
        question = (measure, tuple(sorted(match.items())), rows, start, end)
        found = self._breakdowns.get(question)
        if found is None:
            found = self._breakdowns[question] = self._contributions(question, len(group_by))
        return found

    def samples(self, metric: str, match: Mapping[str, str], since: float
                ) -> list[ResourceSamples]:
        key = (metric, tuple(sorted(match.items())), since)
        found = self._samples.get(key)
        if found is None:
            found = self._samples[key] = self._state.samples(metric, match, since)
        return found

    def _earliest_by(self, measure: Measure, match: Mapping[str, str], group_by: Sequence[str]
                     ) -> dict[Group, float]:
        """``earliest`` of every group, from one read of the tag sets' first buckets."""
        question = (self._firsts_of_measure(measure), tuple(sorted(match.items())),
                    tuple(group_by))
        made = self._firsts.by_group
        answered = made.get(question)
        if answered is None:
            answered = made[question] = self._earliest_groups(measure, match, group_by)
        return answered

    def _earliest_groups(self, measure: Measure, match: Mapping[str, str],
                         group_by: Sequence[str]) -> dict[Group, float]:
        keys = needed_keys(match, group_by)
        question = (self._firsts_of_measure(measure), keys)
        projected = self._firsts.by_keys.get(question)
        if projected is None:
            projected = self._firsts.by_keys[question] = earliest_by_values(
                self._firsts_of(measure).items(), keys, self._project_one)
        return earliest_by_group(projected, keys, match, group_by)

    def __getattr__(self, name: str) -> object:
        if name == "earliest_by" and self._has_cells:
            return self._earliest_by
        return getattr(self._state, name)

    # -- answering --------------------------------------------------------------------

    def _split(self, question: Question) -> dict[Group, int]:
        """The cold part from the kept answers, the hot part read now."""
        measure, match_items, group_by, start, end = question
        kept = self._kept
        if kept is None or start >= kept.hot_from:
            return self._fresh(question)
        cold_end = min(end, kept.hot_from)
        cold = self._cold(kept, (measure, match_items, group_by, start, cold_end))
        if cold_end >= end:
            return cold
        return _added(cold, self._fresh((measure, match_items, group_by, cold_end, end)))

    def _cold(self, kept: KeptAnswers, question: Question) -> dict[Group, int]:
        """A kept answer; else the last one kept plus what lies between; else read."""
        found = kept.get(question)
        if found is None:
            prior = kept.prior(question)
            if prior is None:
                found = self._fresh(question)
            else:
                prior_end, answer = prior
                found = _added(answer, self._fresh((*question[:3], prior_end, question[4])))
            kept.keep(question, found)
        return found

    def _contributions(self, question: Question, width: int) -> Contributions:
        measure, match_items, rows, start, end = question
        kept = self._kept
        if kept is None or start >= kept.hot_from:
            return Contributions(split_rows(self._split(question), width), {})
        cold_end = min(end, kept.hot_from)
        cold_question = (measure, match_items, rows, start, cold_end)
        cold = self._cold(kept, cold_question)
        by_group = kept.split(cold_question, width) or split_rows(cold, width)
        hot = self._fresh((measure, match_items, rows, cold_end, end)) if cold_end < end else {}
        return Contributions(by_group, split_rows(hot, width))

    def _fresh(self, question: Question) -> dict[Group, int]:
        measure, match_items, group_by, start, end = question
        match = dict(match_items)
        if not self._has_cells:
            return self._state.totals(measure, match, group_by, start, end)
        keys = needed_keys(match, group_by)
        out: dict[Group, int] = {}
        for values, value in self._projection((measure, start, end), keys).items():
            plain = dict(zip(keys, values, strict=True))
            if matches(match, plain):
                group = group_of(group_by, plain)
                out[group] = out.get(group, 0) + value
        return out

    def _projection(self, interval: Interval, keys: Keys) -> Projection:
        """The interval's sums per value of ``keys``: from the smallest projection already
        made that holds those keys, else from the cells."""
        made = self._projections.setdefault(interval, {})
        found = made.get(keys)
        if found is not None:
            return found
        wider = [k for k in made if set(keys) <= set(k)]
        if wider:
            source = min(wider, key=lambda k: len(made[k]))
            found = _narrow(made[source], source, keys)
        else:
            found = {}
            for dims, value in self._cells_of(interval).items():
                values = self._project_one(dims, keys)
                found[values] = found.get(values, 0) + value
        made[keys] = found
        return found

    def _firsts_of(self, measure: Measure) -> Mapping[Dimensions, float]:
        kept = self._firsts_of_measure(measure)
        found = self._firsts.by_measure.get(kept)
        if found is None:
            assert isinstance(self._state, CellView)
            found = self._firsts.by_measure[kept] = self._state.firsts(measure)
        return found

    def _firsts_of_measure(self, measure: Measure) -> Measure | None:
        """Which measure's first buckets answer for ``measure``: its own, or (``None``) those
        every measure shares."""
        return measure if self._firsts_per_measure else None

    def _cells_of(self, interval: Interval) -> Mapping[Dimensions, int]:
        found = self._cells.get(interval)
        if found is None:
            assert isinstance(self._state, CellView)
            measure, start, end = interval
            found = self._cells[interval] = self._state.cells(measure, start, end)
        return found

    def _project_one(self, dims: Dimensions, keys: Keys) -> tuple[str, ...]:
        plain = self._dicts.get(dims)
        if plain is None:
            plain = self._dicts[dims] = dict(dims)
        return tuple(plain.get(key, "") for key in keys)


def _added(answer: dict[Group, int], more: dict[Group, int]) -> dict[Group, int]:
    if not more:
        return answer
    merged = dict(answer)
    for group, value in more.items():
        merged[group] = merged.get(group, 0) + value
    return merged


def _narrow(projection: Projection, source: Keys, keys: Keys) -> Projection:
    at = [source.index(key) for key in keys]
    out: Projection = {}
    for values, value in projection.items():
        narrowed = tuple(values[i] for i in at)
        out[narrowed] = out.get(narrowed, 0) + value
    return out


class Contributions:
    """One rule's breakdown by group and contributor: the kept part and the part read now,
    added up only for the groups asked about."""

    def __init__(self, kept: dict[Group, dict[Group, int]], fresh: dict[Group, dict[Group, int]]
                 ) -> None:
        self._kept, self._fresh = kept, fresh

    def get(self, group: Group, default: dict[Group, int] | None = None
            ) -> dict[Group, int] | None:
        kept, fresh = self._kept.get(group), self._fresh.get(group)
        if fresh is None:
            return kept if kept is not None else default
        if kept is None:
            return fresh
        merged = dict(kept)
        for name, value in fresh.items():
            merged[name] = merged.get(name, 0) + value
        return merged
