"""Checkpoint connectors: the registry as rule files see it, and the filesystem connector on
real files — it moves and deletes what it planned, inside its root, and nothing else."""

from __future__ import annotations

import dataclasses
import io
import os
import shutil
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from ruamel.yaml import YAML

from costline.connectors.checkpoints import (
    CHECKPOINT_CONNECTORS,
    NotReclaimable,
    build_checkpoint_connectors,
)
from costline.connectors.checkpoints.dry_run import DryRunCheckpoints
from costline.connectors.checkpoints.filesystem import FilesystemCheckpoints, readers
from costline.connectors.checkpoints.webhook import WebhookCheckpoints, body_of
from costline.connectors.plugins import PLUGINS
from costline.rules.inventory import Checkpoint, Stay
from costline.rules.lifecycle import LifecycleAction
from costline.rules.lifecycle_flow import target_of
from costline.rules.loader import RulesInvalid, load_rule_text, rules_json_schema
from costline.rules.reclaim import Plan
from costline.rules.registry import example_of
from tests.unit.training import T0

SCHEMA = Draft202012Validator(rules_json_schema(PLUGINS))


@pytest.mark.parametrize("name", list(CHECKPOINT_CONNECTORS))
def test_every_connector_documents_an_example_the_loader_and_schema_accept(name: str) -> None:
    text = example_of(CHECKPOINT_CONNECTORS[name])
    assert text is not None
    [rule] = load_rule_text(text, plugins=PLUGINS)
    assert rule.act is not None and rule.act.connector == name  # type: ignore[attr-defined]
    assert list(SCHEMA.iter_errors(YAML(typ="safe").load(text))) == []
    data = YAML(typ="safe").load(text)
    data["rules"][0]["act"]["colour"] = "red"
    assert list(SCHEMA.iter_errors(data))
    out = io.StringIO()
    YAML(typ="safe").dump(data, out)
    with pytest.raises(RulesInvalid, match="colour"):
        load_rule_text(out.getvalue(), plugins=PLUGINS)


def test_the_registry_and_an_unknown_connector() -> None:
    assert sorted(CHECKPOINT_CONNECTORS) == ["dry_run", "filesystem", "webhook"]
    assert sorted(build_checkpoint_connectors()) == ["dry_run", "filesystem", "webhook"]
    text = ("rules:\n  - name: r\n    kind: checkpoint_lifecycle\n    expire_after: 1d\n"
            "    act: {connector: slurm}\n")
    with pytest.raises(RulesInvalid, match="unknown connector 'slurm' \\(known: dry_run, "
                       "filesystem, webhook\\)"):
        load_rule_text(text, plugins=PLUGINS)


# ── the filesystem, on real files ─────────────────────────────────────────────────────────


@dataclasses.dataclass
class Tree:
    root: Path
    cold: Path
    outside: Path

    def checkpoint(self, step: int, files: int = 2) -> Path:
        folder = self.root / "run-42" / f"step-{step}"
        folder.mkdir(parents=True)
        for i in range(files):
            (folder / f"shard-{i}.pt").write_bytes(b"w" * (100 + i))
        return folder


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    found = Tree(tmp_path / "hot", tmp_path / "cold", tmp_path / "elsewhere")
    for folder in (found.root, found.cold, found.outside):
        folder.mkdir()
    (found.outside / "precious.bin").write_bytes(b"keep me")
    return found


def action(location: str, verb: str = "delete") -> LifecycleAction:
    checkpoint = Checkpoint(location, "run-42", 100, 10**12, T0, 60.0, {"job": "run-42"},
                            (Stay(T0, "storage.hot", location, 400_000),))
    return LifecycleAction(checkpoint, verb, "storage.cold" if verb == "move" else None,  # type: ignore[arg-type]
                           "expired")


async def planned(tree: Tree, location: str, verb: str = "delete") -> Plan:
    params = {"root": str(tree.root), "cold_root": str(tree.cold)}
    wanted = action(location, verb)
    identity = await FilesystemCheckpoints().identify(wanted, params)
    return Plan("p1", "retention", location, "storage.hot", {}, "filesystem", params, "live",
                60, T0, T0, T0 + 60, target_of(wanted, identity), 400_000, "USD")


async def test_it_deletes_the_planned_checkpoint_and_nothing_beside_it(tree: Tree) -> None:
    doomed, kept = tree.checkpoint(100), tree.checkpoint(200)
    plan = await planned(tree, str(doomed))
    assert plan.target["size"] == "201" and plan.target["path"] == str(doomed)
    outcome = await FilesystemCheckpoints().act(plan)
    assert outcome.step == "executed", outcome.reason
    assert not doomed.exists() and kept.exists() and (tree.outside / "precious.bin").exists()


