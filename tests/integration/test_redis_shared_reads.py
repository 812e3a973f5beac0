"""On the Redis state the worker reads, shared reads find what per-rule questions find:
cells and first buckets read once, answers about past hours kept, late events noticed."""

from __future__ import annotations

import random
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import pytest
from redis import Redis

from costline.connectors.redis_keys import (
    FirstsLogSize,
    first_count_key,
    first_log_key,
    first_version_key,
    slot_tag,
)
from costline.connectors.redis_state import FirstsAt, RedisState
from costline.rules.engine import Engine
from costline.rules.events import AnyEvent
from costline.rules.kept_answers import KeptAnswers
from costline.rules.loader import RuleSet
from costline.rules.state import Dimensions, FaultRecord, Group, Measure, ResourceSamples
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


async def test_several_measures_are_totalled_from_one_read_of_their_buckets(
        redis_writer: Writer, redis_url: str, namespace: str) -> None:
    # ``costline spend`` asks for spend and waste of the same period: one read of the buckets
    # answers both, and each answer is the one its own question gets.
    rng = random.Random(5)
    await redis_writer.write(_events(rng, [T0 - 2 * DAY + i * 7 * MIN for i in range(300)]))
    state = RedisState(Redis.from_url(redis_url), namespace, "UTC")
    reads = _count_bucket_reads(state)
    measures: tuple[Measure, ...] = ("cost", "waste", "quantity")
    for match, group_by, start, end in [({}, ("team",), T0 - 2 * DAY, T0),
                                        ({"env": "prod"}, ("job", "fault"), T0 - DAY, T0),
                                        ({}, (), T0 - 30 * HOUR + 5 * MIN, T0 - HOUR)]:
        alone = {m: state.totals(m, match, group_by, start, end) for m in measures}
        assert all(alone[m] for m in measures)  # each measure has something to compare
        reads.clear()
        assert state.totals_each(measures, match, group_by, start, end) == alone
        one_read = list(reads)
        reads.clear()
        state.totals("cost", match, group_by, start, end)
        assert one_read == reads  # the same buckets, read as often as for one measure
        assert state.totals_each(("cost", "cost"), match, group_by, start, end) == {
            "cost": alone["cost"]}  # a measure named twice is counted once
    reads.clear()
    assert state.totals_each((), {}, (), T0 - DAY, T0) == {} and reads == []


def _count_bucket_reads(state: RedisState) -> list[bytes | str]:
    """The keys ``state`` reads with HGETALL from now on, in the order read."""
    reads: list[bytes | str] = []
    pipeline = state.redis.pipeline

    def counting(*args: Any, **kwargs: Any) -> Any:
        pipe = pipeline(*args, **kwargs)
        hgetall = pipe.hgetall

        def read(key: bytes | str) -> Any:
            reads.append(key)
            return hgetall(key)
        pipe.hgetall = read  # type: ignore[method-assign]
        return pipe
    state.redis.pipeline = counting  # type: ignore[method-assign]
    return reads


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
    """Counts the full reads of the tag sets' first buckets, and the reads of their log."""

    first_reads = log_reads = 0

    def firsts(self, measure: Measure) -> dict[Dimensions, float]:
        self.first_reads += 1
        return super().firsts(measure)

    def firsts_changes(self, since: Hashable | None
                       ) -> tuple[FirstsAt | None, dict[Dimensions, float] | None]:
        self.log_reads += 1
        return super().firsts_changes(since)


GROWTH = rule(kind="growth", name="growth", group_by=["team"], window="1h", baseline="1d",
              ratio=2)


