"""The evaluation bench (``bench/evaluation.py``) on a small data set: both processes evaluate
the shipped rules once and then tick after new tag sets, and no keys are left behind. Its
timings are printed, not asserted."""

from __future__ import annotations

import json

import pytest
import redis

from bench import evaluation, throughput

pytestmark = pytest.mark.integration


def test_both_ways_of_keeping_first_buckets_are_measured_and_cleaned_up(
        redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = evaluation.main(["--events", "6000", "--tagsets", "1500", "--ticks", "2",
                            "--new-tagsets", "3", "--redis-url", redis_url, "--json"])
    figures = json.loads(capsys.readouterr().out)
    assert code == 0
    for mode in evaluation.MODES:
        assert figures[mode]["first_s"] > 0 and len(figures[mode]["tick_s"]) == 2
        assert figures[mode]["peak_rss_mib"] > 0
    client = redis.Redis.from_url(redis_url)
    try:
        assert throughput.redis_keys(client, figures["namespace"]) == []
    finally:
        client.close()
