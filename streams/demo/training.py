"""The demo's training telemetry: what run-42's spend buys, and the checkpoints it keeps.

* Progress: 512 H100s train 440 steps of 4,194,304 tokens an hour at full speed; writing a
  checkpoint stalls every rank (75 s a checkpoint), and a slow node holds every rank back
  by a fifth for the last 6 hours (synchronous training runs at the slowest rank's pace).
* Checkpoints of 1 TB on storage.checkpoint: every 30 minutes, then every 6 minutes since the
  config change the storage story tells (``scenario._checkpoints``); the old retention kept
  the last 40, so those are the ones before it still there; and four milestones of earlier
  days, the oldest the evaluation baseline, tagged ``keep=true``.
* The silent-data-corruption rollback read back the checkpoint from 6 hours before it.
* Post-training: every ninth experiment (an RL run) failed; the others succeeded.

Locations are under ``root``, where the demo writes a stand-in for each checkpoint so the
lifecycle's filesystem connector finds real files to plan on.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

HOUR = 3600
TB = 10**12
TOKENS_PER_STEP = 4_194_304
STEPS_PER_HOUR = 440
WRITE_S = 75
SLOW_H = 6
SLOW_PACE = 0.8
BEFORE_S, AFTER_S = 1800, 360
KEPT_BEFORE = 40
MILESTONE_DAYS = (9, 8, 5, 3)
DEFAULT_ROOT = Path("/lustre/checkpoints")


def hours(start: float, end: float) -> Iterator[float]:
    """The whole hours within [start, end]: what the demo plays lies in the period it sums."""
    hour = start - start % HOUR
    if hour < start:
        hour += HOUR
    while hour + HOUR <= end:
        yield hour
        hour += HOUR


def progress(start: float, now: float, broke: float, tags: dict[str, str]) -> list[dict[str, Any]]:
    """One progress event an hour: steps at full speed less the checkpoint stalls of that
    hour, and less a fifth in the hours of the slow node; stamped with the hour's GPU usage,
    so any window holds the spend and the tokens of the same hours."""
    events = []
    reached = 0
    for hour in hours(start, now):
        interval = AFTER_S if hour + 1800 > broke else BEFORE_S
        pace = (1 - WRITE_S / interval) * (SLOW_PACE if hour + HOUR > now - SLOW_H * HOUR else 1)
        steps = round(STEPS_PER_HOUR * pace)
        reached += steps
        events.append({"event_id": f"pt-progress-{int(hour)}", "kind": "progress",
                       "ts": hour + 60, "step": reached, "steps": steps,
                       "tokens": steps * TOKENS_PER_STEP, "tags": tags})
    return events


def checkpoint_times(start: float, now: float, broke: float) -> list[float]:
    """When the checkpoints still kept were written, oldest first."""
    times = [now - days * 86400 for days in MILESTONE_DAYS]
    times += [broke - (KEPT_BEFORE - k) * BEFORE_S for k in range(KEPT_BEFORE)]
    after = broke + AFTER_S
    while after <= now - 60:
        times.append(after)
        after += AFTER_S
    return [t for t in times if t >= start]


def checkpoints(start: float, now: float, broke: float, tags: dict[str, str],
                root: Path = DEFAULT_ROOT) -> list[dict[str, Any]]:
    events = []
    for index, ts in enumerate(checkpoint_times(start, now, broke)):
        step = int((ts - start) / HOUR * STEPS_PER_HOUR)
        own = {**tags, "keep": "true"} if index == 0 else tags
        events.append({"event_id": f"pt-ckpt-{step}", "kind": "checkpoint", "ts": round(ts, 3),
                       "location": str(root / tags["job"] / f"step-{step:07d}"), "step": step,
                       "bytes": TB, "tier": "storage.checkpoint", "write_seconds": WRITE_S,
                       "tags": own})
    return events


def restore(sdc_at: float, written: list[dict[str, Any]], tags: dict[str, str]
            ) -> dict[str, Any]:
    """The SDC rollback reads back the last checkpoint written 6 hours before it."""
    clean = [c for c in written if c["ts"] <= sdc_at - 6 * HOUR] or written[:1]
    return {"event_id": "pt-restore-sdc", "kind": "restore", "ts": round(sdc_at + 600, 3),
            "location": clean[-1]["location"], "read_seconds": 420, "tags": tags}


def run_end(job: str, ts: float, tags: dict[str, str], failed: bool) -> dict[str, Any]:
    return {"event_id": f"end-{job}", "kind": "run_end", "ts": round(ts, 3),
            "status": "failed" if failed else "succeeded",
            **({"reason": "reward collapsed: NaN loss"} if failed else {}), "tags": tags}


def stand_ins(events: list[dict[str, Any]]) -> None:
    """A small file where each checkpoint event says it is, for the filesystem connector."""
    for event in events:
        if event["kind"] == "checkpoint":
            folder = Path(event["location"])
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "model.safetensors").write_bytes(b"stand-in")