async def test_it_moves_a_checkpoint_to_the_same_place_under_cold_root(tree: Tree) -> None:
    source = tree.checkpoint(100)
    plan = await planned(tree, str(source), "move")
    outcome = await FilesystemCheckpoints().act(plan)
    moved = tree.cold / "run-42" / "step-100"
    assert outcome.step == "executed" and outcome.detail["location"] == str(moved)
    assert not source.exists() and sorted(p.name for p in moved.iterdir()) == [
        "shard-0.pt", "shard-1.pt"]


async def test_a_move_to_another_file_system_copies_then_removes(tree: Tree,
                                                                 tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("no second file system here")
    cold = shm / f"costline-test-{os.getpid()}"
    try:
        source = tree.checkpoint(100)
        params = {"root": str(tree.root), "cold_root": str(cold)}
        wanted = action(str(source), "move")
        identity = await FilesystemCheckpoints().identify(wanted, params)
        plan = Plan("p1", "r", str(source), "storage.hot", {}, "filesystem", params, "live", 60,
                    T0, T0, T0 + 60, target_of(wanted, identity), 1, "USD")
        outcome = await FilesystemCheckpoints().act(plan)
        assert outcome.step == "executed", outcome.reason
        assert not source.exists() and (cold / "run-42" / "step-100" / "shard-1.pt").stat(
            ).st_size == 101
        assert not list((cold / "run-42").glob(".*partial"))
    finally:
        shutil.rmtree(cold, ignore_errors=True)


@pytest.mark.parametrize("where", ["outside", "root", "link", "relative", "missing"])
async def test_it_refuses_what_is_not_strictly_inside_its_root(tree: Tree, where: str) -> None:
    link = tree.root / "run-42" / "sneaky"
    link.parent.mkdir(parents=True)
    link.symlink_to(tree.outside)
    location = {"outside": str(tree.outside), "root": str(tree.root), "link": str(link),
                "relative": "run-42/step-1", "missing": str(tree.root / "gone")}[where]
    with pytest.raises(NotReclaimable) as refused:
        await FilesystemCheckpoints().identify(action(location),
                                               {"root": str(tree.root)})
    assert refused.value.step == ("skipped" if where == "missing" else "failed")
    assert (tree.outside / "precious.bin").exists()


async def test_a_link_inside_the_checkpoint_is_deleted_not_followed(tree: Tree) -> None:
    folder = tree.checkpoint(100)
    (folder / "escape").symlink_to(tree.outside)
    outcome = await FilesystemCheckpoints().act(await planned(tree, str(folder)))
    assert outcome.step == "executed" and (tree.outside / "precious.bin").exists()


async def test_a_checkpoint_that_changed_since_it_was_planned_is_left(tree: Tree) -> None:
    folder = tree.checkpoint(100)
    plan = await planned(tree, str(folder))
    (folder / "shard-2.pt").write_bytes(b"late writer")
    outcome = await FilesystemCheckpoints().act(plan)
    assert outcome.step == "skipped" and "changed since it was planned (size" in outcome.reason
    assert folder.exists()


async def test_a_checkpoint_open_by_a_process_is_left(tree: Tree) -> None:
    folder = tree.checkpoint(100)
    plan = await planned(tree, str(folder))
    with (folder / "shard-0.pt").open("rb"):
        assert readers(folder) != []
        outcome = await FilesystemCheckpoints().act(plan)
    assert outcome.step == "skipped" and f"open by process {os.getpid()}" in outcome.reason
    assert folder.exists()


async def test_a_move_onto_an_existing_copy_is_refused(tree: Tree) -> None:
    folder = tree.checkpoint(100)
    (tree.cold / "run-42" / "step-100").mkdir(parents=True)
    with pytest.raises(NotReclaimable, match="already exists"):
        await planned(tree, str(folder), "move")


async def test_the_dry_run_connector_remembers_and_touches_nothing(tree: Tree) -> None:
    folder = tree.checkpoint(100)
    connector = DryRunCheckpoints()
    plan = await planned(tree, str(folder))
    outcome = await connector.act(plan)
    assert outcome.step == "skipped" and connector.would_act == [plan] and folder.exists()


async def test_the_webhook_body_names_the_action_and_needs_its_secret(tree: Tree) -> None:
    plan = await planned(tree, str(tree.checkpoint(100)), "move")
    body = body_of(plan)
    assert b'"action":"move"' in body and b'"to_tier":"storage.cold"' in body
    assert b'"step":100' in body
    with pytest.raises(NotReclaimable, match="CKPT_SECRET is not set"):
        await WebhookCheckpoints(environ={}).identify(
            action("/x"), {"url": "https://storage.example/api", "secret_env": "CKPT_SECRET"})
