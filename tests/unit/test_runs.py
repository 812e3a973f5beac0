"""What a run's spend bought, and what a failed run wasted, worked out by hand.

Prices: an H100 GPU-hour is $2.50, so 512 GPUs cost $1,280 an hour."""

from __future__ import annotations

from typing import Any

from costline.rules.runs import (
    Efficiency,
    RunEnd,
    failed_mark,
    failed_runs,
    per_mtok,
    per_step,
)
from tests.unit.training import HOUR, T0, fault, gpus, progress, run_end, state

GROUP = ("run-42",)


def test_dollars_per_million_tokens_and_per_step() -> None:
    # Two hours of 512 GPUs: $2,560. 64 progress events of 20M tokens in 5 steps each:
    # 1,280M tokens and 320 steps, so $2.00 per million tokens and $8.00 a step.
    events = [gpus(T0, 1), gpus(T0 + HOUR, 1)]
    events += [progress(T0 + i * 112.5, step=5 * (i + 1), tokens=20_000_000, steps=5)
               for i in range(64)]
    found = state(*events)
    cost = found.totals("cost", {}, ["job"], T0, T0 + 2 * HOUR)[GROUP]
    tokens = found.totals("quantity", {"resource_type": "progress.tokens"}, ["job"],
                          T0, T0 + 2 * HOUR)[GROUP]
    steps = found.totals("quantity", {"resource_type": "progress.steps"}, ["job"],
                         T0, T0 + 2 * HOUR)[GROUP]
    assert (cost, tokens, steps) == (2_560_000_000, 1_280_000_000, 320_000_000)
    efficiency = Efficiency(cost, 0, tokens, steps)
    assert efficiency.per_mtok == 2_000_000 and efficiency.per_step == 8_000_000
    assert efficiency.whole_steps == 320


def test_progress_costs_nothing() -> None:
    found = state(progress(T0, 1, 1_000_000))
    assert found.totals("cost", {}, [], T0, T0 + HOUR) == {(): 0}


def test_rounding_is_half_to_even_in_micro_units() -> None:
    # $1 over 3 million tokens: 333,333.33… micro-units a million tokens
    assert per_mtok(1_000_000, 3_000_000) == 333_333
    # $0.000005 over 2 steps is 2.5 micro-units a step: to even, 2
    assert per_step(5, 2_000_000) == 2
    assert per_mtok(10, 0) is None and per_step(10, 0) is None


def test_a_failed_run_wastes_its_whole_spend_once() -> None:
    # One hour of 512 GPUs ($1,280) with a node failure that wasted 512 × (1800 + 600) s:
    # 341.33… GPU-hours, $853.333333. The run then fails: its failed_run waste is what the
    # fault did not already count, $426.666667, and its waste adds up to its spend.
    events = [gpus(T0, 1), fault(T0 + 1800), run_end(T0 + 3000, "failed")]
    found = state(*events)
    by_fault = found.totals("waste", {}, ["fault"], T0, T0 + HOUR)
    assert by_fault == {("node_failure",): 853_333_333, ("failed_run",): 426_666_667}
    assert sum(by_fault.values()) == found.totals("cost", {}, [], T0, T0 + HOUR)[()]


def test_a_succeeded_run_wastes_nothing_more() -> None:
    found = state(gpus(T0, 1), run_end(T0 + 3000, "succeeded"))
    assert found.totals("waste", {}, [], T0, T0 + HOUR) == {}


def test_a_cancelled_run_is_waste_and_other_runs_are_not() -> None:
    found = state(gpus(T0, 1), gpus(T0, 2, units=8, run="sft-7"),
                  run_end(T0 + 600, "cancelled", run="sft-7"))
    assert found.totals("waste", {}, ["job", "fault"], T0, T0 + HOUR) == {
        ("sft-7", "failed_run"): 40_000_000}  # 16 GPU-hours at $2.50


