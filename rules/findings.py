"""What a rule kind reports: a ``Finding`` per group that crossed one of the rule's lines.

A finding is the evidence an on-call engineer needs in one place: the figure, the line it
crossed, every line of the rule (so a message can say "80% of 10,000"), and the top
contributors (the jobs to look at first). Amounts are integer micro-units throughout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, ROUND_HALF_EVEN, Decimal
from typing import Any

from costline.rules.durations import rfc3339
from costline.rules.money import money_micro
from costline.rules.prices import MICRO
from costline.rules.state import Group, Measure, StateView

TOP_N = 3
CONTRIBUTOR_KEYS = ("job", "project", "team", "resource_type")


@dataclass(frozen=True)
class Line:
    """A named threshold of a rule: a warning line, the budget line, a rate line."""

    name: str
    value: int


@dataclass(frozen=True)
class Contributor:
    group: Mapping[str, str]
    value: int


@dataclass(frozen=True)
class Forecast:
    """The period-end projection and when the budget line will be crossed at today's rate."""

    value: int
    crosses_at: float | None


@dataclass(frozen=True)
class ReclaimRequest:
    """An idle resource the reclamation agent may act on after ``grace``, if still idle."""

    resource_id: str
    resource_type: str
    tags: Mapping[str, str]
    connector: str
    params: Mapping[str, Any]
    grace: int
    mode: str
    idle_since: float
    requested_at: float

    def to_dict(self) -> dict[str, Any]:
        """``grace`` in seconds; ``execute_at`` is the earliest time the connector may act."""
        return {
            "resource_id": self.resource_id,
            "resource_type": self.resource_type,
            "tags": dict(self.tags),
            "connector": self.connector,
            "params": dict(self.params),
            "approval": self.params.get("approval", "auto"),
            "grace": self.grace,
            "mode": self.mode,
            "idle_since": rfc3339(self.idle_since),
            "execute_at": rfc3339(self.requested_at + self.grace),
        }


@dataclass(frozen=True)
class Finding:
    """One group over one of its rule's lines at one evaluation.

    ``rank`` orders the lines of a rule (higher is more serious) so the lifecycle can tell an
    escalation from a repeat; ``subject`` holds tags beyond the group that silences and
    inhibition may match on (an idle resource's own tags).
    """

    group: Mapping[str, str]
    value: int
    line: str
    threshold: int
    rank: int
    lines: tuple[Line, ...]
    period: tuple[float, float]
    top: tuple[Contributor, ...] = ()
    subject: Mapping[str, str] = field(default_factory=dict)
    forecast: Forecast | None = None
    rate_per_hour: int | None = None
    faults: Mapping[str, int] | None = None
    reclaim: ReclaimRequest | None = None
    basis: int | None = None
    """The amount a share line is a fraction of (a group's spend), for the summary."""

    @property
    def labels(self) -> dict[str, str]:
        """Every tag that describes the alert: the subject's tags, then the group's."""
        return {**self.subject, **self.group}


def highest_crossed(value: int, lines: Sequence[Line]) -> tuple[int, Line] | None:
    """The most serious line ``value`` reached (lines are listed least serious first)."""
    crossed = [(rank, line) for rank, line in enumerate(lines) if value >= line.value]
    return crossed[-1] if crossed else None


def fraction_of(amount: int, fraction: Decimal) -> int:
    """``fraction`` × ``amount`` micro-units, rounded half to even."""
    return int((Decimal(amount) * fraction).to_integral_value(ROUND_HALF_EVEN))


def ceil_fraction_of(amount: int, fraction: Decimal) -> int:
    """``fraction`` × ``amount``, rounded up: a line that is only reached, never undercut."""
    return int((Decimal(amount) * fraction).to_integral_value(ROUND_CEILING))


def per_hour(total: int, seconds: int) -> int:
    """A total over ``seconds`` as a rate per hour."""
    return total * 3600 // seconds


def contributor_key(group_by: Sequence[str]) -> str:
    """The dimension that names contributors: the job, unless the rule already groups by it."""
    return next((k for k in CONTRIBUTOR_KEYS if k not in group_by), "resource_type")


def top_contributors(
    state: StateView,
    measure: Measure,
    match: Mapping[str, str],
    group_by: Sequence[str],
    group: Group,
    start: float,
    end: float,
) -> tuple[Contributor, ...]:
    """The ``TOP_N`` largest contributors to one group over [start, end).

    Asks for the whole rule's breakdown by group and contributor, the same question for every
    group of the rule, so that a state that remembers answers (``EvaluationView``) reads the
    data once per rule rather than once per finding.
    """
    key = contributor_key(group_by)
    indexed = getattr(state, "breakdown", None)
    if indexed is not None:  # the breakdown split by group once, not scanned per finding
        found = indexed(measure, match, group_by, key, start, end).get(group, {})
    else:
        breakdown = state.totals(measure, match, (*group_by, key), start, end)
        width = len(group_by)
        found = {row[width:]: value for row, value in breakdown.items() if row[:width] == group}
    ranked = sorted(found.items(), key=lambda item: (-item[1], item[0]))
    return tuple(
        Contributor({key: name[0]}, value) for name, value in ranked[:TOP_N] if value > 0
    )


def money_text(micro: int, currency: str) -> str:
    """Micro-units for a sentence, as every table and message writes money
    (``costline.rules.money``): ``$8,123.45``, ``8,123.45 CHF``."""
    return money_micro(micro, currency)


def amount_text(micro: int) -> str:
    """A non-money amount (quantity, utilization) for a sentence, without trailing zeros."""
    text = f"{Decimal(micro) / MICRO:f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def labels_text(labels: Mapping[str, str]) -> str:
    """``team=pretrain, env=prod``; ``everything`` for an ungrouped rule."""
    return ", ".join(f"{k}={v}" for k, v in labels.items()) or "everything"
