"""The HTML report renderer on hand-made data: structure, labels, amounts for people, every
alert in view, dry runs, escaping."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from decimal import Decimal
from html.parser import HTMLParser

import pytest

from costline.connectors.report_html import (
    LABEL_CHARS,
    MAX_BUDGET_SERIES,
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
    render,
    time_ticks,
)

HOSTILE = '<b>eval & "co"</b>'
NOV_1 = datetime(2026, 11, 1, tzinfo=UTC).timestamp()
DEC_1 = datetime(2026, 12, 1, tzinfo=UTC).timestamp()
NOW = datetime(2026, 11, 20, 12, tzinfo=UTC).timestamp()
HOUR = 3600.0
VOID = {"meta", "br", "hr", "img", "input", "link"}


# ── a small DOM, enough to count what the page holds ──────────────────────────────────────


@dataclass
class Node:
    tag: str
    attrs: dict[str, str]
    parent: Node | None = None
    children: list[Node] = field(default_factory=list)
    text: str = ""

    def all(self, tag: str, cls: str | None = None) -> list[Node]:
        found = []
        for child in self.children:
            if child.tag == tag and (cls is None or cls in child.attrs.get("class", "").split()):
                found.append(child)
            found.extend(child.all(tag, cls))
        return found

    def content(self) -> str:
        return self.text + "".join(child.content() for child in self.children)

    def by_id(self, ident: str) -> Node:
        for node in self.all("section"):
            if node.attrs.get("id") == ident:
                return node
        raise AssertionError(f"no section #{ident}")


class _Builder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {})
        self.open = self.root

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {k: v or "" for k, v in attrs}, self.open)
        self.open.children.append(node)
        if tag not in VOID:
            self.open = node

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.open.children.append(Node(tag, {k: v or "" for k, v in attrs}, self.open))

    def handle_endtag(self, tag: str) -> None:
        assert self.open.tag == tag, f"</{tag}> closes <{self.open.tag}>"
        assert self.open.parent is not None
        self.open = self.open.parent

    def handle_data(self, data: str) -> None:
        self.open.children.append(Node("#text", {}, self.open, text=data))


def dom(page: str) -> Node:
    builder = _Builder()
    builder.feed(page)
    builder.close()
    assert builder.open is builder.root, "unclosed elements"
    return builder.root


# ── hand-made data ────────────────────────────────────────────────────────────────────────


def _points(*hourly: int) -> tuple[tuple[float, int], ...]:
    points, total = [(NOV_1, 0)], 0
    for index, amount in enumerate(hourly):
        total += amount
        points.append((NOV_1 + (index + 1) * HOUR, total))
    return tuple(points)


def _group(team: str, spent: int, projection: Projection | None = None) -> BudgetGroup:
    return BudgetGroup({"team": team}, _points(spent // 2, 0, 0, 0, spent - spent // 2), spent,
                       projection)


LINES = (BudgetLine("warn_50", 125_000_000_000), BudgetLine("warn_80", 200_000_000_000),
         BudgetLine("limit", 250_000_000_000))
MONTH = Span(NOV_1, DEC_1, "month", "UTC")


def _budget(groups: tuple[BudgetGroup, ...], now: float | None = NOW) -> BudgetChart:
    return BudgetChart("team-monthly", MONTH, LINES, groups, {"env": "prod"}, ("team",), now)


def _report(**changes: object) -> Report:
    report = Report(
        namespace="costline",
        currency="USD",
        span=MONTH,
        generated_at=NOW,
        totals=Totals(spend=300_123_456_789, waste=12_000_000_001, fixed=24_600_000_000,
                      elastic=275_523_456_789),
        budgets=(
            _budget((
                _group("pretrain", 230_000_000_000, Projection(NOW, 290_000_000_000, NOW + 9e5)),
                _group("posttrain", 60_000_500_000),
                _group(HOSTILE, 10_123_456_789),
            )),
        ),
        waste=(Amount("silent_data_corruption", 8_499_200_000),
               Amount("node_failure", 2_194_918_400), Amount("comm_timeout", 1_305_881_601)),
        spenders=(
            Ranking("team", (Amount("pretrain", 230_000_000_000), Amount(HOSTILE, 10_123_456_789),
                             Amount("", 1_000_000))),
            Ranking("job", tuple(Amount(f"run-{n}", (20 - n) * 1_000_000_000)
                                 for n in range(10)), rest_count=4, rest_amount=7_000_000),
        ),
        releases=(
            Release(NOW - 7200, "gpu-idle", "slurm/4211", Decimal("10.5"), 26_145_000),
            Release(NOW - 3600, "gpu-idle", "slurm/4212", Decimal("2"), 4_980_000),
            Release(NOW - 600, "k8s-idle", "k8s/ml/deployment/nb-7", None, 0),
        ),
    )
    return replace(report, **changes)  # type: ignore[arg-type]


def _charts(page: Node) -> list[Node]:
    return page.all("svg")


# ── the page as a whole ───────────────────────────────────────────────────────────────────


def test_the_page_is_one_self_contained_document() -> None:
    page = render(_report())
    assert page.startswith("<!DOCTYPE html>")
    lowered = page.lower()
    for reference in ("<script", "http://", "https://", " src=", "url(", "@import", "<link"):
        assert reference not in lowered, reference
    assert "default-src 'none'" in page
    dom(page)  # balanced


def test_one_svg_per_chart_each_with_a_title_an_aria_label_and_a_data_table() -> None:
    root = dom(render(_report()))
    charts = _charts(root)
    # one budget chart, waste, two rankings, money saved by rule
    assert len(charts) == 5
    for chart in charts:
        label = chart.attrs["aria-label"]
        assert chart.attrs["role"] == "img" and label
        assert chart.children[0].tag == "title" and chart.children[0].content() == label
        figure = chart.parent
        assert figure is not None and figure.tag == "figure"
        assert figure.all("details") and figure.all("table"), label


def test_header_shows_period_currency_totals_and_when_it_was_generated() -> None:
    root = dom(render(_report()))
    header = root.all("header")[0].content()
    assert "2026-11-01 00:00 → 2026-12-01 00:00 (UTC)" in header
    assert "currency USD" in header and "generated 2026-11-20T12:00:00Z" in header
    cards = {card.all("dt")[0].content(): card.all("dd")[0].content()
             for card in root.all("div", "card")}
    assert cards["Spend"] == "$300,123.46"
    assert cards["Waste"].startswith("$12,000.00")
    assert cards["Waste"].endswith("4.0% of spend")
    assert cards["Fixed"].startswith("$24,600.00")
    assert cards["Elastic"].startswith("$275,523.46")


# ── budgets ───────────────────────────────────────────────────────────────────────────────


def test_a_budget_chart_has_a_line_per_group_the_rule_lines_and_dashed_forecasts() -> None:
    root = dom(render(_report()))
    chart = root.by_id("budgets").all("svg")[0]
    assert len(chart.all("path", "series")) == 3
    assert len(chart.all("path", "forecast")) == 1
    assert len(chart.all("line", "warn")) == 2 and len(chart.all("line", "limit")) == 1
    labels = [node.content() for node in chart.all("text", "line-label")]
    assert labels == ["50% warning 125k", "80% warning 200k", "budget 250k"]
    tips = [path.all("title")[0].content() for path in chart.all("path", "series")]
    assert tips[0] == "team=pretrain: $230,000.00 so far"
    assert tips[2] == f"team={HOSTILE}: $10,123.46 so far"
    assert "forecast $290,000.00" in chart.all("path", "forecast")[0].content()
    assert len(chart.all("line", "now")) == 1


def test_the_budget_table_lists_every_group_with_its_share_forecast_and_alert() -> None:
    alerting = replace(_group("pretrain", 230_000_000_000,
                              Projection(NOW, 290_000_000_000, NOW + 9e5)),
                       alert="firing: warn_80")
    root = dom(render(_report(budgets=(_budget((alerting,)),))))
    rows = [[cell.content() for cell in row.all("td")]
            for row in root.by_id("budgets").all("tbody")[0].all("tr")]
    assert rows == [["team=pretrain", "$230,000.00", "92.0%", "$290,000.00",
                     "2026-11-30T22:00:00Z", "firing: warn_80"]]
    caption = root.by_id("budgets").all("caption")[0].content()
    assert caption == "50% warning $125,000.00 · 80% warning $200,000.00 · budget $250,000.00"


def test_a_budget_chart_draws_the_biggest_groups_and_tables_them_all() -> None:
    groups = tuple(_group(f"team-{n:02}", (30 - n) * 1_000_000_000) for n in range(12))
    root = dom(render(_report(budgets=(_budget(groups),))))
    section = root.by_id("budgets")
    assert len(section.all("path", "series")) == MAX_BUDGET_SERIES
    assert len(section.all("tbody")[0].all("tr")) == 12
    assert f"Showing the {MAX_BUDGET_SERIES} groups with the highest spend; all 12" in (
        section.content())
    legend = section.all("ul", "legend")[0].all("li")
    assert len(legend) == MAX_BUDGET_SERIES  # no forecast drawn: no forecast in the legend


def test_a_finished_period_has_no_now_marker_and_flat_runs_are_drawn_as_one_segment() -> None:
    group = _group("pretrain", 2_000_000)
    root = dom(render(_report(budgets=(_budget((group,), now=None),))))
    chart = root.by_id("budgets").all("svg")[0]
    assert chart.all("line", "now") == []
    d = chart.all("path", "series")[0].attrs["d"]
    # the start, hour 1, hour 4 (a flat run keeps only its ends), hour 5
    assert d.count(",") == 4


def test_budget_rule_without_spend_and_no_budget_rules_say_so() -> None:
    empty = dom(render(_report(budgets=(_budget(()),))))
    assert "No spend matches this rule" in empty.by_id("budgets").content()
    assert empty.by_id("budgets").all("svg") == []
    none = dom(render(_report(budgets=())))
    assert "No budget rules are loaded." in none.by_id("budgets").content()


def test_each_groups_alert_state_is_in_the_legend_not_only_in_the_table() -> None:
    alerting = replace(_group("pretrain", 230_000_000_000,
                              Projection(NOW, 290_000_000_000, NOW + 9e5)),
                       alert="firing: forecast")
    quiet = _group("posttrain", 60_000_500_000)
    legend = dom(render(_report(budgets=(_budget((alerting, quiet)),)))).by_id(
        "budgets").all("ul", "legend")[0]
    items = [item.content() for item in legend.all("li")]
    assert items == ["team=pretrain · firing: forecast", "team=posttrain",
                     "forecast to the period end"]


def test_the_forecast_is_in_the_legend_only_when_one_is_drawn() -> None:
    root = dom(render(_report(budgets=(_budget((_group("posttrain", 60_000_500_000),)),))))
    section = root.by_id("budgets")
    assert section.all("path", "forecast") == []
    assert "forecast" not in section.all("ul", "legend")[0].content()
    assert "forecast" not in section.all("svg")[0].attrs["aria-label"]


def test_spend_too_small_for_the_charts_scale_is_named_under_it() -> None:
    """$164 against a $250,000 budget line is a flat line at zero: the chart says so."""
    groups = (_group("pretrain", 230_000_000_000), _group("research", 164_000_000))
    section = dom(render(_report(budgets=(_budget(groups),)))).by_id("budgets")
    notes = [note.content() for note in section.all("p", "note")]
    assert notes == ["Too small to see against this chart's scale (to 300k USD), drawn along "
                     "its foot: team=research ($164.00)."]


def test_every_alert_pending_or_firing_is_listed_whatever_its_kind() -> None:
    alerts = (
        ActiveAlert("gpu-idle", "idle", {"team": "research", "resource_id": "lab/dev-gpu-01"},
                    "firing", NOW - 600, Decimal("0.015"), Decimal("0.05"), "idle",
                    unit="fraction"),
        ActiveAlert("team-monthly", "budget", {"team": "pretrain"}, "firing", NOW - 3600,
                    Decimal("230000"), Decimal("250000"), "forecast", unit="currency",
                    muted="silenced until 2026-11-20T16:00:00Z"),
        ActiveAlert("log-explosion", "log_explosion", {"job": "run-42"}, "pending", NOW - 60,
                    Decimal("120"), Decimal("50"), "max_rate", unit="currency_per_hour"),
    )
    section = dom(render(_report(alerts=alerts))).by_id("alerts")
    assert not section.all("details"), "in the open, not in a collapsed table"
    rows = [[c.content() for c in row.all("td")] for row in section.all("tbody")[0].all("tr")]
    assert rows == [
        ["firing", "gpu-idle", "team=research, resource_id=lab/dev-gpu-01", "2%", "idle 5%",
         "2026-11-20T11:50:00Z"],
        ["firing, silenced until 2026-11-20T16:00:00Z", "team-monthly", "team=pretrain",
         "$230,000.00", "forecast $250,000.00", "2026-11-20T11:00:00Z"],
        ["pending", "log-explosion", "job=run-42", "$120.00/h", "max_rate $50.00/h",
         "2026-11-20T11:59:00Z"],
    ]


# ── bars ──────────────────────────────────────────────────────────────────────────────────


def test_waste_bars_per_fault_type_with_amounts_and_share_of_spend() -> None:
    section = dom(render(_report())).by_id("waste")
    [chart] = section.all("svg")
    assert len(chart.all("rect", "bar")) == 3
    assert [t.content() for t in chart.all("text", "bar-label")] == [
        "silent_data_corruption", "node_failure", "comm_timeout"]
    values = [t.content() for t in chart.all("text", "bar-value")]
    assert values[0] == "$8,499.20 (2.8% of spend)"
    assert values[2] == "$1,305.88 (0.4% of spend)"
    assert "$12,000.00" in section.all("p")[0].content()


def test_top_spenders_one_chart_per_key_with_the_rest_summed_in_the_table() -> None:
    section = dom(render(_report())).by_id("spenders")
    team, job = section.all("svg")
    assert "by team" in team.attrs["aria-label"] and "by job" in job.attrs["aria-label"]
    assert len(team.all("rect", "bar")) == 3 and len(job.all("rect", "bar")) == 10
    assert [t.content() for t in team.all("text", "bar-label")] == [
        "pretrain", HOSTILE, "(no team)"]
    job_rows = section.all("tbody")[1].all("tr")
    assert [c.content() for c in job_rows[-1].all("td")] == ["4 more", "$7.00", "0.0%"]


def test_long_labels_are_shortened_in_the_chart_only() -> None:
    long = "x" * (LABEL_CHARS + 20)
    ranking = Ranking("job", (Amount(long, 5_000_000),))
    section = dom(render(_report(spenders=(ranking,)))).by_id("spenders")
    drawn = section.all("text", "bar-label")[0].content()
    assert len(drawn) == LABEL_CHARS and drawn.endswith("…")
    assert section.all("rect", "bar")[0].all("title")[0].content().startswith(long + ":")
    assert section.all("td")[0].content() == long


# ── reclaimed ─────────────────────────────────────────────────────────────────────────────


def test_reclaimed_hours_and_money_saved_per_rule() -> None:
    section = dom(render(_report())).by_id("reclaimed")
    assert "3 release(s), 12.50 idle hours reclaimed, $31.13 saved." in section.content()
    [chart] = section.all("svg")
    assert [t.content() for t in chart.all("text", "bar-label")] == ["gpu-idle", "k8s-idle"]
    assert chart.all("text", "bar-value")[0].content() == "$31.13 (12.50 h)"
    rows = [[c.content() for c in row.all("td")] for row in section.all("tbody")[0].all("tr")]
    assert rows[0] == ["2026-11-20T10:00:00Z", "gpu-idle", "slurm/4211", "released", "10.50",
                       "$26.15"]
    assert rows[2][4] == "—"


def test_dry_run_releases_show_what_they_would_have_saved() -> None:
    dry = (Release(NOW - 600, "gpu-idle", "lab/dev-gpu-01", Decimal("8.5"), 169_320_000,
                   dry_run=True),
           Release(NOW - 590, "gpu-idle", "lab/dev-gpu-02", Decimal("8.5"), 169_320_000,
                   dry_run=True))
    section = dom(render(_report(releases=dry))).by_id("reclaimed")
    assert not section.all("p", "none")
    assert ("2 dry-run release(s) would have reclaimed 17.00 idle hours and saved $338.64; "
            "nothing was touched (mode: dry_run).") in section.content()
    [chart] = section.all("svg")
    assert [t.content() for t in chart.all("text", "bar-label")] == ["gpu-idle (dry run)"]
    rows = [[c.content() for c in row.all("td")] for row in section.all("tbody")[0].all("tr")]
    assert rows[0][3:] == ["dry run", "8.50", "$169.32 (would have)"]


def test_no_releases_reads_none_yet() -> None:
    section = dom(render(_report(releases=()))).by_id("reclaimed")
    assert section.all("svg") == []
    assert section.all("p", "none")[0].content().startswith("None yet")


# ── escaping ──────────────────────────────────────────────────────────────────────────────


def test_tag_values_are_escaped_everywhere() -> None:
    page = render(_report(namespace="ns<&>"))
    assert "<b>" not in page and "</b>" not in page
    assert "&lt;b&gt;eval &amp; &quot;co&quot;&lt;/b&gt;" in page
    root = dom(page)
    texts = [node.content() for node in root.all("td")]
    assert f"team={HOSTILE}" in texts and HOSTILE in texts
    assert "namespace ns<&>" in root.all("footer")[0].content()


def test_no_data_at_all_still_renders_every_section() -> None:
    empty = Report("costline", "EUR", MONTH, NOW, Totals(0, 0, 0, 0))
    root = dom(render(empty))
    assert _charts(root) == []
    assert [s.attrs["id"] for s in root.all("section")] == [
        "alerts", "budgets", "waste", "spenders", "reclaimed"]
    assert "€0.00" in root.all("header")[0].content()
    assert "No alert is pending or firing." in root.by_id("alerts").content()


# ── time axis ─────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(("span", "labels"), [
    (Span(datetime(2026, 11, 30, tzinfo=UTC).timestamp(),
          datetime(2026, 12, 1, tzinfo=UTC).timestamp(), "day", "UTC"),
     ["00:00", "03:00", "06:00", "09:00", "12:00", "15:00", "18:00", "21:00"]),
    (Span(datetime(2026, 11, 23, tzinfo=UTC).timestamp(),
          datetime(2026, 11, 30, tzinfo=UTC).timestamp(), "week", "UTC"),
     ["Mon 23", "Tue 24", "Wed 25", "Thu 26", "Fri 27", "Sat 28", "Sun 29"]),
    (MONTH, ["Nov 01", "Nov 06", "Nov 11", "Nov 16", "Nov 21", "Nov 26"]),
])
def test_time_ticks_follow_the_period(span: Span, labels: list[str]) -> None:
    assert [label for _, label in time_ticks(span)] == labels


def test_time_ticks_are_local_midnights_across_a_daylight_saving_change() -> None:
    start = datetime(2026, 10, 24, 22, tzinfo=UTC).timestamp()  # Oct 25 00:00 in Berlin
    span = Span(start, start + 25 * HOUR, "day", "Europe/Berlin")
    ticks = time_ticks(span)
    assert ticks[0] == (start, "00:00")
    assert ticks[1] == (start + 4 * HOUR, "03:00")  # the clocks went back an hour before it
    assert ticks[2] == (start + 7 * HOUR, "06:00")
