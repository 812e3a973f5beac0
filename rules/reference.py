"""The rule reference (docs/RULES.md): every kind and connector, read from the registries.

The tables are made from the same JSON Schema editors get (``rules_json_schema``), so a key,
its default and its description are written once, on the model, and the docs cannot drift
from what the loader accepts. ``costline rules reference`` prints it; a test keeps the file
in the repository equal to it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from costline.rules.kinds import KINDS, Rule
from costline.rules.lifecycle_params import CheckpointParams
from costline.rules.loader import rules_json_schema
from costline.rules.plugins import Plugins
from costline.rules.reclaim_params import ReclaimParams
from costline.rules.registry import example_of, summary_of

COMMON_RECLAIM_KEYS = ("connector", "grace", *ReclaimParams.model_fields)


def reference_markdown(plugins: Plugins) -> str:
    """The whole reference as Markdown."""
    defs = rules_json_schema(plugins)["$defs"]
    common = Rule.model_json_schema(by_alias=True)
    parts = [
        "# Rule reference\n",
        "Every rule kind and reclaim connector, generated from their registries by "
        "`costline rules reference`; a test keeps this file equal to its output. Editors "
        "get the same keys as a JSON Schema from `costline rules schema`.\n",
        "## Keys every rule has\n",
        _table(common, list(common["properties"])),
        "## Kinds\n",
    ]
    for name, kind in KINDS.items():
        node = defs[kind.__name__]
        parts += [
            f"### `{name}`\n",
            summary_of(kind) + "\n",
            _table(node, [key for key in node["properties"] if _own(key, node, common)]),
            _example(kind),
        ]
    options = {o["properties"]["connector"]["const"]: o for o in defs["Reclaim"]["oneOf"]}
    parts += ["## Reclaim connectors\n"]
    if options:
        first = next(iter(options.values()))
        parts += [
            "`reclaim:` of an `idle` rule names a connector; every connector takes these "
            "keys besides its own:\n",
            _table(first, [k for k in COMMON_RECLAIM_KEYS if k in first["properties"]]),
        ]
    for name, connector in plugins.reclaimers.items():
        option = options[name]
        own = [key for key in option["properties"] if key not in COMMON_RECLAIM_KEYS]
        parts += [f"### `{name}`\n", option["description"] + "\n"]
        parts += [_table(option, own, noun="parameter")] if own else []
        parts += [_example(connector)]
    return "\n".join(parts + _checkpoint_connectors(plugins, defs))


def _checkpoint_connectors(plugins: Plugins, defs: Mapping[str, Any]) -> list[str]:
    """The ``act:`` connectors of ``checkpoint_lifecycle`` rules, as reclaim's are shown."""
    options = {o["properties"]["connector"]["const"]: o
               for o in defs.get("CheckpointActs", {}).get("oneOf", [])}
    if not options:
        return []
    common = ("connector", "grace", *CheckpointParams.model_fields)
    first = next(iter(options.values()))
    parts = ["## Checkpoint connectors\n",
             "`act:` of a `checkpoint_lifecycle` rule names a connector; every connector "
             "takes these keys besides its own:\n",
             _table(first, [k for k in common if k in first["properties"]])]
    for name, connector in plugins.checkpoint_connectors.items():
        option = options[name]
        own = [key for key in option["properties"] if key not in common]
        parts += [f"### `{name}`\n", option["description"] + "\n"]
        parts += [_table(option, own, noun="parameter")] if own else []
        parts += [_example(connector)]
    return parts


def _own(key: str, node: Mapping[str, Any], common: Mapping[str, Any]) -> bool:
    """Whether a kind defines ``key`` itself (a key of every rule it may narrow, as ``idle``
    does ``for``)."""
    if key == "kind" or key not in common["properties"]:
        return key != "kind"
    narrowed = node["properties"][key] != common["properties"][key]
    return narrowed or (key in node.get("required", ())) != (key in common.get("required", ()))


def _table(node: Mapping[str, Any], keys: list[str], noun: str = "key") -> str:
    required = set(node.get("required", ()))
    rows = [f"| {noun} | default | |", "|---|---|---|"]
    for key in keys:
        prop = node["properties"][key]
        default = "required" if key in required else _default(prop.get("default"))
        rows.append(f"| `{key}` | {default} | {prop.get('description', '')} |")
    return "\n".join(rows) + "\n"


def _default(value: Any) -> str:
    if value is None or value == {} or value == []:
        return "—"
    return f"`{value if isinstance(value, str) else json.dumps(value)}`"


def _example(cls: type[Any]) -> str:
    return f"```yaml\n{example_of(cls) or ''}```\n"
