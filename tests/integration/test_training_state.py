"""Training records in the real Redis, single and clustered: progress summed as tokens and
steps, checkpoints, restores and run ends kept as written (once, whatever resends), a failed
run's spend read as waste, and the inventory with what the lifecycle did and who pinned what."""

from __future__ import annotations

import pytest

from costline.connectors.checkpoint_store import CheckpointStore
from costline.connectors.redis_apply import Applied, Duplicates
from costline.connectors.redis_client import connect
from costline.connectors.redis_keys import slot_tag
from costline.connectors.redis_state import RedisState
from costline.rules.inventory import Change, Pin
from costline.rules.ledger import event_key
from costline.rules.tally import tally_of
from tests.integration.redis_writer import ZONE, Writer
from tests.unit.training import (
    HOUR,
    T0,
    TB,
    checkpoint,
    fault,
    gpus,
    progress,
    restore,
    run_end,
)

pytestmark = pytest.mark.integration


def state_of(url: str, namespace: str) -> RedisState:
    return RedisState(connect(url), namespace, ZONE)


async def test_progress_is_summed_and_a_failed_run_is_waste(redis_writer: Writer,
                                                            any_redis_url: str) -> None:
    # run-42: 512 GPUs for an hour on the example book's $2.49: $1,274.88, 1,280M tokens in
    # 320 steps ($0.996 per million, $3.984 a step). sft-7: 8 GPUs for 2 hours, $39.84, then
    # failed after a node failure that wasted 8 × 2400 s: $13.28; failed_run adds $26.56.
    await redis_writer.write([
        gpus(T0, 1), gpus(T0, 2, units=8, run="sft-7"),
        *[progress(T0 + i * 60, step=5 * i, tokens=20_000_000, steps=5) for i in range(64)],
        fault(T0 + 1800, units=8, run="sft-7"), run_end(T0 + 3000, "failed", run="sft-7"),
        run_end(T0 + 3500, "succeeded"),
    ])
    state = state_of(any_redis_url, redis_writer.namespace)
    tokens = state.totals("quantity", {"resource_type": "progress.tokens"}, ["job"], T0,
                          T0 + 2 * HOUR)
    steps = state.totals("quantity", {"resource_type": "progress.steps"}, ["job"], T0,
                         T0 + 2 * HOUR)
    assert tokens == {("run-42",): 1_280_000_000} and steps == {("run-42",): 320_000_000}
    cost = state.totals("cost", {}, ["job"], T0, T0 + 2 * HOUR)
    assert cost == {("run-42",): 1_274_880_000, ("sft-7",): 39_840_000}
    waste = state.totals("waste", {}, ["job", "fault"], T0, T0 + 2 * HOUR)
    assert waste == {("sft-7", "node_failure"): 13_280_000, ("sft-7", "failed_run"): 26_560_000}
    assert {(e.run, e.status) for e in state.run_ends()} == {
        ("sft-7", "failed"), ("run-42", "succeeded")}


async def test_a_failed_runs_waste_is_its_spend_when_its_usage_and_faults_are_apart(
        redis_writer: Writer, any_redis_url: str) -> None:
    """A tag set's usage and its faults go to the home partitions of their own ids, so their
    sums lie in different slots: the run's waste is still its spend, not each slot's part of
    it worked out on its own."""
    apart = Writer(redis_writer.writer, redis_writer.namespace, partitions=4)
    usage = gpus(T0, 1, units=8, run="sft-7")  # $19.92
    home = event_key(usage.event_id, 4)[1]
    lost = next(f for f in (fault(T0 + 1800, units=8, lost=5400, run="sft-7")
                            for _ in range(64))
                if event_key(f.event_id, 4)[1] != home)  # 8 × 6000 s: $33.20
    await apart.write([usage, lost, run_end(T0 + 3000, "failed", run="sft-7")])
    state = state_of(any_redis_url, redis_writer.namespace)
    waste = state.totals("waste", {}, ["fault"], T0, T0 + HOUR)
    assert waste == {("node_failure",): 33_200_000, ("failed_run",): -13_280_000}
    assert sum(waste.values()) == state.totals("cost", {}, [], T0, T0 + HOUR)[()] == 19_920_000


