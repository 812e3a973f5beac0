"""What ``costline report`` shows, read from Redis, the rule set and the reclamation ledger.

``build_report`` works on anything that answers ``totals`` and ``series`` (the Redis state in
production), the loaded rules, the alert book and the latest action records, and returns the
``costline.connectors.report_html.Report`` the renderer draws. ``gather`` opens those sources for a
set of ``Settings``.

Periods: the report's own period (``--period`` around ``--at``, in ``COSTLINE_TIMEZONE``)
frames the totals, the waste, the top spenders and the releases. Each budget rule is drawn
over *its* period (its ``period`` and ``timezone``) containing ``--at``, because a budget line
only means something against the spend of the period it was written for. While a period is
running, figures reach the end of the 5-minute bucket holding now, as the rules see them.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any, Protocol

from costline.connectors.report_html import (
    TOP_SPENDERS,
    ActiveAlert,
    Amount,
    BudgetChart,
    BudgetGroup,
    BudgetLine,
    Projection,
    Ranking,
    Release,
    Report,
    Span,
    Totals,
)
from costline.rules.alerts import AlertBook
from costline.rules.durations import Period, parse_time, period_bounds, rfc3339
from costline.rules.engine import alert_id
from costline.rules.kinds.budget import FORECAST_MIN_HISTORY_S, FORECAST_WINDOW_S, BudgetRule
from costline.rules.loader import RuleSet
from costline.rules.prices import PriceBook, to_micro
from costline.rules.reclaim import hourly_cost
from costline.rules.state import Group, Measure, align_down, group_of, matches, through

if TYPE_CHECKING:
    from costline.connectors.redis_client import AsyncRedisClient
    from costline.streams.settings import Settings

HOUR_S = 3600
ACTIONS_READ = 10_000
"""Action records read from the ledger's log (it keeps at most this many)."""


class SpendReader(Protocol):
    """The read side of the stored totals that a report needs (``RedisState`` answers it)."""

    def totals(self, measure: Measure, match: Mapping[str, str], group_by: Sequence[str],
               start: float, end: float) -> dict[Group, int]: ...

    def series(self, measure: Measure, match: Mapping[str, str], group_by: Sequence[str],
               start: float, end: float, step: int = HOUR_S) -> dict[Group, dict[int, int]]: ...


@dataclass(frozen=True)
class ReportRequest:
    """Which period to report (the ``period`` holding ``at`` in ``zone``), as of ``now``."""

    period: Period
    at: float
    now: float
    zone: str
    by: tuple[str, ...] = ("team", "project", "job")


@dataclass(frozen=True)
class Sources:
    """Everything a report is made from."""

    state: SpendReader
    rules: RuleSet
    alerts: AlertBook
    actions: Sequence[Mapping[str, Any]]
    prices: PriceBook
    namespace: str


def build_report(sources: Sources, request: ReportRequest) -> Report:
    start, end = period_bounds(request.at, request.period, request.zone)
    upto = _reach(start, end, request.now)
    state = sources.state
    waste = _ranked(state.totals("waste", {}, ["fault"], start, upto))
    return Report(
        namespace=sources.namespace,
        currency=sources.prices.currency,
        span=Span(start, end, request.period, request.zone),
        generated_at=request.now,
        totals=_totals(state, start, upto, sum(item.amount for item in waste)),
        budgets=budget_charts(state, sources.rules, sources.alerts, request),
        waste=waste,
        spenders=tuple(_ranking(state, key, start, upto) for key in request.by),
        releases=releases(sources.actions, sources.prices, start, end),
        alerts=active_alerts(sources.alerts),
    )


def _reach(start: float, end: float, now: float) -> float:
    """How far into [start, end) the stored totals are read: through now's bucket."""
    return max(start, min(float(through(now)), end))


def _totals(state: SpendReader, start: float, upto: float, waste: int) -> Totals:
    billing = state.totals("cost", {}, ["billing"], start, upto)
    return Totals(spend=sum(billing.values()), waste=waste,
                  fixed=billing.get(("fixed",), 0), elastic=billing.get(("elastic",), 0))