def _history(team: str, since: float) -> list[AnyEvent]:
    """Steady hourly spend from ``since`` on, then ten times as much in the last hour."""
    hours = int((T0 - 2 * HOUR - since) // HOUR) + 1
    return ([usage(since + i * HOUR, 1.0, team=team) for i in range(hours)]
            + [usage(T0 - 30 * MIN, 10.0, team=team)])


class Growth:
    """The growth rule evaluated in full, as on the tick, with answers kept between."""

    def __init__(self, redis_url: str, namespace: str) -> None:
        self.client = Redis.from_url(redis_url)
        self.state, self.kept = CountingState(self.client, namespace, "UTC"), KeptAnswers()
        self.engine = Engine(RuleSet((GROWTH,)), "USD")
        self.fresh = RedisState(self.client, namespace, "UTC")

    def found(self, now: float = T0) -> list[dict[str, str]]:
        return [dict(f.group) for f in self.engine.findings(self.state, now, self.kept)["growth"]]

    def kept_matches_a_fresh_read(self) -> bool:
        return self.kept.firsts.by_measure[None] == self.fresh.firsts("cost")


async def test_first_buckets_are_kept_up_to_date_with_their_changes_alone(
        redis_writer: Writer, redis_url: str, namespace: str) -> None:
    growth = Growth(redis_url, namespace)
    state = growth.state
    # Team a grew in the last hour, but its history does not cover the day-long baseline yet.
    await redis_writer.write(_history("a", T0 - 20 * HOUR))
    assert growth.found() == [] and state.first_reads == 1
    # More spend of the same tag set, no earlier first bucket: nothing to read again.
    await redis_writer.write([usage(T0 - 20 * MIN, 1.0, team="a")])
    assert growth.found() == [] and growth.found() == [] and state.first_reads == 1
    # A data-driven evaluation with no late event does not even ask for the changes.
    asked = state.log_reads
    growth.engine.findings(state, T0, growth.kept, reuse={})
    assert state.log_reads == asked
    # A late event two days back: team a's history now covers the baseline. Its first bucket
    # comes from the log, not from reading them all again.
    await redis_writer.write([usage(T0 - 2 * DAY, 1.0, team="a")])
    assert growth.found() == [{"team": "a"}] and state.first_reads == 1
    # A new tag set whose history covers the baseline, written late: found the same way.
    await redis_writer.write(_history("b", T0 - 30 * HOUR))
    assert growth.found() == [{"team": "a"}, {"team": "b"}] and state.first_reads == 1
    assert growth.kept_matches_a_fresh_read()


async def test_first_buckets_are_read_in_full_when_their_changes_cannot_be_told(
        redis_writer: Writer, redis_url: str, namespace: str) -> None:
    growth = Growth(redis_url, namespace)
    state, client, writer = growth.state, growth.client, redis_writer.writer
    slot = slot_tag(namespace, 0)
    log, count, version = first_log_key(slot), first_count_key(slot), first_version_key(slot)
    both = [{"team": "a"}, {"team": "b"}]

    def reads_in_full(now: float = T0) -> int:
        """First-bucket reads of one evaluation, which must find teams a and b."""
        reads = state.first_reads
        assert growth.found(now) == both
        return state.first_reads - reads

    await redis_writer.write(_history("a", T0 - 2 * DAY) + _history("b", T0 - 3 * DAY))
    assert reads_in_full() == 1 and reads_in_full() == 0

    # First buckets with a token and no log (written by a worker from before the log): read
    # once more, then kept while the token stays.
    client.delete(log, count)
    assert reads_in_full() == 1 and reads_in_full() == 0
    # With neither (written before tokens were): read every time.
    client.delete(version)
    assert reads_in_full() == 1 and reads_in_full() == 1
    # A logged change says where they stand again: read once more, then its changes alone.
    await redis_writer.write([usage(T0 - 40 * MIN, 1.0, team="c")])
    assert reads_in_full() == 1 and reads_in_full() == 0

    # The log moved on past the entry last read: it keeps only its last two entries, then
    # only those naming three tag sets in all.
    for size, written in ((FirstsLogSize(entries=2), [["d"], ["e"], ["f"]]),
                          (FirstsLogSize(named=3), [["g", "h"], ["i", "j"]])):
        writer.firsts_log = size
        for teams in written:
            await redis_writer.write([usage(T0 - 40 * MIN, 1.0, team=t) for t in teams])
        assert reads_in_full() == 1 and reads_in_full() == 0
    assert [entry.split(b" ")[2] for entry in client.lrange(log, 0, -1)] == [b"2"]  # i, j
    # A write that changes more than the log may name says "read them all".
    writer.firsts_log = FirstsLogSize(named=1)
    await redis_writer.write([usage(T0 - 40 * MIN, 1.0, team=team) for team in ("k", "l")])
    assert reads_in_full() == 1
    await redis_writer.write([usage(T0 - 40 * MIN, 1.0, team="m")])
    assert reads_in_full() == 0

    def lose_last_entry() -> int:
        """As a Redis that restarted without its last write: the log one entry shorter."""
        number = int(client.rpop(log).split(b" ")[0])  # type: ignore[union-attr]
        client.decr(count)
        client.set(version, client.lindex(log, -1).split(b" ")[1])  # type: ignore[union-attr]
        return number

    writer.firsts_log = FirstsLogSize()
    for team in ("n", "o", "p"):
        await redis_writer.write([usage(T0 - 40 * MIN, 1.0, team=team)])
    assert reads_in_full() == 0
    # Redis lost the entry last read: the log counts less than was read.
    lose_last_entry()
    assert reads_in_full() == 1 and reads_in_full() == 0
    # It lost it, and the next write took its number: the entry last read is not the same.
    number = lose_last_entry()
    await redis_writer.write([usage(T0 - 40 * MIN, 1.0, team="q")])
    assert int(client.get(count)) == number  # type: ignore[arg-type]
    assert reads_in_full() == 1 and reads_in_full() == 0

    # However well the log tells them, they are read in full again after an hour.
    assert reads_in_full(T0 + 10 * MIN) == 0
    reads = state.first_reads
    growth.found(T0 + HOUR)  # the spikes have left the window by then
    assert state.first_reads == reads + 1
    assert growth.kept_matches_a_fresh_read()


async def test_first_buckets_are_read_once_for_every_measure(
        redis_writer: Writer, redis_url: str, namespace: str) -> None:
    # Redis keeps one first bucket per tag set, whatever the measure: growth of spend and of
    # GPU-hours share one read of them, and each finds what it would alone.
    by_hours = rule(kind="growth", name="gpu-hours", metric="quantity",
                    match={"resource_type": "gpu.h100"}, group_by=["team"], window="1h",
                    baseline="1d", ratio=2)
    await redis_writer.write(_history("a", T0 - 2 * DAY))
    state = CountingState(Redis.from_url(redis_url), namespace, "UTC")
    both = Engine(RuleSet((GROWTH, by_hours)), "USD").findings(state, T0, KeptAnswers())
    assert state.first_reads == 1
    for alone in (GROWTH, by_hours):
        fresh = RedisState(Redis.from_url(redis_url), namespace, "UTC")
        expected = Engine(RuleSet((alone,)), "USD").findings(fresh, T0)[alone.name]
        assert both[alone.name] == expected and [dict(f.group) for f in expected] == [
            {"team": "a"}]
