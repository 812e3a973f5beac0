"""The exact alerts the alertmanager notifier POSTs to ``/api/v2/alerts``, from alert changes
the rule engine produced (``tests/unit/notify_scenario.py``)."""

from __future__ import annotations

from costline.connectors.alert_change import AlertChange
from costline.connectors.notify.alertmanager import AlertmanagerNotifier
from tests.unit.notify_scenario import ALERT_ID, FIRST_SUMMARY, SITE, changes
from tests.unit.rulefiles.builders import HOUR, T0


def test_the_engine_gives_the_alert_its_alertmanager() -> None:
    first, _, _ = changes()
    assert first.notify["alertmanager"] == {
        "url": "http://alertmanager:9093/", "resolve_timeout": "4m",
        "labels": {"receiver": "finops"}}


def test_alertmanager_gets_labels_annotations_and_an_end_one_resolve_timeout_ahead() -> None:
    first, escalated, resolved = changes()
    now = T0 + HOUR
    notifier = AlertmanagerNotifier(None, SITE, clock=lambda: now)
    assert notifier.alert(first, now) == {
        "labels": {"team": "pretrain", "receiver": "finops", "alertname": "team-monthly",
                   "severity": "warning", "kind": "budget"},
        "annotations": {
            "summary": FIRST_SUMMARY,
            "headline": "$8,123.45 crossed warn_80 ($8,000.00)",
            "description": first.summary,
            "alert_id": ALERT_ID,
            "value": "8123.450000",
            "currency": "USD",
            "threshold": "8000.000000",
            "line": "warn_80",
            "period": "2026-11-01T00:00:00Z/2026-12-01T00:00:00Z",
        },
        "startsAt": "2026-11-30T09:00:00Z",
        "endsAt": "2026-11-30T09:04:00Z",
        "generatorURL": f"{SITE}/?alert=team-monthly%2F{ALERT_ID.split('/')[1]}",
    }
    later = notifier.alert(escalated, T0 + 2 * HOUR)
    assert (later["startsAt"], later["endsAt"]) == ("2026-11-30T09:00:00Z",
                                                    "2026-11-30T10:04:00Z")
    assert later["labels"] == notifier.alert(first, now)["labels"], "one alert, one label set"
    ended = notifier.alert(resolved, T0 + 3 * HOUR)
    assert (ended["startsAt"], ended["endsAt"]) == ("2026-11-30T09:00:00Z",
                                                    "2026-11-30T11:00:00Z")


def test_a_resolution_never_ends_later_than_now() -> None:
    """An Alertmanager keeps the later of two ends still ahead: an end in the future would
    leave the alert firing."""
    _, _, resolved = changes()
    notifier = AlertmanagerNotifier(None, SITE)
    assert notifier.alert(resolved, T0 + 2 * HOUR)["endsAt"] == "2026-11-30T10:00:00Z"


def test_a_tag_named_like_a_label_of_costlines_is_kept_apart() -> None:
    first, _, _ = changes()
    record = {**first.record, "group": {"severity": "low", "team": "pretrain"}}
    notifier = AlertmanagerNotifier(None, SITE)
    labels = notifier.alert(AlertChange.from_record(record), T0)["labels"]
    assert labels["severity"] == "warning" and labels["tag_severity"] == "low"
