"""One alert change as the rule engine publishes it on ``NS.alerts.v1``, read once, and the
plain words every notifier says it with.

:class:`AlertChange` reads the record strictly enough that a malformed one is refused here
rather than half-sent: retrying it could not help. The phrases (the headline, a title naming
rule, group, figure and line) are plain text; each notifier formats them for its channel.

How an alert reads depends on its kind, and comes from the registered kind itself
(``KINDS[kind].presentation``): the unit of its figures when the record names none (money,
money per hour, a utilization fraction shown as a percentage) and the words of its headline.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from costline.rules.kinds import KINDS, Presentation
from costline.rules.money import figure_in

STATES = ("pending", "firing", "resolved", "silenced")
SEVERITIES = ("info", "warning", "critical")
FORECAST_LINE = "forecast"


class InvalidAlertRecord(ValueError):
    """The record does not have the shape the rule engine promises; retrying will not help."""


@dataclass(frozen=True)
class Line:
    name: str
    value: Decimal


@dataclass(frozen=True)
class Contributor:
    group: Mapping[str, str]
    value: Decimal


@dataclass(frozen=True)
class Forecast:
    value: Decimal
    crosses_at: datetime | None


@dataclass(frozen=True)
class Reclaim:
    resource_id: str
    connector: str
    grace_s: int
    execute_at: datetime | None
    mode: str
    approval: str

    @property
    def needs_approval(self) -> bool:
        """Anything but ``auto`` means a person must approve before the release happens."""
        return self.approval != "auto"


@dataclass(frozen=True)
class AlertChange:
    """One alert state change, as published by the rule engine."""

    alert_id: str
    rule: str
    kind: str
    severity: str
    state: str
    previous_state: str | None
    group: Mapping[str, str]
    since: datetime | None
    at: datetime
    value: Decimal
    threshold: Decimal | None
    line: str | None
    lines: tuple[Line, ...]
    currency: str
    period_start: str | None
    period_end: str | None
    forecast: Forecast | None
    rate_per_hour: Decimal | None
    top: tuple[Contributor, ...]
    faults: Mapping[str, Decimal] | None
    reclaim: Reclaim | None
    notify: Mapping[str, Any]
    """Where the alert goes: each notifier's parameters, routed for it by the rule engine."""
    notify_slack: str | None
    route_by_tag: str | None
    notify_channel: str | None
    mode: str
    summary: str
    unit: str | None
    record: Mapping[str, Any]

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> AlertChange:
        """Read a record, refusing one that lacks what every message needs."""
        try:
            return _parse(record)
        except (KeyError, TypeError, ValueError, InvalidOperation, AttributeError) as exc:
            raise InvalidAlertRecord(f"alert record: {exc!r}") from None

    @property
    def thread_key(self) -> str:
        """One Slack thread per alert and period: a new month's budget alert starts afresh."""
        return f"{self.alert_id}@{self.period_start}" if self.period_start else self.alert_id

    @property
    def change_key(self) -> str:
        """Identifies this change, so a redelivered record is recognised as already sent."""
        return f"{self.state}|{self.line or '-'}|{self.at.isoformat()}"

    @property
    def presentation(self) -> Presentation:
        """How alerts of this kind read, as the registered kind says."""
        return KINDS[self.kind].presentation

    @property
    def is_open(self) -> bool:
        """Pending and firing alerts still invite action; resolved and silenced ones do not."""
        return self.state in ("pending", "firing")


def _parse(record: Mapping[str, Any]) -> AlertChange:
    state = str(record["state"])
    if state not in STATES:
        raise ValueError(f"unknown state {state!r}")
    kind = str(record["kind"])
    if kind not in KINDS:
        raise ValueError(KINDS.unknown(kind))
    notify = record.get("notify") or {}
    period = record.get("period") or {}
    forecast = record.get("forecast")
    faults = record.get("faults")
    return AlertChange(
        alert_id=_text(record["alert_id"]),
        rule=_text(record["rule"]),
        kind=kind,
        severity=str(record.get("severity") or "warning"),
        state=state,
        previous_state=record.get("previous_state"),
        group={str(k): str(v) for k, v in dict(record.get("group") or {}).items()},
        since=optional_time(record.get("since")),
        at=_required_time(record["at"]),
        value=Decimal(str(record["value"])),
        threshold=_decimal(record.get("threshold")),
        line=record.get("line"),
        lines=tuple(Line(str(x["name"]), Decimal(str(x["value"])))
                    for x in record.get("lines") or ()),
        currency=str(record.get("currency") or "USD"),
        period_start=period.get("start"),
        period_end=period.get("end"),
        forecast=Forecast(Decimal(str(forecast["value"])),
                          optional_time(forecast.get("crosses_at"))) if forecast else None,
        rate_per_hour=_decimal(record.get("rate_per_hour")),
        top=tuple(Contributor({str(k): str(v) for k, v in x["group"].items()},
                              Decimal(str(x["value"]))) for x in record.get("top") or ()),
        faults={str(k): Decimal(str(v)) for k, v in faults.items()} if faults else None,
        reclaim=_reclaim(record.get("reclaim")),
        notify=dict(notify),
        notify_slack=notify.get("slack"),
        route_by_tag=notify.get("route_by_tag"),
        notify_channel=notify.get("channel"),
        mode=str(record.get("mode") or "live"),
        summary=str(record.get("summary") or ""),
        unit=record.get("unit"),
        record=record,
    )


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError("expected a non-empty string")
    return value


