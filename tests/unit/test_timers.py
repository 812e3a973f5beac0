"""Timer steps that outlast their interval: one at a time, no overlap warning, cancelled on stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import mode
import pytest

from costline.streams.worker.timers import single_flight


class Owner(mode.Service):
    """A mode service, as the Faust app is: it owns the futures a tick starts."""


async def _tick_for(service: Owner, seconds: float, tick) -> None:
    async def loop() -> None:
        async for _ in service.itertimer(0.02, name="evaluation"):
            await tick()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(loop(), seconds)


async def test_a_slow_step_runs_once_at_a_time_and_again_after(caplog):
    service = Owner()
    await service.start()
    running, runs, most = 0, 0, 0

    async def step() -> None:
        nonlocal running, runs, most
        running += 1
        runs += 1
        most = max(most, running)
        await asyncio.sleep(0.15)
        running -= 1

    caplog.set_level(logging.WARNING)
    await _tick_for(service, 0.8, single_flight(service, step, "evaluation"))
    await service.stop()
    assert most == 1
    assert 2 <= runs <= 6  # a run every 0.15 s or so, not one per 0.02-s tick (40)
    assert not [r for r in caplog.records if "overlapping" in r.getMessage()]


async def test_awaited_in_the_timer_the_same_step_is_reported_overlapping(caplog):
    """The warning the single flight avoids, with the same timer and step."""
    service = Owner()
    await service.start()

    async def step() -> None:
        await asyncio.sleep(0.15)

    caplog.set_level(logging.WARNING)
    await _tick_for(service, 0.5, step)
    await service.stop()
    assert [r for r in caplog.records if "overlapping" in r.getMessage()]


async def test_a_running_step_is_cancelled_when_the_owner_stops():
    service = Owner()
    await service.start()
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def step() -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    tick = single_flight(service, step, "reclaim")
    await tick()
    await asyncio.wait_for(started.wait(), 5)
    await asyncio.wait_for(service.stop(), 5)
    assert cancelled.is_set()


@pytest.mark.parametrize("name", ["evaluation", "kafka_probe"])
def test_the_tick_carries_the_timer_name(name):
    assert single_flight(Owner(), asyncio.sleep, name).__name__ == name
