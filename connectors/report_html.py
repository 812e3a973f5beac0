"""The spend report as one self-contained HTML page: inline CSS, inline SVG, no scripts.

``render(report)`` turns the data gathered by ``costline.streams.cli.report`` into a page that
opens from
disk, prints, and can be mailed as an attachment: nothing is fetched (a Content-Security-Policy
forbids it), nothing runs. Every chart is an ``<svg role="img">`` with a ``<title>`` and an
``aria-label``, followed by a ``<details>`` table of the same figures for screen readers and
for copying. Amounts are shown as people read currency (``$1,804.92``, ``rules.money``); the
exact six-place figures are ``costline spend --json``'s.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from html import escape
from zoneinfo import ZoneInfo

from costline.rules.durations import rfc3339
from costline.rules.money import figure_in, money_micro

TOP_SPENDERS = 10
"""Bars per top-spender chart; the rest is summed into one table row."""
MAX_BUDGET_SERIES = 8
"""Groups drawn per budget chart (highest spend first); the table lists every group."""
LABEL_CHARS = 30
"""Longest bar label drawn in a chart; the full text is in the bar's tooltip and the table."""
NO_VALUE = "(none)"
SMALL_SHARE = 0.01
"""A group whose spend is under this share of its budget chart's height is a flat line at the
bottom: the chart says so and names it."""

PALETTE = ("#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#7f3c8d", "#3b3b3b",
           "#a6761d")
"""Series colours (Okabe-Ito based): distinguishable with the common colour-vision deficiencies."""


# ── the data a report shows ───────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Span:
    """A calendar period: [start, end) Unix seconds, its kind, and the zone it is counted in."""

    start: float
    end: float
    kind: str
    zone: str


@dataclass(frozen=True)
class BudgetLine:
    """A warning line (``warn_80``) or the budget line (``limit``), micro-units."""

    name: str
    amount: int


@dataclass(frozen=True)
class Projection:
    """Spend projected from ``at`` to the period end at the recent burn rate."""

    at: float
    value: int
    crosses_at: float | None = None


@dataclass(frozen=True)
class BudgetGroup:
    """One group of a budget rule: its cumulative spend over the period so far."""

    labels: Mapping[str, str]
    points: tuple[tuple[float, int], ...]
    spent: int
    projection: Projection | None = None
    alert: str = ""


@dataclass(frozen=True)
class BudgetChart:
    """A budget rule over its own period; ``groups`` highest spend first."""

    rule: str
    span: Span
    lines: tuple[BudgetLine, ...]
    groups: tuple[BudgetGroup, ...]
    match: Mapping[str, str]
    group_by: tuple[str, ...]
    now: float | None = None
    """Where the spend line stops while the period is running; ``None`` once it is over."""


@dataclass(frozen=True)
class Amount:
    """A labelled amount of money, micro-units."""

    label: str
    amount: int


@dataclass(frozen=True)
class Ranking:
    """The biggest spenders by one key; ``rest_*`` sum the groups beyond ``top``."""

    key: str
    top: tuple[Amount, ...]
    rest_count: int = 0
    rest_amount: int = 0


@dataclass(frozen=True)
class Release:
    """A reclamation that ran: when, by which rule, what, the idle hours and money saved; a
    dry run's touched nothing, and ``saved`` is what it would have saved."""

    at: float
    rule: str
    resource_id: str
    hours: Decimal | None
    saved: int
    dry_run: bool = False


@dataclass(frozen=True)
class ActiveAlert:
    """An alert pending or firing as the report is made, of any rule kind."""

    rule: str
    kind: str
    labels: Mapping[str, str]
    state: str
    since: float
    value: Decimal | None
    threshold: Decimal | None
    line: str
    unit: str = "currency"
    """What ``value`` and ``threshold`` measure (``currency``, ``fraction``, ``gb_hour``…)."""
    muted: str = ""
    """``silenced until …`` or ``muted by a fault until …`` when notifications are held."""


@dataclass(frozen=True)
class Totals:
    """Spend and waste of the period; spend split by the price book's billing."""

    spend: int
    waste: int
    fixed: int
    elastic: int


