"""What the rule engine may ask of the stored spend: the ``StateView`` protocol.

Two stores answer it: the Redis store the worker reads, and ``InMemoryState`` for rule tests
and backtests. Keeping the surface this small is what lets the engine stay pure and lets a
rule test prove what production will do.

Vocabulary shared by both stores:

* **dimensions** of a counted event: its tags, plus the pseudo-tags ``category``,
  ``resource_type``, ``billing`` and ``charge`` (they win over a tag of the same name); waste
  also has ``fault`` (the fault type), and its ``charge`` is ``usage``.
* **match**: dimension → glob (``costline.rules.globs``: ``*`` alone is special), case-sensitive.
  A dimension an event lacks reads as ``""``, so ``team: "*"`` also matches untagged spend.
* **group**: the values of the ``group_by`` dimensions in that order, ``""`` when absent.
* **[start, end)**: Unix seconds. A store answers per 5-minute bucket (coarser for old data):
  a bucket counts when it overlaps the interval, so callers align to ``BUCKET_S``.
* **amounts**: integer micro-units; ``quantity`` is ``round(quantity * 1e6)``. Money has three
  measures: ``gross`` sums the positive charges, ``credits`` the negative ones (as a positive
  amount: credits, refunds, downward adjustments), and ``cost`` is the net, gross − credits:
  what the bill says.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from costline.rules.globs import glob_match, literal

Measure = Literal["cost", "gross", "credits", "quantity", "waste"]
Group = tuple[str, ...]
Dimensions = tuple[tuple[str, str], ...]

BUCKET_S = 300
PSEUDO_TAGS = ("category", "resource_type", "billing", "charge")
# The charge of spend whose tag set does not name one (metered usage, and all waste).
USAGE_CHARGE = "usage"
WASTE_ONLY_DIMENSIONS = ("fault",)


@dataclass(frozen=True)
class ResourceSamples:
    """Gauge samples of one resource, ``(unix ts, value)`` ascending."""

    resource_id: str
    resource_type: str
    tags: Mapping[str, str]
    points: Sequence[tuple[float, float]]


@dataclass(frozen=True)
class FaultRecord:
    """A fault as inhibition needs it: which job, when, and how long recovery took."""

    ts: float
    fault: str
    resource_type: str
    units: int
    lost_seconds: float
    recovery_seconds: float
    tags: Mapping[str, str] = field(default_factory=dict)

    @property
    def recovered_at(self) -> float:
        return self.ts + self.recovery_seconds


class StateView(Protocol):
    """The read side of the stored totals, as the rule kinds use it."""

    def totals(
        self,
        measure: Measure,
        match: Mapping[str, str],
        group_by: Sequence[str],
        start: float,
        end: float,
    ) -> dict[Group, int]:
        """Sum of ``measure`` over [start, end) per group of the matching dimensions."""
        ...

    def samples(
        self, metric: str, match: Mapping[str, str], since: float
    ) -> list[ResourceSamples]:
        """Samples of ``metric`` at or after ``since`` of every resource whose tags (plus
        ``resource_type``) match."""
        ...


@runtime_checkable
class HistoryView(Protocol):
    """Optional: how far back the data of a selection goes.

    Growth rules use it so that a rule never compares against a baseline that had no data
    yet (the first day of a new project is not a spike).
    """

    def earliest(self, measure: Measure, match: Mapping[str, str]) -> float | None:
        """Start of the oldest bucket holding ``measure`` for the selection, or ``None``."""
        ...


@runtime_checkable
class CellView(Protocol):
    """Optional: the stored cells themselves, so that one read serves many questions.

    A cell is one tag set's sum of a measure over [start, end); its key is the tag set's
    dimensions as sorted ``(key, value)`` pairs (waste cells include ``fault``). The engine
    answers every rule's ``totals`` from these, sharing reads between rules.
    """

    def cells(self, measure: Measure, start: float, end: float) -> Mapping[Dimensions, int]:
        """Every tag set's sum of ``measure`` over [start, end) (zero sums may be absent)."""
        ...

    def firsts(self, measure: Measure) -> dict[Dimensions, float]:
        """Start of the oldest bucket of every tag set holding ``measure``: a dict of the
        caller's own, which it may keep and change."""
        ...


