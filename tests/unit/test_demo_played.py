"""The demo's own sum of what it played: the contract's arithmetic in decimal, agreeing to the
micro-unit with what the worker's pricing counts of the scenario on any day, and said plainly
when the counted figures differ."""

from __future__ import annotations

import pytest

from costline.streams.demo.played import counted_micro, exactness, played_micro
from costline.streams.demo.scenario import Scenario, training_cluster
from costline.streams.demo.summary import exactness_text
from tests.unit.test_scenario import ANY_DAY, DAYS, PRICES, played

T = 1_796_000_000.0


def usage(event_id: str, quantity: float, **extra: object) -> dict[str, object]:
    return {"event_id": event_id, "kind": "usage", "ts": T, "resource_id": "n1",
            "resource_type": "gpu.h100", "unit": "gpu_hour", "quantity": quantity,
            "tags": {"team": "a"}, **extra}


def test_the_contracts_arithmetic_on_a_few_events() -> None:
    scenario = Scenario(now=T, start=T - 3600)
    scenario.usage = [
        usage("u1", 0.1),                                        # 0.1 × 2.49 = 0.249
        [usage("u2", 3.0), usage("u1", 1000.0)],                 # 7.47; u1 again: counted once
        usage("c1", 0.0, charge="credit", cost=-12.5),           # a credit: its stated cost
        usage("r1", 1.0, cost=0.0000005),                        # half a micro-unit: to even, 0
        usage("r2", 1.0, cost=0.0000015),                        # to even, 2
    ]
    scenario.faults = [{"event_id": "f1", "kind": "fault", "ts": T, "fault": "node_failure",
                        "resource_type": "gpu.h100", "units": 8, "lost_seconds": 1800,
                        "recovery_seconds": 600}]                # 8 × 2400 / 3600 × 2.49 = 13.28
    assert played_micro(scenario, PRICES) == {
        "spend": 249_000 + 7_470_000 - 12_500_000 + 0 + 2,
        "fault waste": 13_280_000,
    }


@pytest.mark.parametrize("now", ANY_DAY.values(), ids=ANY_DAY.keys())
def test_the_sum_is_what_the_worker_counts_over_the_period_the_demo_reads(now: float) -> None:
    """The demo reads Redis over [start, now + 300]: every event played must lie in it."""
    scenario = training_cluster(now, days=DAYS)
    counted = counted_micro(played(now), scenario.start, scenario.now + 300)
    assert played_micro(scenario, PRICES) == counted


def test_a_difference_is_named_with_both_figures() -> None:
    same = exactness({"spend": 5_000_000, "fault waste": 0}, {"spend": 5_000_000})
    assert same["equal"] and "Counted exactly what was played" in exactness_text(same, "USD")
    off = exactness({"spend": 5_000_000, "fault waste": 7}, {"spend": 4_999_999,
                                                             "fault waste": 7})
    assert not off["equal"]
    assert off["measures"]["spend"] == {"played": "5.000000", "counted": "4.999999"}
    text = exactness_text(off, "USD")
    assert "spend counted 4.999999, played 5.000000" in text and "fault waste" not in text
