"""The spend bench (``bench/spend.py``) on a small data set: every question is answered twice
alike, the baseline read finds the fields, and no keys are left behind. Its timings are
printed, not asserted."""

from __future__ import annotations

import pytest

from bench import spend
from tests.integration.bench_checks import figures_of, keys_left

pytestmark = pytest.mark.integration


def test_each_question_and_the_raw_read_are_measured_and_cleaned_up(
        redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, figures = figures_of(spend.main, [
        "--events", "3000", "--tagsets", "800", "--repeats", "1", "--redis-url", redis_url],
        capsys)
    assert code == 0
    questions = figures["questions"]
    assert questions["raw read (baseline)"]["fields"] > 800
    assert questions["--by team"]["rows"] >= 1
    assert questions["--by job"]["rows"] > questions["--by team"]["rows"]
    for label, _, _, _ in spend.QUESTIONS:
        assert questions[label]["first"]["wall_s"] > 0 and questions[label]["again"]["cpu_s"] >= 0
    assert figures["total_ok"] and questions["--by job"]["cost_micro"] > 0
    assert keys_left(redis_url, figures["namespace"]) == []
