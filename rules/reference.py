"""The rule reference (docs/RULES.md): every kind, connector and notifier, read from the
registries.

The tables are made from the same JSON Schema editors get (``rules_json_schema``), so a key,
its default and its description are written once, on the model, and the docs cannot drift
from what the loader accepts. ``costline rules reference`` prints it; a test keeps the file
in the repository equal to it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from costline.rules.enforce_params import COMMON_KEYS, EnforceParams
from costline.rules.kinds import KINDS, Rule
from costline.rules.lifecycle_params import CheckpointParams
from costline.rules.loader import rules_json_schema
from costline.rules.plugins import Plugins
from costline.rules.reclaim_params import ReclaimParams
from costline.rules.registry import example_of, summary_of

COMMON_RECLAIM_KEYS = ("connector", "grace", *ReclaimParams.model_fields)
COMMON_ENFORCE_KEYS = (*COMMON_KEYS, *EnforceParams.model_fields)
COMMON_NOTIFY_KEYS = ("route_by_tag", "channels")


def reference_markdown(plugins: Plugins) -> str:
    """The whole reference as Markdown."""
    defs = rules_json_schema(plugins)["$defs"]
    common = Rule.model_json_schema(by_alias=True)
    parts = [
        "# Rule reference\n",
        "Every rule kind, reclaim connector, enforcement connector, checkpoint connector and "
        "notifier, generated from their registries by `costline rules reference`; a test keeps "
        "this file equal to its output. Editors get the same keys as a JSON Schema from "
        "`costline rules schema`.\n",
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
    return "\n".join(parts + _enforcers(plugins, defs) + _checkpoint_connectors(plugins, defs)
                     + _notifiers(defs["Notify"], plugins))


def _enforcers(plugins: Plugins, defs: Mapping[str, Any]) -> list[str]:
    options = {o["properties"]["connector"]["const"]: o for o in defs["Enforce"]["oneOf"]}
    parts = ["## Enforcement connectors\n"]
    if options:
        first = next(iter(options.values()))
        parts += [
            "`enforce:` of a `budget` rule names a connector (docs/ENFORCE.md); every connector "
            "takes these keys besides its own:\n",
            _table(first, [k for k in COMMON_ENFORCE_KEYS if k in first["properties"]]),
        ]
    for name, connector in plugins.enforcers.items():
        option = options[name]
        own = [key for key in option["properties"] if key not in COMMON_ENFORCE_KEYS]
        parts += [f"### `enforce: {name}`\n", option["description"] + "\n"]
        parts += [_table(option, own, noun="parameter")] if own else []
        parts += [_example(connector)]
    return parts


def _notifiers(notify: Mapping[str, Any], plugins: Plugins) -> list[str]:
    """``notify:``: the keys every notifier shares, then each notifier's own."""
    parts = [
        "## Notifiers\n",
        "`notify:` names one or more notifiers, each under its own key (docs/NOTIFY.md). "
        "Beside them:\n",
        _table(notify, [key for key in COMMON_NOTIFY_KEYS if key in notify["properties"]]),
    ]
    for name, notifier in plugins.notifiers.items():
        option = notify["properties"][name]
        [keys] = [o for o in option.get("anyOf", [option]) if o.get("type") == "object"]
        shorthand = notifier.params_model.shorthand
        parts += [f"### `{name}`\n", summary_of(notifier) + "\n"]
        if shorthand is not None:
            parts += [f"`{name}: VALUE` is short for `{name}: {{{shorthand}: VALUE}}`.\n"]
        parts += [_table(keys, list(keys["properties"]), noun="parameter"), _example(notifier)]
    return parts


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
