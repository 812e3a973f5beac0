"""Backtests: which alerts a rule set would have raised on recorded events, and when.

Recorded events (JSON lines, each an event or a batch, as ``costline produce`` reads them)
are fed into an ``InMemoryState`` in time order and the engine runs at every 5-minute step,
as the worker would have. Tuning a growth ratio or a warning line against last month's data
is how a team avoids both alert fatigue and silence.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from costline.rules.alerts import AlertBook
from costline.rules.engine import Engine
from costline.rules.events import AnyEvent, Parsed, parse_message
from costline.rules.memory_state import InMemoryState
from costline.rules.prices import PricingError
from costline.rules.state import BUCKET_S, align_down


@dataclass
class Recording:
    """Events read from a file, and the lines that could not be used."""

    events: list[AnyEvent] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)


def read_events(path: Path | str) -> Recording:
    """JSON lines → events; a bad line is noted with its number and reason, then skipped."""
    recording = Recording()
    with Path(path).open("rb") as lines:
        for number, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            parsed = parse_message(raw, now=math.inf)
            if isinstance(parsed, Parsed):
                recording.events.extend(parsed.events)
            else:
                recording.rejected.append(f"{path}:{number}: {parsed.reason}")
    return recording


@dataclass
class Backtest:
    """Every alert change the rules would have published, in order."""

    changes: list[dict[str, Any]] = field(default_factory=list)
    counted: int = 0
    rejected: list[str] = field(default_factory=list)
    start: float | None = None
    end: float | None = None


def run_backtest(
    engine: Engine,
    state: InMemoryState,
    events: Sequence[AnyEvent],
    until: float | None = None,
    step: int = BUCKET_S,
) -> Backtest:
    """Replay ``events`` into ``state`` and evaluate every ``step`` seconds.

    The replay runs from the first event to the step after the last, or to ``until``: an
    alert whose ``for`` outlasts the recording shows only with a later ``until``.
    """
    ordered = sorted(events, key=lambda e: e.unix_ts)
    result = Backtest()
    if not ordered:
        return result
    result.start = float(align_down(ordered[0].unix_ts, step))
    last = float(align_down(ordered[-1].unix_ts, step) + step)
    result.end = last if until is None else float(until)
    book = AlertBook()
    cursor = 0
    for now in _steps(result.start, result.end, step):
        while cursor < len(ordered) and ordered[cursor].unix_ts < now:
            _count(state, ordered[cursor], result)
            cursor += 1
        evaluation = engine.evaluate(state, now, book)
        book = evaluation.book
        result.changes.extend(evaluation.changes)
    return result


def _count(state: InMemoryState, event: AnyEvent, result: Backtest) -> None:
    try:
        result.counted += state.add(event)
    except PricingError as exc:
        result.rejected.append(f"event {event.event_id}: {exc.reason}")


def _steps(start: float, end: float, step: int) -> Iterator[float]:
    now = start + step
    while now <= end:
        yield now
        now += step
