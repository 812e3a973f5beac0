"""The exact Slack payload of every message type, from alert changes the rule engine produced.

Each scenario runs real rules through ``costline.rules.engine.Engine`` on an ``InMemoryState`` and
turns
the published change records into the calls the notifier makes: a thread root is
``chat.postMessage`` to the routed channel with ``message_for``; a later change of a posted
alert re-renders the root (``chat.update``) and replies in its thread with
``render_change_reply``. The payloads are compared with the JSON files in
``tests/unit/golden/slack/``; ``COSTLINE_UPDATE_GOLDEN=1`` rewrites them after a deliberate
change of the layout (review the diff: the files are the specification).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from costline.connectors.notify.slack import SlackNotifier
from costline.connectors.slack_blocks import block_errors
from costline.connectors.slack_render import AlertChange, message_for, render_change_reply
from costline.rules.alerts import FIELD_ORDER, AlertBook
from costline.rules.engine import Engine
from costline.rules.loader import RuleSet
from costline.rules.memory_state import InMemoryState
from tests.unit.rulefiles.builders import (
    DAY,
    HOUR,
    MIN,
    T0,
    at,
    book,
    fault,
    rule,
    sample,
    state,
    usage,
)

GOLDEN = Path(__file__).parent / "golden" / "slack"
FALLBACK = "#costline-alerts"

Payload = dict[str, Any]


# ── the engine, step by step ──────────────────────────────────────────────────────────────


class Cluster:
    """Rules evaluated over time on one in-memory state, the alert book carried between
    evaluations as the worker carries it in Redis."""

    def __init__(self, *rules: Any) -> None:
        self.engine = Engine.for_prices(RuleSet(tuple(rules)), book())
        self.state: InMemoryState = state()
        self.book = AlertBook()

    def add(self, *events: Any) -> Cluster:
        self.state.add_all(events)
        return self

    def evaluate(self, now: float) -> list[dict[str, Any]]:
        evaluation = self.engine.evaluate(self.state, now, self.book)
        self.book = evaluation.book
        return evaluation.changes


def notifier() -> SlackNotifier:
    """Routing only: a notifier without a token sends nothing and needs no ledger."""
    return SlackNotifier(token=None, ledger=None, fallback_channel=FALLBACK)


def root_post(changes: Sequence[dict[str, Any]]) -> Payload:
    """``chat.postMessage`` of a new thread root: one alert, or a digest of several."""
    parsed = [AlertChange.from_record(change) for change in changes]
    message = message_for(parsed)
    return {"method": "chat.postMessage", "channel": notifier().route(parsed[0]),
            "text": message.text, "blocks": message.blocks}


def later_change(change: dict[str, Any], previous: dict[str, Any]) -> list[Payload]:
    """A later change of a posted alert: the root re-rendered, then a reply in its thread."""
    now, before = AlertChange.from_record(change), AlertChange.from_record(previous)
    message = message_for([now])
    return [{"method": "chat.update", "text": message.text, "blocks": message.blocks},
            {"method": "chat.postMessage", "thread": True,
             "text": render_change_reply(now, before)}]


def golden(name: str, payload: Any) -> None:
    """The payload equals ``golden/slack/<name>.json`` (or rewrites it when asked to)."""
    path = GOLDEN / f"{name}.json"
    text = json.dumps(payload, indent=2, ensure_ascii=False) + "\n"
    if os.environ.get("COSTLINE_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"{path} is missing; run with COSTLINE_UPDATE_GOLDEN=1 to write it"
    assert payload == json.loads(path.read_text(encoding="utf-8")), f"differs from {path}"


def only(changes: list[dict[str, Any]]) -> dict[str, Any]:
    assert len(changes) == 1, [c["alert_id"] for c in changes]
    assert tuple(changes[0]) == FIELD_ORDER, "not the engine's published shape"
    return changes[0]


# ── scenarios ─────────────────────────────────────────────────────────────────────────────

TEAM_MONTHLY = {
    "kind": "budget", "name": "team-monthly", "group_by": ["team"], "limit": 10000,
    "warn_at": [0.5, 0.8], "notify": {"slack": "#ml-budgets"},
}


def gpu(ts: float, usd: float, **tags: str) -> Any:
    """GPU usage costing ``usd`` at the test price book's 2.50 USD per GPU-hour."""
    return usage(ts, usd / 2.5, **tags)


