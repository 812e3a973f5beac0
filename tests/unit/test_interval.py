"""The checkpoint interval advisor against figures worked out by hand (bc, 12 decimals).

The fault rate is the one the demo cites: Llama 3 pre-training saw 419 interruptions in 54
days on 16,384 GPUs, 419 / (54 × 24 × 16,384) = 419 / 21,233,664 per GPU-hour."""

from __future__ import annotations

from decimal import Decimal

import pytest

from costline.rules.interval import IntervalInputs, advise, daily_cost, valid

LLAMA3 = Decimal(419) / Decimal(21_233_664)


def run(gpus: int, interval: int, storage: str = "0", write: int = 60) -> IntervalInputs:
    """A run of ``gpus`` H100s at $2.50 a GPU-hour, writing a checkpoint in ``write`` s."""
    return IntervalInputs(accelerators=Decimal(gpus), burn_per_hour=Decimal(gpus) * Decimal("2.5"),
                          faults_per_accelerator_hour=LLAMA3, write_seconds=Decimal(write),
                          interval_seconds=Decimal(interval), storage_per_hour=Decimal(storage))


def test_a_512_gpu_run_checkpointing_every_30_minutes() -> None:
    advice = advise(run(512, 1800))
    # MTBF = 3600 × 21,233,664 / (419 × 512) = 356,322.673031 s = 98.98 h
    assert round(advice.inputs.mtbf_seconds, 6) == Decimal("356322.673031")
    # Young: √(2 × 60 × 356,322.673031) = 6,539.015275 s, 1 h 49 min
    assert round(advice.optimal_seconds, 6) == Decimal("6539.015275") == \
        round(advice.young_seconds, 6)
    # Now, a day: overhead 24 × 1,280 × 60 / 1,800 = $1,024.00;
    # recompute 24 × 1,280 × 1,800 / (2 × 356,322.673031) = $77.592593
    assert (advice.now.overhead, advice.now.recompute, advice.now.storage) == (
        1_024_000_000, 77_592_593, 0)
    # At the optimum the two parts are equal: 24 × 1,280 × 60 / 6,539.015275 = $281.877305
    assert advice.best.overhead == advice.best.recompute == 281_877_305
    # At stake: 1,101.592593 − 563.754610 = $537.837983 a day; 95.4% above the optimum
    assert advice.at_stake == 537_837_983
    assert round(advice.excess, 4) == Decimal("0.9540")


def test_at_llama_3_scale_the_optimum_is_about_19_minutes() -> None:
    advice = advise(run(16_384, 1800))
    # MTBF = 3600 × 54 × 24 / 419 = 11,135.083532 s (3.09 h): the cluster fails every 3 h
    assert round(advice.inputs.mtbf_seconds, 6) == Decimal("11135.083532")
    # √(2 × 60 × 11,135.083532) = 1,155.945511 s
    assert round(advice.optimal_seconds, 6) == Decimal("1155.945511")
    # Now: overhead 24 × 40,960 × 60 / 1,800 = $32,768.00, recompute
    # 24 × 40,960 × 1,800 / (2 × 11,135.083532) = $79,454.814815; optimum 2 × $51,025.242497
    assert (advice.now.overhead, advice.now.recompute) == (32_768_000_000, 79_454_814_815)
    assert advice.best.total == 2 * 51_025_242_497
    assert advice.at_stake == 10_172_329_821
    assert round(advice.excess, 4) == Decimal("0.0997")


def test_storage_makes_checkpoints_dearer_and_the_optimum_longer() -> None:
    # Five 1 TB checkpoints on a $0.00041/GB-hour tier: $2.05 an hour. Kept as a span of
    # history, one checkpoint costs 60 s + 2.05 × 1,800 / 1,280 = 62.8828125 s of the run.
    inputs = run(512, 1800, storage="2.05")
    assert inputs.checkpoint_seconds == Decimal("62.8828125")
    advice = advise(inputs)
    # √(2 × 356,322.673031 × 62.8828125) = 6,694.261996 s
    assert round(advice.optimal_seconds, 6) == Decimal("6694.261996")
    # Storage now: 24 × 2.05 = $49.20; at the optimum 49.20 × 1,800 / 6,694.261996 = $13.229240
    assert (advice.now.storage, advice.best.storage) == (49_200_000, 13_229_240)
    assert advice.at_stake == 573_653_545


def test_the_optimum_costs_no_more_than_any_other_interval() -> None:
    inputs = run(2048, 3600, storage="8")
    best = advise(inputs).best.total
    for seconds in (600, 1800, 3000, 3500, 3700, 5000, 14_400):
        assert daily_cost(inputs, Decimal(seconds)).total >= best


@pytest.mark.parametrize("change", [
    {"accelerators": Decimal(0)}, {"burn_per_hour": Decimal(0)},
    {"faults_per_accelerator_hour": Decimal(0)}, {"interval_seconds": Decimal(0)},
])
def test_advice_needs_a_run_that_costs_fails_and_checkpoints(change: dict) -> None:
    import dataclasses
    assert valid(run(512, 1800)) and not valid(dataclasses.replace(run(512, 1800), **change))