@dataclass(frozen=True)
class Report:
    namespace: str
    currency: str
    span: Span
    generated_at: float
    totals: Totals
    budgets: tuple[BudgetChart, ...] = ()
    waste: tuple[Amount, ...] = ()
    spenders: tuple[Ranking, ...] = ()
    releases: tuple[Release, ...] = ()
    alerts: tuple[ActiveAlert, ...] = ()


# ── the page ──────────────────────────────────────────────────────────────────────────────


def render(report: Report) -> str:
    """The whole page as one HTML string."""
    body = "".join((
        _header(report),
        "<main>",
        _alerts_section(report),
        _budget_section(report),
        _waste_section(report),
        _spenders_section(report),
        _reclaim_section(report),
        "</main>",
        _tag("footer", {}, _text(f"costline · namespace {report.namespace} · generated "
                                 f"{_utc(report.generated_at)}")),
    ))
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "style-src 'unsafe-inline'\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<title>{_text(_page_title(report))}</title><style>{STYLE}</style></head>"
        f"<body>{body}</body></html>\n"
    )


def _page_title(report: Report) -> str:
    return f"Spend report · {report.span.kind} from {_day(report.span.start, report.span.zone)}"


def _header(report: Report) -> str:
    span = report.span
    meta = (f"{span.kind.capitalize()} {_local(span.start, span.zone)} → "
            f"{_local(span.end, span.zone)} ({span.zone}) · currency {report.currency} · "
            f"generated {_utc(report.generated_at)}")
    return _tag("header", {}, "".join((
        _tag("h1", {}, _text(_page_title(report))),
        _tag("p", {"class": "meta"}, _text(meta)),
        _totals(report.totals, report.currency),
    )))


def _totals(totals: Totals, currency: str) -> str:
    cards = (
        ("Spend", _money(totals.spend, currency), ""),
        ("Waste", _money(totals.waste, currency), f"{_share(totals.waste, totals.spend)} of spend"),
        ("Fixed", _money(totals.fixed, currency), f"{_share(totals.fixed, totals.spend)} of spend"),
        ("Elastic", _money(totals.elastic, currency),
         f"{_share(totals.elastic, totals.spend)} of spend"),
    )
    items = "".join(
        _tag("div", {"class": "card"}, _tag("dt", {}, _text(name)) + _tag(
            "dd", {}, _text(value) + (_tag("small", {}, _text(note)) if note else "")))
        for name, value, note in cards
    )
    return _tag("dl", {"class": "totals"}, items)


def _section(anchor: str, heading: str, body: str) -> str:
    return _tag("section", {"id": anchor, "aria-labelledby": f"{anchor}-h"},
                _tag("h2", {"id": f"{anchor}-h"}, _text(heading)) + body)


# ── alerts now ────────────────────────────────────────────────────────────────────────────


def _alerts_section(report: Report) -> str:
    """Every alert pending or firing, of every kind, in the open: an idle GPU or a log
    explosion has no chart of its own, and a budget's state should not need a click."""
    heading = "Alerts now"
    if not report.alerts:
        return _section("alerts", heading, _none("No alert is pending or firing."))
    head = ("state", "rule", "group", "figure", "line", "since")
    rows = [(_alert_state(alert), alert.rule, _group_label(alert.labels),
             _alert_figure(alert, alert.value, report.currency),
             f"{alert.line} {_alert_figure(alert, alert.threshold, report.currency)}".strip(),
             _utc(alert.since))
            for alert in report.alerts]
    return _section("alerts", heading, _table(head, rows))


def _alert_state(alert: ActiveAlert) -> str:
    return f"{alert.state}, {alert.muted}" if alert.muted else alert.state


def _alert_figure(alert: ActiveAlert, amount: Decimal | None, currency: str) -> str:
    if amount is None:
        return ""
    return figure_in(amount, alert.unit or "currency", currency)


# ── (1) budgets ───────────────────────────────────────────────────────────────────────────


def _budget_section(report: Report) -> str:
    if not report.budgets:
        body = _none("No budget rules are loaded.")
    else:
        body = "".join(_budget_figure(chart, report.currency) for chart in report.budgets)
    return _section("budgets", "Spend against budgets", body)