def team_monthly() -> tuple[Cluster, list[dict[str, Any]]]:
    """A team's month: 50% line, then 80%, then the new month resolves the alert."""
    cluster = Cluster(rule(**TEAM_MONTHLY))
    cluster.add(gpu(T0 - 3 * DAY, 3100, team="pretrain", job="run-42"),
                gpu(T0 - 2 * DAY, 2100, team="pretrain", job="run-7"))
    first = only(cluster.evaluate(T0))
    cluster.add(gpu(T0 + 30 * MIN, 2923.45, team="pretrain", job="run-42"))
    escalated = only(cluster.evaluate(T0 + 2 * HOUR))
    resolved = only(cluster.evaluate(at("2026-12-01T00:10")))
    return cluster, [first, escalated, resolved]


def test_the_first_warning_posts_one_root_with_snooze_buttons() -> None:
    _, (first, _, _) = team_monthly()
    assert (first["state"], first["previous_state"], first["line"]) == (
        "firing", "inactive", "warn_50")
    golden("first_warning", root_post([first]))


def test_an_escalation_updates_the_root_and_replies_in_its_thread() -> None:
    _, (first, escalated, _) = team_monthly()
    assert (escalated["state"], escalated["line"]) == ("firing", "warn_80")
    golden("escalation", later_change(escalated, first))


def test_a_resolution_closes_the_root_and_says_so_in_the_thread() -> None:
    _, (_, escalated, resolved) = team_monthly()
    assert (resolved["state"], resolved["previous_state"]) == ("resolved", "firing")
    golden("resolved", later_change(resolved, escalated))


def test_crossing_the_budget_line_is_critical_and_shows_the_overrun() -> None:
    hard = rule(kind="budget", name="project-hard-limit", group_by=["project"], limit=20000,
                severity="critical", notify={"slack": "#ml-budgets"})
    cluster = Cluster(hard).add(
        gpu(T0 - 5 * DAY, 12000, project="llm-70b", job="run-42"),
        gpu(T0 - 2 * DAY, 9410.5, project="llm-70b", job="run-43"),
        gpu(T0 - 1 * DAY, 75.25, project="llm-70b", job="eval-3"),
    )
    change = only(cluster.evaluate(T0))
    assert (change["line"], change["severity"]) == ("limit", "critical")
    golden("budget_line", root_post([change]))


def test_a_forecast_warns_before_any_line_is_crossed() -> None:
    forecasting = rule(kind="budget", name="team-forecast", group_by=["team"], limit=10000,
                       warn_at=[0.8], forecast=True, notify={"slack": "#ml-budgets"})
    cluster = Cluster(forecasting).add(gpu(T0 - 3 * DAY, 5800, team="posttrain", job="sft-1"))
    cluster.add(*(gpu(T0 - (h + 1) * HOUR, 200, team="posttrain", job="sft-2")
                  for h in range(6)))
    change = only(cluster.evaluate(T0))
    assert change["line"] == "forecast"
    assert change["forecast"] == {"value": "10200.000000", "crosses_at": "2026-11-30T23:00:00Z"}
    golden("forecast", root_post([change]))


def test_a_resolved_forecast_says_the_projection_is_back_under_the_line() -> None:
    forecasting = rule(kind="budget", name="team-forecast", group_by=["team"], limit=10000,
                       forecast=True, notify={"slack": "#ml-budgets"})
    cluster = Cluster(forecasting).add(gpu(T0 - 3 * DAY, 5800, team="posttrain", job="sft-1"))
    cluster.add(*(gpu(T0 - (h + 1) * HOUR, 200, team="posttrain", job="sft-2")
                  for h in range(6)))
    fired = only(cluster.evaluate(T0))
    resolved = only(cluster.evaluate(at("2026-12-01T00:10")))
    [_, reply] = later_change(resolved, fired)
    assert reply["text"] == (
        ":white_check_mark: Resolved: $7,000.00, forecast back under limit ($10,000.00).")