async def test_a_run_failing_moves_every_hours_mark(redis_writer: Writer,
                                                    any_redis_url: str) -> None:
    await redis_writer.write([gpus(T0, 1, run="sft-9")])
    state = state_of(any_redis_url, redis_writer.namespace)
    hours = [T0 - HOUR, T0]
    before = state.hour_marks(hours)
    await redis_writer.write([run_end(T0 + 7 * HOUR, "cancelled", run="sft-9")])
    after = state.hour_marks(hours)
    assert all(before[h] != after[h] for h in hours)


async def test_checkpoints_are_kept_once_with_their_storage_cost(redis_writer: Writer,
                                                                 any_redis_url: str) -> None:
    written = [checkpoint(T0 + i * HOUR, step=1000 * i, size=TB, tier="storage.parallel_fs")
               for i in range(1, 4)]
    await redis_writer.write([*written, restore(T0 + 4 * HOUR, step=1000)])
    # the same events again, in a new window: the dedup memory refuses them
    record = redis_writer.intake.records(written)[0]
    slot = slot_tag(redis_writer.namespace, 0)
    mark = redis_writer.marks[slot]
    again = await redis_writer.writer.apply(slot, mark, mark + 1, tally_of([record]))
    assert isinstance(again, Duplicates) and len(again.digests) == 3
    state = state_of(any_redis_url, redis_writer.namespace)
    found = state.checkpoints()
    assert [c.step for c in found] == [1000, 2000, 3000]
    # 1 TB on storage.parallel_fs at $0.00041/GB-hour: $0.41 an hour, priced when counted
    assert {c.stays[-1].hourly for c in found} == {410_000}
    [read] = state.restores(T0)
    assert read.checkpoint_id == "/ckpt/run-42/step-1000" and read.ts == T0 + 4 * HOUR
    assert again != Applied()


async def test_the_inventory_holds_what_the_lifecycle_did_and_the_pins(
        redis_writer: Writer, any_redis_url: str) -> None:
    await redis_writer.write([checkpoint(T0, step=1, tier="storage.ssd"),
                              checkpoint(T0 + HOUR, step=2, tier="storage.ssd")])
    store = CheckpointStore(connect(any_redis_url), redis_writer.namespace)
    store.record_change(Change("/ckpt/run-42/step-1", "move", T0 + 2 * HOUR,
                               "storage.archive", "/cold/run-42/step-1", 1_370))
    store.record_change(Change("/ckpt/run-42/step-1", "delete", T0 + 3 * HOUR))
    store.pin("/ckpt/run-42/step-2", Pin("erin", T0 + 86400, "eval baseline"))
    state = state_of(any_redis_url, redis_writer.namespace)
    first, second = state.checkpoints()
    assert [(s.tier, s.location) for s in first.stays] == [
        ("storage.ssd", "/ckpt/run-42/step-1"), ("storage.archive", "/cold/run-42/step-1")]
    assert first.deleted_at == T0 + 3 * HOUR and second.live
    assert state.pins() == {"/ckpt/run-42/step-2": Pin("erin", T0 + 86400, "eval baseline")}
    assert store.unpin("/ckpt/run-42/step-2") and state.pins() == {}


async def test_the_failed_runs_are_read_again_only_when_a_run_ends(
        redis_writer: Writer, any_redis_url: str) -> None:
    await redis_writer.write([gpus(T0, 1, run="a"), run_end(T0 + 60, "failed", run="a")])
    state = state_of(any_redis_url, redis_writer.namespace)
    assert state.records.failed_runs() == {"a"}
    read = state.records.run_ends
    calls: list[int] = []

    def counted() -> list:  # type: ignore[type-arg]
        calls.append(1)
        return read()

    state.records.run_ends = counted  # type: ignore[method-assign]
    assert state.records.failed_runs() == {"a"} and calls == []
    await redis_writer.write([run_end(T0 + 120, "cancelled", run="b")])
    assert state.records.failed_runs() == {"a", "b"} and calls == [1]
