"""The alert lifecycle, after Alertmanager: inactive → pending → firing → resolved.

One alert per (rule, group). Each evaluation turns the rules' findings into observations,
and ``advance`` moves every alert one step and says which changes to publish:

* a new finding is ``pending`` while the rule's ``for`` runs, then ``firing``;
* a firing alert reaching a more serious line (80% → 100%) is published again as an
  escalation of the same alert, so Slack updates one message;
* a firing alert is re-published after ``realert`` (the repeat interval);
* an alert whose finding is gone is ``resolved``, and dropped;
* a muted alert (silence or inhibition) keeps its lifecycle, but its changes are published
  as ``silenced``; when the mute ends a firing alert is published as ``firing`` again. A
  resolution is always published as ``resolved``, so a message posted before the mute is
  closed.

Everything is plain data with ``to_dict``/``from_dict``: the worker persists the book between
evaluations and a restart resumes where it was.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, cast

from costline.rules.durations import format_duration, rfc3339

State = Literal["pending", "firing"]
Shown = Literal["inactive", "pending", "firing", "silenced", "resolved"]

FIELD_ORDER = (
    "alert_id", "rule", "kind", "severity", "state", "previous_state", "group", "since", "at",
    "value", "threshold", "line", "lines", "currency", "unit", "period", "forecast",
    "rate_per_hour", "top", "faults", "reclaim", "notify", "mode", "summary",
)  # fmt: skip


@dataclass(frozen=True)
class Mute:
    """Why an alert is muted and until when: a silence, or a fault's recovery window."""

    by: str
    until: float
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"by": self.by, "until": self.until, "reason": self.reason}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Mute:
        return cls(str(data["by"]), float(data["until"]), str(data["reason"]))


@dataclass(frozen=True)
class Policy:
    """The lifecycle settings of one rule."""

    pending_for: int
    realert: int


@dataclass(frozen=True)
class Observation:
    """A finding as the lifecycle sees it: identity, seriousness, and the rendered payload."""

    alert_id: str
    rule: str
    rank: int
    payload: Mapping[str, Any]
    mute: Mute | None = None


