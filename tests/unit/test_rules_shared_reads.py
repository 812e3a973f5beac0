"""Shared reads change nothing: findings from cells, projections and kept answers equal the
findings from asking the state every question, evaluation after evaluation, late events too."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from costline.rules.engine import Engine
from costline.rules.events import AnyEvent
from costline.rules.kept_answers import KeptAnswers
from costline.rules.loader import RuleSet
from costline.rules.memory_state import InMemoryState
from costline.rules.state import Dimensions, Group, Measure, ResourceSamples
from tests.unit.rulefiles.builders import DAY, HOUR, MIN, T0, book, fault, rule, usage

KEYS = ("billing", "category", "env", "fault", "job", "resource_type", "team")


class CellState:
    """The worker's read path over an ``InMemoryState``: cells and hour marks."""

    def __init__(self) -> None:
        self.inner = InMemoryState(book())
        self.marks: Counter[int] = Counter()

    def add(self, event: AnyEvent) -> None:
        if self.inner.add(event):
            self.marks[int(event.unix_ts) // HOUR * HOUR] += 1

    def totals(self, measure: Measure, match: Mapping[str, str], group_by: Sequence[str],
               start: float, end: float) -> dict[Group, int]:
        return self.inner.totals(measure, match, group_by, start, end)

    def samples(self, metric: str, match: Mapping[str, str], since: float
                ) -> list[ResourceSamples]:
        return self.inner.samples(metric, match, since)

    def cells(self, measure: Measure, start: float, end: float) -> dict[Dimensions, int]:
        # An absent dimension reads as "": dropping empty values keeps every match and group.
        by_all = self.inner.totals(measure, {}, KEYS, start, end)
        return {_dims(values): value for values, value in by_all.items()}

    def firsts(self, measure: Measure) -> dict[Dimensions, float]:
        by_all = self.inner.earliest_by(measure, {}, KEYS)
        return {_dims(values): first for values, first in by_all.items()}

    def hour_marks(self, hours: Sequence[int]) -> dict[int, int]:
        return {hour: self.marks[hour] for hour in hours}


def _dims(values: tuple[str, ...]) -> Dimensions:
    return tuple((k, v) for k, v in zip(KEYS, values, strict=True) if v)


RULES: list[dict[str, Any]] = [
    {"kind": "budget", "name": "team-day", "group_by": ["team"], "period": "day",
     "limit": 400, "warn_at": [0.5], "forecast": True},
    {"kind": "budget", "name": "prod-month", "match": {"env": "prod"}, "period": "month",
     "timezone": "Asia/Kolkata", "limit": 3000},
    {"kind": "budget", "name": "job-day", "match": {"team": "t1"}, "group_by": ["job"],
     "period": "day", "limit": 60},
    {"kind": "growth", "name": "team-growth", "group_by": ["team", "env"], "window": "1h",
     "baseline": "1d", "ratio": 2},
    {"kind": "log_explosion", "name": "logs", "group_by": ["team"], "window": "15m",
     "baseline": "6h", "ratio": 3, "max_rate": 20},
    {"kind": "fault_waste", "name": "waste", "group_by": ["team"], "period": "day",
     "max_waste": 50, "max_share": 0.1},
]


def _event(rng: random.Random, ts: float) -> AnyEvent:
    tags = {"team": f"t{rng.randrange(3)}", "env": rng.choice(["prod", "dev"]),
            "job": f"j{rng.randrange(6)}"}
    if rng.random() < 0.1:
        return fault(ts, units=8, lost_seconds=rng.uniform(60, 900), **tags)
    if rng.random() < 0.25:
        return usage(ts, rng.uniform(1, 40), "logs.ingest", **tags)
    return usage(ts, rng.uniform(0.5, 20), **tags)


def test_kept_answers_and_cells_find_what_plain_questions_find() -> None:
    rng = random.Random(5)
    engine = Engine(RuleSet(tuple(rule(**keys) for keys in RULES)), "USD")
    plain, cells, kept = InMemoryState(book()), CellState(), KeptAnswers()
    for i in range(400):  # two days of history
        event = _event(rng, T0 - 2 * DAY + i * 7 * MIN)
        plain.add(event)
        cells.add(event)
    now = T0
    reused, fired = 0, set()
    for step in range(60):  # five hours, an evaluation every five minutes
        now += 5 * MIN
        late = rng.random() < 0.2
        for _ in range(rng.randrange(1, 6)):
            ts = now - (rng.uniform(2 * HOUR, DAY) if late else rng.uniform(0, 4 * MIN))
            event = _event(rng, ts)
            plain.add(event)
            cells.add(event)
        expected = engine.findings(plain, now)
        assert engine.findings(cells, now, kept) == expected, f"step {step}"
        reused += len(kept)
        fired |= {name for name, found in expected.items() if found}
    assert reused > 0  # the comparison covered kept answers, not only fresh ones
    assert fired == {keys["name"] for keys in RULES}  # and findings of every rule