def _ranked(amounts: Mapping[Group, int]) -> tuple[Amount, ...]:
    """One amount per single-key group, largest first (ties by label)."""
    ordered = sorted(amounts.items(), key=lambda item: (-item[1], item[0]))
    return tuple(Amount(group[0], amount) for group, amount in ordered)


def _ranking(state: SpendReader, key: str, start: float, upto: float) -> Ranking:
    ranked = _ranked(state.totals("cost", {}, [key], start, upto))
    rest = ranked[TOP_SPENDERS:]
    return Ranking(key, ranked[:TOP_SPENDERS], len(rest), sum(item.amount for item in rest))


# ── budgets ───────────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class _Window:
    """A budget rule's period around the report's moment, and how far it is read."""

    start: float
    end: float
    upto: float
    running: bool
    line_end: float
    """Where the spend line stops: now while the period runs, else its end."""

    @property
    def first_hour(self) -> float:
        """The first whole UTC hour of the period (its start in most zones)."""
        return min(self.upto, float(math.ceil(self.start / HOUR_S) * HOUR_S))

    @classmethod
    def of(cls, rule: BudgetRule, request: ReportRequest) -> _Window:
        start, end = period_bounds(request.at, rule.period, rule.timezone)
        upto = _reach(start, end, request.now)
        running = start <= request.now < end
        return cls(start, end, upto, running, min(upto, request.now) if running else end)


@dataclass(frozen=True)
class _HourlySpend:
    """Hourly spend per combination of every dimension the budget rules match or group on.

    Read with one ``series`` call for all budget rules of a basis (net or gross), then
    narrowed to each rule, so the report's cost does not grow with the number of budget rules.
    """

    dimensions: tuple[str, ...]
    cells: Mapping[Group, Mapping[int, int]]

    @classmethod
    def read(cls, state: SpendReader, windows: Sequence[tuple[BudgetRule, _Window]],
             measure: Measure) -> _HourlySpend:
        dimensions = tuple(sorted({key for rule, _ in windows
                                   for key in (*rule.match, *rule.group_by)}))
        start = min((window.first_hour for _, window in windows), default=0.0)
        end = max((window.upto for _, window in windows), default=0.0)
        if end <= start:
            return cls(dimensions, {})
        return cls(dimensions, state.series(measure, {}, dimensions, start, end, step=HOUR_S))

    def of(self, rule: BudgetRule, window: _Window) -> dict[Group, dict[int, int]]:
        """The rule's groups' spend per whole hour of its window (the series is read to the
        latest end of all rules: an hour past this one's is another rule's)."""
        out: dict[Group, dict[int, int]] = {}
        for cell, hours in self.cells.items():
            values = dict(zip(self.dimensions, cell, strict=True))
            if not matches(rule.match, values):
                continue
            target = out.setdefault(group_of(rule.group_by, values), {})
            for hour, amount in hours.items():
                if window.first_hour <= hour and hour + HOUR_S <= window.upto:
                    target[hour] = target.get(hour, 0) + amount
        return out


def budget_charts(state: SpendReader, rules: RuleSet, book: AlertBook,
                  request: ReportRequest, hourly: bool = True) -> tuple[BudgetChart, ...]:
    """Every budget rule over its period holding the request's moment. Without ``hourly``
    each group's spend is only its total so far (no points between): what the budget gauges
    and ``/api/v1/budgets`` without ``points`` need, read without the period's hours."""
    windows = [(rule, _Window.of(rule, request)) for rule in rules
               if isinstance(rule, BudgetRule)]
    spend = {measure: _HourlySpend.read(state, [w for w in windows if w[0].measure == measure],
                                        measure)
             for measure in {rule.measure for rule, _ in windows}} if hourly else {}
    return tuple(_budget_chart(state, spend.get(rule.measure), rule, window, book, request.now)
                 for rule, window in windows)