def _budget_figure(chart: BudgetChart, currency: str) -> str:
    span = chart.span
    caption = (f"{chart.rule}: {span.kind} {_local(span.start, span.zone)} → "
               f"{_local(span.end, span.zone)} ({span.zone}) · "
               f"{_selection(chart.match, chart.group_by)}")
    if not chart.groups:
        return _figure(caption, _none("No spend matches this rule in the period."))
    drawn = chart.groups[:MAX_BUDGET_SERIES]
    notes = []
    if len(chart.groups) > len(drawn):
        notes.append(f"Showing the {len(drawn)} groups with the highest spend; all "
                     f"{len(chart.groups)} are in the table.")
    plot = _budget_plot(chart, drawn)
    small = [group for group in drawn if _units(group.spent) < plot.y1 * SMALL_SHARE]
    if small:
        names = ", ".join(f"{_group_label(group.labels)} ({money_micro(group.spent, currency)})"
                          for group in small)
        notes.append(f"Too small to see against this chart's scale (to "
                     f"{_compact(plot.y1)} {currency}), drawn along its foot: {names}.")
    return _figure(caption, "".join((
        _budget_svg(chart, drawn, currency),
        _legend(drawn),
        "".join(_tag("p", {"class": "note"}, _text(note)) for note in notes),
        _budget_table(chart, currency),
    )))


def _selection(match: Mapping[str, str], group_by: Sequence[str]) -> str:
    where = ", ".join(f"{key}={value}" for key, value in match.items()) or "all spend"
    per = f" per {', '.join(group_by)}" if group_by else ""
    return f"{where}{per}"


@dataclass(frozen=True)
class _Plot:
    """Where a chart's data area is inside its view box, and how values map onto it."""

    width: float
    height: float
    left: float
    right: float
    top: float
    bottom: float
    x0: float
    x1: float
    y1: float

    @property
    def inner_width(self) -> float:
        return self.width - self.left - self.right

    @property
    def inner_height(self) -> float:
        return self.height - self.top - self.bottom

    def x(self, value: float) -> float:
        span = self.x1 - self.x0 or 1.0
        return self.left + (value - self.x0) / span * self.inner_width

    def y(self, value: float) -> float:
        return self.top + self.inner_height - value / (self.y1 or 1.0) * self.inner_height


def _budget_plot(chart: BudgetChart, drawn: Sequence[BudgetGroup]) -> _Plot:
    highest = max(
        [line.amount for line in chart.lines]
        + [group.spent for group in drawn]
        + [group.projection.value for group in drawn if group.projection is not None]
    )
    step = _nice_step(_units(highest) * 1.05)
    top = step * max(1, math.ceil(_units(highest) * 1.05 / step))
    return _Plot(width=760, height=320, left=64, right=16, top=14, bottom=36,
                 x0=chart.span.start, x1=chart.span.end, y1=top)


def _budget_svg(chart: BudgetChart, drawn: Sequence[BudgetGroup], currency: str) -> str:
    plot = _budget_plot(chart, drawn)
    forecasts = any(group.projection is not None for group in drawn)
    title = (f"Cumulative spend of {chart.rule} per group against its warning and budget "
             f"lines, {currency}" + ("; dashed: forecast to the period end" if forecasts
                                     else ""))
    parts = [
        _y_axis(plot, currency),
        _time_axis(plot, chart.span),
        *(_budget_line(plot, line, currency) for line in chart.lines),
        _now_marker(plot, chart.now),
    ]
    for index, group in enumerate(drawn):
        colour = PALETTE[index % len(PALETTE)]
        parts.append(_spend_path(plot, group, colour, currency))
        parts.append(_forecast_path(plot, group, colour, currency))
    return _svg(plot.width, plot.height, title, "".join(parts), "budget")


