"""The Redis reclamation ledger: compare-and-set steps, the execution claim, caps, the outbox;
on a single Redis and on a Redis Cluster."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from costline.connectors.reclaim_ledger import Pause, RedisReclaimLedger
from costline.connectors.redis_client import connect_async
from costline.rules.findings import ReclaimRequest
from costline.rules.reclaim import ActionRecord, Keep, Plan, make_plan
from tests.integration.slurm import reclaim_redis_url

__all__ = ["reclaim_redis_url"]

T0 = 1_796_025_600.0


def plan(resource_id: str = "slurm/4211", at: float = T0) -> Plan:
    request = ReclaimRequest(resource_id=resource_id, resource_type="gpu.h100", tags={},
                             connector="slurm", params={"action": "cancel"}, grace=900,
                             mode="live", idle_since=at - 1800, requested_at=at)
    return make_plan(request, "gpu-idle", {"job_id": "4211"}, 2_490_000, "USD", at)


def record(found: Plan, step: str) -> dict[str, Any]:
    return ActionRecord(found, step, f"{step} for the test", T0).to_dict()  # type: ignore[arg-type]


@pytest.fixture
def redis_url(reclaim_redis_url: str) -> str:
    """The single Redis of ``any_redis_url``: a private one when none is configured."""
    return reclaim_redis_url


@pytest.fixture
async def ledgers(any_redis_url: str, namespace: str
                  ) -> AsyncIterator[tuple[RedisReclaimLedger, RedisReclaimLedger]]:
    """Two workers' ledgers on the same namespace, each with its own connection."""
    one, two = connect_async(any_redis_url), connect_async(any_redis_url)
    yield RedisReclaimLedger(one, namespace), RedisReclaimLedger(two, namespace)
    keys = [key async for key in one.scan_iter(match=f"{{{namespace}:reclaim}}*")]
    if keys:
        await one.delete(*keys)
    await one.aclose()
    await two.aclose()


async def test_one_plan_per_rule_and_resource(ledgers: tuple[RedisReclaimLedger, ...]) -> None:
    a, b = ledgers
    first, second = plan(at=T0), plan(at=T0 + 1)
    results = await asyncio.gather(a.open(first, record(first, "planned")),
                                   b.open(second, record(second, "planned")))
    assert sorted(results) == [False, True]
    [tracked] = await a.plans()
    assert tracked.state == "planned" and await b.holder("gpu-idle", "slurm/4211") == (
        tracked.plan.plan_id)
    assert tracked.plan == (first if results[0] else second)


async def test_each_step_is_taken_once_and_logged_once(
        ledgers: tuple[RedisReclaimLedger, ...]) -> None:
    a, b = ledgers
    found = plan()
    await a.open(found, record(found, "planned"))
    moved = await asyncio.gather(*(ledger.advance(found.plan_id, "planned", "warned",
                                                  record(found, "warned"), T0)
                                   for ledger in (a, b, a, b)))
    assert moved.count(True) == 1
    tracked = await b.get(found.plan_id)
    assert tracked is not None and (tracked.state, tracked.warned_at) == ("warned", T0)
    assert [r["step"] for r in await b.history()] == ["warned", "planned"]
    assert len(await a.outbox()) == 2


async def test_the_execution_claim_is_taken_once(ledgers: tuple[RedisReclaimLedger, ...]
                                                 ) -> None:
    a, b = ledgers
    found = plan()
    await a.open(found, record(found, "planned"))
    await a.advance(found.plan_id, "planned", "warned", record(found, "warned"), T0 + 5)
    claims = await asyncio.gather(*(ledger.claim(found.plan_id, f"w{i}", T0)
                                    for i, ledger in enumerate((a, b, a, b, a, b))))
    assert sorted(claims) == ["claimed"] + ["taken"] * 5
    tracked = await b.get(found.plan_id)
    assert tracked is not None and (tracked.state, tracked.claimed_at) == ("executing", T0)


