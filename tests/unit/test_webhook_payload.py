"""The exact Alertmanager webhook payload (version 4) the webhook notifier POSTs, from alert
changes the rule engine produced (``tests/unit/notify_scenario.py``)."""

from __future__ import annotations

from costline.connectors.delivery_ledger import ThreadRef
from costline.connectors.notify.webhook import WebhookNotifier, WebhookParams
from tests.unit.notify_scenario import ALERT_ID, FIRST_SUMMARY, SITE, another, changes
from tests.unit.rulefiles.builders import HOUR, T0


def test_the_engine_gives_the_alert_its_webhook() -> None:
    first, _, _ = changes()
    assert first.notify["webhook"] == {
        "url": "https://oncall.example.com/hook", "secret_env": "HOOK_SECRET",
        "receiver": "costline", "labels": {}}


def test_the_webhook_sends_alertmanagers_payload_version_4() -> None:
    first, _, resolved = changes()
    notifier = WebhookNotifier(None, SITE, environ={}, clock=lambda: T0 + 3 * HOUR)
    thread = ThreadRef("https://oncall.example.com/hook", "5f3a9c01")
    params = WebhookParams.model_validate(first.notify["webhook"])
    payload = notifier.payload(thread, [first], params)
    labels = {"team": "pretrain", "alertname": "team-monthly", "severity": "warning",
              "kind": "budget"}
    [alert] = payload["alerts"]
    assert payload == {
        "version": "4",
        "groupKey": '{}:{costline_group="5f3a9c01"}',
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": "costline",
        "groupLabels": {"alertname": "team-monthly"},
        "commonLabels": labels,
        "commonAnnotations": alert["annotations"],
        "externalURL": SITE,
        "alerts": [{
            "status": "firing",
            "labels": labels,
            "annotations": alert["annotations"],
            "startsAt": "2026-11-30T09:00:00Z",
            "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": f"{SITE}/?alert=team-monthly%2F{ALERT_ID.split('/')[1]}",
            "fingerprint": alert["fingerprint"],
        }],
    }
    assert alert["annotations"]["summary"] == FIRST_SUMMARY
    closed = notifier.payload(thread, [resolved], params)
    assert closed["status"] == "resolved"
    assert (closed["alerts"][0]["status"], closed["alerts"][0]["endsAt"]) == (
        "resolved", "2026-11-30T11:00:00Z")
    assert closed["alerts"][0]["fingerprint"] == alert["fingerprint"]


def test_a_group_of_two_rules_has_no_group_labels_and_only_common_labels() -> None:
    first, _, _ = changes()
    notifier = WebhookNotifier(None, SITE, environ={})
    params = WebhookParams.model_validate(first.notify["webhook"])
    payload = notifier.payload(ThreadRef("https://x.example/", "1"),
                               [first, another(first, "other", "eval")], params)
    assert payload["groupLabels"] == {}
    assert payload["commonLabels"] == {"severity": "warning", "kind": "budget"}