def test_growth_against_the_baseline_names_the_top_jobs() -> None:
    growth = rule(kind="growth", name="project-growth", group_by=["project"], window="1h",
                  baseline="1d", ratio=3, notify={"slack": "#ml-platform"})
    cluster = Cluster(growth)
    cluster.add(*(gpu(T0 - (h + 2) * HOUR, 25, project="llm-70b", job="run-42")
                  for h in range(25)))
    cluster.add(gpu(T0 - 50 * MIN, 60, project="llm-70b", job="run-43"),
                gpu(T0 - 40 * MIN, 25, project="llm-70b", job="run-42"))
    change = only(cluster.evaluate(T0))
    assert change["kind"] == "growth"
    golden("growth", root_post([change]))


IDLE_GPUS = {
    "kind": "idle", "name": "idle-gpus", "group_by": ["team"], "metric": "gpu_util",
    "below": 0.05, "for": "30m",
    "reclaim": {"connector": "slurm", "grace": "15m", "action": "cancel", "approval": "manual"},
    "notify": {"slack": "#ml-gpu-idle", "route_by_tag": "owner",
               "channels": {"alice": "#alice-jobs"}},
}


def idle_node() -> dict[str, Any]:
    cluster = Cluster(rule(**IDLE_GPUS))
    cluster.add(*(sample(T0 + m * MIN, 0.02 if m % 7 else 0.03, team="pretrain", job="run-42",
                         owner="alice") for m in range(41)))
    return only(cluster.evaluate(T0 + 40 * MIN))


def test_an_idle_gpu_with_a_pending_release_offers_keep_and_approve() -> None:
    change = idle_node()
    assert change["reclaim"]["execute_at"] == "2026-11-30T08:55:00Z"
    payload = root_post([change])
    [actions] = [b for b in payload["blocks"] if b["type"] == "actions"]
    assert [e["action_id"] for e in actions["elements"]][-2:] == [
        "costline.keep", "costline.approve"], "a manual release needs its Approve button"
    golden("idle_pending_release", payload)


def test_an_alert_goes_to_the_channel_its_rule_maps_the_tag_to() -> None:
    change = idle_node()
    assert change["notify"]["channel"] == "#alice-jobs"
    assert notifier().route(AlertChange.from_record(change)) == "#alice-jobs"


def test_a_tag_value_that_names_a_channel_is_where_the_alert_goes() -> None:
    routed = rule(**{**TEAM_MONTHLY, "name": "owner-monthly", "group_by": ["owner"],
                     "notify": {"slack": "#ml-budgets", "route_by_tag": "owner"}})
    cluster = Cluster(routed).add(gpu(T0 - DAY, 6000, owner="#team-vision"),
                                  gpu(T0 - DAY, 6000, owner="bob"))
    routes = {c["group"]["owner"]: notifier().route(AlertChange.from_record(c))
              for c in cluster.evaluate(T0)}
    assert routes == {"#team-vision": "#team-vision", "bob": "#ml-budgets"}


def test_the_operators_channel_map_routes_what_the_rule_does_not_map() -> None:
    routed = rule(**{**TEAM_MONTHLY, "name": "owner-monthly", "group_by": ["owner"],
                     "notify": {"slack": "#ml-budgets", "route_by_tag": "owner",
                                "channels": {"bob": "#bob-budget"}}})
    owners = ("alice", "bob", "carol")
    cluster = Cluster(routed).add(*(gpu(T0 - DAY, 6000, owner=owner) for owner in owners))
    mapped = SlackNotifier(token=None, ledger=None, fallback_channel=FALLBACK,
                           channel_by_tag_value={"alice": "#alice-ops", "bob": "#bob-ops"})
    routes = {c["group"]["owner"]: mapped.route(AlertChange.from_record(c))
              for c in cluster.evaluate(T0)}
    assert routes == {"alice": "#alice-ops", "bob": "#bob-budget", "carol": "#ml-budgets"}


