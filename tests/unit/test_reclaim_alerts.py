"""A reclamation round stopped by a cap is raised as an alert that Slack can render."""

from __future__ import annotations

from costline.connectors.alert_change import _parse as parse_change
from costline.connectors.slack_render import fallback_text, render_alert
from costline.streams.worker.reclaim_alerts import cap_breach_alert, is_cap_breach

ABORTED = {"step": "failed", "aborted": True, "rule": "gpu-idle", "at": "2026-11-30T11:00:00Z",
           "reason": "aborted: 6 of 8 resources (75%) exceed max_percent 50",
           "currency": "USD", "mode": "live"}


def test_only_an_aborted_round_is_a_cap_breach():
    assert is_cap_breach(ABORTED)
    assert not is_cap_breach({**ABORTED, "aborted": False})
    assert not is_cap_breach({"step": "executed", "rule": "gpu-idle"})


def test_the_cap_breach_alert_names_the_rule_and_the_reason_and_goes_where_the_rule_says():
    change = cap_breach_alert(ABORTED, {"slack": "#ml-gpu-idle"})
    text = fallback_text(parse_change(change))
    assert text.startswith("[CRITICAL] gpu-idle")
    assert "6 of 8 resources (75%) exceed max_percent 50" in text
    assert change["notify"] == {"slack": "#ml-gpu-idle"}
    assert change["alert_id"] == "gpu-idle/reclaim-cap" and change["state"] == "firing"
    rendered = render_alert(change)
    assert "max_percent" in str(rendered)