def _spend_path(plot: _Plot, group: BudgetGroup, colour: str, currency: str) -> str:
    points = _without_flat_interior(group.points)
    if not points:
        return ""
    if len(points) == 1:
        points = (*points, points[0])
    d = "M" + " L".join(f"{plot.x(t):.1f},{plot.y(_units(v)):.1f}" for t, v in points)
    tip = f"{_group_label(group.labels)}: {_money(group.spent, currency)} so far"
    return _tag("path", {"class": "series", "d": d, "stroke": colour},
                _tag("title", {}, _text(tip)))


def _forecast_path(plot: _Plot, group: BudgetGroup, colour: str, currency: str) -> str:
    projection = group.projection
    if projection is None:
        return ""
    start = f"{plot.x(projection.at):.1f},{plot.y(_units(group.spent)):.1f}"
    end = f"{plot.x(plot.x1):.1f},{plot.y(_units(projection.value)):.1f}"
    tip = (f"{_group_label(group.labels)}: forecast {_money(projection.value, currency)} "
           "at the period end")
    return _tag("path", {"class": "forecast", "d": f"M{start} L{end}", "stroke": colour},
                _tag("title", {}, _text(tip)))


def _without_flat_interior(points: Sequence[tuple[float, int]]) -> tuple[tuple[float, int], ...]:
    """Drop points inside a run of equal values: the drawn line is the same, the file smaller."""
    kept = [
        point for index, point in enumerate(points)
        if index in (0, len(points) - 1)
        or not (points[index - 1][1] == point[1] == points[index + 1][1])
    ]
    return tuple(kept)


def _budget_line(plot: _Plot, line: BudgetLine, currency: str) -> str:
    y = plot.y(_units(line.amount))
    kind = "limit" if line.name == "limit" else "warn"
    label = f"{_line_words(line.name)} {_compact(_units(line.amount))}"
    return (
        _tag("line", {"class": f"rule-line {kind}", "x1": f"{plot.left:.1f}",
                      "x2": f"{plot.width - plot.right:.1f}", "y1": f"{y:.1f}", "y2": f"{y:.1f}"},
             _tag("title", {}, _text(f"{_line_words(line.name)}: {_money(line.amount, currency)}")))
        + _tag("text", {"class": f"line-label {kind}", "x": f"{plot.left + 6:.1f}",
                        "y": f"{y - 4:.1f}"}, _text(label))
    )


def _line_words(name: str) -> str:
    if name == "limit":
        return "budget"
    return f"{name.removeprefix('warn_')}% warning"


def _now_marker(plot: _Plot, now: float | None) -> str:
    if now is None or not plot.x0 <= now <= plot.x1:
        return ""
    x = f"{plot.x(now):.1f}"
    return (_tag("line", {"class": "now", "x1": x, "x2": x, "y1": f"{plot.top:.1f}",
                          "y2": f"{plot.height - plot.bottom:.1f}"})
            + _tag("text", {"class": "tick", "x": x, "y": f"{plot.top - 3:.1f}",
                            "text-anchor": "middle"}, "now"))


def _y_axis(plot: _Plot, currency: str) -> str:
    step = _nice_step(plot.y1)
    parts = []
    for index in range(int(round(plot.y1 / step)) + 1):
        value = index * step
        y = f"{plot.y(value):.1f}"
        parts.append(_tag("line", {"class": "grid", "x1": f"{plot.left:.1f}",
                                   "x2": f"{plot.width - plot.right:.1f}", "y1": y, "y2": y}))
        parts.append(_tag("text", {"class": "tick", "x": f"{plot.left - 6:.1f}", "y": y,
                                   "dy": "0.32em", "text-anchor": "end"}, _text(_compact(value))))
    parts.append(_tag("text", {"class": "tick", "x": "4", "y": f"{plot.top - 3:.1f}"},
                      _text(currency)))
    return "".join(parts)


def _time_axis(plot: _Plot, span: Span) -> str:
    baseline = f"{plot.height - plot.bottom:.1f}"
    parts = [_tag("line", {"class": "axis", "x1": f"{plot.left:.1f}",
                           "x2": f"{plot.width - plot.right:.1f}", "y1": baseline,
                           "y2": baseline})]
    for moment, label in time_ticks(span):
        x = f"{plot.x(moment):.1f}"
        parts.append(_tag("line", {"class": "axis", "x1": x, "x2": x, "y1": baseline,
                                   "y2": f"{plot.height - plot.bottom + 4:.1f}"}))
        parts.append(_tag("text", {"class": "tick", "x": x, "y": f"{plot.height - 12:.1f}",
                                   "text-anchor": "middle"}, _text(label)))
    return "".join(parts)


