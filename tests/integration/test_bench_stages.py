"""The stage bench (``bench/stages.py``) on small data sets: every event goes through each
stage into Redis, Redis ends up with the generator's total, and no keys are left behind. Its
timings are printed, not asserted."""

from __future__ import annotations

import pytest

from bench import stages
from bench.datasets import DATA_SETS
from tests.integration.bench_checks import figures_of, keys_left

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("data", DATA_SETS)
def test_every_stage_runs_and_redis_holds_the_generators_total(
        redis_url: str, data: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, figures = figures_of(stages.main, [
        "--events", "20000", "--tagsets", "2000", "--partitions", "2", "--take", "20",
        "--window", "3000", "--data", data, "--redis-url", redis_url], capsys)
    assert code == 0 and figures["total_ok"] is True
    assert figures["events"] == 20_000
    # takes of 20 messages on 2 input partitions, routed to 2 home partitions
    assert figures["ledger_records"] >= 2 * 20_000 // (20 * 100)
    assert figures["windows"] >= 20_000 // 3_000
    assert set(figures["us_per_event"]) == set(stages.STAGES)
    assert all(value > 0 for value in figures["us_per_event"].values())
    assert keys_left(redis_url, figures["namespace"]) == []