def test_a_run_is_judged_by_how_it_ended_last() -> None:
    ends = [RunEnd("a", "failed", 10.0), RunEnd("a", "succeeded", 20.0),
            RunEnd("b", "succeeded", 10.0), RunEnd("b", "cancelled", 30.0)]
    assert failed_runs(ends) == {"b"}
    resumed = state(gpus(T0, 1), run_end(T0 + 60, "failed"), run_end(T0 + 120, "succeeded"))
    assert resumed.totals("waste", {}, [], T0, T0 + HOUR) == {}


def test_the_failed_mark_moves_with_the_set_of_failed_runs() -> None:
    assert failed_mark({"a"}) == failed_mark({"a"}) != failed_mark({"a", "b"})


def test_the_fault_waste_rule_counts_failed_runs() -> None:
    from tests.unit.training import rule

    # sft-7: 16 GPU-hours ($40.00), then cancelled: $40.00 of failed_run waste, past $30
    found = state(gpus(T0, 2, units=8, run="sft-7", stage="posttrain"),
                  run_end(T0 + 600, "cancelled", run="sft-7"))
    watch = rule(kind="fault_waste", group_by=["job"], period="day", max_waste=30)
    [finding] = watch.evaluate(found, T0 + HOUR)
    assert finding.group == {"job": "sft-7"} and finding.value == 40_000_000
    assert finding.faults == {"failed_run": 40_000_000}


def test_a_failed_runs_waste_is_its_spend_over_any_span_and_its_parts() -> None:
    """A fault's waste is counted when it happens, for work bought before: over the hour of
    the fault it may be more than that hour's spend. The run's waste is still its spend, over
    the whole and over each part, so parts add up to the whole (slots, kept answers)."""
    events = [gpus(T0, 1, units=8), gpus(T0 + HOUR, 0.25, units=8),  # $20.00, then $5.00
              fault(T0 + HOUR + 60, units=8, lost=5400, recovery=600),  # 8 × 6000 s: $33.33
              run_end(T0 + HOUR + 600, "failed")]
    found = state(*events)
    spans = [(T0, T0 + HOUR), (T0 + HOUR, T0 + 2 * HOUR), (T0, T0 + 2 * HOUR)]
    waste = [sum(found.totals("waste", {}, ["fault"], a, b).values()) for a, b in spans]
    cost = [found.totals("cost", {}, [], a, b)[()] for a, b in spans]
    assert waste == cost == [20_000_000, 5_000_000, 25_000_000]
    assert found.totals("waste", {}, ["fault"], *spans[1]) == {
        ("node_failure",): 33_333_333, ("failed_run",): -28_333_333}


def test_a_failed_runs_waste_is_its_spend_through_the_evaluations_kept_answers() -> None:
    """The worker's evaluation keeps answers about past hours and reads the last ones fresh:
    the kept part and the fresh part add up to what a rule test reads in one go."""
    from costline.rules.evaluation_view import EvaluationView
    from costline.rules.kept_answers import KeptAnswers
    from costline.rules.memory_state import InMemoryState

    class Marked(InMemoryState):
        """Answers the hour marks kept answers need, as the Redis state does."""

        def hour_marks(self, hours: Any) -> dict[int, int]:
            return dict.fromkeys(hours, 0)

    found = Marked(state().prices)
    found.add_all([fault(T0 + HOUR, units=8, lost=3600, recovery=0),  # $20.00 at 01:00
                   gpus(T0 + 5 * HOUR, 1, units=8),  # $20.00 at 05:00
                   run_end(T0 + 5 * HOUR + 600, "failed")])
    now = T0 + 5 * HOUR + 1200
    kept = KeptAnswers()
    kept.begin(found, now)
    assert T0 < kept.hot_from < T0 + 5 * HOUR  # the fault's hour is kept, the usage's fresh
    whole = found.totals("waste", {}, ["job"], T0, now)
    assert EvaluationView(found, kept).totals("waste", {}, ["job"], T0, now) == whole == {
        GROUP: 20_000_000}
