"""The demo's training story is true of the events it plays: run-42's progress and checkpoints
give the figures the demo shows, and its lifecycle rule plans on the stand-in files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from costline.rules.inventory import by_run
from costline.rules.kinds.checkpoint_lifecycle import CheckpointLifecycleRule
from costline.streams.demo.run import compress
from costline.streams.demo.scenario import training_cluster
from costline.streams.demo.training import stand_ins
from costline.streams.demo.training_summary import expiry
from tests.unit.test_scenario import ANY_DAY, played

NOW = ANY_DAY["the 3rd"]


def test_run_42_keeps_the_checkpoints_the_story_tells() -> None:
    checkpoints = by_run(played(NOW).checkpoints())["run-42"]
    # 4 milestones, the last 40 of every 30 minutes, then every 6 minutes for 12 hours
    assert len(checkpoints) == 4 + 40 + 119
    assert checkpoints[0].tags["keep"] == "true"
    gaps = {round(b.written_at - a.written_at) for a, b in zip(checkpoints[-10:],
                                                                checkpoints[-9:], strict=False)}
    assert gaps == {360}


def test_the_lifecycle_would_delete_one_and_move_the_older_ones(tmp_path: Path) -> None:
    rules: list[dict[str, Any]] = [{
        "name": "checkpoint-retention", "kind": "checkpoint_lifecycle", "keep_last": 3,
        "keep_every": 10, "cold_after": "1d", "cold_tier": "storage.archive",
        "expire_after": "7d", "act": {"connector": "filesystem", "grace": "1h",
                                      "root": "/lustre/checkpoints"}}]
    assert compress(rules, live=False, checkpoints=tmp_path / "ckpt") == [
        "checkpoint-retention grace 1h → 30s"]
    assert rules[0]["act"] == {"connector": "filesystem", "grace": "30s",
                               "root": str(tmp_path / "ckpt"),
                               "cold_root": str(tmp_path / "archive")}
    rule = CheckpointLifecycleRule.model_validate({**rules[0], "act": None})
    [found] = rule.actions(played(NOW), NOW).values()
    # the 8-day milestone expired; the 9-day one is exempt (keep=true); the 5- and 3-day
    # milestones and the 30-minute checkpoints older than a day move
    assert [a.action for a in found].count("delete") == 1
    assert [a.action for a in found].count("move") == 19


def test_every_checkpoint_played_has_a_stand_in_file(tmp_path: Path) -> None:
    scenario = training_cluster(NOW, checkpoint_root=tmp_path)
    events = [e for m in scenario.usage if isinstance(m, list) for e in m]
    stand_ins(events)
    made = [e for e in events if e["kind"] == "checkpoint"]
    assert all(Path(e["location"], "model.safetensors").is_file() for e in made)
    assert all(Path(e["location"]).is_relative_to(tmp_path) for e in made)


def test_the_dry_run_is_summed_from_the_lifecycle_records() -> None:
    records = [
        {"step": "skipped", "dry_run": True, "action": "delete", "to_tier": None,
         "saves_per_day": "0.756000"},
        {"step": "skipped", "dry_run": True, "action": "move", "to_tier": "storage.archive",
         "saves_per_day": "0.723120"},
        {"step": "planned", "action": "move", "to_tier": "storage.archive",
         "saves_per_day": "0.723120"},
        {"step": "skipped", "would_save": "12.00"},  # an idle box's: not a checkpoint's
    ]
    assert expiry(records) == {"actions": {"delete": 1, "move to storage.archive": 1},
                               "saves_per_day": "1.479120"}
