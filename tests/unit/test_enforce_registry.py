"""Every enforcement connector walked the way every kind and reclaim connector is: its
documented example loads with exactly its parameters, the JSON Schema accepts it and refuses an
extra key, and an enforcement's Slack message is valid Block Kit with the right buttons."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from ruamel.yaml import YAML

from costline.connectors.enforce import ENFORCERS
from costline.connectors.plugins import PLUGINS
from costline.connectors.slack_render import LIFT_ACTION, render_alert
from costline.connectors.slack_server import block_errors
from costline.rules.kinds.budget import BudgetRule
from costline.rules.loader import RulesInvalid, load_rule_text, rules_json_schema
from costline.rules.registry import example_of
from costline.streams.worker.enforce_alerts import enforcement_alert

ROOT = Path(__file__).parents[2]
SCHEMA = rules_json_schema(PLUGINS)


def example(name: str) -> str:
    text = example_of(ENFORCERS[name])
    assert text is not None
    return text


def data_of(text: str) -> Any:
    return YAML(typ="safe").load(text)


def text_of(data: Any) -> str:
    out = io.StringIO()
    YAML(typ="safe").dump(data, out)
    return out.getvalue()


@pytest.mark.parametrize("name", list(ENFORCERS))
def test_the_documented_example_loads_with_its_parameters(name: str) -> None:
    [rule] = load_rule_text(example(name), plugins=PLUGINS)
    assert isinstance(rule, BudgetRule) and rule.enforce is not None
    assert rule.enforce.connector == name
    written = data_of(example(name))["rules"][0]["enforce"]
    common = ("connector", "at", "within", "grace", "exempt")
    own = {key: value for key, value in written.items() if key not in common}
    model = ENFORCERS[name].params_model
    assert rule.enforce.params == model.model_validate(own).model_dump(mode="json")


@pytest.mark.parametrize("name", list(ENFORCERS))
def test_the_schema_accepts_the_example_and_refuses_an_extra_key(name: str) -> None:
    data = data_of(example(name))
    assert list(Draft202012Validator(SCHEMA).iter_errors(data)) == []
    data["rules"][0]["enforce"]["surprise"] = 1
    assert not Draft202012Validator(SCHEMA).is_valid(data)
    with pytest.raises(RulesInvalid, match=r"rules\.0\.enforce\.surprise: Extra inputs"):
        load_rule_text(text_of(data), plugins=PLUGINS)


def test_every_connector_in_the_schema_takes_exactly_its_own_parameters() -> None:
    options = {o["properties"]["connector"]["const"]: o
               for o in SCHEMA["$defs"]["Enforce"]["oneOf"]}
    assert sorted(options) == sorted(ENFORCERS)
    for name, connector in ENFORCERS.items():
        assert set(options[name]["properties"]) == {
            "connector", "at", "within", "grace", "exempt",
            *connector.params_model.model_fields}


def test_every_module_of_the_folder_registers_a_connector() -> None:
    folder = ROOT / "connectors" / "enforce"
    modules = {p.stem for p in folder.glob("*.py") if not p.stem.startswith("_")}
    assert modules == {ENFORCERS[n].__module__.rsplit(".", 1)[1] for n in ENFORCERS}


def record(step: str, reason: str = "set GrpTRES=cpu=0 on Slurm account pretrain") -> dict[
        str, Any]:
    return {"action_id": f"p1:{step}", "plan_id": "p1", "automation": "enforce", "step": step,
            "reason": reason, "rule": "team-daily", "group": {"team": "pretrain"},
            "resource_id": "team=pretrain", "connector": "slurm", "mode": "live",
            "at": "2026-11-30T08:10:00Z", "line": "limit", "threshold": "100.000000",
            "spent": "120.000000", "currency": "USD", "execute_at": "2026-11-30T08:10:00Z",
            "period_end": "2026-12-01T00:00:00Z", "target": {"account": "pretrain"}}


def buttons(message_blocks: list[dict[str, Any]]) -> list[str]:
    return [e["text"]["text"] for b in message_blocks if b["type"] == "actions"
            for e in b["elements"]]


def test_the_warning_says_what_happens_next_with_approve_and_lift() -> None:
    change = enforcement_alert(record("warned", "owners warned: set GrpTRES=cpu=0 on Slurm "
                                      "account pretrain after 10m grace, at 08:20"),
                               {"slack": "#budgets"}, approval="manual")
    assert change is not None and change["alert_id"] == "team-daily/enforce/team=pretrain"
    text, blocks = render_alert(change)
    assert block_errors(blocks) == []
    assert "team=pretrain will be stopped at its budget line" in text
    assert "*What happens next*" in json.dumps(blocks) and "Approve" in json.dumps(blocks)
    assert buttons(blocks)[-2:] == ["Approve", "Lift"]
    lift = [e for b in blocks if b["type"] == "actions" for e in b["elements"]
            if e["action_id"] == LIFT_ACTION][0]
    assert json.loads(lift["value"])["resource_id"] == "team=pretrain"


def test_an_enforcement_says_until_when_and_a_lift_resolves_it() -> None:
    held = enforcement_alert(record("executed"))
    assert held is not None
    _, blocks = render_alert(held)
    assert block_errors(blocks) == [] and buttons(blocks)[-1] == "Lift"
    assert "when the period ends" in json.dumps(blocks)
    lifted = enforcement_alert(record("lifted", "the budget period ended"))
    assert lifted is not None and lifted["state"] == "resolved"
    assert buttons(render_alert(lifted).blocks) == []
    assert enforcement_alert(record("planned")) is None
    assert enforcement_alert(record("executed", "sweep: held 2 pending job(s)")) is None
    # A sweep or a lift that failed and is tried again leaves the enforcement on: no change.
    assert enforcement_alert(record("failed", "sweep: scontrol did not answer")) is None
    retried = {**record("failed", "lift failed (period ended): sacctmgr refused; tried again in "
                        "a minute"), "action_id": "p1:failed:lift-1796025600.000"}
    assert enforcement_alert(retried) is None
    assert enforcement_alert(record("failed", "could not enforce"))["state"] == "resolved"  # type: ignore[index]
