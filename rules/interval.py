"""The checkpoint interval that costs least: Young/Daly's interval, priced.

A run of ``U`` accelerators burning ``B`` a second checkpoints every ``τ`` seconds; writing a
checkpoint stalls it ``δ`` seconds; its accelerators fail at ``λ`` interruptions per
accelerator-hour, so the run is interrupted every ``M = 3600 / (λ·U)`` seconds on average (its
MTBF); the checkpoints it keeps cost ``S`` a second to store. Per second, the interval costs

* **recompute**: an interruption loses on average half an interval of work, ``B·τ / (2M)``;
* **checkpoint overhead**: the run stalls ``δ`` of every ``τ``, ``B·δ / τ``;
* **storage**: the run keeps a span of history (its checkpoints × its interval); at another
  interval the same span holds more or fewer checkpoints, ``S·τ₀ / τ`` (``τ₀``: the interval
  now, at which ``S`` is measured).

Their sum is least at ``τ* = √(2M·(δ + S·τ₀/B))``: with no storage cost, Young's interval
``√(2δM)`` (Young 1974; Daly 2006 to first order). Restart and recovery time cost the same at
any interval, so they are left out: the figures compare intervals, they are not the run's
whole fault waste. Amounts come out in micro-units a day, rounded half to even.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Context, Decimal

from costline.rules.prices import MICRO

DAY_S = Decimal(86400)
HOUR_S = Decimal(3600)
_CTX = Context(prec=34)


@dataclass(frozen=True)
class IntervalInputs:
    """What the advice is worked out from (money in the price book's currency)."""

    accelerators: Decimal
    burn_per_hour: Decimal
    faults_per_accelerator_hour: Decimal
    write_seconds: Decimal
    interval_seconds: Decimal
    storage_per_hour: Decimal = Decimal(0)

    @property
    def mtbf_seconds(self) -> Decimal:
        """Mean time between interruptions of the run, at its scale."""
        return _CTX.divide(HOUR_S, self.faults_per_accelerator_hour * self.accelerators)

    @property
    def checkpoint_seconds(self) -> Decimal:
        """What one checkpoint costs, in seconds of the run: its write time plus the storage
        it adds over the span kept, as run time of the same money."""
        storage = _CTX.divide(self.storage_per_hour * self.interval_seconds, self.burn_per_hour)
        return self.write_seconds + storage


@dataclass(frozen=True)
class DailyCost:
    """What an interval costs a day, micro-units, by part."""

    interval_seconds: Decimal
    recompute: int
    overhead: int
    storage: int

    @property
    def total(self) -> int:
        return self.recompute + self.overhead + self.storage


@dataclass(frozen=True)
class Advice:
    """The interval now and the one that costs least, each with what it costs a day."""

    inputs: IntervalInputs
    young_seconds: Decimal
    optimal_seconds: Decimal
    now: DailyCost
    best: DailyCost

    @property
    def at_stake(self) -> int:
        """Micro-units a day the optimal interval saves."""
        return self.now.total - self.best.total

    @property
    def excess(self) -> Decimal:
        """How much more the interval now costs than the optimum, as a fraction of it."""
        if self.best.total <= 0:
            return Decimal(0)
        return _CTX.divide(Decimal(self.now.total), Decimal(self.best.total)) - 1


def valid(inputs: IntervalInputs) -> bool:
    """Whether the figures can be worked out: a run that costs, fails and checkpoints."""
    return (inputs.accelerators > 0 and inputs.burn_per_hour > 0 and
            inputs.faults_per_accelerator_hour > 0 and inputs.interval_seconds > 0 and
            inputs.write_seconds >= 0 and inputs.storage_per_hour >= 0)


def daily_cost(inputs: IntervalInputs, interval_seconds: Decimal) -> DailyCost:
    """What checkpointing every ``interval_seconds`` costs a day."""
    tau = interval_seconds
    burn = _CTX.divide(inputs.burn_per_hour, HOUR_S)
    store = _CTX.divide(inputs.storage_per_hour, HOUR_S)
    recompute = _CTX.divide(burn * tau, 2 * inputs.mtbf_seconds)
    overhead = _CTX.divide(burn * inputs.write_seconds, tau)
    storage = _CTX.divide(store * inputs.interval_seconds, tau)
    return DailyCost(tau, _micro(recompute * DAY_S), _micro(overhead * DAY_S),
                     _micro(storage * DAY_S))


def optimal_interval(inputs: IntervalInputs) -> Decimal:
    """``√(2M·(δ + S·τ₀/B))`` seconds."""
    return (2 * inputs.mtbf_seconds * inputs.checkpoint_seconds).sqrt(_CTX)


def advise(inputs: IntervalInputs) -> Advice:
    optimal = optimal_interval(inputs)
    young = (2 * inputs.mtbf_seconds * inputs.write_seconds).sqrt(_CTX)
    return Advice(inputs, young, optimal, daily_cost(inputs, inputs.interval_seconds),
                  daily_cost(inputs, optimal))


def _micro(amount: Decimal) -> int:
    return int((amount * MICRO).to_integral_value(ROUND_HALF_EVEN))