@dataclass(frozen=True)
class Alert:
    """One active (pending or firing) alert."""

    alert_id: str
    rule: str
    state: State
    active_since: float
    rank: int
    shown: Shown
    payload: Mapping[str, Any]
    firing_since: float | None = None
    last_notified: float | None = None
    mute: Mute | None = None

    @property
    def since(self) -> float:
        """When the current episode started: firing time once firing, else pending time."""
        return self.firing_since if self.firing_since is not None else self.active_since

    def to_dict(self) -> dict[str, Any]:
        return {
            "alert_id": self.alert_id,
            "rule": self.rule,
            "state": self.state,
            "active_since": self.active_since,
            "rank": self.rank,
            "shown": self.shown,
            "payload": dict(self.payload),
            "firing_since": self.firing_since,
            "last_notified": self.last_notified,
            "mute": self.mute.to_dict() if self.mute else None,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Alert:
        mute = data.get("mute")
        return cls(
            alert_id=str(data["alert_id"]),
            rule=str(data["rule"]),
            state=cast(State, data["state"]),
            active_since=float(data["active_since"]),
            rank=int(data["rank"]),
            shown=cast(Shown, data["shown"]),
            payload=dict(data["payload"]),
            firing_since=_maybe_float(data.get("firing_since")),
            last_notified=_maybe_float(data.get("last_notified")),
            mute=Mute.from_dict(mute) if mute else None,
        )


@dataclass(frozen=True)
class AlertBook:
    """Every active alert by id: the lifecycle's whole memory."""

    alerts: Mapping[str, Alert] = field(default_factory=dict)

    def active(self) -> list[Alert]:
        return sorted(self.alerts.values(), key=lambda a: a.alert_id)

    def to_dict(self) -> dict[str, Any]:
        return {"alerts": [alert.to_dict() for alert in self.active()]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AlertBook:
        alerts = (Alert.from_dict(item) for item in data.get("alerts", []))
        return cls({alert.alert_id: alert for alert in alerts})


def advance(
    book: AlertBook,
    observations: Sequence[Observation],
    policies: Mapping[str, Policy],
    now: float,
) -> tuple[AlertBook, list[dict[str, Any]]]:
    """One evaluation step: the new book and the changes to publish, in order.

    ``policies`` names every rule evaluated this step; an alert of a rule missing from it
    (the rule was removed by a reload) resolves like an alert whose finding is gone.
    """
    alerts: dict[str, Alert] = {}
    changes: list[dict[str, Any]] = []
    for observation in observations:
        previous = book.alerts.get(observation.alert_id)
        policy = policies[observation.rule]
        alert, change = _observe(previous, observation, policy, now)
        alerts[alert.alert_id] = alert
        if change is not None:
            changes.append(change)
    for alert_id, alert in sorted(book.alerts.items()):
        if alert_id not in alerts:
            changes.append(_resolved(alert, now))
    return AlertBook(alerts), changes


def _observe(
    previous: Alert | None, observation: Observation, policy: Policy, now: float
) -> tuple[Alert, dict[str, Any] | None]:
    alert = _next(previous, observation, policy, now)
    muted = observation.mute is not None
    state_changed = previous is None or previous.state != alert.state
    escalated = (
        previous is not None and previous.state == "firing" and observation.rank > previous.rank
    )
    mute_changed = previous is not None and (previous.mute is not None) != muted
    realert_due = (
        not muted
        and alert.state == "firing"
        and (alert.last_notified is None or now - alert.last_notified >= policy.realert)
    )
    if not (state_changed or escalated or mute_changed or realert_due):
        return alert, None
    shown: Shown = "silenced" if muted else alert.state
    notified = alert.last_notified if muted or alert.state != "firing" else now
    alert = replace(alert, shown=shown, last_notified=notified)
    before: Shown = previous.shown if previous else "inactive"
    return alert, _change(alert, shown, before, now, policy)


def _next(previous: Alert | None, observation: Observation, policy: Policy, now: float) -> Alert:
    """The alert after this observation, before deciding what to publish."""
    if previous is None:
        state: State = "firing" if policy.pending_for <= 0 else "pending"
        return Alert(
            alert_id=observation.alert_id,
            rule=observation.rule,
            state=state,
            active_since=now,
            rank=observation.rank,
            shown="inactive",
            payload=observation.payload,
            firing_since=now if state == "firing" else None,
            mute=observation.mute,
        )
    if previous.state == "firing":
        return replace(
            previous,
            rank=max(previous.rank, observation.rank),
            payload=observation.payload,
            mute=observation.mute,
        )
    fires = now - previous.active_since >= policy.pending_for
    return replace(
        previous,
        state="firing" if fires else "pending",
        rank=observation.rank,
        payload=observation.payload,
        firing_since=now if fires else None,
        mute=observation.mute,
    )


def _change(
    alert: Alert, state: Shown, previous: Shown, now: float, policy: Policy
) -> dict[str, Any]:
    payload = dict(alert.payload)
    summary = str(payload.get("summary", ""))
    if state == "pending":
        summary += f" Pending: fires if it holds for {format_duration(policy.pending_for)}."
    elif state == "silenced" and alert.mute is not None:
        summary += f" Muted: {alert.mute.reason}."
    return _ordered(
        payload,
        alert_id=alert.alert_id,
        rule=alert.rule,
        state=state,
        previous_state=previous,
        since=rfc3339(alert.since),
        at=rfc3339(now),
        summary=summary,
    )


def _resolved(alert: Alert, now: float) -> dict[str, Any]:
    payload = dict(alert.payload)
    group = payload.get("group") or {}
    who = ", ".join(f"{k}={v}" for k, v in group.items()) or "everything"
    line = payload.get("line", "line")
    return _ordered(
        payload,
        alert_id=alert.alert_id,
        rule=alert.rule,
        state="resolved",
        previous_state=alert.shown,
        since=rfc3339(alert.since),
        at=rfc3339(now),
        summary=f"Resolved: {alert.rule} for {who} is no longer past its {line} line.",
    )


def _ordered(payload: Mapping[str, Any], **lifecycle: Any) -> dict[str, Any]:
    """The published change, keys in the documented order."""
    merged = {**payload, **lifecycle}
    return {key: merged.get(key) for key in FIELD_ORDER}


def _maybe_float(value: Any) -> float | None:
    return None if value is None else float(value)
