"""Inhibition: a fault on a job mutes that job's idle and growth alerts while it recovers.

After a node failure a job's GPUs sit near 0% while it is detected, isolated, restarted and
reloaded, and its checkpoint storage jumps as it restores. Those are symptoms of the fault,
already priced as waste; alerting on them as well would page the on-call twice for one
event and could even reclaim the job's nodes mid-recovery. Which kinds are muted is a
property of each kind (``Rule.inhibited_by_faults``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from costline.rules.durations import rfc3339
from costline.rules.state import FaultRecord

FAULT_LOOKBACK_S = 86_400
"""How far back the engine asks for faults: longer than any real recovery window."""

INHIBIT_BY = "job"


@dataclass(frozen=True)
class Inhibition:
    fault: FaultRecord
    job: str

    @property
    def until(self) -> float:
        return self.fault.recovered_at

    @property
    def reason(self) -> str:
        return (
            f"{self.fault.fault} on job {self.job} at {rfc3339(self.fault.ts)}, "
            f"recovering until {rfc3339(self.until)}"
        )


def inhibition_for(
    faults: Iterable[FaultRecord], labels: Mapping[str, str], now: float
) -> Inhibition | None:
    """The fault whose recovery window covers ``now`` on the alert's job, if any."""
    job = labels.get(INHIBIT_BY)
    if not job:
        return None
    recovering = [
        f for f in faults if f.tags.get(INHIBIT_BY) == job and f.ts <= now < f.recovered_at
    ]
    if not recovering:
        return None
    return Inhibition(max(recovering, key=lambda f: f.recovered_at), job)
