"""An alert change in Alertmanager's vocabulary: labels, annotations and the times it holds.

Shared by the ``alertmanager`` notifier (which pushes alerts to its API) and the ``webhook``
notifier (which sends Alertmanager's webhook payload), so both describe an alert the same way.

Labels identify the alert (Alertmanager's fingerprint is their hash): ``alertname`` is the
rule, ``severity`` and ``kind`` come from it, and every tag of the alert's group is a label of
its own, so an Alertmanager routes and silences costline's alerts by team, project or owner.
A tag named like one of costline's labels is kept as ``tag_<name>``. Annotations carry what a
person reads: the headline, the summary, the figures.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Annotated, Any
from urllib.parse import quote

from pydantic import Field

from costline.connectors.alert_change import AlertChange, headline, title
from costline.rules.durations import rfc3339

LabelName = Annotated[str, Field(pattern=r"^[a-zA-Z_][a-zA-Z0-9_]*$")]
OWN_LABELS = ("alertname", "severity", "kind")


def labels_of(change: AlertChange, extra: Mapping[str, str]) -> dict[str, str]:
    """What identifies the alert to an Alertmanager: rule, severity, kind, the group's tags
    and the rule's own ``labels``."""
    found = {f"tag_{key}" if key in OWN_LABELS else key: value
             for key, value in change.group.items() if value}
    found.update(extra)
    found.update(alertname=change.rule, severity=change.severity, kind=change.kind)
    return found


def annotations_of(change: AlertChange) -> dict[str, str]:
    """What a person reads about the alert; figures as the rule engine publishes them."""
    found = {
        "summary": title(change),
        "headline": headline(change),
        "description": change.summary,
        "alert_id": change.alert_id,
        "value": _plain(change.value),
        "currency": change.currency,
    }
    if change.threshold is not None:
        found["threshold"] = _plain(change.threshold)
    if change.line:
        found["line"] = change.line
    if change.period_start and change.period_end:
        found["period"] = f"{change.period_start}/{change.period_end}"
    return {key: value for key, value in found.items() if value}


def generator_url(external_url: str, change: AlertChange) -> str:
    """Where the alert comes from: this costline, naming the alert."""
    return f"{external_url}/?alert={quote(change.alert_id, safe='')}"


def starts_at(change: AlertChange) -> str:
    return rfc3339((change.since or change.at).timestamp())


def ends_at(change: AlertChange, now: datetime, valid_for: timedelta) -> str:
    """A firing alert holds for ``valid_for`` unless it is sent again; a resolved or muted
    one ended when the change was made, and no later than now: an Alertmanager keeps the
    later of two ends that have not passed yet."""
    if change.state == "firing":
        return rfc3339((now + valid_for).timestamp())
    return rfc3339(min(change.at, now).timestamp())


def fingerprint(alert_labels: Mapping[str, str]) -> str:
    """A stable id of a label set (a receiver may group or deduplicate by it)."""
    text = "\xff".join(f"{k}\xff{v}" for k, v in sorted(alert_labels.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _plain(amount: Any) -> str:
    return f"{amount:f}"
