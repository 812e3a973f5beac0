"""On the Redis state the worker reads, shared reads find what per-rule questions find:
cells and first buckets read once, answers about past hours kept, late events noticed."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from redis import Redis

from connectors.redis_keys import first_version_key, slot_tag
from connectors.redis_state import RedisState
from rules.engine import Engine
from rules.events import AnyEvent
from rules.kept_answers import KeptAnswers
from rules.loader import RuleSet
from rules.state import Dimensions, FaultRecord, Group, Measure, ResourceSamples
from tests.integration.redis_writer import Writer
from tests.unit.rulefiles.builders import DAY, HOUR, MIN, T0, fault, rule, usage

pytestmark = pytest.mark.integration


class Questions:
    """The same Redis state answering one question at a time (no cells, no hour marks)."""

    def __init__(self, state: RedisState) -> None:
        self.state = state

    def totals(self, measure: Measure, match: Mapping[str, str], group_by: Sequence[str],
               start: float, end: float) -> dict[Group, int]:
        return self.state.totals(measure, match, group_by, start, end)

    def samples(self, metric: str, match: Mapping[str, str], since: float
                ) -> list[ResourceSamples]:
        return self.state.samples(metric, match, since)

    def earliest_by(self, measure: Measure, match: Mapping[str, str], group_by: Sequence[str]
                    ) -> dict[Group, float]:
        return self.state.earliest_by(measure, match, group_by)

    def faults(self, since: float) -> list[FaultRecord]:
        return self.state.faults(since)


RULES: list[dict[str, Any]] = [
    {"kind": "budget", "name": "team-day", "group_by": ["team"], "period": "day",
     "limit": 300, "warn_at": [0.5], "forecast": True},
    {"kind": "budget", "name": "job-month", "match": {"env": "prod"}, "group_by": ["job"],
     "period": "month", "limit": 150},
    {"kind": "growth", "name": "growth", "group_by": ["team"], "window": "1h",
     "baseline": "1d", "ratio": 2},
    {"kind": "fault_waste", "name": "waste", "group_by": ["team"], "period": "day",
     "max_waste": 20, "max_share": 0.05},
]


def _events(rng: random.Random, times: list[float]) -> list[AnyEvent]:
    out: list[AnyEvent] = []
    for ts in times:
        tags = {"team": f"t{rng.randrange(3)}", "env": rng.choice(["prod", "dev"]),
                "job": f"j{rng.randrange(5)}"}
        if rng.random() < 0.15:
            out.append(fault(ts, units=8, lost_seconds=rng.uniform(60, 900), **tags))
        else:
            out.append(usage(ts, rng.uniform(0.5, 15), **tags))
    return out


async def test_shared_reads_on_redis_find_what_single_questions_find(
        redis_writer: Writer, redis_url: str, namespace: str) -> None:
    rng = random.Random(3)
    engine = Engine(RuleSet(tuple(rule(**keys) for keys in RULES)), "USD")
    state = RedisState(Redis.from_url(redis_url), namespace, "UTC")
    plain = Questions(RedisState(Redis.from_url(redis_url), namespace, "UTC"))
    kept = KeptAnswers()
    await redis_writer.write(_events(rng, [T0 - 2 * DAY + i * 13 * MIN for i in range(200)]))
    now, fired = T0, set()
    for step in range(12):
        now += 10 * MIN
        late = step % 4 == 3  # every fourth step, spend hours late
        times = [now - (rng.uniform(3 * HOUR, DAY) if late else rng.uniform(0, 5 * MIN))
                 for _ in range(4)]
        await redis_writer.write(_events(rng, times))
        expected = engine.findings(plain, now)
        assert engine.findings(state, now, kept) == expected, f"step {step}"
        fired |= {name for name, found in expected.items() if found}
    assert len(kept) > 0
    assert fired == {keys["name"] for keys in RULES}


async def test_tag_sets_share_the_keys_values_and_pairs_they_repeat(
        redis_writer: Writer, redis_url: str, namespace: str) -> None:
    # Memory per tag set is what a worker's evaluation process holds for every tag set: the
    # strings and pairs many tag sets repeat must be one object each, whichever tag set and
    # slot they were read from.
    await redis_writer.write([usage(T0 - HOUR + i * MIN, 1.0, team="pretrain", env="prod",
                                    job=f"run-{i}") for i in range(40)])
    state = RedisState(Redis.from_url(redis_url), namespace, "UTC")
    cells = state.cells("cost", T0 - DAY, T0)
    assert len(cells) == 40
    env_pairs = {id(pair) for dims in cells for pair in dims if pair[0] == "env"}
    team_values = {id(value) for dims in cells for key, value in dims if key == "team"}
    job_pairs = {pair for dims in cells for pair in dims if pair[0] == "job"}
    assert len(env_pairs) == 1 and len(team_values) == 1
    assert len(job_pairs) == 40  # what differs stays apart


class CountingState(RedisState):
    """Counts the full reads of the tag sets' first buckets, and of their tokens."""

    first_reads = version_reads = 0

    def firsts(self, measure: Measure) -> dict[Dimensions, float]:
        self.first_reads += 1
        return super().firsts(measure)

    def firsts_version(self) -> tuple[tuple[str, str], ...] | None:
        self.version_reads += 1
        return super().firsts_version()


async def test_first_buckets_are_read_again_only_after_the_aggregation_changed_them(
        redis_writer: Writer, redis_url: str, namespace: str) -> None:
    growth = rule(kind="growth", name="growth", group_by=["team"], window="1h",
                  baseline="1d", ratio=2)
    engine = Engine(RuleSet((growth,)), "USD")
    client = Redis.from_url(redis_url)
    state, kept = CountingState(client, namespace, "UTC"), KeptAnswers()

    def found() -> list[Group]:  # every evaluation here is a full one, as on the tick
        return [dict(f.group) for f in engine.findings(state, T0, kept)["growth"]]

    # Team a spends steadily for the last 20 hours, then ten times as much in the last one:
    # it grew, but its history does not cover the day-long baseline yet.
    await redis_writer.write([usage(T0 - 20 * HOUR + i * HOUR, 1.0, team="a")
                              for i in range(19)] + [usage(T0 - 30 * MIN, 10.0, team="a")])
    assert found() == [] and state.first_reads == 1
    # More spend of the same tag set, no earlier first bucket: nothing to read again.
    await redis_writer.write([usage(T0 - 20 * MIN, 1.0, team="a")])
    assert found() == [] and found() == [] and state.first_reads == 1
    # A data-driven evaluation with no late event does not even ask for the tokens.
    asked = state.version_reads
    engine.findings(state, T0, kept, reuse={})
    assert state.version_reads == asked and state.first_reads == 1
    # A late event two days back: team a's history now covers the baseline.
    await redis_writer.write([usage(T0 - 2 * DAY, 1.0, team="a")])
    assert found() == [{"team": "a"}] and state.first_reads == 2
    # A new tag set moves the token too.
    await redis_writer.write([usage(T0 - 10 * MIN, 1.0, team="b")])
    assert found() == [{"team": "a"}] and state.first_reads == 3
    # First buckets without a token (written by a worker from before tokens): read every time.
    client.delete(first_version_key(slot_tag(namespace, "usage", 0)))
    assert state.firsts_version() is None
    assert found() == [{"team": "a"}] and found() == [{"team": "a"}]
    assert state.first_reads == 5