def time_ticks(span: Span) -> list[tuple[float, str]]:
    """Tick marks of a period in its own zone: 3-hourly for a day, daily for a week, every
    fifth day of a month."""
    tz = ZoneInfo(span.zone)
    first = datetime.fromtimestamp(span.start, tz).date()
    last = datetime.fromtimestamp(span.end, tz).date()
    if span.end - span.start <= 2 * 86400:
        moments = [datetime.combine(first, time(hour), tz) for hour in range(0, 24, 3)]
        return [(m.timestamp(), m.strftime("%H:%M")) for m in moments]
    days = [first + timedelta(days=n) for n in range((last - first).days)]
    if span.end - span.start <= 8 * 86400:
        return [(_midnight(day, tz), day.strftime("%a %d")) for day in days]
    return [(_midnight(day, tz), day.strftime("%b %d")) for day in days if day.day % 5 == 1]


def _midnight(day: date, tz: ZoneInfo) -> float:
    return datetime.combine(day, time(), tz).timestamp()


def _legend(drawn: Sequence[BudgetGroup]) -> str:
    """One entry per drawn group with its alert state in words (``firing: warn_80``), and the
    forecast's dash only when a forecast is drawn."""
    items = [
        _tag("li", {}, _tag("span", {"class": "swatch", "style": f"background:{colour}"}, "")
             + _text(_group_label(group.labels))
             + (_tag("strong", {"class": "state"}, _text(f" · {group.alert}"))
                if group.alert else ""))
        for group, colour in zip(drawn, PALETTE, strict=False)
    ]
    if any(group.projection is not None for group in drawn):
        items.append(_tag("li", {}, _tag("span", {"class": "swatch dashed"}, "")
                          + _text("forecast to the period end")))
    return _tag("ul", {"class": "legend"}, "".join(items))


def _budget_table(chart: BudgetChart, currency: str) -> str:
    lines = " · ".join(f"{_line_words(line.name)} {_money(line.amount, currency)}"
                       for line in chart.lines)
    limit = chart.lines[-1].amount if chart.lines else 0
    head = ("group", "spent", "of budget", "forecast at period end", "crosses the budget line",
            "alert")
    rows = [
        (_group_label(group.labels), _money(group.spent, currency), _share(group.spent, limit),
         _money(group.projection.value, currency) if group.projection else "—",
         _utc(group.projection.crosses_at) if group.projection and
         group.projection.crosses_at is not None else "—",
         group.alert or "—")
        for group in chart.groups
    ]
    return _details(f"{chart.rule} data", lines, head, rows)


# ── (2) waste ─────────────────────────────────────────────────────────────────────────────


def _waste_section(report: Report) -> str:
    spend = report.totals.spend
    if not report.waste:
        return _section("waste", "Waste by fault type", _none("No fault waste in this period."))
    bars = [_Bar(item.label, item.amount, f"{_share(item.amount, spend)} of spend")
            for item in report.waste]
    title = f"Waste by fault type, {report.currency}, with its share of spend"
    head = ("fault", "waste", "share of spend")
    rows = [(item.label, _money(item.amount, report.currency), _share(item.amount, spend))
            for item in report.waste]
    total = _money(report.totals.waste, report.currency)
    intro = _tag("p", {}, _text(
        f"{total} of work redone or waited for after faults: "
        f"{_share(report.totals.waste, spend)} of the period's spend."))
    return _section("waste", "Waste by fault type", intro + _figure(title, _bars_svg(
        title, bars, report.currency, "waste") + _details("Waste data", "", head, rows)))


# ── (3) top spenders ──────────────────────────────────────────────────────────────────────


