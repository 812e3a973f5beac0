"""Every registered plug-in — each rule kind, reclaim connector and notifier — walked the same
way: its documented example loads, a finding of it renders in Slack, and the JSON Schema
accepts the example and nothing more. A new kind, connector or notifier is covered here
without a line added."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from ruamel.yaml import YAML

from costline.connectors.notify import NOTIFIERS
from costline.connectors.plugins import PLUGINS
from costline.connectors.reclaim import RECLAIMERS
from costline.connectors.slack_blocks import block_errors
from costline.connectors.slack_render import AlertChange, render_alert
from costline.rules.engine import Engine
from costline.rules.findings import Finding, Line, ReclaimRequest
from costline.rules.kinds import KINDS, Rule
from costline.rules.kinds.idle import IdleRule
from costline.rules.loader import RuleSet, RulesInvalid, load_rule_text, rules_json_schema
from costline.rules.registry import Registry, example_of
from tests.unit.rulefiles.builders import HOUR, T0, book, state

ROOT = Path(__file__).parents[2]
ELEMENTS = ([("kind", name) for name in KINDS] + [("connector", name) for name in RECLAIMERS]
            + [("notifier", name) for name in NOTIFIERS])
SCHEMA = rules_json_schema(PLUGINS)
FAMILIES: dict[str, Registry[Any]] = {"kind": KINDS, "connector": RECLAIMERS,
                                      "notifier": NOTIFIERS}


def registered(family: str, name: str) -> type[Any]:
    return FAMILIES[family][name]


def example(family: str, name: str) -> str:
    text = example_of(registered(family, name))
    assert text is not None, f"{family} {name} documents no example"
    return text


def loaded(family: str, name: str) -> Rule:
    [rule] = load_rule_text(example(family, name), file=f"{name} example", plugins=PLUGINS)
    return rule


def data_of(text: str) -> Any:
    return YAML(typ="safe").load(text)


def text_of(data: Any) -> str:
    out = io.StringIO()
    YAML(typ="safe").dump(data, out)
    return out.getvalue()


def element_keys(family: str, data: Any, name: str = "") -> dict[str, Any]:
    """The keys the element itself defines: the rule, its ``reclaim`` block, or its
    notifier's keys under ``notify`` (a shorthand written out as the mapping it stands for)."""
    rule: dict[str, Any] = data["rules"][0]
    if family == "kind":
        return rule
    if family == "connector":
        return rule["reclaim"]  # type: ignore[no-any-return]
    notify = rule["notify"]
    if not isinstance(notify[name], dict):
        notify[name] = {NOTIFIERS[name].params_model.shorthand: notify[name]}
    return notify[name]  # type: ignore[no-any-return]


def finding_of(rule: Rule) -> Finding:
    """A finding as any kind reports one: a group over a line, with the reclaim request of
    an idle rule that has one."""
    line = Line("example", 1_000_000)
    reclaim = None
    if isinstance(rule, IdleRule) and rule.reclaim is not None:
        reclaim = ReclaimRequest(
            resource_id="cluster-a/node-017", resource_type="gpu.h100", tags={},
            connector=rule.reclaim.connector, params=rule.reclaim.params,
            grace=rule.reclaim.grace, mode=rule.mode, idle_since=T0 - HOUR, requested_at=T0)
    return Finding(group={key: "example" for key in rule.group_by}, value=2_000_000,
                   line=line.name, threshold=line.value, rank=0, lines=(line,),
                   period=(T0 - HOUR, T0), reclaim=reclaim)


def alert_of(rule: Rule) -> dict[str, Any]:
    """The alert change the engine publishes for that finding."""
    engine = Engine.for_prices(RuleSet((rule,)), book())
    evaluation = engine.evaluate(state(), T0, reuse={rule.name: [finding_of(rule)]})
    [change] = evaluation.changes
    return change


@pytest.mark.parametrize(("family", "name"), ELEMENTS, ids=lambda x: x)
def test_the_documented_example_loads(family: str, name: str) -> None:
    rule = loaded(family, name)
    if family == "kind":
        assert rule.kind == name
        return
    if family == "notifier":
        assert rule.notify is not None
        data = data_of(example(family, name))
        written = element_keys(family, data, name)
        channels = data["rules"][0]["notify"].get("channels")  # Slack's by_tag, written apart
        if channels:
            written = {**written, "by_tag": channels}
        model = NOTIFIERS[name].params_model
        assert rule.notify.notifiers[name] == model.model_validate(written)
        return
    assert isinstance(rule, IdleRule) and rule.reclaim is not None
    assert rule.reclaim.connector == name
    written = element_keys(family, data_of(example(family, name)))
    own = {key: value for key, value in written.items() if key not in ("connector", "grace")}
    model = RECLAIMERS[name].params_model
    assert rule.reclaim.params == model.model_validate(own).model_dump(mode="json")


@pytest.mark.parametrize(("family", "name"), ELEMENTS, ids=lambda x: x)
def test_a_finding_of_the_example_renders_in_slack(family: str, name: str) -> None:
    rule = loaded(family, name)
    change = alert_of(rule)
    assert AlertChange.from_record(change).presentation is type(rule).presentation
    units = {resource: price.unit for resource, price in book().prices.items()}
    assert change["unit"] == rule.value_unit(units)
    text, blocks = render_alert(change)
    assert f"{rule.name} · " in text and "example" in text
    assert block_errors(blocks) == []
    if family == "connector":
        assert "*What happens next*" in json.dumps(blocks)
    if family == "notifier":
        assert change["notify"] and name in change["notify"]


