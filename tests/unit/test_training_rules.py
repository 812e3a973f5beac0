"""The training rules on measured data, against hand-computed figures: a run's cost per token
regressing, and the checkpoint interval advice measured from usage, checkpoints and faults."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from costline.rules.engine import Engine
from costline.rules.kinds.checkpoint_interval import CheckpointIntervalRule
from costline.rules.kinds.growth import GrowthRule
from costline.rules.loader import RuleSet
from tests.unit.training import (
    DAY,
    HOUR,
    PRICES,
    T0,
    checkpoint,
    fault,
    gpus,
    progress,
    rule,
    state,
)

LLAMA3_PER_GPU_DAY = Decimal(419) / Decimal(54 * 16384)


def training(hours: int, tokens_per_hour: int, slow_from: int | None = None,
             slow_tokens: int = 0) -> list:
    """``hours`` hours of run-42 on 512 GPUs ($1,280 an hour), a progress event an hour."""
    events = []
    for h in range(hours):
        events.append(gpus(T0 + h * HOUR, 1))
        made = slow_tokens if slow_from is not None and h >= slow_from else tokens_per_hour
        events.append(progress(T0 + h * HOUR, step=h, tokens=made))
    return events


def test_a_run_whose_cost_per_token_regresses_is_found() -> None:
    # $1,280 an hour for 640M tokens is $2.00 per million; the last 6 hours trained 512M an
    # hour, $2.50 per million: 1.25 times the baseline, on the growth line.
    events = training(97, 640_000_000, slow_from=91, slow_tokens=512_000_000)
    growth = rule(kind="growth", metric="cost_per_token", match={"stage": "pretrain"},
                  group_by=["job"], window="6h", baseline="3d", ratio=1.25)
    assert isinstance(growth, GrowthRule)
    [finding] = growth.evaluate(state(*events), T0 + 4 * DAY + 300)
    assert (finding.value, finding.threshold, finding.lines[0].value) == (
        2_500_000, 2_500_000, 2_000_000)
    assert growth.value_unit({}) == "currency_per_mtok"
    assert growth.summarize(finding, "USD") == (
        "job=run-42 spent $2.50 per million tokens in the last 6h, 1.2x the $2.00 per "
        "million tokens of the 3d before (growth line 1.25x).")
    steady = training(97, 640_000_000)
    assert growth.evaluate(state(*steady), T0 + 4 * DAY + 300) == []


def test_a_run_without_progress_is_not_compared() -> None:
    growth = rule(kind="growth", metric="cost_per_token", group_by=["job"], window="1h",
                  baseline="1d", ratio=2)
    events = [gpus(T0 + h * HOUR, 1) for h in range(30)]
    asked = Asking(state(*events))
    assert growth.evaluate(asked, T0 + 30 * HOUR) == []
    # no group trains, so its spend is not even read
    assert asked.measures == ["quantity"]


class Asking:
    """A state that notes which measure each ``totals`` question asks."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.measures = inner, []

    def totals(self, measure: str, *args: Any, **kwargs: Any) -> Any:
        self.measures.append(measure)
        return self.inner.totals(measure, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def interval_rule(**keys: object) -> CheckpointIntervalRule:
    found = rule(kind="checkpoint_interval", match={"stage": "pretrain"}, **keys)
    assert isinstance(found, CheckpointIntervalRule)
    return found


def run_with_checkpoints(hours: int) -> list:
    """512 GPUs for ``hours`` hours, a checkpoint every 30 minutes written in 60 s (of no
    size: no storage cost, to match the hand figures of test_interval)."""
    events = [gpus(T0 + h * HOUR, 1) for h in range(hours)]
    events += [checkpoint(T0 + i * 1800, step=100 * i, size=0) for i in range(2 * hours)]
    return events


def test_the_interval_advice_is_measured_from_the_run() -> None:
    # Too few faults to measure: Llama 3's rate stands in; 512 GPUs at $1,280 an hour,
    # 30 minutes between checkpoints, 60 s to write: the figures of test_interval.
    advised = interval_rule(min_faults=3, fault_rate=LLAMA3_PER_GPU_DAY)
    [run] = advised.advice(state(*run_with_checkpoints(25)), T0 + 24 * HOUR + 600)
    inputs = run.advice.inputs
    assert (inputs.accelerators, inputs.burn_per_hour, inputs.interval_seconds,
            inputs.write_seconds, inputs.storage_per_hour) == (512, 1280, 1800, 60, 0)
    assert not run.rate.measured
    assert run.advice.at_stake == 537_837_983
    [finding] = advised.evaluate(state(*run_with_checkpoints(25)), T0 + 24 * HOUR + 600)
    # the line: the optimum's $563.754610 a day, 10% above, rounded up
    assert (finding.value, finding.threshold) == (1_101_592_593, 620_130_071)
    assert [c.value for c in finding.top] == [77_592_593, 1_024_000_000, 0]
    assert "$537.84/day at stake (95% more)" in advised.summarize(finding, "USD")


def test_the_fault_rate_is_measured_when_enough_faults_are_seen() -> None:
    # 48 hours of 512 GPUs is 24,576 GPU-hours; 4 faults: 1/6,144 per GPU-hour, so the run
    # is interrupted every 6,144 / 512 = 12 hours (43,200 s). √(2 × 60 × 43,200) = 2,276.8 s.
    events = run_with_checkpoints(48) + [fault(T0 + h * HOUR) for h in (5, 17, 29, 41)]
    [run] = interval_rule(min_faults=3).advice(state(*events), T0 + 48 * HOUR)
    assert run.rate.measured and run.rate.faults == 4
    assert run.rate.accelerator_hours == 24_576
    assert round(run.advice.inputs.mtbf_seconds, 6) == 43_200
    assert round(run.advice.optimal_seconds, 1) == Decimal("2276.8")


def test_no_advice_without_a_fault_rate_or_a_second_checkpoint() -> None:
    assert interval_rule().advice(state(*run_with_checkpoints(5)), T0 + 5 * HOUR) == []
    one = [gpus(T0, 1), checkpoint(T0, step=1, size=0)]
    assert interval_rule(fault_rate=0.0005).advice(state(*one), T0 + HOUR) == []


def test_a_run_near_its_optimum_raises_nothing() -> None:
    # checkpoints every 6,600 s, near the 6,539 s optimum: within 10%
    events = [gpus(T0 + h * HOUR, 1) for h in range(25)]
    events += [checkpoint(T0 + i * 6600, step=i, size=0) for i in range(14)]
    advised = interval_rule(fault_rate=LLAMA3_PER_GPU_DAY)
    assert advised.evaluate(state(*events), T0 + 24 * HOUR + 600) == []


def test_the_engine_renders_every_training_alert() -> None:
    rules = RuleSet([interval_rule(fault_rate=LLAMA3_PER_GPU_DAY)])
    evaluation = Engine.for_prices(rules, PRICES).evaluate(
        state(*run_with_checkpoints(25)), T0 + 24 * HOUR + 600)
    [change] = evaluation.changes
    assert change["unit"] == "currency_per_day" and change["value"] == "1101.592593"
