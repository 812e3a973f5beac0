"""README says what a new user needs, and what it says is true: its example events are events
the worker counts, its fault types are the parser's, the integer fields are named as such, and
the commands of "Using it" run in a plain shell."""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path

import pytest

from costline.rules.events import (
    EVENT_KINDS,
    EVENT_MODELS,
    CheckpointEvent,
    FaultEvent,
    FaultType,
    Parsed,
    UsageEvent,
    parse_message,
)
from costline.rules.prices import PriceBook

ROOT = Path(__file__).parents[2]
README = (ROOT / "README.md").read_text()
PRICES = PriceBook.load(ROOT / "rules" / "prices" / "example.yaml")


def section(title: str) -> str:
    start = README.index(f"{title}\n")
    following = re.search(r"\n#{2,3} ", README[start + len(title):])
    return README[start:start + len(title) + (following.start() if following else len(README))]


EVENTS = section("### Events")
WORDS = " ".join(EVENTS.split())
EXAMPLES = re.findall(r"```json\n(.*?)```", EVENTS, re.S)


def test_the_events_section_shows_one_event_of_each_kind_and_a_credit() -> None:
    kinds = [json.loads(example)["kind"] for example in EXAMPLES]
    assert sorted(set(kinds)) == sorted(EVENT_KINDS)
    assert any(json.loads(e).get("charge") == "credit" and json.loads(e)["cost"] < 0
               for e in EXAMPLES)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: json.loads(e)["kind"])
def test_each_example_event_is_counted_by_the_worker(example: str) -> None:
    parsed = parse_message(example.encode(), now=float("inf"))
    assert isinstance(parsed, Parsed), parsed
    [event] = parsed.events
    if isinstance(event, UsageEvent):
        PRICES.charge(event)
    elif isinstance(event, FaultEvent):
        assert PRICES.waste(event) > 0
    elif isinstance(event, CheckpointEvent):
        PRICES.storage_price(event.tier)


def test_every_fault_type_is_listed() -> None:
    listed = re.search(r"`fault` is one of (.*?)\.", WORDS)
    assert listed is not None
    assert re.findall(r"`([a-z_]+)`", listed.group(1)) == [f.value for f in FaultType]


def test_the_integer_fields_are_named_as_whole_numbers() -> None:
    whole = {name for model in EVENT_MODELS
             for name, field in model.model_fields.items()
             if int in _types(field.annotation) and float not in _types(field.annotation)}
    assert whole == {"units", "step", "steps", "tokens", "samples", "bytes"}
    said = re.search(r"Whole numbers: (.*?) \(`512`", WORDS)
    assert said is not None
    assert set(re.findall(r"`([a-z_]+)`", said.group(1))) == whole


def test_fault_events_are_said_to_need_a_resource_type() -> None:
    assert FaultEvent.model_fields["resource_type"].is_required()
    assert "A fault event needs `resource_type`" in WORDS


def test_using_it_says_how_to_get_costline_on_the_path() -> None:
    using = section("## Using it")
    assert "source .venv/bin/activate" in using and ".venv/bin/costline" in using


def _types(annotation: object) -> set[object]:
    found = {annotation}
    for argument in typing.get_args(annotation):
        found |= _types(argument)
    return found


def test_the_rule_cookbook_loads() -> None:
    from costline.connectors.plugins import PLUGINS
    from costline.rules.loader import load_rule_text

    cookbook = section("### Rule cookbook")
    [block] = re.findall(r"```yaml\n(.*?)```", cookbook, re.S)
    kinds = {rule.kind for rule in load_rule_text(block, plugins=PLUGINS)}
    assert {"checkpoint_lifecycle", "checkpoint_interval"} <= kinds
