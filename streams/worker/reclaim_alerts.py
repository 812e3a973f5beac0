"""A reclamation round stopped by a cap becomes an alert, not only an audit record.

The caps exist for the day something goes wrong (a broken exporter reports a whole cluster
idle): the people who own the rule must hear of it at once, through the same alert path as
every other alert (``NS.alerts.v1`` → Slack), and not only find it later in ``costline
actions``.
"""

from __future__ import annotations

from typing import Any


def is_cap_breach(record: dict[str, Any]) -> bool:
    return record.get("step") == "failed" and bool(record.get("aborted"))


def cap_breach_alert(record: dict[str, Any], notify: dict[str, Any] | None = None
                     ) -> dict[str, Any]:
    """The alert change for an aborted round, in the rule engine's change shape."""
    rule = str(record.get("rule", ""))
    return {
        "alert_id": f"{rule}/reclaim-cap",
        "rule": rule,
        "kind": "idle",
        "severity": "critical",
        "state": "firing",
        "previous_state": None,
        "group": {"rule": rule},
        "since": record["at"],
        "at": record["at"],
        "value": "1",
        "threshold": None,
        "line": None,
        "lines": [],
        "unit": "aborted round",
        "currency": record.get("currency") or "USD",
        "notify": notify or {},
        "mode": record.get("mode") or "live",
        "reclaim": None,
        "headline": f"reclamation stopped: {record.get('reason', 'a cap was hit')}",
        "summary": (f"Reclamation by {rule} stopped: {record.get('reason', 'a cap was hit')}. "
                    f"Nothing was released in that round; check what the rule matched."),
    }
