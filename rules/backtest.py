"""Backtests: which alerts a rule set would have raised on recorded events, and when.

Recorded events (JSON lines, each an event or a batch, as ``costline produce`` reads them)
are fed into an ``InMemoryState`` in time order and the engine runs at every 5-minute step,
as the worker would have. Tuning a growth ratio or a warning line against last month's data
is how a team avoids both alert fatigue and silence.

A line is read as the worker reads a message: the same parser, the same price book, the same
limit on times in the future. What the worker would refuse is reported and left out, so one
mistyped or far-future line neither changes the answer nor stretches the replay over decades
of empty 5-minute steps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from costline.rules.alerts import AlertBook
from costline.rules.engine import Engine
from costline.rules.events import AnyEvent, FaultEvent, Parsed, UsageEvent, parse_message
from costline.rules.memory_state import InMemoryState
from costline.rules.prices import PriceBook, PricingError
from costline.rules.state import BUCKET_S, align_down

Progress = Callable[[int, int], None]
"""Told ``(steps done, steps in all)`` as a replay advances."""

LONGEST_AFTER_S = 31 * 86400
"""How far past the last event a replay may be asked to run (``--until``): a calendar month,
the longest period a rule counts in. It keeps a mistyped year from replaying decades of empty
5-minute steps."""


@dataclass
class Recording:
    """Events read from a file, and the lines that could not be used (``FILE:LINE: reason``)."""

    events: list[AnyEvent] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)


def read_events(path: Path | str, prices: PriceBook, now: float | None = None) -> Recording:
    """JSON lines → the events the worker would count at ``now`` (default: the clock).

    A line the worker would refuse — not an event, a time more than ten minutes after
    ``now``, a resource type or unit the price book does not price — is noted with its line
    number and reason, and skipped whole, as the worker refuses a message whole.
    """
    recording = Recording()
    with Path(path).open("rb") as lines:
        for number, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            parsed = parse_message(raw, now=now)
            reason = parsed.reason if not isinstance(parsed, Parsed) else _unpriced(parsed,
                                                                                   prices)
            if reason is None:
                recording.events.extend(parsed.events)  # type: ignore[union-attr]
            else:
                recording.rejected.append(f"{path}:{number}: {reason}")
    return recording


def _unpriced(parsed: Parsed, prices: PriceBook) -> str | None:
    """Why the price book cannot price the message's events, or ``None`` when it can."""
    for index, event in enumerate(parsed.events):
        try:
            if isinstance(event, UsageEvent):
                prices.charge(event)
            elif isinstance(event, FaultEvent):
                prices.waste(event)
        except PricingError as exc:
            return f"event {index}: {exc.reason}" if parsed.batch else exc.reason
    return None


@dataclass
class Backtest:
    """Every alert change the rules would have published, in order."""

    changes: list[dict[str, Any]] = field(default_factory=list)
    counted: int = 0
    start: float | None = None
    end: float | None = None


def replay_span(events: Sequence[AnyEvent], until: float | None = None,
                step: int = BUCKET_S) -> tuple[float, float] | None:
    """The evaluation times of a replay: from the first event's step to the step after the
    last event (or to ``until``); ``None`` without events."""
    if not events:
        return None
    times = [event.unix_ts for event in events]
    start = float(align_down(min(times), step))
    end = float(align_down(max(times), step) + step) if until is None else float(until)
    return start, end


def run_backtest(
    engine: Engine,
    state: InMemoryState,
    events: Sequence[AnyEvent],
    until: float | None = None,
    step: int = BUCKET_S,
    progress: Progress | None = None,
) -> Backtest:
    """Replay ``events`` into ``state`` and evaluate every ``step`` seconds.

    The replay runs from the first event to the step after the last, or to ``until``: an
    alert whose ``for`` outlasts the recording shows only with a later ``until``.
    """
    ordered = sorted(events, key=lambda e: e.unix_ts)
    result = Backtest()
    span = replay_span(ordered, until, step)
    if span is None:
        return result
    result.start, result.end = span
    book = AlertBook()
    cursor = 0
    total = max(0, int((result.end - result.start) // step))
    for done, now in enumerate(_steps(result.start, result.end, step), start=1):
        while cursor < len(ordered) and ordered[cursor].unix_ts < now:
            result.counted += state.add(ordered[cursor])
            cursor += 1
        evaluation = engine.evaluate(state, now, book)
        book = evaluation.book
        result.changes.extend(evaluation.changes)
        if progress is not None:
            progress(done, total)
    return result


def _steps(start: float, end: float, step: int) -> Iterator[float]:
    now = start + step
    while now <= end:
        yield now
        now += step
