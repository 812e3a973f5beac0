"""The tag sets' first buckets as growth-type rules use them, kept up to date by their changes.

A growth or log-explosion rule compares a group only once its history covers the baseline, so
it needs each group's oldest bucket: every tag set's first bucket (``CellView.firsts``),
projected onto the dimensions a question needs and grouped. Reading and grouping them is
what costs most on many tag sets, and they change in one way only: a new tag set appears, or
a late event moves one back. So all three forms are kept, and a change is folded into each by
taking the earlier of two buckets, without reading the rest again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from rules.state import Dimensions, Group, Measure, group_of, matches

Keys = tuple[str, ...]
MatchItems = tuple[tuple[str, str], ...]
K = TypeVar("K", bound=tuple[object, ...])


@dataclass
class FirstBuckets:
    by_measure: dict[Measure | None, dict[Dimensions, float]] = field(default_factory=dict)
    """Every tag set's first bucket, as read for a measure (``None``: for all of them)."""
    by_keys: dict[tuple[Measure | None, Keys], dict[tuple[str, ...], float]] = field(
        default_factory=dict)
    """The earliest of the tag sets sharing the values of some dimensions."""
    by_group: dict[tuple[Measure | None, MatchItems, Keys], dict[Group, float]] = field(
        default_factory=dict)
    """The earliest of each group of a question (its match and group-by)."""

    def lower(self, changes: Mapping[Dimensions, float]) -> None:
        """Fold in tag sets added or moved back: each form keeps the earlier bucket."""
        if not changes:
            return
        plain = [(dict(dims), first) for dims, first in changes.items()]
        for firsts in self.by_measure.values():
            _keep_earlier(firsts, changes.items())
        for (_, keys), projected in self.by_keys.items():
            _keep_earlier(projected, ((tuple(dims.get(key, "") for key in keys), first)
                                      for dims, first in plain))
        for (_, match_items, group_by), groups in self.by_group.items():
            match = dict(match_items)
            _keep_earlier(groups, ((group_of(group_by, dims), first)
                                   for dims, first in plain if matches(match, dims)))

    def clear(self) -> None:
        self.by_measure.clear()
        self.by_keys.clear()
        self.by_group.clear()


def _keep_earlier(firsts: dict[K, float], items: Iterable[tuple[K, float]]) -> None:
    for key, first in items:
        if first < firsts.get(key, first + 1):
            firsts[key] = first
