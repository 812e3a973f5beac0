"""Hourly series (``spend --peaks``) stay inside their period, also in a zone whose days start on
the half hour."""

from __future__ import annotations

import pytest

from costline.connectors.redis_client import connect
from costline.connectors.redis_state import _BUCKETS_PER_READ, RedisState
from costline.rules.durations import period_bounds
from tests.integration.redis_writer import Writer
from tests.unit.rulefiles.builders import at, usage

pytestmark = pytest.mark.integration

# Asia/Kolkata (UTC+05:30): 2 January begins at 18:30 UTC on 1 January.
BEFORE = at("2025-01-01T18:10")  # 1 January in Kolkata
AFTER = at("2025-01-01T18:40")  # 2 January in Kolkata, in the same UTC hour


async def test_an_hour_cut_by_the_period_counts_only_its_part_inside(
        redis_writer: Writer, any_redis_url: str, namespace: str) -> None:
    await redis_writer.write([usage(BEFORE, 10.0, team="a"), usage(AFTER, 1.0, team="a")])
    state = RedisState(connect(any_redis_url), namespace, "Asia/Kolkata")
    start, end = period_bounds(at("2025-01-02T06:00"), "day", "Asia/Kolkata")
    hours = state.series("cost", {}, ("team",), start, end)[("a",)]
    day = state.totals("cost", {}, ("team",), start, end)[("a",)]
    assert sum(hours.values()) == day  # before: the 10 GPU-hours of 1 January were in it too
    assert max(hours.values()) == day


async def test_a_series_read_in_pieces_equals_its_hours_asked_one_by_one(
        redis_writer: Writer, any_redis_url: str, namespace: str) -> None:
    # Five days of hours are more than one round trip reads (_BUCKETS_PER_READ): the pieces
    # must join without losing or repeating an hour.
    first = at("2025-03-01T00:00")
    hours = 5 * 24
    assert hours > _BUCKETS_PER_READ
    await redis_writer.write([usage(first + h * 3600 + 600, 1.0 + h % 7, team=f"t{h % 3}")
                              for h in range(hours)])
    state = RedisState(connect(any_redis_url), namespace, "UTC")
    start, end = first - 1800, first + hours * 3600 + 900  # cut hours at both ends
    series = state.series("cost", {}, ("team",), start, end)
    for team in ("t0", "t1", "t2"):
        alone = {}
        for h in range(-1, hours + 1):
            t = first + h * 3600
            value = state.totals("cost", {}, ("team",), max(t, start), min(t + 3600, end))
            if value.get((team,)):
                alone[int(t)] = value[(team,)]
        assert series[(team,)] == alone and len(alone) == hours // 3