def _budget_chart(state: SpendReader, hourly: _HourlySpend | None, rule: BudgetRule,
                  window: _Window, book: AlertBook, now: float) -> BudgetChart:
    spent = state.totals(rule.measure, rule.match, rule.group_by, window.start, window.upto)
    lines = _cumulative(state, rule, window, hourly.of(rule, window), spent) if hourly else {}
    rates = _burn_rates(state, rule, window.start, now) if window.running else {}
    groups = tuple(
        BudgetGroup(
            labels=dict(zip(rule.group_by, group, strict=True)),
            points=lines.get(group, ((window.start, 0),)),
            spent=spent[group],
            projection=_projection(rule, spent[group], rates.get(group), now, window.end),
            alert=_alert_state(book, rule, group),
        )
        for group in sorted(spent, key=lambda g: (-spent[g], g))
    )
    return BudgetChart(
        rule=rule.name, span=Span(window.start, window.end, rule.period, rule.timezone),
        lines=tuple(BudgetLine(line.name, line.value) for line in rule.budget_lines()),
        groups=groups, match=dict(rule.match), group_by=tuple(rule.group_by),
        now=now if window.running else None,
    )


def _cumulative(state: SpendReader, rule: BudgetRule, window: _Window,
                hours: Mapping[Group, Mapping[int, int]], spent: Mapping[Group, int]
                ) -> dict[Group, tuple[tuple[float, int], ...]]:
    """Each group's spend so far at the start and at the end of every hour of the period,
    ending at ``spent`` (the group's total over the period as far as it is read).

    Hours are UTC hours; a period that starts off the hour (a zone offset of :30 or :45)
    reads the part before its first whole hour as one total, and the part after its last
    whole hour (such a period's end, or the hour now is in) is what ``spent`` holds beyond the
    whole hours.
    """
    first_hour = window.first_hour
    head = state.totals(rule.measure, rule.match, rule.group_by, window.start, first_hour) \
        if first_hour > window.start else {}
    last_hour = max(first_hour, float(int(window.upto // HOUR_S) * HOUR_S))
    grid = range(int(first_hour), int(last_hour), HOUR_S)
    out = {}
    for group in set(head) | set(hours) | set(spent):
        running = head.get(group, 0)
        points = [(window.start, 0)]
        if first_hour > window.start:
            points.append((first_hour, running))
        for hour in grid:
            running += hours.get(group, {}).get(hour, 0)
            points.append((min(float(hour + HOUR_S), window.line_end), running))
        if window.upto > last_hour:
            points.append((window.line_end, spent.get(group, running)))
        out[group] = tuple(points)
    return out


def _burn_rates(state: SpendReader, rule: BudgetRule, start: float, now: float
                ) -> dict[Group, Decimal]:
    """Spend per second over the recent complete buckets: the rate the rule's forecast uses."""
    rate_end = align_down(now)
    rate_start = max(start, rate_end - FORECAST_WINDOW_S)
    seconds = int(rate_end - rate_start)
    if seconds < FORECAST_MIN_HISTORY_S:
        return {}
    recent = state.totals(rule.measure, rule.match, rule.group_by, rate_start, rate_end)
    return {group: Decimal(total) / seconds for group, total in recent.items()}


def _projection(rule: BudgetRule, spent: int, rate: Decimal | None, now: float, end: float
                ) -> Projection | None:
    """Spend at the period end if the recent rate holds, and when it crosses the budget line."""
    if rate is None or rate <= 0:
        return None
    projected = spent + int(rate * Decimal(end - now))
    crosses_at = None
    if spent < rule.limit <= projected:
        crosses_at = now + float((rule.limit - spent) / rate)
    return Projection(now, projected, crosses_at)


def _alert_state(book: AlertBook, rule: BudgetRule, group: Group) -> str:
    alert = book.alerts.get(alert_id(rule.name, dict(zip(rule.group_by, group, strict=True))))
    if alert is None:
        return ""
    muted = " (silenced)" if alert.mute is not None else ""
    return f"{alert.state}: {alert.payload.get('line', '?')}{muted}"


# ── reclamation ───────────────────────────────────────────────────────────────────────────


def releases(actions: Iterable[Mapping[str, Any]], prices: PriceBook, start: float,
             end: float) -> tuple[Release, ...]:
    """Releases in [start, end), oldest first: the executed ones, and the dry runs' (a
    ``skipped`` step with the ``would_save`` of a release it did not make).

    Idle hours reclaimed = ``saved`` ÷ the resource's hourly cost (its type's price per
    unit-hour × its ``units`` tag), the hours ``saved`` was counted for; unknown when the
    price book does not price the type by the hour.
    """
    found = []
    for record in actions:
        dry_run = record.get("step") == "skipped" and "would_save" in record
        if record.get("step") != "executed" and not dry_run:
            continue
        try:
            at = parse_time(str(record.get("at", "")))
            amount = record.get("would_save" if dry_run else "saved", "0")
            saved = to_micro(Decimal(str(amount)))
        except (ValueError, InvalidOperation):
            continue
        if start <= at < end:
            found.append(_release(record, at, saved, prices, dry_run))
    return tuple(sorted(found, key=lambda r: (r.at, r.resource_id)))


def _release(record: Mapping[str, Any], at: float, saved: int, prices: PriceBook,
             dry_run: bool) -> Release:
    hourly = hourly_cost(prices, str(record.get("resource_type", "")),
                         dict(record.get("tags") or {}))
    hours = Decimal(saved) / Decimal(hourly) if hourly else None
    return Release(at=at, rule=str(record.get("rule", "?")),
                   resource_id=str(record.get("resource_id", "?")), hours=hours, saved=saved,
                   dry_run=dry_run)


def active_alerts(book: AlertBook) -> tuple[ActiveAlert, ...]:
    """Every alert pending or firing, firing first, then by rule and group."""
    from costline.streams.cli.alerts_cmd import alert_unit

    found = []
    for alert in book.active():
        payload = alert.payload
        found.append(ActiveAlert(
            rule=alert.rule, kind=str(payload.get("kind") or ""),
            labels=dict(payload.get("group") or {}), state=alert.state, since=alert.since,
            value=_decimal(payload.get("value")), threshold=_decimal(payload.get("threshold")),
            line=str(payload.get("line") or ""), unit=alert_unit(payload),
            muted=_muted(alert.mute.by, alert.mute.until) if alert.mute else ""))
    return tuple(sorted(found, key=lambda a: (a.state != "firing", a.rule,
                                              sorted(a.labels.items()))))


def _muted(by: str, until: float) -> str:
    how = "silenced" if by.startswith("silence:") else "muted by a fault"
    return f"{how} until {rfc3339(until)}"


def _decimal(value: Any) -> Decimal | None:
    try:
        return Decimal(str(value)) if value is not None else None
    except InvalidOperation:
        return None


# ── the sources of a running installation ─────────────────────────────────────────────────


def gather(settings: Settings, request: ReportRequest) -> Report:
    """Read everything for ``request`` from the namespace ``settings`` name.

    Raises ``costline.rules.loader.RulesInvalid`` for a rule set that does not load and
    one of ``costline.connectors.redis_client.FAILURES`` when Redis does not answer.
    """
    from costline.connectors.alert_store import AlertStore
    from costline.connectors.plugins import PLUGINS
    from costline.connectors.redis_client import connect, connect_async
    from costline.connectors.redis_state import RedisState
    from costline.rules.loader import load_rules

    rules = load_rules([settings.rules], settings.timezone, plugins=PLUGINS)
    redis = connect(settings.redis_url, timeout_s=30)
    try:
        sources = Sources(
            state=RedisState(redis, settings.namespace, settings.timezone),
            rules=rules,
            alerts=AlertStore(redis, settings.namespace).book(),
            actions=asyncio.run(_action_history(connect_async(settings.redis_url, timeout_s=30),
                                                settings.namespace)),
            prices=PriceBook.load(settings.prices),
            namespace=settings.namespace,
        )
        return build_report(sources, request)
    finally:
        redis.close()


async def _action_history(redis: AsyncRedisClient, namespace: str) -> list[dict[str, Any]]:
    from costline.connectors.reclaim_ledger import RedisReclaimLedger

    try:
        return await RedisReclaimLedger(redis, namespace).history(ACTIONS_READ)
    finally:
        await redis.aclose()
