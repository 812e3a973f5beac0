"""The loader: golden good and bad rule files, registry-walking checks, the generated schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from costline.connectors.plugins import PLUGINS
from costline.rules.kinds import KINDS, Rule
from costline.rules.loader import (
    RulesInvalid,
    load_rules,
    rule_files,
    rules_json_schema,
)

HERE = Path(__file__).parent / "rulefiles"
GOOD = sorted(rule_files([HERE / "good"]))
BAD = sorted([*rule_files([HERE / "bad"]), *(p for p in (HERE / "bad").iterdir() if p.is_dir())])
DEFINITIONS = Path(__file__).parents[2] / "rules" / "definitions"


def expected_errors(path: Path) -> list[str]:
    """The ``# expect: LINE:COL: message`` lines at the end of a golden bad file; a folder is
    one rule set, expecting what its files expect, in order. ``{file}`` and ``{dir}`` stand
    for the file and its folder."""
    if path.is_dir():
        return [error for file in rule_files([path]) for error in expected_errors(file)]
    lines = path.read_bytes().decode("utf-8", "replace").splitlines()
    marks = [line.removeprefix("# expect: ") for line in lines if line.startswith("# expect: ")]
    return [
        f"{path}:{mark.replace('{file}', str(path)).replace('{dir}', str(path.parent))}"
        for mark in marks
    ]


def problems(*paths: Path) -> list[str]:
    with pytest.raises(RulesInvalid) as caught:
        load_rules(paths, plugins=PLUGINS)
    return [str(error) for error in caught.value.errors]


@pytest.mark.parametrize("path", GOOD, ids=lambda p: p.name)
def test_golden_good_files_load(path: Path) -> None:
    load_rules([path], plugins=PLUGINS)


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.name)
def test_golden_bad_files_fail_exactly_where_they_say(path: Path) -> None:
    expected = expected_errors(path)
    assert expected, f"{path.name} says which errors it expects"
    assert problems(path) == expected


def test_every_problem_of_every_file_is_reported() -> None:
    first, second = HERE / "bad" / "many_problems.yaml", HERE / "bad" / "unknown_key.yaml"
    assert problems(first, second) == expected_errors(first) + expected_errors(second)


def test_a_directory_is_its_yaml_files_and_the_set_is_all_or_nothing() -> None:
    assert [p.suffix for p in rule_files([HERE / "good"])] == [".yaml", ".yml", ".yaml"]
    with pytest.raises(RulesInvalid):
        load_rules([HERE / "good", HERE / "bad" / "unknown_key.yaml"], plugins=PLUGINS)


def test_a_name_repeated_in_another_file_points_at_the_second(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("rules:\n  - {name: monthly, kind: budget, limit: 1}\n")
    (tmp_path / "b.yaml").write_text(
        "rules:\n\n  - name: monthly\n    kind: budget\n    limit: 9\n"
    )
    assert problems(tmp_path) == [
        f"{tmp_path / 'b.yaml'}:3:5: rules.0.name: duplicate rule name 'monthly' "
        f"(first defined at {tmp_path / 'a.yaml'}:2:6)"
    ]


def test_a_missing_file_is_a_positioned_problem(tmp_path: Path) -> None:
    assert problems(tmp_path / "nope.yaml") == [
        f"{tmp_path / 'nope.yaml'}:1:1: cannot read: No such file or directory"
    ]


def test_the_shipped_rules_load_and_cover_every_kind() -> None:
    ruleset = load_rules([DEFINITIONS], plugins=PLUGINS)
    assert {rule.kind for rule in ruleset} == set(KINDS)
    assert {rule.name for rule in ruleset} >= {
        "team-monthly",
        "dev-daily",
        "gpu-idle",
        "checkpoint-growth",
        "log-explosion",
        "fault-waste-share",
    }


def _objects(node: Any) -> list[dict[str, Any]]:
    """Every schema object in the tree that declares properties."""
    found = []
    if isinstance(node, dict):
        if "properties" in node:
            found.append(node)
        for value in node.values():
            found.extend(_objects(value))
    elif isinstance(node, list):
        for value in node:
            found.extend(_objects(value))
    return found


def test_the_schema_is_one_of_the_registered_kinds() -> None:
    schema = rules_json_schema(PLUGINS)
    items = schema["properties"]["rules"]["items"]
    assert items["discriminator"]["propertyName"] == "kind"
    assert set(items["discriminator"]["mapping"]) == set(KINDS)
    for name, model in KINDS.items():
        definition = schema["$defs"][model.__name__]
        assert definition["properties"]["kind"]["const"] == name
        assert "for" in definition["properties"]


def test_the_schema_forbids_extra_keys_everywhere() -> None:
    objects = _objects(rules_json_schema(PLUGINS))
    assert len(objects) > len(KINDS)
    for node in objects:
        assert node.get("additionalProperties") is False, node.get("title")


def test_the_reclaim_schema_lists_every_registered_connector() -> None:
    reclaim = rules_json_schema(PLUGINS)["$defs"]["Reclaim"]["oneOf"]
    assert [option["properties"]["connector"]["const"] for option in reclaim] == [
        "dry_run",
        "kubernetes",
        "slurm",
        "webhook",
    ]


def test_a_rule_is_a_rule() -> None:
    assert all(issubclass(model, Rule) for model in KINDS.values())
