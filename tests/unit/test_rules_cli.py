"""``costline rules validate | schema | test | backtest`` as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from costline.connectors.plugins import PLUGINS
from costline.connectors.reclaim import RECLAIMERS
from costline.rules.events import AnyEvent
from costline.rules.kinds import KINDS
from costline.rules.loader import rules_json_schema
from costline.streams.cli import rules_cmd
from costline.streams.cli.root import _register, app
from tests.unit.rulefiles.builders import MIN, T0, sample, usage
from tests.unit.test_rules_loader import expected_errors

ROOT = Path(__file__).parents[2]
DEFINITIONS = ROOT / "rules" / "definitions"
PRICES = ROOT / "rules" / "prices" / "example.yaml"
HERE = Path(__file__).parent / "rulefiles"


@pytest.fixture(scope="module")
def run() -> CliRunner:
    """The real ``costline`` app with the ``rules`` group attached, whatever ran before."""
    _register()
    if not any(group.name == "rules" for group in app.registered_groups):
        rules_cmd.register(app)
    return CliRunner()


def costline(runner: CliRunner, *args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["--prices", str(PRICES), *args])
    return result.exit_code, result.stdout


def test_validate_accepts_the_shipped_rules(run: CliRunner) -> None:
    assert costline(run, "rules", "validate", str(DEFINITIONS)) == (0, "ok: 10 rules in 5 files\n")


def test_validate_prints_one_positioned_line_per_problem(run: CliRunner) -> None:
    bad = [HERE / "bad" / "many_problems.yaml", HERE / "bad" / "unknown_kind.yaml"]
    code, out = costline(run, "rules", "validate", *map(str, bad))
    assert code == 1
    assert out.splitlines() == expected_errors(bad[0]) + expected_errors(bad[1])


def test_schema_prints_the_json_schema(run: CliRunner) -> None:
    code, out = costline(run, "rules", "schema")
    assert code == 0
    schema = json.loads(out)
    assert schema["title"] == "costline rule file"
    assert "IdleRule" in schema["$defs"]


def test_schema_is_the_one_the_loader_checks_against(run: CliRunner) -> None:
    """Every connector with the parameters it takes where it runs (Kubernetes ``delete``,
    Slurm's ``job_id_tag``, the common ``approval``), whatever the command imported."""
    code, out = costline(run, "rules", "schema")
    assert code == 0
    schema = json.loads(out)
    assert schema == rules_json_schema(PLUGINS)
    options = {o["properties"]["connector"]["const"]: o["properties"]
               for o in schema["$defs"]["Reclaim"]["oneOf"]}
    assert options["kubernetes"]["action"]["enum"] == ["scale_to_zero", "delete"]
    assert {"job_id_tag", "approval"} <= set(options["slurm"])


def test_reference_is_docs_rules_md(run: CliRunner) -> None:
    code, out = costline(run, "rules", "reference")
    assert code == 0
    assert out == (ROOT / "docs" / "RULES.md").read_text(), (
        "docs/RULES.md is out of date: costline rules reference > docs/RULES.md")
    for name in [*KINDS, *RECLAIMERS]:
        assert f"### `{name}`" in out


def test_validate_says_warn_at_is_a_list_of_fractions(run: CliRunner, tmp_path: Path) -> None:
    path = tmp_path / "budget.yaml"
    path.write_text("rules:\n  - name: b\n    kind: budget\n    limit: 100\n    warn_at: 0.5\n")
    assert costline(run, "rules", "validate", str(path)) == (
        1, f"{path}:5:5: rules.0.warn_at: Input should be a list of fractions, e.g. [0.5, 0.8]\n")


def test_the_shipped_rule_tests_pass(run: CliRunner) -> None:
    code, out = costline(run, "rules", "test", str(DEFINITIONS / "tests" / "cluster_test.yaml"))
    assert code == 0, out
    assert out.splitlines()[-1].startswith("SUCCESS: ")


RULE_TEST = """\
rule_files: [rules.yaml]
tests:
  - name: budget fires
    eval_time: 2026-11-30T09:00:00Z
    events:
      - {{kind: usage, ts: 2026-11-30T08:00:00Z, resource_id: n1, resource_type: gpu.h100,
         quantity: 100, unit: gpu_hour, tags: {{team: a}}}}
    silences:
      - {{rule: budget, matchers: {{team: b}}, ends_at: 2026-12-01T00:00:00Z}}
    expect_alerts:
      - {{rule: budget, group: {{team: a}}, state: {state}, line: limit}}
  - name: idle series
    eval_time: 2026-11-30T08:40:00Z
    rules: [idle]
    series:
      - {{resource_id: n1, resource_type: gpu.h100, metric: gpu_util, start: 2026-11-30T08:00:00Z,
         every: 1m, values: [0.5, "0.0x40"]}}
    expect_alerts:
      - {{rule: idle, group: {{resource_id: n1}}}}
"""
RULES = """\
rules:
  - {name: budget, kind: budget, group_by: [team], limit: 100, for: 30m}
  - {name: idle, kind: idle, below: 0.05, for: 30m}
"""


def write_test(tmp_path: Path, state: str) -> Path:
    (tmp_path / "rules.yaml").write_text(RULES)
    test_file = tmp_path / "rules_test.yaml"
    test_file.write_text(RULE_TEST.format(state=state))
    return test_file


def test_a_rule_test_passes_when_the_alerts_are_as_expected(run: CliRunner, tmp_path: Path) -> None:
    code, out = costline(run, "rules", "test", str(write_test(tmp_path, "firing")))
    assert code == 0
    assert out.splitlines() == [
        "PASS  budget fires",
        "PASS  idle series",
        "SUCCESS: 2 passed, 0 failed",
    ]


def test_a_failing_rule_test_says_what_differs(run: CliRunner, tmp_path: Path) -> None:
    code, out = costline(run, "rules", "test", str(write_test(tmp_path, "pending")))
    assert code == 1
    assert out.splitlines() == [
        "FAIL  budget fires",
        "      missing: budget {team=a} pending line=limit",
        "      unexpected: budget {team=a} firing line=limit value=249.000000",
        "PASS  idle series",
        "FAILED: 1 passed, 1 failed",
    ]


def test_a_bad_event_in_a_rule_test_is_a_positioned_problem(run: CliRunner, tmp_path: Path) -> None:
    test_file = write_test(tmp_path, "firing")
    test_file.write_text(test_file.read_text().replace("quantity: 100", "quantity: -1"))
    code, out = costline(run, "rules", "test", str(test_file))
    assert code == 1
    assert out == (
        f"{test_file}:7:10: tests.0.events.0.quantity: Input should be greater than or equal to 0\n"
    )


def test_backtest_shows_when_alerts_would_have_fired(run: CliRunner, tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(RULES)
    events: list[AnyEvent] = [usage(T0 + m * 5 * MIN, 10, team="a") for m in range(6)]
    events += [sample(T0 + m * MIN, 0.0) for m in range(40)]
    recorded = tmp_path / "events.jsonl"
    recorded.write_text(
        "".join(e.model_dump_json() + "\n" for e in events) + '{"not": "an event"}\n'
    )
    args = ["rules", "backtest", "--rules", str(tmp_path / "rules.yaml"), "--events", str(recorded)]
    code, out = costline(run, *args)
    assert code == 0
    assert [line.split()[:3] for line in out.splitlines()[:-1]] == [
        ["2026-11-30T08:25:00Z", "pending", "budget"],
        ["2026-11-30T08:30:00Z", "firing", "idle"],
    ]
    assert out.splitlines()[-1] == "46 events, 2 alert changes, 1 alert fired"
    code, out = costline(run, *args, "--until", "2026-11-30T09:00:00Z", "--json")
    changes = json.loads(out)
    assert [(c["rule"], c["state"], c["at"]) for c in changes] == [
        ("budget", "pending", "2026-11-30T08:25:00Z"),
        ("idle", "firing", "2026-11-30T08:30:00Z"),
        ("idle", "resolved", "2026-11-30T08:45:00Z"),
        ("budget", "firing", "2026-11-30T08:55:00Z"),
    ]


def test_validate_json_says_what_loaded(run: CliRunner) -> None:
    code, out = costline(run, "rules", "validate", "--json", str(DEFINITIONS))
    assert code == 0
    assert json.loads(out) == {"valid": True, "rules": 10, "files": 5, "problems": []}


def test_validate_json_lists_each_problem_with_its_position(run: CliRunner) -> None:
    bad = HERE / "bad" / "unknown_kind.yaml"
    code, out = costline(run, "rules", "validate", "--json", str(bad))
    assert code == 1
    found = json.loads(out)
    assert found["valid"] is False
    assert [f"{p['file']}:{p['line']}:{p['column']}: {p['message']}"
            for p in found["problems"]] == expected_errors(bad)
