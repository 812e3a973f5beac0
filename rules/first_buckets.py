"""The tag sets' first buckets as growth-type rules use them, kept up to date by their changes.

A growth or log-explosion rule compares a group only once its history covers the baseline, so
it needs each group's oldest bucket: every tag set's first bucket (``CellView.firsts``),
projected onto the dimensions a question needs and grouped. Reading and grouping them is
what costs most on many tag sets, and they change in one way only: a new tag set appears, or
a late event moves one back. So all three forms are kept, and a change is folded into each by
taking the earlier of two buckets, without reading the rest again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from costline.rules.state import Dimensions, Group, Measure, group_of, matches, needed_keys

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
        """Fold in tag sets added or moved back: each form keeps the earlier bucket, worked
        out from the changes as it was from every tag set."""
        if not changes:
            return
        for firsts in self.by_measure.values():
            _keep_earlier(firsts, changes.items())
        for (_, keys), projected in self.by_keys.items():
            _keep_earlier(projected, earliest_by_values(changes.items(), keys).items())
        for (_, match_items, group_by), groups in self.by_group.items():
            match = dict(match_items)
            keys = needed_keys(match, group_by)
            changed = earliest_by_values(changes.items(), keys)
            _keep_earlier(groups, earliest_by_group(changed, keys, match, group_by).items())

    def clear(self) -> None:
        self.by_measure.clear()
        self.by_keys.clear()
        self.by_group.clear()


def project(dims: Dimensions, keys: Keys) -> tuple[str, ...]:
    """The values of ``keys`` in a tag set's dimensions (absent reads as "")."""
    plain = dict(dims)
    return tuple(plain.get(key, "") for key in keys)


def earliest_by_values(firsts: Iterable[tuple[Dimensions, float]], keys: Keys,
                       projected: Callable[[Dimensions, Keys], tuple[str, ...]] = project
                       ) -> dict[tuple[str, ...], float]:
    """The earliest first bucket of the tag sets sharing each set of values of ``keys``."""
    out: dict[tuple[str, ...], float] = {}
    _keep_earlier(out, ((projected(dims, keys), first) for dims, first in firsts))
    return out


def earliest_by_group(by_values: Mapping[tuple[str, ...], float], keys: Keys,
                      match: Mapping[str, str], group_by: Sequence[str]) -> dict[Group, float]:
    """The earliest first bucket of each group of a question, from ``earliest_by_values`` on
    the dimensions it needs (``keys``)."""
    out: dict[Group, float] = {}
    plain = ((dict(zip(keys, values, strict=True)), first) for values, first in by_values.items())
    _keep_earlier(out, ((group_of(group_by, dims), first) for dims, first in plain
                        if matches(match, dims)))
    return out


def _keep_earlier(firsts: dict[K, float], items: Iterable[tuple[K, float]]) -> None:
    for key, first in items:
        if first < firsts.get(key, first + 1):
            firsts[key] = first
