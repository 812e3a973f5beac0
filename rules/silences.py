"""Silences: a person mutes matching alerts until a given time (Slack's "snooze").

A silence matches on the rule name and on tag globs, and always ends: an open-ended silence
is how a budget overrun goes unnoticed for a quarter. While silenced, an alert keeps its
lifecycle (it can still escalate or resolve) but its changes are published as ``silenced``,
so nobody is paged and the audit trail stays complete.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from costline.rules.globs import glob_match
from costline.rules.state import matches


@dataclass(frozen=True)
class Silence:
    """Mute alerts of rules matching ``rule`` whose tags match ``matchers``, until ``ends_at``."""

    id: str
    ends_at: float
    rule: str | None = None
    matchers: Mapping[str, str] = field(default_factory=dict)
    starts_at: float = 0.0
    created_by: str = ""
    comment: str = ""

    def __post_init__(self) -> None:
        if self.rule is None and not self.matchers:
            raise ValueError("a silence names a rule, tag matchers, or both")
        if self.ends_at <= self.starts_at:
            raise ValueError("a silence ends after it starts")

    def active(self, now: float) -> bool:
        return self.starts_at <= now < self.ends_at

    def covers(self, rule: str, labels: Mapping[str, str], now: float) -> bool:
        """Whether this silence mutes an alert of ``rule`` with these tags at ``now``."""
        if not self.active(now):
            return False
        if self.rule is not None and not glob_match(rule, self.rule):
            return False
        return matches(self.matchers, labels)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "rule": self.rule,
            "matchers": dict(self.matchers),
            "starts_at": self.starts_at,
            "ends_at": self.ends_at,
            "created_by": self.created_by,
            "comment": self.comment,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Silence:
        return cls(
            id=str(data["id"]),
            ends_at=float(data["ends_at"]),
            rule=data.get("rule"),
            matchers=dict(data.get("matchers") or {}),
            starts_at=float(data.get("starts_at", 0.0)),
            created_by=str(data.get("created_by", "")),
            comment=str(data.get("comment", "")),
        )


def silence_for(
    silences: Iterable[Silence], rule: str, labels: Mapping[str, str], now: float
) -> Silence | None:
    """The silence muting this alert now; of several, the one lasting longest."""
    covering = [s for s in silences if s.covers(rule, labels, now)]
    return max(covering, key=lambda s: s.ends_at) if covering else None


def unexpired(silences: Iterable[Silence], now: float) -> list[Silence]:
    """Silences that still matter: the ones not yet over."""
    return [s for s in silences if s.ends_at > now]