@pytest.mark.parametrize(("family", "name"), ELEMENTS, ids=lambda x: x)
def test_the_schema_accepts_the_example(family: str, name: str) -> None:
    errors = list(Draft202012Validator(SCHEMA).iter_errors(data_of(example(family, name))))
    assert errors == []


@pytest.mark.parametrize(("family", "name"), ELEMENTS, ids=lambda x: x)
def test_the_schema_and_the_loader_refuse_an_extra_key(family: str, name: str) -> None:
    data = data_of(example(family, name))
    element_keys(family, data, name)["surprise"] = 1
    assert not Draft202012Validator(SCHEMA).is_valid(data)
    where = r"rules\.0\." + {"kind": "", "connector": r"reclaim\.",
                              "notifier": rf"notify\.{name}\."}[family]
    with pytest.raises(RulesInvalid, match=where + "surprise: Extra inputs are not permitted"):
        load_rule_text(text_of(data), plugins=PLUGINS)


def _properties(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    """Every property of every object in the schema, with where it is."""
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        for key, value in (node.get("properties") or {}).items():
            found.append((f"{path}/{key}", value))
        for key, value in node.items():
            found.extend(_properties(value, f"{path}/{key}"))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found.extend(_properties(value, f"{path}[{index}]"))
    return found


def test_every_key_of_the_schema_is_described() -> None:
    described = _properties(SCHEMA)
    assert len(described) > 100
    assert [path for path, prop in described if not prop.get("description")] == []


def test_every_connector_in_the_schema_takes_exactly_its_own_parameters() -> None:
    alternatives = SCHEMA["$defs"]["Reclaim"]["oneOf"]
    options = {o["properties"]["connector"]["const"]: o for o in alternatives}
    assert sorted(options) == sorted(RECLAIMERS)
    for name, connector in RECLAIMERS.items():
        assert set(options[name]["properties"]) == {
            "connector", "grace", *connector.params_model.model_fields}


def test_every_notifier_in_the_schema_takes_exactly_its_own_parameters() -> None:
    notify = SCHEMA["$defs"]["Notify"]["properties"]
    assert sorted(set(notify) - {"route_by_tag", "channels"}) == sorted(NOTIFIERS)
    for name, notifier in NOTIFIERS.items():
        options = notify[name].get("anyOf", [notify[name]])
        [keys] = [o for o in options if o.get("type") == "object"]
        assert set(keys["properties"]) == set(notifier.params_model.model_fields)
        assert keys["additionalProperties"] is False


def test_slack_rendering_names_no_kind() -> None:
    """Rendering reads what a kind needs from the registered kind, never from a list."""
    source = (ROOT / "connectors" / "slack_render.py").read_text()
    assert [name for name in KINDS if f'"{name}"' in source or f"'{name}'" in source] == []


def test_the_registries_are_whole_whatever_was_imported() -> None:
    """A fresh interpreter that imports only the loader and the plug-ins gets the very schema
    the whole program uses, and the rules core alone loads nothing of ``connectors``."""
    script = (
        "import json, sys\n"
        "from costline.rules.loader import rules_json_schema\n"
        "assert not [m for m in sys.modules if m.startswith('costline.connectors')]\n"
        "from costline.connectors.plugins import PLUGINS\n"
        "print(json.dumps(rules_json_schema(PLUGINS)))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True, cwd=ROOT)
    assert json.loads(done.stdout) == SCHEMA


def test_every_module_of_a_plugin_folder_registers_something() -> None:
    """A file in ``rules/kinds/``, ``connectors/reclaim/`` or ``connectors/notify/`` is a
    plug-in (helpers start with ``_``), so none can be forgotten by the registry that
    discovers them."""
    for folder, registry in ((ROOT / "rules" / "kinds", KINDS),
                             (ROOT / "connectors" / "reclaim", RECLAIMERS),
                             (ROOT / "connectors" / "notify", NOTIFIERS)):
        modules = {p.stem for p in folder.glob("*.py") if not p.stem.startswith("_")}
        defined_in = {registry[name].__module__.rsplit(".", 1)[1] for name in registry}
        assert modules == defined_in, folder


class Widget:
    """A plug-in of a family made up for this test.

    ```yaml
    rules: []
    ```
    """


def test_a_registry_takes_each_name_once_and_only_documented_members() -> None:
    widgets: Registry[Widget] = Registry("widget", Widget)
    widgets.register("plain")(Widget)
    with pytest.raises(ValueError, match="widget 'plain' is registered twice"):
        widgets.register("plain")(Widget)
    with pytest.raises(TypeError, match="int is not a Widget"):
        widgets.register("number")(int)

    class Undocumented(Widget):
        pass

    with pytest.raises(TypeError, match="needs a docstring with a ```yaml example"):
        widgets.register("bare")(Undocumented)
    assert list(widgets) == ["plain"] and widgets["plain"] is Widget
    assert widgets.unknown("fancy") == "unknown widget 'fancy' (known: plain)"