def test_a_log_explosion_is_shown_as_money_per_hour() -> None:
    flood = rule(kind="log_explosion", name="log-flood", group_by=["job"], window="15m",
                 baseline="1d", ratio=5, max_rate=10, severity="critical",
                 notify={"slack": "#ml-oncall"})
    cluster = Cluster(flood)
    cluster.add(*(usage(T0 - (h + 1) * HOUR, 4, "logs.ingest", job="run-42")
                  for h in range(26)))
    cluster.add(usage(T0 - 10 * MIN, 21.25, "logs.ingest", job="run-42"))
    change = only(cluster.evaluate(T0))
    assert (change["unit"], change["line"]) == ("currency_per_hour", "max_rate")
    golden("log_explosion", root_post([change]))


def test_a_rate_alert_without_its_window_shows_contributors_as_plain_totals() -> None:
    golden_root = json.loads((GOLDEN / "log_explosion.json").read_text(encoding="utf-8"))
    assert "• project _untagged_ $42.50/h (100%)" in json.dumps(golden_root["blocks"],
                                                                ensure_ascii=False)
    record = {**AlertChange.from_record(idle_node()).record, "kind": "log_explosion",
              "unit": "currency_per_hour", "value": "42.500000", "period": None,
              "reclaim": None, "top": [{"group": {"job": "run-42"}, "value": "10.625000"}]}
    [top] = [b for b in message_for([AlertChange.from_record(record)]).blocks
             if b["type"] == "section" and "Top contributors" in b["text"]["text"]]
    assert top["text"]["text"] == "*Top contributors*\n• job `run-42` $10.63"


def test_fault_waste_lists_the_waste_by_fault_type() -> None:
    waste = rule(kind="fault_waste", name="fault-waste", group_by=["project"], period="day",
                 max_waste=100, notify={"slack": "#ml-reliability"})
    tags = {"project": "llm-70b", "stage": "pretrain"}
    cluster = Cluster(waste).add(
        gpu(T0 - 2 * HOUR, 1000, **tags, job="run-42"),
        fault(T0 - HOUR, units=40, lost_seconds=3600, recovery_seconds=0, job="run-42", **tags),
        fault(T0 - HOUR, units=10, lost_seconds=3600, recovery_seconds=0, kind="oom",
              job="run-43", **tags),
    )
    change = only(cluster.evaluate(T0))
    assert change["faults"] == {"node_failure": "100.000000", "oom": "25.000000"}
    golden("fault_waste", root_post([change]))


def test_a_burst_for_one_channel_is_one_digest_with_a_menu_per_alert() -> None:
    cluster = Cluster(rule(**TEAM_MONTHLY))
    spends = {"pretrain": 8123.45, "posttrain": 5200, "eval": 10240, "infra": 6000,
              "vision": 5001}
    cluster.add(*(gpu(T0 - DAY, usd, team=team, job=f"{team}-1") for team, usd in spends.items()))
    changes = cluster.evaluate(T0)
    assert len(changes) == len(spends)
    payload = root_post(changes)
    assert len(payload["blocks"]) == 2 + len(spends)
    golden("digest", payload)


# ── every golden is a message Slack accepts ───────────────────────────────────────────────


def _payloads(data: Any) -> list[Payload]:
    return data if isinstance(data, list) else [data]


GOLDEN_RULES = {
    "first_warning": "team-monthly", "escalation": "team-monthly", "resolved": "team-monthly",
    "budget_line": "project-hard-limit", "forecast": "team-forecast", "growth": "project-growth",
    "idle_pending_release": "idle-gpus", "log_explosion": "log-flood",
    "fault_waste": "fault-waste", "digest": "team-monthly",
}


@pytest.mark.parametrize("name", sorted(GOLDEN_RULES))
def test_every_golden_payload_fits_slacks_limits_and_names_its_rule(name: str) -> None:
    path = GOLDEN / f"{name}.json"
    for payload in _payloads(json.loads(path.read_text(encoding="utf-8"))):
        assert block_errors(payload.get("blocks", [])) == []
        assert 0 < len(payload["text"]) <= 3000
        if "blocks" in payload:
            assert GOLDEN_RULES[name] in payload["text"]
        if payload["method"] == "chat.postMessage" and not payload.get("thread"):
            assert payload["channel"].startswith("#")
