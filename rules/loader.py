"""Rule files → a validated ``RuleSet``, or every problem of every file as ``FILE:LINE:COL``.

A rule set is all-or-nothing: the worker never runs half of a reload, so the loader reads
every file, collects every problem, and only then decides. Dispatch on ``kind`` goes through
the ``KINDS`` registry, and ``rules_json_schema`` is generated from the same registry, so an
editor's schema cannot drift from what the loader accepts. Both are given the plug-ins rule
files may name beyond the kinds (``rules/plugins.py``: the reclaim connectors and the
notifiers), never left to find them by what happens to be imported.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.json_schema import models_json_schema

from costline.rules.enforce_params import enforce_json_schema
from costline.rules.kinds import KINDS, Rule
from costline.rules.kinds.checkpoint_lifecycle import acts_json_schema
from costline.rules.kinds.idle import reclaim_json_schema
from costline.rules.notify import notify_json_schema
from costline.rules.plugins import CONTEXT_KEY, NO_PLUGINS, Plugins
from costline.rules.yaml_source import Document, SourceError, SourceInvalid, load_document

RULE_SUFFIXES = (".yaml", ".yml")
SCHEMA_ID = "https://costline.dev/schemas/rules.json"


class RulesInvalid(SourceInvalid):
    """A rule set that cannot be used; ``errors`` holds every problem of every file."""


class _RuleFile(BaseModel):
    """The top level of a rule file."""

    model_config = ConfigDict(extra="forbid")

    rules: list[dict[str, Any]]


@dataclass(frozen=True)
class LoadedRule:
    """A rule and where it was written, for messages that point back at the source."""

    rule: Rule
    file: str
    index: int
    line: int
    col: int


@dataclass(frozen=True)
class RuleSet:
    """Validated rules, in file order; names are unique."""

    rules: tuple[Rule, ...]
    sources: tuple[LoadedRule, ...] = ()

    def __len__(self) -> int:
        return len(self.rules)

    def __iter__(self) -> Iterator[Rule]:
        return iter(self.rules)

    def get(self, name: str) -> Rule | None:
        return next((rule for rule in self.rules if rule.name == name), None)

    def only(self, names: Iterable[str]) -> RuleSet:
        """The subset of rules with these names."""
        wanted = set(names)
        return RuleSet(
            tuple(r for r in self.rules if r.name in wanted),
            tuple(s for s in self.sources if s.rule.name in wanted),
        )


def rule_files(paths: Iterable[Path | str]) -> list[Path]:
    """A file stands for itself; a directory for its ``*.yaml``/``*.yml`` files, sorted."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found.extend(sorted(p for p in path.iterdir() if p.suffix in RULE_SUFFIXES))
        else:
            found.append(path)
    return found


def load_rules(
    paths: Iterable[Path | str], timezone: str = "UTC", *, plugins: Plugins = NO_PLUGINS
) -> RuleSet:
    """Load and validate every rule of every file; raise ``RulesInvalid`` with all problems.

    ``timezone`` is the configured default zone of calendar periods; ``plugins`` are the
    connectors ``reclaim:`` may name (none: a rule with ``reclaim`` is refused).
    """
    loaded: list[LoadedRule] = []
    errors: list[SourceError] = []
    for path in rule_files(paths):
        try:
            document = load_document(path)
        except SourceInvalid as exc:
            errors.extend(exc.errors)
            continue
        file_rules, file_errors = _rules_of(document, timezone, plugins)
        loaded.extend(file_rules)
        errors.extend(file_errors)
    errors.extend(_duplicate_names(loaded))
    if errors:
        raise RulesInvalid(errors)
    return RuleSet(tuple(item.rule for item in loaded), tuple(loaded))


def load_rule_text(
    text: str, timezone: str = "UTC", file: str = "<rules>", *, plugins: Plugins = NO_PLUGINS
) -> RuleSet:
    """Load a rule file given as text (docstring examples, tests)."""
    try:
        document = load_document(file, text)
    except SourceInvalid as exc:
        raise RulesInvalid(exc.errors) from exc
    loaded, errors = _rules_of(document, timezone, plugins)
    errors.extend(_duplicate_names(loaded))
    if errors:
        raise RulesInvalid(errors)
    return RuleSet(tuple(item.rule for item in loaded), tuple(loaded))


