"""The exact Events API v2 events the pagerduty notifier sends, from alert changes the rule
engine produced (``tests/unit/notify_scenario.py``)."""

from __future__ import annotations

import pytest

from costline.connectors.alert_change import AlertChange
from costline.connectors.notify.pagerduty import PagerDutyNotifier
from tests.unit.notify_scenario import ALERT_ID, FIRST_SUMMARY, KEY, SITE, changes


def notifier() -> PagerDutyNotifier:
    return PagerDutyNotifier(None, "https://events.pagerduty.com", SITE, environ={})


def test_the_engine_routes_the_alert_to_its_tag_values_service() -> None:
    first, _, _ = changes()
    assert first.notify["pagerduty"] == {"routing_key_env": "PD_PRETRAIN",
                                         "severity_at": "warning"}


def test_pagerduty_triggers_with_the_alert_id_as_dedup_key_and_the_amounts() -> None:
    first, _, resolved = changes()
    assert notifier().event(first, KEY) == {
        "routing_key": KEY,
        "event_action": "trigger",
        "dedup_key": ALERT_ID,
        "payload": {
            "summary": FIRST_SUMMARY,
            "source": "team=pretrain",
            "severity": "warning",
            "timestamp": "2026-11-30T09:00:00Z",
            "component": "budget",
            "group": "team-monthly",
            "class": "warn_80",
            "custom_details": {
                "rule": "team-monthly",
                "alert_id": ALERT_ID,
                "group": {"team": "pretrain"},
                "summary": first.summary,
                "value": "8123.450000",
                "threshold": "8000.000000",
                "line": "warn_80",
                "lines": {"warn_80": "8000.000000", "limit": "10000.000000"},
                "currency": "USD",
                "unit": "currency",
                "period": {"start": "2026-11-01T00:00:00Z", "end": "2026-12-01T00:00:00Z"},
                "top": [{"group": {"job": "run-42"}, "value": "7500.000000"},
                        {"group": {"job": "run-7"}, "value": "623.450000"}],
                "mode": "live",
            },
        },
        "client": "costline",
        "client_url": SITE,
        "links": [{"href": f"{SITE}/?alert={ALERT_ID}", "text": f"costline: {ALERT_ID}"}],
    }
    assert notifier().event(resolved, KEY) == {
        "routing_key": KEY, "event_action": "resolve", "dedup_key": ALERT_ID}
    muted = AlertChange.from_record({**first.record, "state": "silenced"})
    assert notifier().event(muted, KEY) == {
        "routing_key": KEY, "event_action": "acknowledge", "dedup_key": ALERT_ID}


@pytest.mark.parametrize(("severity", "pages"), [("info", False), ("warning", True),
                                                 ("critical", True)])
def test_alerts_below_severity_at_do_not_page(severity: str, pages: bool) -> None:
    first, _, _ = changes()
    change = AlertChange.from_record({**first.record, "severity": severity})
    assert notifier().wants(change) is pages


def test_pending_alerts_never_page() -> None:
    first, _, _ = changes()
    assert not notifier().wants(AlertChange.from_record({**first.record, "state": "pending"}))