def _spenders_section(report: Report) -> str:
    if not report.spenders:
        return _section("spenders", "Top spenders", _none("No grouping keys were asked for."))
    body = "".join(_ranking_figure(ranking, report) for ranking in report.spenders)
    return _section("spenders", "Top spenders", body)


def _ranking_figure(ranking: Ranking, report: Report) -> str:
    title = f"Top {TOP_SPENDERS} spenders by {ranking.key}, {report.currency}"
    if not ranking.top:
        return _figure(title, _none("No spend in this period."))
    spend = report.totals.spend
    bars = [_Bar(item.label or f"(no {ranking.key})", item.amount, _share(item.amount, spend))
            for item in ranking.top]
    head = (ranking.key, "spend", "share of spend")
    rows = [(bar.label, _money(bar.amount, report.currency), bar.note) for bar in bars]
    if ranking.rest_count:
        rows.append((f"{ranking.rest_count} more", _money(ranking.rest_amount, report.currency),
                     _share(ranking.rest_amount, spend)))
    return _figure(title, _bars_svg(title, bars, report.currency, "spenders")
                   + _details(f"Spend by {ranking.key}", "", head, rows))


# ── (4) reclamation ───────────────────────────────────────────────────────────────────────


def _reclaim_section(report: Report) -> str:
    heading = "Idle resources reclaimed"
    releases = report.releases
    if not releases:
        return _section("reclaimed", heading, _none(
            "None yet: no idle resource was released in this period, not even as a dry run."))
    currency = report.currency
    done = [r for r in releases if not r.dry_run]
    dry = [r for r in releases if r.dry_run]
    said = []
    if done:
        said.append(f"{len(done)} release(s), {_hours(_idle_hours(done))} idle hours "
                    f"reclaimed, {_money(sum(r.saved for r in done), currency)} saved.")
    if dry:
        said.append(f"{len(dry)} dry-run release(s) would have reclaimed "
                    f"{_hours(_idle_hours(dry))} idle hours and saved "
                    f"{_money(sum(r.saved for r in dry), currency)}; nothing was touched "
                    "(mode: dry_run).")
    intro = _tag("p", {}, _text(" ".join(said)))
    bars = _saved_by_rule(releases)
    title = (f"Money saved by reclamation per rule (dry runs: what they would have saved), "
             f"{currency}")
    head = ("at", "rule", "resource", "how", "idle hours", "saved")
    rows = [(_utc(r.at), r.rule, r.resource_id, "dry run" if r.dry_run else "released",
             _hours(r.hours) if r.hours is not None else "—",
             f"{_money(r.saved, currency)}{' (would have)' if r.dry_run else ''}")
            for r in releases]
    return _section("reclaimed", heading, intro + _figure(title, _bars_svg(
        title, bars, currency, "saved") + _details("Releases", "", head, rows)))


def _idle_hours(releases: Iterable[Release]) -> Decimal:
    return sum((r.hours for r in releases if r.hours is not None), Decimal(0))


def _saved_by_rule(releases: Iterable[Release]) -> list[_Bar]:
    saved: dict[str, int] = {}
    hours: dict[str, Decimal] = {}
    for release in releases:
        rule = f"{release.rule} (dry run)" if release.dry_run else release.rule
        saved[rule] = saved.get(rule, 0) + release.saved
        hours[rule] = hours.get(rule, Decimal(0)) + (release.hours or 0)
    ranked = sorted(saved, key=lambda rule: (-saved[rule], rule))
    return [_Bar(rule, saved[rule], f"{_hours(hours[rule])} h") for rule in ranked]


# ── bar charts ────────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class _Bar:
    label: str
    amount: int
    note: str = ""


BAR_ROW = 26
BAR_LABELS = 210
BAR_VALUES = 250


def _bars_svg(title: str, bars: Sequence[_Bar], currency: str, kind: str) -> str:
    width = 760
    height = BAR_ROW * len(bars) + 8
    room = width - BAR_LABELS - BAR_VALUES
    highest = max((bar.amount for bar in bars), default=0) or 1
    rows = [_bar_row(index, bar, room * max(bar.amount, 0) / highest, currency)
            for index, bar in enumerate(bars)]
    return _svg(width, height, title, "".join(rows), kind)