async def test_a_claim_left_by_a_dead_worker_is_never_taken_again(
        ledgers: tuple[RedisReclaimLedger, ...]) -> None:
    a, b = ledgers
    found = plan()
    await a.open(found, record(found, "planned"))
    await a.advance(found.plan_id, "planned", "warned", record(found, "warned"), T0 + 5)
    assert await a.claim(found.plan_id, "dead", T0) == "claimed"
    # Even if someone put the plan back to warned, the claim key still refuses it.
    await b.advance(found.plan_id, "executing", "warned", record(found, "warned"), T0 + 5)
    assert await b.claim(found.plan_id, "alive", T0 + 60) == "taken"


async def test_pause_refuses_the_claim_until_resumed(ledgers: tuple[RedisReclaimLedger, ...]
                                                     ) -> None:
    a, b = ledgers
    found = plan()
    await a.open(found, record(found, "planned"))
    await a.advance(found.plan_id, "planned", "warned", record(found, "warned"), T0 + 5)
    await a.pause(Pause("ada", T0, "maintenance"))
    assert await b.paused() == Pause("ada", T0, "maintenance")
    assert await b.claim(found.plan_id, "w", T0) == "paused"
    assert await b.resume() is True and await a.resume() is False
    assert await b.claim(found.plan_id, "w", T0) == "claimed"


async def test_closing_frees_the_resource_after_the_cooldown(
        ledgers: tuple[RedisReclaimLedger, ...]) -> None:
    a, b = ledgers
    found, kept = plan("slurm/1"), plan("slurm/2")
    for item in (found, kept):
        await a.open(item, record(item, "planned"))
    assert await a.close(found.plan_id, "planned", record(found, "skipped"), 0)
    assert not await b.close(found.plan_id, "planned", record(found, "skipped"), 0)
    assert await a.close(kept.plan_id, "planned", record(kept, "skipped"), 3600)
    assert await a.plans() == []
    assert await b.holder("gpu-idle", "slurm/1") is None
    assert await b.holder("gpu-idle", "slurm/2") == kept.plan_id


async def test_an_unplanned_plan_is_one_record_holding_its_resource_for_the_cooldown(
        ledgers: tuple[RedisReclaimLedger, ...]) -> None:
    a, b = ledgers
    found, other = plan("slurm/1"), plan("slurm/2")
    assert await a.close_unplanned(found, record(found, "skipped"), 3600)
    assert not await b.close_unplanned(found, record(found, "skipped"), 3600)
    assert await a.close_unplanned(other, record(other, "failed"), 0)
    assert await a.plans() == []
    assert [r["step"] for r in await b.history()] == ["failed", "skipped"]
    assert await b.holder("gpu-idle", "slurm/1") == found.plan_id
    assert await b.holder("gpu-idle", "slurm/2") is None


async def test_the_hourly_reservation_is_atomic(ledgers: tuple[RedisReclaimLedger, ...]
                                                ) -> None:
    a, b = ledgers
    assert await a.reserve("gpu-idle", ["p1", "p2"], T0, 3) is None
    assert await b.reserve("gpu-idle", ["p1", "p2"], T0 + 1, 3) is None
    assert await b.reserve("gpu-idle", ["p3", "p4"], T0 + 2, 3) == 2
    assert await a.released("gpu-idle", T0 + 3) == 2
    assert await a.released("gpu-idle", T0 + 3, excluding=["p1"]) == 1
    assert await a.reserve("gpu-idle", ["p3", "p4"], T0 + 3601, 3) is None


async def test_keep_and_approval(ledgers: tuple[RedisReclaimLedger, ...]) -> None:
    a, b = ledgers
    until = time.time() + 60
    await a.keep("slurm/4211", Keep("ada", until))
    assert await b.kept("slurm/4211", until - 1) == Keep("ada", until)
    assert await b.kept("slurm/4211", until + 1) is None
    found = plan()
    await a.open(found, record(found, "planned"))
    assert await b.approve(found.plan_id, "ada")
    tracked = await a.get(found.plan_id)
    assert tracked is not None and tracked.approved_by == "ada"


async def test_the_outbox_hands_each_record_over_until_sent(
        ledgers: tuple[RedisReclaimLedger, ...]) -> None:
    a, b = ledgers
    found = plan()
    await a.open(found, record(found, "planned"))
    await a.advance(found.plan_id, "planned", "warned", record(found, "warned"), T0 + 5)
    first, second = await b.outbox()
    await a.sent(second)
    assert await b.outbox() == [first]
    await b.sent(first)
    assert await a.outbox() == []
