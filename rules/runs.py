"""Training runs: what their spend bought (tokens, steps) and what a failed run wasted.

A run is named by its ``job`` tag (``RUN_TAG``). Its spend is every amount carrying that tag;
its progress events say what the spend bought. Progress is counted like usage, as quantities
of three pseudo resource types with no price, so any period's tokens and steps are sums read
from the same buckets as its spend:

* ``progress.tokens`` in millions of tokens (``mtok``): a quantity's micro-units are tokens;
* ``progress.steps`` in optimizer steps;
* ``progress.samples`` in millions of samples.

A run that ends ``failed`` or ``cancelled`` bought nothing: all of its spend is waste, of the
waste type ``failed_run``. It is worked out when spend is read, not when it is counted (the
run's spend came before its end): for each tag set of such a run and each interval read, its
``failed_run`` waste is its spend less the fault waste already counted for it, so a failed
run's waste adds up to its spend and no dollar is waste twice.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal

from pydantic import ValidationError

from costline.rules.events import RUN_TAG, RunEndEvent, RunStatus
from costline.rules.prices import MICRO

PROGRESS_TOKENS = "progress.tokens"
PROGRESS_STEPS = "progress.steps"
PROGRESS_SAMPLES = "progress.samples"
PROGRESS_UNITS = {PROGRESS_TOKENS: "mtok", PROGRESS_STEPS: "step", PROGRESS_SAMPLES: "msample"}
PROGRESS_CATEGORY = "other"
PROGRESS_BILLING = "elastic"

FAILED_RUN = "failed_run"
"""The waste type of a failed or cancelled run's spend."""
WASTED_ENDS = frozenset({RunStatus.failed, RunStatus.cancelled})

# The ledger's record sets (``costline.rules.ledger.RECORD``): facts kept as written, not summed.
CHECKPOINTS = "checkpoints"
RESTORES = "restores"
RUN_ENDS = "runs"


@dataclass(frozen=True)
class RunEnd:
    """How and when a run ended (the latest ``run_end`` event of the run)."""

    run: str
    status: str
    ts: float
    reason: str | None = None

    @property
    def wasted(self) -> bool:
        return self.status in WASTED_ENDS


def run_end_of(raw: bytes | str) -> RunEnd | None:
    """A stored ``run_end`` event → ``RunEnd`` (``None`` for anything else)."""
    try:
        event = RunEndEvent.model_validate_json(raw)
    except ValidationError:
        return None
    return RunEnd(event.tags[RUN_TAG], event.status.value, event.unix_ts, event.reason)


def latest_ends(ends: Iterable[RunEnd]) -> dict[str, RunEnd]:
    """Each run's latest end: a run resumed and ended again is judged by how it ended last."""
    found: dict[str, RunEnd] = {}
    for end in ends:
        known = found.get(end.run)
        if known is None or (end.ts, end.status) > (known.ts, known.status):
            found[end.run] = end
    return found


def failed_runs(ends: Iterable[RunEnd]) -> frozenset[str]:
    """The runs whose latest end is failed or cancelled."""
    return frozenset(run for run, end in latest_ends(ends).items() if end.wasted)


def failed_mark(failed: Iterable[str]) -> int:
    """A number that changes whenever the set of failed runs does: kept answers about past
    hours include their failed-run waste, so a run failing moves every hour's mark."""
    digest = hashlib.blake2b("\n".join(sorted(failed)).encode(), digest_size=6).digest()
    return int.from_bytes(digest, "big")


def failed_run_waste(cost: int, fault_waste: int) -> int:
    """A failed run's tag set's ``failed_run`` waste over an interval: its spend less the fault
    waste already counted for it, so that its waste is its spend over any interval, however
    the interval, the tag set's slots or a reader's kept answers split it (a sum of parts is
    the whole's). Below zero where the interval's fault waste is more than its spend: a fault's
    waste is counted when it happens, for work bought before."""
    return cost - fault_waste


# ── efficiency ────────────────────────────────────────────────────────────────────────────


def _divided(numerator: int, denominator: int) -> int:
    return int((Decimal(numerator) / Decimal(denominator)).to_integral_value(ROUND_HALF_EVEN))


def per_mtok(cost: int, tokens: int) -> int | None:
    """Money per million tokens, micro-units: ``cost`` micro-units over ``tokens`` (the
    ``progress.tokens`` quantity, whose micro-units are tokens). ``None`` without tokens."""
    if tokens <= 0:
        return None
    return _divided(cost * MICRO, tokens)


def per_step(cost: int, steps: int) -> int | None:
    """Money per optimizer step, micro-units; ``steps`` is the ``progress.steps`` quantity in
    micro-units (a step is 10^6). ``None`` without steps."""
    if steps <= 0:
        return None
    return _divided(cost * MICRO, steps)


@dataclass(frozen=True)
class Efficiency:
    """What a group's spend bought: amounts in micro-units, tokens as counted."""

    cost: int
    waste: int
    tokens: int
    steps: int

    @property
    def per_mtok(self) -> int | None:
        return per_mtok(self.cost, self.tokens)

    @property
    def per_step(self) -> int | None:
        return per_step(self.cost, self.steps)

    @property
    def whole_steps(self) -> int:
        return self.steps // MICRO


def efficiencies(cost: Mapping[tuple[str, ...], int], waste: Mapping[tuple[str, ...], int],
                 tokens: Mapping[tuple[str, ...], int], steps: Mapping[tuple[str, ...], int]
                 ) -> dict[tuple[str, ...], Efficiency]:
    """Per group: spend, waste, tokens and steps side by side."""
    groups = set(cost) | set(waste) | set(tokens) | set(steps)
    return {g: Efficiency(cost.get(g, 0), waste.get(g, 0), tokens.get(g, 0), steps.get(g, 0))
            for g in groups}
