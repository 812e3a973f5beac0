"""The demo's scenario tells the same story at any hour: the faults its day-long fault-waste
rule is shown firing on fall on the day the demo runs, never after it runs."""

from __future__ import annotations

import pytest

from costline.streams.demo.scenario import training_cluster

MIDNIGHT = 1796169600.0  # 2026-12-02T00:00:00Z
HEADLINE = ("pt-nccl-0", "pt-sdc-0")


@pytest.mark.parametrize("after_midnight", [15 * 60, 2 * 3600, 12 * 3600, 23 * 3600 + 59 * 60])
def test_the_headline_faults_fall_on_the_day_the_demo_runs(after_midnight: float) -> None:
    now = MIDNIGHT + after_midnight
    faults = {f["event_id"]: f["ts"] for f in training_cluster(now).faults}
    for event_id in HEADLINE:
        assert MIDNIGHT <= faults[event_id] <= now, event_id
