"""Checkpoint interval: a run checkpointing far from the interval that costs least.

What each run's interval costs a day — recompute after faults, checkpoint overhead, storage —
against Young/Daly's optimum (``costline.rules.interval``), from measured figures:

* the fault rate per accelerator-hour: fault events of the matched runs over ``lookback``
  divided by their accelerator-hours (``fault_rate`` stands in while fewer than
  ``min_faults`` faults are measured);
* the run's scale and burn: its accelerator-hours and their cost over ``window``;
* its interval and write time: the median gap between and the mean write time of its
  ``recent`` last checkpoints; its storage: what the checkpoints it keeps cost an hour.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from typing import Annotated, ClassVar, Literal

from pydantic import Field, WithJsonSchema

from costline.rules.durations import Money, PositiveDuration, format_duration
from costline.rules.events import RUN_TAG
from costline.rules.findings import Contributor, Finding, Line, labels_text, money_text
from costline.rules.globs import glob_match
from costline.rules.interval import Advice, IntervalInputs, advise, valid
from costline.rules.inventory import Checkpoint, CheckpointInventory, by_run, storage_now
from costline.rules.kinds import Glob, GroupBy, Presentation, Rule, kind
from costline.rules.prices import MICRO
from costline.rules.state import PSEUDO_TAGS, FaultHistory, StateView, align_down, matches

OPTIMUM_LINE = "optimum"
EXCESS_LINE = "max_excess"
FAULTS_KEPT_S = 7 * 86400
HOUR_S = 3600

Fraction = Annotated[Decimal, Field(gt=0, le=100),
                     WithJsonSchema({"type": "number", "exclusiveMinimum": 0, "maximum": 100})]
Rate = Annotated[Decimal, Field(gt=0, le=1),
                 WithJsonSchema({"type": "number", "exclusiveMinimum": 0, "maximum": 1})]


@dataclass(frozen=True)
class FaultRate:
    """Interruptions per accelerator-hour, and what they were measured on."""

    per_accelerator_hour: Decimal
    faults: int
    accelerator_hours: Decimal
    measured: bool


@dataclass(frozen=True)
class RunAdvice:
    """One run's advice with the figures it rests on."""

    run: str
    group: dict[str, str]
    advice: Advice
    rate: FaultRate
    checkpoints: int


