"""The stage bench (``bench/stages.py``) on a small data set: it folds and writes every event,
Redis ends up with the generator's total, and it leaves no keys behind. Its timings are
printed, not asserted."""

from __future__ import annotations

import pytest

from bench import stages
from tests.integration.bench_checks import figures_of, keys_left

pytestmark = pytest.mark.integration


def test_every_stage_runs_and_redis_holds_the_generators_total(
        redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, figures = figures_of(stages.main, [
        "--events", "20000", "--tagsets", "2000", "--partitions", "2", "--window", "3000",
        "--redis-url", redis_url], capsys)
    assert code == 0 and figures["total_ok"] is True
    assert figures["events"] == 20_000
    assert figures["windows"] >= 20_000 // 3_000
    assert set(figures["us_per_event"]) == set(stages.STAGES)
    assert all(value > 0 for value in figures["us_per_event"].values())
    assert keys_left(redis_url, figures["namespace"]) == []
