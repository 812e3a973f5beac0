"""The rule engine: rules × a ``StateView`` at ``now`` → findings → alert state changes.

Pure: it reads the state view, the alert book, silences and recent faults it is given, and
returns the changes to publish with the next book. The worker persists the book and
publishes the changes; ``rules test`` and ``rules backtest`` run the very same code on an
``InMemoryState``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from costline.rules.alerts import AlertBook, Mute, Observation, Policy, advance
from costline.rules.durations import rfc3339
from costline.rules.evaluation_view import EvaluationView
from costline.rules.findings import Finding, Line
from costline.rules.inhibit import FAULT_LOOKBACK_S, inhibition_for
from costline.rules.kept_answers import KeptAnswers
from costline.rules.kinds import Rule
from costline.rules.loader import RuleSet, load_rules
from costline.rules.plugins import NO_PLUGINS, Plugins
from costline.rules.prices import PriceBook, format_micro
from costline.rules.silences import Silence, silence_for
from costline.rules.state import FaultHistory, FaultRecord, StateView


def group_hash(group: Mapping[str, str]) -> str:
    """A stable short digest of a group's tags: the same group always maps to one alert."""
    canonical = json.dumps(dict(group), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def alert_id(rule: str, group: Mapping[str, str]) -> str:
    return f"{rule}/{group_hash(group)}"


@dataclass(frozen=True)
class Evaluation:
    """The outcome of one evaluation: changes to publish and the book to keep."""

    at: float
    changes: list[dict[str, Any]]
    book: AlertBook
    findings: Mapping[str, list[Finding]] = field(default_factory=dict)
    reused: frozenset[str] = frozenset()
    """Rules whose findings were taken from the previous evaluation, not evaluated now."""
    muted: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Rule → its alert ids muted now: silenced, or inhibited by a fault's recovery."""

    def evaluated(self) -> dict[str, list[Finding]]:
        """The findings of the rules evaluated now (what a consumer has not seen yet)."""
        return {name: found for name, found in self.findings.items() if name not in self.reused}

    def actionable(self) -> dict[str, list[Finding]]:
        """``evaluated`` without the findings whose alert is muted: what automation may act
        on. An idle alert muted by a fault's recovery is idleness the fault explains, and a
        silenced one was told to keep quiet: neither is released without a word."""
        evaluated = self.evaluated()
        for name, ids in self.muted.items():
            if name in evaluated:
                evaluated[name] = [f for f in evaluated[name] if alert_id(name, f.group) not in ids]
        return evaluated


class Engine:
    """Evaluates a rule set; holds no alert state of its own (the caller keeps the book)."""

    def __init__(
        self, rules: RuleSet, currency: str, units: Mapping[str, str] | None = None
    ) -> None:
        self.rules = rules
        self.currency = currency
        self.units = dict(units or {})
        self.policies = {r.name: Policy(r.pending_for, r.realert) for r in rules}
        # Findings reused from the last evaluation (``reuse``) are the very same objects:
        # their alert id and payload are kept with them instead of being rendered again.
        self._rendered: dict[int, tuple[Finding, str, Mapping[str, Any]]] = {}

    @classmethod
    def for_prices(cls, rules: RuleSet, prices: PriceBook) -> Engine:
        """An engine speaking the price book's currency and units."""
        units = {name: price.unit for name, price in prices.prices.items()}
        return cls(rules, prices.currency, units)

    @classmethod
    def load(
        cls,
        paths: Iterable[Path | str],
        prices: PriceBook,
        timezone: str = "UTC",
        *,
        plugins: Plugins = NO_PLUGINS,
    ) -> Engine:
        return cls.for_prices(load_rules(paths, timezone, plugins=plugins), prices)

    def findings(
        self,
        state: StateView,
        now: float,
        kept: KeptAnswers | None = None,
        reuse: Mapping[str, list[Finding]] | None = None,
    ) -> dict[str, list[Finding]]:
        """Every rule's findings at ``now``; a rule named in ``reuse`` keeps those findings
        instead of being evaluated (the caller knows they cannot have changed)."""
        if kept is not None:
            kept.begin(state, now, full=reuse is None)
        view = state if isinstance(state, EvaluationView) else EvaluationView(state, kept)
        reuse = reuse or {}
        return {
            rule.name: list(reuse[rule.name]) if rule.name in reuse else rule.evaluate(view, now)
            for rule in self.rules
        }

    def evaluate(
        self,
        state: StateView,
        now: float,
        book: AlertBook | None = None,
        silences: Sequence[Silence] = (),
        faults: Sequence[FaultRecord] | None = None,
        *,
        kept: KeptAnswers | None = None,
        reuse: Mapping[str, list[Finding]] | None = None,
    ) -> Evaluation:
        """Evaluate every rule and advance the alert lifecycle by one step.

        ``faults`` are the recent faults for inhibition; when not given they are read from
        the state if it keeps them (``FaultHistory``). ``kept`` carries answers about past
        hours between evaluations; ``reuse`` gives findings of rules not to evaluate now.
        """
        recent = _recent_faults(state, now) if faults is None else list(faults)
        # Only a fault whose recovery window covers now can mute: sorting them out once
        # saves a pass over every recent fault per finding.
        recovering = [f for f in recent if f.ts <= now < f.recovered_at]
        found = self.findings(state, now, kept, reuse)
        rendered: dict[int, tuple[Finding, str, Mapping[str, Any]]] = {}
        observations = [
            self._observe(rule, finding, now, silences, recovering, rendered)
            for rule in self.rules
            for finding in found[rule.name]
        ]
        self._rendered = rendered
        next_book, changes = advance(book or AlertBook(), observations, self.policies, now)
        muted: dict[str, set[str]] = {}
        for o in observations:
            if o.mute is not None:
                muted.setdefault(o.rule, set()).add(o.alert_id)
        return Evaluation(now, changes, next_book, found, frozenset(reuse or ()),
                          {rule: frozenset(ids) for rule, ids in muted.items()})

    def _observe(
        self,
        rule: Rule,
        finding: Finding,
        now: float,
        silences: Sequence[Silence],
        faults: Sequence[FaultRecord],
        rendered: dict[int, tuple[Finding, str, Mapping[str, Any]]],
    ) -> Observation:
        known = self._rendered.get(id(finding))
        if known is not None and known[0] is finding:
            _, identity, body = known
        else:
            identity = alert_id(rule.name, finding.group)
            body = payload(rule, finding, self.currency, self.units)
        rendered[id(finding)] = (finding, identity, body)
        return Observation(
            alert_id=identity,
            rule=rule.name,
            rank=finding.rank,
            payload=body,
            mute=_mute(rule, finding, now, silences, faults),
        )


def _recent_faults(state: StateView, now: float) -> list[FaultRecord]:
    if not isinstance(state, FaultHistory):
        return []
    return [f for f in state.faults(now - FAULT_LOOKBACK_S) if f.ts <= now]


def _mute(
    rule: Rule,
    finding: Finding,
    now: float,
    silences: Sequence[Silence],
    faults: Sequence[FaultRecord],
) -> Mute | None:
    labels = finding.labels
    silence = silence_for(silences, rule.name, labels, now)
    if silence is not None:
        who = f" by {silence.created_by}" if silence.created_by else ""
        note = f" ({silence.comment})" if silence.comment else ""
        reason = f"silenced{who} until {rfc3339(silence.ends_at)}{note}"
        return Mute(f"silence:{silence.id}", silence.ends_at, reason)
    if not rule.inhibited_by_faults:
        return None
    inhibition = inhibition_for(faults, labels, now)
    if inhibition is None:
        return None
    return Mute(f"fault:{inhibition.fault.fault}", inhibition.until, inhibition.reason)


def payload(
    rule: Rule, finding: Finding, currency: str, units: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """A finding rendered as the published alert fields (amounts as 6-place decimals).

    ``unit`` says what ``value`` measures (``currency``, ``currency_per_hour``, ``fraction``
    or a price book unit such as ``gb_hour``), so a renderer need not guess from the kind.
    """
    forecast = finding.forecast
    return {
        "kind": rule.kind,
        "severity": rule.severity,
        "group": dict(finding.group),
        "value": format_micro(finding.value),
        "threshold": format_micro(finding.threshold),
        "line": finding.line,
        "lines": _lines(finding.lines),
        "currency": currency,
        "unit": rule.value_unit(units or {}),
        "period": {"start": rfc3339(finding.period[0]), "end": rfc3339(finding.period[1])},
        "forecast": None
        if forecast is None
        else {
            "value": format_micro(forecast.value),
            "crosses_at": None if forecast.crosses_at is None else rfc3339(forecast.crosses_at),
        },
        "rate_per_hour": _maybe_micro(finding.rate_per_hour),
        "top": [{"group": dict(c.group), "value": format_micro(c.value)} for c in finding.top],
        "faults": None
        if finding.faults is None
        else {name: format_micro(micro) for name, micro in finding.faults.items()},
        "reclaim": finding.reclaim.to_dict() if finding.reclaim else None,
        "notify": _notify(rule, finding),
        "mode": rule.mode,
        "summary": rule.summarize(finding, currency),
    }


def _lines(lines: Sequence[Line]) -> list[dict[str, str]]:
    return [{"name": line.name, "value": format_micro(line.value)} for line in lines]


def _maybe_micro(micro: int | None) -> str | None:
    return None if micro is None else format_micro(micro)


def _notify(rule: Rule, finding: Finding) -> dict[str, Any] | None:
    """Where the alert goes: each notifier's parameters, routed for this alert's tags."""
    return None if rule.notify is None else rule.notify.published(finding.labels)
