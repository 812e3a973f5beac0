"""Alert changes the rule engine produced, for the tests of the exact requests each notifier
sends: a budget rule that notifies every registered notifier, run on an in-memory state — its
first warning, its escalation to the budget line, and its resolution."""

from __future__ import annotations

from typing import Any

from costline.connectors.alert_change import AlertChange
from costline.connectors.notify import NOTIFIERS
from costline.rules.alerts import AlertBook
from costline.rules.engine import Engine, group_hash
from costline.rules.loader import RuleSet
from tests.unit.rulefiles.builders import HOUR, T0, rule, state, usage

SITE = "https://costline.example.com"
KEY = "0123456789abcdef0123456789abcdef"
EVERY_NOTIFIER: dict[str, Any] = {
    "slack": "#ml-budgets",
    "email": {"to": ["finops@example.com"],
              "by_tag": {"pretrain": ["pretrain-leads@example.com"]}},
    "pagerduty": {"routing_key_env": "PD_FINOPS", "severity_at": "warning",
                  "by_tag": {"pretrain": "PD_PRETRAIN"}},
    "alertmanager": {"url": "http://alertmanager:9093", "resolve_timeout": "4m",
                     "labels": {"receiver": "finops"}},
    "webhook": {"url": "https://oncall.example.com/hook", "secret_env": "HOOK_SECRET"},
}
ALERT_ID = "team-monthly/" + group_hash({"team": "pretrain"})
FIRST_SUMMARY = ("[WARNING] team-monthly · team=pretrain: "
                 "$8,123.45 crossed warn_80 ($8,000.00)")


def changes() -> list[AlertChange]:
    """First warning at 80%, escalation past the budget line, then resolution (the rule is
    removed, as a reload would)."""
    notify = {"route_by_tag": "team",
              **{name: keys for name, keys in EVERY_NOTIFIER.items() if name in NOTIFIERS}}
    budget = rule(kind="budget", name="team-monthly", group_by=["team"], limit=10000,
                  warn_at=[0.8], notify=notify)
    engine = Engine(RuleSet((budget,)), "USD")
    found = state(usage(T0, 3000, team="pretrain", job="run-42"),
                  usage(T0, 249.38, team="pretrain", job="run-7"))
    first = engine.evaluate(found, T0 + HOUR, AlertBook())
    found.add_all([usage(T0 + HOUR, 1000, team="pretrain", job="run-42")])
    second = engine.evaluate(found, T0 + 2 * HOUR, first.book)
    third = Engine(RuleSet(()), "USD").evaluate(found, T0 + 3 * HOUR, second.book)
    records = [*first.changes, *second.changes, *third.changes]
    found_changes = [AlertChange.from_record(record) for record in records]
    assert [(c.state, c.line) for c in found_changes] == [
        ("firing", "warn_80"), ("firing", "limit"), ("resolved", "limit")]
    return found_changes


def another(change: AlertChange, rule_name: str, team: str) -> AlertChange:
    """The same change for another rule and group."""
    return AlertChange.from_record({**change.record, "alert_id": f"{rule_name}/1",
                                    "rule": rule_name, "group": {"team": team}})