def _bar_row(index: int, bar: _Bar, length: float, currency: str) -> str:
    y = 4 + index * BAR_ROW
    middle = f"{y + BAR_ROW / 2 - 2:.1f}"
    value = _money(bar.amount, currency) + (f" ({bar.note})" if bar.note else "")
    tip = f"{bar.label}: {value}"
    return "".join((
        _tag("text", {"class": "bar-label", "x": str(BAR_LABELS - 8), "y": middle,
                      "dy": "0.32em", "text-anchor": "end"}, _text(_shortened(bar.label))),
        _tag("rect", {"class": "bar", "x": str(BAR_LABELS), "y": f"{y:.1f}",
                      "width": f"{max(length, 1.0):.1f}", "height": str(BAR_ROW - 8)},
             _tag("title", {}, _text(tip))),
        _tag("text", {"class": "bar-value", "x": f"{BAR_LABELS + length + 6:.1f}", "y": middle,
                      "dy": "0.32em"}, _text(value)),
    ))


def _shortened(label: str) -> str:
    return label if len(label) <= LABEL_CHARS else label[: LABEL_CHARS - 1] + "…"


# ── shared pieces ─────────────────────────────────────────────────────────────────────────


def _svg(width: float, height: float, title: str, body: str, kind: str) -> str:
    return _tag(
        "svg",
        {"class": f"chart {kind}", "role": "img", "aria-label": title,
         "viewBox": f"0 0 {width:g} {height:g}", "width": f"{width:g}",
         "preserveAspectRatio": "xMinYMin meet"},
        _tag("title", {}, _text(title)) + body,
    )


def _figure(caption: str, body: str) -> str:
    return _tag("figure", {}, _tag("figcaption", {}, _text(caption)) + body)


def _details(summary: str, note: str, head: Sequence[str], rows: Iterable[Sequence[str]]
             ) -> str:
    table = _table(head, rows, note)
    return _tag("details", {}, _tag("summary", {}, _text(f"{summary} (table)")) + table)


def _table(head: Sequence[str], rows: Iterable[Sequence[str]], note: str = "") -> str:
    header = _tag("tr", {}, "".join(_tag("th", {"scope": "col"}, _text(h)) for h in head))
    body = "".join(
        _tag("tr", {}, "".join(_tag("td", {}, _text(cell)) for cell in row)) for row in rows
    )
    caption = _tag("caption", {}, _text(note)) if note else ""
    return _tag("table", {}, caption + _tag("thead", {}, header) + _tag("tbody", {}, body))


def _none(message: str) -> str:
    return _tag("p", {"class": "none"}, _text(message))


def _tag(name: str, attrs: Mapping[str, str], body: str | None = None) -> str:
    """An element; attribute values are escaped here, ``body`` is markup already escaped."""
    rendered = "".join(f' {key}="{escape(value, quote=True)}"' for key, value in attrs.items())
    if body is None:
        return f"<{name}{rendered}/>" if name in _SVG_EMPTY else f"<{name}{rendered}>"
    return f"<{name}{rendered}>{body}</{name}>"


_SVG_EMPTY = frozenset({"line", "rect", "path", "circle"})


def _text(value: str) -> str:
    return escape(value, quote=True)


def _group_label(labels: Mapping[str, str]) -> str:
    if not labels:
        return "all"
    return ", ".join(f"{key}={value or NO_VALUE}" for key, value in labels.items())


def _money(micro: int, currency: str) -> str:
    return money_micro(micro, currency)


def _units(micro: int) -> float:
    """Micro-units as a float, for geometry only: every printed amount is exact."""
    return micro / 1_000_000


def _share(part: int, whole: int) -> str:
    if whole <= 0:
        return "—"
    percent = (Decimal(part) * 100 / Decimal(whole)).quantize(Decimal("0.1"), ROUND_HALF_EVEN)
    return f"{percent}%"


def _hours(hours: Decimal) -> str:
    return str(hours.quantize(Decimal("0.01"), ROUND_HALF_EVEN))