@runtime_checkable
class FirstsLog(Protocol):
    """Optional: what changed in ``CellView.firsts`` since an earlier reading. The tag sets'
    first buckets are read in full and grouped for every growth-type rule, so they are kept
    between evaluations, also full ones, and brought up to date with the changes alone (a
    new tag set, an earlier first bucket: a first bucket only ever moves back). The changes
    hold for ``firsts`` of every measure: a tag set has one first bucket, whatever the
    measure."""

    def firsts_changes(self, since: Hashable | None
                       ) -> tuple[Hashable | None, Mapping[Dimensions, float] | None]:
        """``(stands, changes)``. ``stands`` names where the first buckets stand, to pass
        as ``since`` next time (``None`` when the state cannot tell: then nothing is kept).
        ``changes`` are the first buckets added or moved back since ``since``, or ``None``
        when they cannot be told (``since`` is ``None``, or too old): read them all with
        ``firsts``, after this call, so that a change in between is told next time."""
        ...


@runtime_checkable
class HourMarks(Protocol):
    """Optional: a mark per hour of event time that moves whenever anything is counted
    with an event time in that hour. It lets answers about past hours be kept between
    evaluations and dropped exactly when a late event changes them."""

    def hour_marks(self, hours: Sequence[int]) -> dict[int, int]:
        """The mark of every hour (Unix seconds of its start) asked for."""
        ...


@runtime_checkable
class FaultHistory(Protocol):
    """Optional: the recent faults, for inhibition."""

    def faults(self, since: float) -> list[FaultRecord]:
        """Faults with ``ts >= since``, oldest first."""
        ...


@runtime_checkable
class TotalsEach(Protocol):
    """Optional: ``totals`` of several measures from one read (spend and waste of a month are
    read from the same buckets)."""

    def totals_each(self, measures: Sequence[Measure], match: Mapping[str, str],
                    group_by: Sequence[str], start: float, end: float
                    ) -> dict[Measure, dict[Group, int]]:
        """``totals`` of every measure asked for, by measure."""
        ...


def totals_each(state: StateView, measures: Sequence[Measure], match: Mapping[str, str],
                group_by: Sequence[str], start: float, end: float
                ) -> dict[Measure, dict[Group, int]]:
    """``totals`` of several measures, in one read where the state can (``TotalsEach``)."""
    if isinstance(state, TotalsEach):
        return state.totals_each(measures, match, group_by, start, end)
    return {measure: state.totals(measure, match, group_by, start, end) for measure in measures}


def matches(match: Mapping[str, str], dimensions: Mapping[str, str]) -> bool:
    """Whether ``dimensions`` satisfy every glob of ``match`` (absent reads as ``""``)."""
    return all(glob_match(dimensions.get(key, ""), pattern) for key, pattern in match.items())


def needed_keys(match: Mapping[str, str], group_by: Sequence[str]) -> tuple[str, ...]:
    """The dimensions a question needs: what it matches on and what it groups by."""
    return tuple(sorted({*match, *group_by}))


def group_of(group_by: Sequence[str], dimensions: Mapping[str, str]) -> Group:
    """The group a set of dimensions falls in."""
    return tuple(dimensions.get(key, "") for key in group_by)


def narrowed(
    match: Mapping[str, str], group_by: Sequence[str], group: Group
) -> dict[str, str]:
    """``match`` restricted to one group: how a kind asks for that group's contributors."""
    narrowed_match = dict(match)
    for key, value in zip(group_by, group, strict=True):
        narrowed_match[key] = literal(value)
    return narrowed_match


def align_down(ts: float, step: int = BUCKET_S) -> int:
    """Start of the bucket holding ``ts`` (floored, as the ledger's slots are: -0.5 is in the
    bucket before 0)."""
    return int(ts // step) * step


def dimensions_of(
    tags: Mapping[str, str], resource_type: str, category: str | None, billing: str | None,
    charge: str = USAGE_CHARGE,
) -> dict[str, str]:
    """Tags plus pseudo-tags; the pseudo-tags win over a tag of the same name."""
    dims = dict(tags)
    dims["resource_type"] = resource_type
    if category is not None:
        dims["category"] = category
    if billing is not None:
        dims["billing"] = billing
    dims["charge"] = charge
    return dims


def through(now: float) -> int:
    """End of the bucket holding ``now``: a total "so far" includes the bucket in progress."""
    return align_down(now) + BUCKET_S
