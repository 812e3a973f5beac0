"""The checkpoint lifecycle's shell on real files: plans announced at once, actions taken after
their grace and a re-check, within the caps, at most once; a dry run touches nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from costline.connectors.checkpoints.filesystem import FilesystemCheckpoints
from costline.connectors.reclaim_ledger_memory import MemoryReclaimLedger
from costline.rules.events import CheckpointEvent
from costline.rules.inventory import Pin
from costline.rules.loader import RuleSet
from costline.rules.memory_state import InMemoryState
from costline.streams.worker.lifecycle import CheckpointKeeper, lifecycle_cap_alert
from tests.unit.training import DAY, HOUR, PRICES, T0, rule, run_tags

NOW = T0 + 2 * DAY


class World:
    def __init__(self, root: Path, mode: str = "live", policy: dict[str, Any] | None = None,
                 **act: Any) -> None:
        self.root = root
        self.state = InMemoryState(PRICES)
        for step in range(1, 6):  # a checkpoint every 6 hours, from T0
            folder = root / "run-42" / f"step-{step}"
            folder.mkdir(parents=True)
            (folder / "model.pt").write_bytes(b"x" * 1000)
            self.state.add(CheckpointEvent(
                event_id=f"c-{step}", kind="checkpoint", ts=T0 + (step - 1) * 6 * HOUR,
                location=str(folder), step=step, bytes=10**12, tier="storage.hot",
                write_seconds=30, tags=run_tags()))
        self.rule = rule(kind="checkpoint_lifecycle", name="retention", keep_last=2,
                         mode=mode, **(policy or {"expire_after": "1d"}),
                         act={"connector": "filesystem", "grace": "10m", "root": str(root),
                              **act})
        self.records: list[dict[str, Any]] = []
        self.ledger = MemoryReclaimLedger(clock=lambda: self.now)
        self.now = NOW
        self.keeper = CheckpointKeeper(
            rules=RuleSet([self.rule]), state=self.state, changes=self.state,
            ledger=self.ledger, prices=PRICES, sink=self.sink,
            connectors={"filesystem": FilesystemCheckpoints()}, clock=lambda: self.now)

    async def sink(self, record: dict[str, Any]) -> None:
        self.records.append(record)

    async def tick(self, at: float) -> list[dict[str, Any]]:
        self.now = at
        return await self.keeper.tick(at)

    def steps(self) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for record in self.records:
            found.setdefault(record["resource_id"].rsplit("/", 1)[-1], []).append(record["step"])
        return found

    def left(self) -> list[str]:
        return sorted(p.name for p in (self.root / "run-42").iterdir())


async def test_expired_checkpoints_are_deleted_after_the_grace_and_a_re_check(
        tmp_path: Path) -> None:
    world = World(tmp_path)
    # at T0 + 2 days, steps 1–3 are older than a day and not among the last two
    await world.tick(NOW)
    assert world.steps() == {f"step-{i}": ["planned", "warned"] for i in (1, 2, 3)}
    assert world.left() == [f"step-{i}" for i in range(1, 6)]
    await world.tick(NOW + 599)  # the grace runs
    assert world.left() == [f"step-{i}" for i in range(1, 6)]
    await world.tick(NOW + 600)
    assert world.left() == ["step-4", "step-5"]
    executed = [r for r in world.records if r["step"] == "executed"]
    assert len(executed) == 3 and executed[0]["reason"].startswith("deleted ")
    assert executed[0]["saves_per_day"] == "9.600000"  # 1 TB on $0.0004/GB-hour
    inventory = {c.step: c.live for c in world.state.checkpoints()}
    assert inventory == {1: False, 2: False, 3: False, 4: True, 5: True}
    await world.tick(NOW + 1200)  # nothing is done twice
    assert len([r for r in world.records if r["step"] == "executed"]) == 3


async def test_a_grace_lengthened_after_the_announcement_is_waited_for(tmp_path: Path) -> None:
    world = World(tmp_path)
    await world.tick(NOW)
    lengthened = rule(kind="checkpoint_lifecycle", name="retention", keep_last=2, mode="live",
                      expire_after="1d",
                      act={"connector": "filesystem", "grace": "1h", "root": str(tmp_path)})
    world.keeper = CheckpointKeeper(
        rules=RuleSet([lengthened]), state=world.state, changes=world.state,
        ledger=world.ledger, prices=PRICES, sink=world.sink,
        connectors={"filesystem": FilesystemCheckpoints()}, clock=lambda: world.now)
    await world.tick(NOW + 600)  # the announced grace is over, the rule's is not
    assert world.left() == [f"step-{i}" for i in range(1, 6)]
    await world.tick(NOW + HOUR)
    assert world.left() == ["step-4", "step-5"]


async def test_the_kind_is_a_dry_run_unless_it_says_live(tmp_path: Path) -> None:
    world = World(tmp_path, mode="dry_run")
    await world.tick(NOW)
    await world.tick(NOW + 600)
    assert world.left() == [f"step-{i}" for i in range(1, 6)]
    closing = [r for r in world.records if r["step"] == "skipped"]
    assert len(closing) == 3 and all(r["dry_run"] for r in closing)
    assert f"dry run: would delete {tmp_path}/run-42/step-1; nothing was touched" in {
        r["reason"] for r in closing}


async def test_a_checkpoint_pinned_during_the_grace_is_kept(tmp_path: Path) -> None:
    world = World(tmp_path)
    await world.tick(NOW)
    world.state.pin(str(tmp_path / "run-42" / "step-2"), Pin("erin", NOW + DAY, "eval"))
    await world.tick(NOW + 600)
    assert world.left() == ["step-2", "step-4", "step-5"]
    assert world.steps()["step-2"][-1] == "skipped"


async def test_a_round_over_the_caps_does_nothing_and_raises_an_alert(tmp_path: Path) -> None:
    world = World(tmp_path, max_per_hour=2)
    await world.tick(NOW)
    await world.tick(NOW + 600)
    assert world.left() == [f"step-{i}" for i in range(1, 6)]
    failed = [r for r in world.records if r["step"] == "failed"]
    assert len(failed) == 3 and all(r["aborted"] for r in failed)
    assert "over max_per_hour 2" in failed[0]["reason"]
    alert = lifecycle_cap_alert(failed[0], {"slack": "#ml-storage"})
    assert alert["alert_id"] == "retention/lifecycle-cap" and alert["severity"] == "critical"


async def test_a_checkpoint_the_connector_cannot_find_is_closed_at_once(tmp_path: Path) -> None:
    world = World(tmp_path)
    (tmp_path / "run-42" / "step-1" / "model.pt").unlink()
    (tmp_path / "run-42" / "step-1").rmdir()
    await world.tick(NOW)
    assert world.steps()["step-1"] == ["skipped"]
    assert "does not exist" in world.records[0]["reason"]


@pytest.mark.parametrize("approve", [False, True])
async def test_manual_approval_holds_the_action_until_someone_approves(
        tmp_path: Path, approve: bool) -> None:
    world = World(tmp_path, approval="manual")
    await world.tick(NOW)
    if approve:
        for step in (1, 2, 3):
            await world.keeper.approve("retention", str(tmp_path / "run-42" / f"step-{step}"),
                                       "farid")
    await world.tick(NOW + 600)
    assert world.left() == (["step-4", "step-5"] if approve else
                            [f"step-{i}" for i in range(1, 6)])


async def test_a_moved_checkpoint_is_in_the_inventory_on_its_new_tier(tmp_path: Path) -> None:
    hot, cold = tmp_path / "hot", tmp_path / "cold"
    hot.mkdir()
    world = World(hot, policy={"cold_after": "1d", "cold_tier": "storage.cold"},
                  cold_root=str(cold))
    await world.tick(NOW)
    await world.tick(NOW + 600)
    assert world.left() == ["step-4", "step-5"]
    assert sorted(p.name for p in (cold / "run-42").iterdir()) == ["step-1", "step-2", "step-3"]
    moved = {c.step: c for c in world.state.checkpoints()}[1]
    # 1 TB on storage.cold at $0.00001/GB-hour: $0.01 an hour from the move on
    assert (moved.tier, moved.location, moved.stays[-1].hourly) == (
        "storage.cold", str(cold / "run-42" / "step-1"), 10_000)
    executed = [r for r in world.records if r["step"] == "executed"]
    assert executed[0]["saves_per_day"] == "9.360000"  # ($0.40 − $0.01) × 24