def _rules_of(
    document: Document, timezone: str, plugins: Plugins
) -> tuple[list[LoadedRule], list[SourceError]]:
    try:
        items = _RuleFile.model_validate(_top_level(document)).rules
    except ValidationError as exc:
        return [], document.errors_from(exc)
    loaded, errors = [], []
    for index, item in enumerate(items):
        try:
            rule = _rule_of(document, index, item, {"timezone": timezone, CONTEXT_KEY: plugins})
        except ValidationError as exc:
            errors.extend(document.errors_from(exc, ("rules", index)))
        except _KindUnknown as exc:
            errors.append(exc.error)
        else:
            line, col = document.position(("rules", index, "name"))
            loaded.append(LoadedRule(rule, document.file, index, line, col))
    return loaded, sorted(errors, key=lambda e: (e.line, e.col))


def _top_level(document: Document) -> Any:
    """An empty file is an empty rule set, not a type error."""
    return {"rules": []} if document.data is None else document.data


class _KindUnknown(Exception):
    def __init__(self, error: SourceError) -> None:
        super().__init__(str(error))
        self.error = error


def _rule_of(
    document: Document, index: int, item: dict[str, Any], context: dict[str, Any]
) -> Rule:
    name = item.get("kind")
    model = KINDS.get(name) if isinstance(name, str) else None
    if model is None:
        has_kind = "kind" in item
        loc: tuple[int | str, ...] = ("rules", index, "kind") if has_kind else ("rules", index)
        line, col = document.position(loc)
        field = f"rules.{index}.kind"
        message = KINDS.unknown(name) if has_kind else "kind is missing"
        raise _KindUnknown(SourceError(document.file, line, col, f"{field}: {message}"))
    return model.model_validate(item, context=context)


def _duplicate_names(loaded: Sequence[LoadedRule]) -> list[SourceError]:
    """Each repeat of a name, pointing at the repeat and naming the first."""
    first: dict[str, LoadedRule] = {}
    errors = []
    for item in loaded:
        seen = first.setdefault(item.rule.name, item)
        if seen is not item:
            errors.append(
                SourceError(
                    item.file,
                    item.line,
                    item.col,
                    f"rules.{item.index}.name: duplicate rule name {item.rule.name!r} "
                    f"(first defined at {seen.file}:{seen.line}:{seen.col})",
                )
            )
    return errors


def rules_json_schema(plugins: Plugins = NO_PLUGINS) -> dict[str, Any]:
    """The JSON Schema of a rule file: ``rules`` items are ``oneOf`` the registered kinds,
    ``reclaim``, ``enforce`` and a ``checkpoint_lifecycle`` rule's ``act`` are ``oneOf`` the
    connectors in ``plugins`` and ``notify`` has a key per notifier in ``plugins``."""
    models = list(KINDS.items())
    _, top = models_json_schema(
        [(model, "validation") for _, model in models],
        by_alias=True,
        ref_template="#/$defs/{model}",
    )
    defs = top.get("$defs", {})
    if "Reclaim" in defs:
        defs["Reclaim"] = reclaim_json_schema(plugins.reclaimers)
    if "Enforce" in defs:
        defs["Enforce"] = enforce_json_schema(plugins.enforcers)
    if "Notify" in defs:
        defs["Notify"] = notify_json_schema(plugins.notifiers)
    if "CheckpointActs" in defs:
        defs["CheckpointActs"] = acts_json_schema(plugins.checkpoint_connectors)
    refs = {name: {"$ref": f"#/$defs/{model.__name__}"} for name, model in models}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "costline rule file",
        "type": "object",
        "properties": {
            "rules": {
                "type": "array",
                "description": "the rules of this file; names are unique across all files",
                "items": {
                    "oneOf": list(refs.values()),
                    "discriminator": {
                        "propertyName": "kind",
                        "mapping": {name: ref["$ref"] for name, ref in refs.items()},
                    },
                },
            }
        },
        "required": ["rules"],
        "additionalProperties": False,
        "$defs": defs,
    }
