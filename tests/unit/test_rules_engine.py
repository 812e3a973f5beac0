"""The engine: rules × state → alert changes in the exact shape the notifier renders."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from costline.connectors.plugins import PLUGINS
from costline.rules.alerts import FIELD_ORDER
from costline.rules.engine import Engine, alert_id, group_hash
from costline.rules.loader import RuleSet, load_rules
from costline.rules.memory_state import InMemoryState
from costline.rules.prices import PriceBook
from costline.rules.silences import Silence
from tests.unit.rulefiles.builders import HOUR, MIN, T0, book, fault, rule, sample, state, usage

DEFINITIONS = Path(__file__).parents[2] / "rules" / "definitions"

BUDGET: dict[str, Any] = {
    "kind": "budget",
    "name": "team-monthly",
    "group_by": ["team"],
    "limit": 10000,
    "warn_at": [0.5, 0.8],
    "notify": {
        "slack": "#ml-budgets",
        "route_by_tag": "team",
        "channels": {"pretrain": "#pretrain-budget"},
    },
}


def test_a_budget_change_has_exactly_the_published_shape() -> None:
    engine = Engine(RuleSet((rule(**BUDGET),)), "USD")
    found = state(
        usage(T0, 1000, team="pretrain", job="run-7"),
        usage(T0, 2249.38, team="pretrain", job="run-42"),
    )
    [change] = engine.evaluate(found, T0 + HOUR).changes
    assert change == {
        "alert_id": "team-monthly/" + group_hash({"team": "pretrain"}),
        "rule": "team-monthly",
        "kind": "budget",
        "severity": "warning",
        "state": "firing",
        "previous_state": "inactive",
        "group": {"team": "pretrain"},
        "since": "2026-11-30T09:00:00Z",
        "at": "2026-11-30T09:00:00Z",
        "value": "8123.450000",
        "threshold": "8000.000000",
        "line": "warn_80",
        "lines": [
            {"name": "warn_50", "value": "5000.000000"},
            {"name": "warn_80", "value": "8000.000000"},
            {"name": "limit", "value": "10000.000000"},
        ],
        "currency": "USD",
        "unit": "currency",
        "period": {"start": "2026-11-01T00:00:00Z", "end": "2026-12-01T00:00:00Z"},
        "forecast": None,
        "rate_per_hour": None,
        "top": [
            {"group": {"job": "run-42"}, "value": "5623.450000"},
            {"group": {"job": "run-7"}, "value": "2500.000000"},
        ],
        "faults": None,
        "reclaim": None,
        "notify": {"slack": "#ml-budgets", "route_by_tag": "team", "channel": "#pretrain-budget"},
        "mode": "live",
        "summary": "team=pretrain has spent $8,123.45 this month of a $10,000.00 budget, "
        "past the 80% warning line of $8,000.00.",
    }
    assert tuple(change) == FIELD_ORDER


def test_an_alert_id_depends_on_the_group_not_on_key_order() -> None:
    assert alert_id("r", {"a": "1", "b": "2"}) == alert_id("r", {"b": "2", "a": "1"})
    assert alert_id("r", {"a": "1"}) != alert_id("r", {"a": "2"})


def test_a_group_without_a_mapped_channel_falls_back_to_slack() -> None:
    engine = Engine(RuleSet((rule(**BUDGET),)), "USD")
    [change] = engine.evaluate(state(usage(T0, 4000, team="eval")), T0 + HOUR).changes
    assert change["notify"]["channel"] == "#ml-budgets"


def test_silences_given_to_the_engine_mute_matching_alerts() -> None:
    engine = Engine(RuleSet((rule(**BUDGET),)), "USD")
    hush = Silence("s1", ends_at=T0 + 2 * HOUR, matchers={"team": "pretrain"}, created_by="bob")
    found = state(usage(T0, 4000, team="pretrain"), usage(T0, 4000, team="eval"))
    changes = engine.evaluate(found, T0 + HOUR, silences=[hush]).changes
    assert {c["group"]["team"]: c["state"] for c in changes} == {
        "pretrain": "silenced",
        "eval": "firing",
    }


def _busy_cluster() -> tuple[Engine, InMemoryState]:
    """The shipped rules and price book on a morning of a busy cluster."""
    prices = PriceBook.load(Path(__file__).parents[2] / "rules" / "prices" / "example.yaml")
    engine = Engine.for_prices(load_rules([DEFINITIONS], plugins=PLUGINS), prices)
    tags = "team=pretrain env=prod stage=pretrain project=llm-70b owner=alice"
    labels = dict(pair.split("=") for pair in tags.split())
    found = InMemoryState(prices)
    found.add_all(usage(T0 - h * HOUR, 20000, job=f"run-{h % 3}", **labels) for h in range(8))
    found.add_all(
        sample(T0 - m * MIN, 0.01, job="run-1", team="pretrain", owner="alice") for m in range(45)
    )
    found.add(fault(T0 - 2 * HOUR, 4096, 7200, 900, "node_failure", job="run-2", **labels))
    return engine, found


def test_every_change_of_the_shipped_rules_is_plain_json() -> None:
    engine, found = _busy_cluster()
    changes = engine.evaluate(found, T0).changes
    assert {c["kind"] for c in changes} >= {"budget", "idle", "fault_waste"}
    assert json.loads(json.dumps(changes)) == changes


def test_the_slack_renderer_accepts_every_change() -> None:
    render = pytest.importorskip("costline.connectors.slack_render")
    engine, found = _busy_cluster()
    first = engine.evaluate(found, T0)
    later = engine.evaluate(state(), T0 + HOUR, first.book)
    for change in [*first.changes, *later.changes]:
        render.AlertChange.from_record(change)
        render.render_alert(change)


def test_findings_are_returned_per_rule() -> None:
    engine = Engine(RuleSet((rule(**BUDGET),)), "USD")
    result = engine.evaluate(state(usage(T0, 4000, team="a")), T0 + HOUR)
    assert [f.line for f in result.findings["team-monthly"]] == ["limit"]
    assert book().currency == "USD"


@pytest.mark.parametrize(
    ("owner", "channel"),
    [("alice", "#alice-jobs"), ("@bob", "@bob"), ("#team-x", "#team-x"), ("carol", "#ml")],
)
def test_route_by_tag_maps_a_tag_value_to_its_channel(owner: str, channel: str) -> None:
    budget = rule(
        **{
            **BUDGET,
            "group_by": ["owner"],
            "notify": {
                "slack": "#ml",
                "route_by_tag": "owner",
                "channels": {"alice": "#alice-jobs"},
            },
        }
    )
    engine = Engine(RuleSet((budget,)), "USD")
    [change] = engine.evaluate(state(usage(T0, 4000, owner=owner)), T0 + HOUR).changes
    assert change["notify"]["channel"] == channel
