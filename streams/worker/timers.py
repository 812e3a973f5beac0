"""The worker's timers: a step that outlasts its interval runs on, and the ticks pass it by.

A timer's step may take far longer than its interval: the leader evaluates every 0.15 s of
idle time, and an evaluation of many tag sets takes seconds. Awaited inside the timer, such a
step holds the timer up, and mode's timer logs a warning ("Timer ... is overlapping") each
time. Started as one of the app's futures instead (``Service.add_future``), the step runs on
while the ticks in between return at once: steps still run one at a time, and the app
cancels a running step when it stops, as it does its timers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol


class FutureOwner(Protocol):
    def add_future(self, coro: Awaitable[Any]) -> asyncio.Future[Any]: ...


def single_flight(owner: FutureOwner, step: Callable[[], Awaitable[Any]],
                  name: str) -> Callable[[], Awaitable[None]]:
    """A timer callback named ``name``: starts ``step`` unless its last run is still going."""
    running: asyncio.Future[Any] | None = None

    async def tick() -> None:
        nonlocal running
        if running is None or running.done():
            running = owner.add_future(step())

    tick.__name__ = tick.__qualname__ = name
    return tick