def _decimal(value: Any) -> Decimal | None:
    return None if value is None else Decimal(str(value))


def optional_time(value: Any) -> datetime | None:
    """An RFC 3339 time, or None for none."""
    return None if value in (None, "") else _required_time(value)


def _required_time(value: Any) -> datetime:
    parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _reclaim(raw: Any) -> Reclaim | None:
    if not raw:
        return None
    return Reclaim(
        resource_id=_text(raw["resource_id"]),
        connector=str(raw.get("connector") or ""),
        grace_s=int(raw.get("grace") or 0),
        execute_at=optional_time(raw.get("execute_at")),
        mode=str(raw.get("mode") or "live"),
        approval=str(raw.get("approval") or "auto"),
    )


# ── words and figures ─────────────────────────────────────────────────────────────────────


def unit_of(change: AlertChange) -> str:
    return change.unit or change.presentation.unit


def figure(change: AlertChange, amount: Decimal) -> str:
    """An amount in the unit the alert's kind measures."""
    return figure_in(amount, unit_of(change), change.currency)


def short_time(moment: datetime) -> str:
    utc = moment.astimezone(UTC)
    return f"{utc:%b} {utc.day} {utc:%H:%M} UTC"


def duration(seconds: int) -> str:
    if seconds % 86400 == 0 and seconds:
        return f"{seconds // 86400}d"
    if seconds % 3600 == 0 and seconds:
        return f"{seconds // 3600}h"
    if seconds % 60 == 0:
        return f"{seconds // 60}m"
    return f"{seconds}s"


def headline(change: AlertChange) -> str:
    """The figure against the line, in words: the heart of every message about an alert.

    An alert made outside the rule engine (a stopped reclamation round) brings its own.
    """
    if change.record.get("headline"):
        return str(change.record["headline"])
    value = figure(change, change.value)
    line = change.line or "its line"
    against = f" ({figure(change, change.threshold)})" if change.threshold is not None else ""
    if change.line == FORECAST_LINE and change.forecast is not None:
        target = limit_line(change)
        name = target.name if target else "its line"
        if change.state == "resolved":
            return f"{value}, forecast back under {name}{against}"
        return f"{value}, forecast {figure(change, change.forecast.value)} crosses {name}{against}"
    words = change.presentation.back if change.state == "resolved" else change.presentation.crossed
    return words.format(value=value, line=line) + against


def state_tag(change: AlertChange) -> str:
    return change.state.upper() if change.state != "firing" else change.severity.upper()


def limit_line(change: AlertChange) -> Line | None:
    """The budget line a figure is measured against: ``limit``, else the highest line."""
    named = [x for x in change.lines if x.name == "limit"]
    if named:
        return named[0]
    return max(change.lines, key=lambda x: x.value) if change.lines else None


def group_text(group: Mapping[str, str]) -> str:
    """``team=pretrain project=llm-70b``; ``all`` for a rule without ``group_by``."""
    return " ".join(f"{k}={v}" for k, v in group.items()) or "all"


def title(change: AlertChange) -> str:
    """``[WARNING] team-monthly · team=pretrain: $8,123.45 crossed warn_80 ($8,000.00)``:
    rule, group, figure and line, all a pager or a subject line shows."""
    return f"[{state_tag(change)}] {change.rule} · {group_text(change.group)}: {headline(change)}"


def change_phrase(change: AlertChange, previous: AlertChange | None) -> str:
    """What changed since the last message about this alert, in plain words."""
    what = headline(change)
    if change.state == "resolved":
        return f"Resolved: {what}."
    if change.state == "silenced":
        return f"Silenced: {what}."
    if previous is not None and previous.line != change.line and change.line:
        return f"Escalated from {previous.line or previous.state} to {change.line}: {what}."
    if previous is not None and previous.state != change.state:
        return f"Now {change.state}: {what}."
    return f"Still {change.state}: {what}."


def severity_rank(severity: str) -> int:
    """``info`` < ``warning`` < ``critical``; an unknown severity ranks as ``warning``."""
    return SEVERITIES.index(severity) if severity in SEVERITIES else 1
