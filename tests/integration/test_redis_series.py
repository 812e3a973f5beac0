"""Hourly series (``spend --peaks``) stay inside their period, also in a zone whose days start on
the half hour."""

from __future__ import annotations

import pytest
from redis import Redis

from connectors.redis_state import RedisState
from rules.durations import period_bounds
from tests.integration.redis_writer import Writer
from tests.unit.rulefiles.builders import at, usage

pytestmark = pytest.mark.integration

# Asia/Kolkata (UTC+05:30): 2 January begins at 18:30 UTC on 1 January.
BEFORE = at("2025-01-01T18:10")  # 1 January in Kolkata
AFTER = at("2025-01-01T18:40")  # 2 January in Kolkata, in the same UTC hour


async def test_an_hour_cut_by_the_period_counts_only_its_part_inside(
        redis_writer: Writer, redis_url: str, namespace: str) -> None:
    await redis_writer.write([usage(BEFORE, 10.0, team="a"), usage(AFTER, 1.0, team="a")])
    state = RedisState(Redis.from_url(redis_url), namespace, "Asia/Kolkata")
    start, end = period_bounds(at("2025-01-02T06:00"), "day", "Asia/Kolkata")
    hours = state.series("cost", {}, ("team",), start, end)[("a",)]
    day = state.totals("cost", {}, ("team",), start, end)[("a",)]
    assert sum(hours.values()) == day  # before: the 10 GPU-hours of 1 January were in it too
    assert max(hours.values()) == day