def _nice_step(top: float, count: int = 4) -> float:
    """A round tick step (1, 2, 2.5 or 5 × 10ⁿ) giving about ``count`` intervals up to ``top``."""
    raw = max(top, 1e-6) / count
    magnitude = 10.0 ** math.floor(math.log10(raw))
    for multiple in (1, 2, 2.5, 5, 10):
        if raw <= multiple * magnitude:
            return multiple * magnitude
    return 10 * magnitude


def _compact(value: float) -> str:
    """An axis tick: 250000 → ``250k``, 1500000 → ``1.5M``."""
    for size, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:.4g}{suffix}"
    return f"{value:.4g}"


def _local(ts: float, zone: str) -> str:
    return datetime.fromtimestamp(ts, ZoneInfo(zone)).strftime("%Y-%m-%d %H:%M")


def _day(ts: float, zone: str) -> str:
    return datetime.fromtimestamp(ts, ZoneInfo(zone)).strftime("%Y-%m-%d")


def _utc(ts: float) -> str:
    return rfc3339(ts)


STYLE = """
:root{color-scheme:light;--ink:#1f2328;--muted:#57606a;--rule:#d0d7de;--bg:#fff;--card:#f6f8fa}
*{box-sizing:border-box}
body{margin:0 auto;max-width:1040px;padding:24px 32px 48px;font:15px/1.45 system-ui,-apple-system,
"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;color:var(--ink);background:var(--bg)}
h1{font-size:26px;margin:0 0 4px}h2{font-size:20px;margin:36px 0 8px;padding-bottom:4px;
border-bottom:1px solid var(--rule)}
.meta,.note,footer,figcaption{color:var(--muted)}
.totals{display:grid;grid-template-columns:repeat(auto-fit,minmax(210px,1fr));gap:12px;
margin:16px 0 0}
.card{background:var(--card);border:1px solid var(--rule);border-radius:8px;padding:10px 14px}
.card dt{font-size:13px;color:var(--muted);text-transform:uppercase;letter-spacing:.04em}
.card dd{margin:2px 0 0;font-size:16px;font-weight:600;font-variant-numeric:tabular-nums}
.card small{display:block;font-size:12px;font-weight:400;color:var(--muted)}
figure{margin:16px 0 24px}figcaption{font-size:14px;margin-bottom:6px}
svg.chart{display:block;width:100%;height:auto;max-width:760px;font-size:11px}
.grid{stroke:#eaeef2}.axis{stroke:#8c959f}
.tick{fill:var(--muted)}
.series{fill:none;stroke-width:2.2;stroke-linejoin:round}
.forecast{fill:none;stroke-width:2;stroke-dasharray:7 5;opacity:.85}
.rule-line{stroke-width:1.5}.rule-line.warn{stroke:#bf8700;stroke-dasharray:2 3}
.rule-line.limit{stroke:#cf222e;stroke-width:2}
.line-label{font-weight:600}.line-label.warn{fill:#9a6700}.line-label.limit{fill:#cf222e}
.now{stroke:#8c959f;stroke-dasharray:1 3}
.bar{fill:#0072b2}.waste .bar{fill:#d55e00}.saved .bar{fill:#009e73}
.bar-label{fill:var(--ink)}.bar-value{fill:var(--muted);font-variant-numeric:tabular-nums}
.legend .state{font-weight:600}
.legend{list-style:none;display:flex;flex-wrap:wrap;gap:4px 16px;padding:0;margin:6px 0;
font-size:13px}
.swatch{display:inline-block;width:14px;height:4px;margin-right:6px;vertical-align:middle}
.swatch.dashed{background:repeating-linear-gradient(90deg,#57606a 0 5px,transparent 5px 8px)}
details{margin:6px 0}summary{cursor:pointer;color:var(--muted);font-size:13px}
table{border-collapse:collapse;margin-top:6px;font-size:13px}
caption{text-align:left;color:var(--muted);padding-bottom:4px}
th,td{border-bottom:1px solid var(--rule);padding:3px 10px;text-align:left}
td{font-variant-numeric:tabular-nums}
.none{font-style:italic;color:var(--muted)}
footer{margin-top:40px;font-size:12px}
@media print{body{padding:0}}
"""
