"""The evaluation bench (``bench/evaluation.py``) on a small data set: both processes evaluate
the shipped rules once and then tick after new tag sets, and no keys are left behind. Its
timings are printed, not asserted."""

from __future__ import annotations

import pytest

from bench import evaluation
from tests.integration.bench_checks import figures_of, keys_left

pytestmark = pytest.mark.integration


def test_both_ways_of_keeping_first_buckets_are_measured_and_cleaned_up(
        redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, figures = figures_of(evaluation.main, [
        "--events", "6000", "--tagsets", "1500", "--ticks", "2", "--new-tagsets", "3",
        "--redis-url", redis_url], capsys)
    assert code == 0
    for mode in evaluation.MODES:
        assert figures[mode]["first_s"] > 0 and len(figures[mode]["tick_s"]) == 2
        assert figures[mode]["peak_rss_mib"] > 0
    assert keys_left(redis_url, figures["namespace"]) == []