@kind("checkpoint_interval")
class CheckpointIntervalRule(Rule):
    """Runs whose checkpoint interval costs more than ``max_excess`` above the optimal one.

    Per run (its ``job`` tag): the Young/Daly interval for its measured MTBF at its scale,
    write time and storage, and what the interval now and the optimal one cost a day in
    recompute after faults, checkpoint overhead and storage. The alert fires when the
    interval now costs more than ``max_excess`` (a fraction: 0.1 is 10%) above the optimum
    and at least ``min_stake`` a day more, and says how many dollars a day are at stake.

    ```yaml
    rules:
      - name: checkpoint-interval
        kind: checkpoint_interval
        match: {stage: pretrain}
        accelerators: "gpu.*"
        lookback: 7d
        min_faults: 3
        fault_rate: 0.000474
        max_excess: 0.1
        min_stake: 100
        notify: {slack: "#ml-reliability"}
    ```
    """

    data_driven: ClassVar[bool] = False  # checkpoints, faults and time move it: on the tick
    presentation = Presentation(
        unit="currency_per_day",
        crossed="{value} for the checkpoint interval, past {line}",
        back="{value}, back within {line}",
    )

    kind: Literal["checkpoint_interval"]
    group_by: GroupBy = Field((RUN_TAG,), description="tag keys of the alert's group; the run's "
                              "job is always one")
    accelerators: Glob = Field("gpu.*", description="resource types that are the run's "
                               "accelerators (a * glob allowed)")
    window: PositiveDuration = Field(6 * 3600, json_schema_extra={"default": "6h"},
                                     description="the recent span a run's scale and burn rate "
                                     "are measured over")
    lookback: PositiveDuration = Field(7 * 86400, le=FAULTS_KEPT_S,
                                       json_schema_extra={"default": "7d"},
                                       description="the span the fault rate is measured over "
                                       "(at most 7d: faults are kept that long)")
    min_faults: int = Field(3, ge=1, le=1_000_000, description="fewer faults measured: "
                            "fault_rate stands in, or no advice")
    fault_rate: Rate | None = Field(None, description="interruptions per accelerator-day to "
                                    "assume while too few faults are measured (Llama 3: "
                                    "0.000474)")
    recent: int = Field(10, ge=2, le=1000, description="a run's latest checkpoints its "
                        "interval and write time are measured on")
    max_excess: Fraction = Field(Decimal("0.1"), description="the line: the interval now "
                                 "costs more than this fraction above the optimum")
    min_stake: Money = Field(0, description="a day's difference below this never fires")

    @property
    def usage_match(self) -> dict[str, str]:
        return {**self.match, "resource_type": self.accelerators}

    @property
    def run_match(self) -> dict[str, str]:
        return {k: v for k, v in self.match.items() if k not in PSEUDO_TAGS}

    def advice(self, state: StateView, now: float) -> list[RunAdvice]:
        """Every run's advice (runs with fewer than two checkpoints, no accelerator spend in
        ``window`` or no fault rate get none)."""
        if not isinstance(state, CheckpointInventory):
            return []
        rate = self.fault_rate_of(state, now)
        if rate is None:
            return []
        end = align_down(now)
        start = end - self.window
        match, by = self.usage_match, (RUN_TAG,)
        hours = state.totals("quantity", match, by, start, end)
        cost = state.totals("cost", match, by, start, end)
        earliest_by = getattr(state, "earliest_by", None)
        firsts = earliest_by("quantity", match, by) if earliest_by is not None else {}
        found = []
        for run, checkpoints in by_run(c for c in state.checkpoints()
                                       if matches(self.run_match, c.tags)).items():
            active = (end - max(start, firsts.get((run,), start))) / HOUR_S
            used = Decimal(hours.get((run,), 0)) / MICRO
            if active <= 0 or used <= 0:
                continue
            inputs = self._inputs(checkpoints, used / Decimal(str(active)),
                                  Decimal(cost.get((run,), 0)) / MICRO / Decimal(str(active)),
                                  rate)
            if inputs is not None and valid(inputs):
                found.append(RunAdvice(run, self._group(run, checkpoints), advise(inputs), rate,
                                       sum(1 for c in checkpoints if c.live)))
        return found

    def fault_rate_of(self, state: StateView, now: float) -> FaultRate | None:
        """Interruptions per accelerator-hour of the matched runs over ``lookback``."""
        since = now - self.lookback
        exposure = Decimal(sum(state.totals("quantity", self.usage_match, (), since,
                                            align_down(now) + 300).values())) / MICRO
        faults = 0
        if isinstance(state, FaultHistory):
            faults = sum(1 for f in state.faults(since) if f.ts <= now
                         and glob_match(f.resource_type, self.accelerators)
                         and matches(self.match, {**f.tags, "resource_type": f.resource_type}))
        if faults >= self.min_faults and exposure > 0:
            return FaultRate(Decimal(faults) / exposure, faults, exposure, True)
        if self.fault_rate is not None:
            return FaultRate(self.fault_rate / 24, faults, exposure, False)
        return None

    def _inputs(self, checkpoints: list[Checkpoint], accelerators: Decimal, burn: Decimal,
                rate: FaultRate) -> IntervalInputs | None:
        written = sorted(checkpoints, key=lambda c: c.written_at)[-self.recent:]
        if len(written) < 2:
            return None
        gaps = [b.written_at - a.written_at for a, b in zip(written, written[1:], strict=False)]
        interval = Decimal(str(statistics.median(gaps)))
        write = sum((Decimal(str(c.write_seconds)) for c in written), Decimal(0)) / len(written)
        storage = Decimal(sum(storage_now(c) for c in checkpoints)) / MICRO
        return IntervalInputs(accelerators, burn, rate.per_accelerator_hour, write, interval,
                              storage)

    def _group(self, run: str, checkpoints: list[Checkpoint]) -> dict[str, str]:
        tags = checkpoints[-1].tags
        group = {key: tags.get(key, "") for key in self.group_by}
        group.setdefault(RUN_TAG, run)
        return group

    def threshold(self, advice: Advice) -> int:
        """The line: the optimum's daily cost, ``max_excess`` above it, rounded up."""
        line = Decimal(advice.best.total) * (1 + self.max_excess)
        return int(line.to_integral_value(ROUND_CEILING))

    def evaluate(self, state: StateView, now: float) -> list[Finding]:
        found = []
        for run in self.advice(state, now):
            advice = run.advice
            line = self.threshold(advice)
            if advice.now.total <= line or advice.at_stake < self.min_stake:
                continue
            now_cost = advice.now
            top = (Contributor({"part": "recompute"}, now_cost.recompute),
                   Contributor({"part": "checkpoint overhead"}, now_cost.overhead),
                   Contributor({"part": "storage"}, now_cost.storage))
            found.append(Finding(
                group=run.group, value=now_cost.total, line=EXCESS_LINE, threshold=line,
                rank=0, lines=(Line(OPTIMUM_LINE, advice.best.total), Line(EXCESS_LINE, line)),
                period=(now - self.window, now), top=top, basis=advice.best.total))
        return found

    def summarize(self, finding: Finding, currency: str) -> str:
        best = finding.basis or 0
        stake = finding.value - best
        share = f" ({Decimal(stake) * 100 / best:.0f}% more)" if best else ""
        return (f"{labels_text(finding.group)}: its checkpoint interval costs "
                f"{money_text(finding.value, currency)}/day in recompute, checkpoint overhead "
                f"and storage; the optimal interval would cost {money_text(best, currency)}/day"
                f": {money_text(stake, currency)}/day at stake{share}. "
                "costline advise checkpoints shows the intervals.")


def interval_text(seconds: Decimal) -> str:
    """An interval for people: ``1h49m``, ``19m16s``."""
    return format_duration(int(seconds.to_integral_value()))


def rate_words(rate: FaultRate, mtbf_seconds: Decimal, accelerators: Decimal) -> str:
    """Where the MTBF comes from, in a phrase."""
    source = (f"{rate.faults} faults in {rate.accelerator_hours:,.0f} accelerator-hours"
              if rate.measured else "the rule's fault_rate")
    return (f"MTBF {mtbf_seconds / HOUR_S:.1f} h at {accelerators:,.0f} accelerators "
            f"({source})")
