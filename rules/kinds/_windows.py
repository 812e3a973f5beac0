"""A recent window against the baseline before it: the arithmetic growth and log explosion share.

Only complete 5-minute buckets are compared (a half-filled bucket would look like a drop), and
a group whose data does not reach back over the whole baseline is "not yet ready": a project's
first day is not a spike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal

from pydantic import ValidationInfo
from pydantic_core import PydanticCustomError

from costline.rules.findings import per_hour
from costline.rules.prices import MICRO
from costline.rules.runs import PROGRESS_TOKENS, per_mtok
from costline.rules.state import (
    PSEUDO_TAGS,
    Group,
    HistoryView,
    Measure,
    StateView,
    align_down,
    narrowed,
)


@dataclass(frozen=True)
class WindowComparison:
    """One group's total over the window and over the baseline before it."""

    group: Group
    current: int
    baseline_total: int
    window: int
    baseline: int
    ready: bool
    start: float
    end: float

    @property
    def expected(self) -> int:
        """The baseline's average total per window length."""
        return self.baseline_total * self.window // self.baseline

    @property
    def rate_per_hour(self) -> int:
        return per_hour(self.current, self.window)

    def growth_line(self, ratio: Decimal) -> int:
        """The window total that is ``ratio`` × the baseline average, rounded up."""
        scaled = ratio * self.baseline_total * self.window / self.baseline
        return int(scaled.to_integral_value(ROUND_CEILING))

    def grew(self, ratio: Decimal, min_baseline: int = 0) -> bool:
        """Window ≥ ratio × baseline average, on a ready baseline of at least ``min_baseline``."""
        if not self.ready or self.baseline_total <= 0 or self.baseline_total < min_baseline:
            return False
        return self.current * self.baseline >= ratio * self.baseline_total * self.window


def compare_windows(
    state: StateView,
    measure: Measure,
    match: Mapping[str, str],
    group_by: Sequence[str],
    now: float,
    window: int,
    baseline: int,
) -> list[WindowComparison]:
    """Every group with something in the window, compared with its baseline."""
    end = align_down(now)
    start = end - window
    base_start = start - baseline
    current = state.totals(measure, match, group_by, start, end)
    before = state.totals(measure, match, group_by, base_start, start)
    ready = _ready(state, measure, match, group_by, current, base_start, window)
    return [
        WindowComparison(
            group, total, before.get(group, 0), window, baseline, ready[group], start, end
        )
        for group, total in sorted(current.items())
        if total > 0
    ]


@dataclass(frozen=True)
class EfficiencyComparison:
    """One group's money per million tokens over the window and over the baseline before it."""

    group: Group
    cost: int
    tokens: int
    baseline_cost: int
    baseline_tokens: int
    ready: bool
    start: float
    end: float

    @property
    def current(self) -> int:
        return per_mtok(self.cost, self.tokens) or 0

    @property
    def expected(self) -> int:
        return per_mtok(self.baseline_cost, self.baseline_tokens) or 0

    def growth_line(self, ratio: Decimal) -> int:
        scaled = ratio * self.baseline_cost * MICRO / self.baseline_tokens
        return int(scaled.to_integral_value(ROUND_CEILING))

    def grew(self, ratio: Decimal, min_baseline: int = 0) -> bool:
        """Cost per token ≥ ratio × the baseline's, on a ready baseline that spent at least
        ``min_baseline``; both spans must have trained tokens."""
        if not self.ready or self.tokens <= 0 or self.baseline_tokens <= 0 or \
                self.baseline_cost <= 0 or self.baseline_cost < min_baseline:
            return False
        return self.cost * self.baseline_tokens >= ratio * self.baseline_cost * self.tokens


def compare_efficiency(state: StateView, match: Mapping[str, str], group_by: Sequence[str],
                       now: float, window: int, baseline: int) -> list[EfficiencyComparison]:
    """Every group that spent and trained in the window, with its baseline. Tokens are read
    with the match's tags only: the pseudo-tags (``resource_type``…) select the spend."""
    end = align_down(now)
    start, base_start = end - window, end - window - baseline
    tokens_match = {**{k: v for k, v in match.items() if k not in PSEUDO_TAGS},
                    "resource_type": PROGRESS_TOKENS}
    # Tokens first: groups that report none have no efficiency to compare, so a rule whose
    # groups do not train (or not yet) reads no spend at all.
    tokens = state.totals("quantity", tokens_match, group_by, start, end)
    if not any(count > 0 for count in tokens.values()):
        return []
    cost = state.totals("cost", match, group_by, start, end)
    base_cost = state.totals("cost", match, group_by, base_start, start)
    base_tokens = state.totals("quantity", tokens_match, group_by, base_start, start)
    ready = _ready(state, "cost", match, group_by, cost, base_start, window)
    return [
        EfficiencyComparison(group, total, tokens.get(group, 0), base_cost.get(group, 0),
                             base_tokens.get(group, 0), ready[group], start, end)
        for group, total in sorted(cost.items()) if total > 0 and tokens.get(group, 0) > 0
    ]


def _ready(
    state: StateView,
    measure: Measure,
    match: Mapping[str, str],
    group_by: Sequence[str],
    groups: Mapping[Group, int],
    base_start: float,
    window: int,
) -> dict[Group, bool]:
    """Whether each group's history covers the whole baseline.

    A store that knows its history answers exactly; otherwise a group with nothing in the
    baseline's first window-length is taken as too young.
    """
    earliest_by = getattr(state, "earliest_by", None)
    if earliest_by is not None:
        firsts = earliest_by(measure, match, group_by)
        return {group: group in firsts and firsts[group] <= base_start for group in groups}
    if isinstance(state, HistoryView):
        return {
            group: _reaches_back(state, measure, narrowed(match, group_by, group), base_start)
            for group in groups
        }
    first = state.totals(measure, match, group_by, base_start, base_start + window)
    return {group: first.get(group, 0) > 0 for group in groups}


def _reaches_back(
    state: HistoryView, measure: Measure, match: Mapping[str, str], base_start: float
) -> bool:
    earliest = state.earliest(measure, match)
    return earliest is not None and earliest <= base_start


def baseline_covers_window(baseline: int, info: ValidationInfo) -> int:
    """A baseline shorter than the window would compare the window with a fragment of itself."""
    window = info.data.get("window")
    if isinstance(window, int) and baseline < window:
        raise PydanticCustomError("baseline", "baseline must be at least as long as window")
    return baseline
