"""Alert records → Slack payloads: the exact shape each kind of alert is posted with."""

from __future__ import annotations

import json
import re
from copy import deepcopy
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costline.connectors.alert_change import AlertChange, InvalidAlertRecord
from costline.connectors.slack_blocks import block_errors, plain
from costline.connectors.slack_render import (
    APPROVE_ACTION,
    DIGEST_MENU_ACTION,
    KEEP_ACTION,
    render_alert,
    render_change_reply,
    render_digest,
    usage_bar,
)
from costline.rules.money import money

NOVEMBER = {"start": "2026-11-01T00:00:00Z", "end": "2026-12-01T00:00:00Z"}


def record(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "severity": "warning", "state": "firing", "previous_state": "pending",
        "since": "2026-11-30T08:00:00Z", "at": "2026-11-30T08:05:00Z", "currency": "USD",
        "period": NOVEMBER, "forecast": None, "rate_per_hour": None, "top": [],
        "faults": None, "reclaim": None, "notify": {"slack": "#ml-platform"}, "mode": "live",
    }
    base.update(fields)
    return base


BUDGET = record(
    alert_id="team-monthly/3f2a9c", rule="team-monthly", kind="budget",
    group={"team": "pretrain"}, value="8123.450000", threshold="8000.000000", line="warn_80",
    lines=[{"name": "warn_50", "value": "5000.000000"},
           {"name": "warn_80", "value": "8000.000000"},
           {"name": "limit", "value": "10000.000000"}],
    forecast={"value": "11020.000000", "crosses_at": "2026-11-26T14:00:00Z"},
    rate_per_hour="12.500000",
    top=[{"group": {"job": "run-42"}, "value": "4100.000000"},
         {"group": {"job": "run-43"}, "value": "2650.000000"}],
    faults={"node_failure": "956.160000"},
    notify={"slack": "#ml-platform", "route_by_tag": "owner"},
    summary="Team pretrain has spent $8,123.45 of its $10,000.00 November budget.",
)
GROWTH = record(
    alert_id="project-growth/9b1e07", rule="project-growth", kind="growth",
    group={"project": "llm-70b"}, value="1840.000000", threshold="1200.000000", line="ratio",
    lines=[{"name": "baseline", "value": "400.000000"}, {"name": "ratio", "value": "1200.000000"}],
    rate_per_hour="306.670000", period=None,
    top=[{"group": {"job": "run-43"}, "value": "1500.000000"},
         {"group": {"job": "run-42"}, "value": "340.000000"}],
    summary="llm-70b spent $1,840.00 in the last 6h, 4.6x its daily baseline.",
)
IDLE = record(
    alert_id="idle-gpus/77c2d1", rule="idle-gpus", kind="idle",
    group={"cluster": "cluster-a", "job": "run-42"}, value="0.020000", threshold="0.050000",
    line="idle", lines=[{"name": "idle", "value": "0.050000"}], rate_per_hour="19.920000",
    period=None,
    reclaim={"resource_id": "cluster-a/node-017", "connector": "slurm", "grace": 900,
             "execute_at": "2026-11-30T14:30:00Z", "mode": "dry_run", "approval": "auto"},
    summary="cluster-a/node-017 has run under 5% GPU utilization for 45 minutes.",
)
LOG_EXPLOSION = record(
    alert_id="log-flood/c0ffee", rule="log-flood", kind="log_explosion", severity="critical",
    group={"job": "run-42"}, value="42.500000", threshold="10.000000", line="max_rate",
    lines=[{"name": "baseline", "value": "2.500000"}, {"name": "max_rate", "value": "10.000000"}],
    period=None, summary="run-42 ingests logs at $42.50/h, 17x its baseline.",
)
FAULT_WASTE = record(
    alert_id="fault-waste/5e11a0", rule="fault-waste", kind="fault_waste",
    severity="critical", group={"project": "llm-70b"}, value="956.160000",
    threshold="500.000000", line="max_waste",
    lines=[{"name": "max_waste", "value": "500.000000"}],
    faults={"node_failure": "765.000000", "comm_timeout": "191.160000"},
    summary="Faults wasted $956.16 of llm-70b's spend this month.",
)
ALL_KINDS = [BUDGET, GROWTH, IDLE, LOG_EXPLOSION, FAULT_WASTE]


def texts(blocks: list[dict[str, Any]]) -> str:
    """Every visible string of a message, joined: what a reader could see."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("text"), str):
                found.append(node["text"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(blocks)
    return "\n".join(found)


def test_budget_alert_is_posted_with_this_exact_payload() -> None:
    text, blocks = render_alert(BUDGET)
    value = json.dumps({"alert_id": "team-monthly/3f2a9c", "rule": "team-monthly"},
                       separators=(",", ":"))
    assert text == "[WARNING] team-monthly · team=pretrain: $8,123.45 crossed warn_80 ($8,000.00)"
    assert blocks == [
        {"type": "header",
         "text": {"type": "plain_text", "text": ":warning: team-monthly", "emoji": True}},
        {"type": "section", "text": {"type": "mrkdwn", "text":
            "team `pretrain`\n"
            "Team pretrain has spent $8,123.45 of its $10,000.00 November budget."}},
        {"type": "section", "text": {"type": "mrkdwn", "text":
            "*$8,123.45 crossed warn_80 ($8,000.00)*\n"
            "`▓▓▓▓▓▓▓▓░░ 81%` of limit $10,000.00\n"
            "· warn_50 $5,000.00\n"
            "▸ *warn_80* $8,000.00\n"
            "· limit $10,000.00"}},
        {"type": "section", "text": {"type": "mrkdwn", "text":
            ":chart_with_upwards_trend: Burning *$12.50/h*\n"
            ":crystal_ball: Forecast *$11,020.00* at period end\n"
            "crosses limit <!date^1795701600^{date_short_pretty} {time}|Nov 26 14:00 UTC>"}},
        {"type": "section", "text": {"type": "mrkdwn", "text":
            "*Top contributors*\n"
            "• job `run-42` $4,100.00 (50%)\n"
            "• job `run-43` $2,650.00 (33%)"}},
        {"type": "section", "text": {"type": "mrkdwn", "text":
            "*Waste* $956.16 (12% of spend)\n"
            "• node_failure $956.16"}},
        {"type": "actions", "block_id": "costline.actions", "elements": [
            {"type": "button", "text": {"type": "plain_text", "text": "Snooze 1h"},
             "action_id": "costline.snooze.1h", "value": value},
            {"type": "button", "text": {"type": "plain_text", "text": "Snooze 4h"},
             "action_id": "costline.snooze.4h", "value": value},
            {"type": "button", "text": {"type": "plain_text", "text": "Snooze 1d"},
             "action_id": "costline.snooze.1d", "value": value},
        ]},
        {"type": "context", "elements": [{"type": "mrkdwn", "text":
            "`team-monthly/3f2a9c` · firing since "
            "<!date^1796025600^{date_short_pretty} {time}|Nov 30 08:00 UTC>"}]},
    ]


@pytest.mark.parametrize("alert", ALL_KINDS, ids=lambda r: r["kind"])
def test_text_fallback_names_rule_group_figure_and_line(alert: dict[str, Any]) -> None:
    text, _ = render_alert(alert)
    change = AlertChange.from_record(alert)
    assert change.rule in text
    assert all(value in text for value in alert["group"].values())
    assert alert["line"] in text
    assert re.search(r"\$[\d,]+\.\d\d|\d+%", text), text


@pytest.mark.parametrize("alert", ALL_KINDS, ids=lambda r: r["kind"])
def test_every_kind_fits_slack_block_kit_limits(alert: dict[str, Any]) -> None:
    _, blocks = render_alert(alert)
    assert block_errors(blocks) == []


@pytest.mark.parametrize("alert", ALL_KINDS, ids=lambda r: r["kind"])
def test_every_line_reads_on_a_phone(alert: dict[str, Any]) -> None:
    _, blocks = render_alert(alert)
    for line in plain(texts(blocks)).splitlines():
        assert len(line) <= 100, line


def test_growth_shows_figure_against_its_line_and_top_jobs() -> None:
    text, blocks = render_alert(GROWTH)
    shown = texts(blocks)
    assert text == ("[WARNING] project-growth · project=llm-70b: "
                    "$1,840.00 crossed ratio ($1,200.00)")
    assert "*$1,840.00 crossed ratio ($1,200.00)*" in shown
    assert "· baseline $400.00\n▸ *ratio* $1,200.00" in shown
    assert "• job `run-43` $1,500.00 (82%)" in shown
    assert "▓" not in shown, "the budget bar belongs to budgets"


def test_idle_reclaim_says_what_happens_next_and_offers_keep() -> None:
    text, blocks = render_alert(IDLE)
    shown = texts(blocks)
    assert text == ("[WARNING] idle-gpus · cluster=cluster-a job=run-42: "
                    "2% utilization is under idle (5%)")
    assert ("`cluster-a/node-017` will be released at "
            "<!date^1796049000^{date_short_pretty} {time}|Nov 30 14:30 UTC> "
            "unless someone presses *Keep*.") in shown
    assert "_Dry run: the release is planned and logged, not executed._" in shown
    actions = next(b for b in blocks if b["type"] == "actions")
    ids = [e["action_id"] for e in actions["elements"]]
    assert ids == ["costline.snooze.1h", "costline.snooze.4h", "costline.snooze.1d",
                   KEEP_ACTION]
    keep = json.loads(actions["elements"][3]["value"])
    assert keep == {"alert_id": "idle-gpus/77c2d1", "rule": "idle-gpus",
                    "resource_id": "cluster-a/node-017"}


def test_reclaim_that_needs_approval_offers_a_confirmed_approve_button() -> None:
    alert = deepcopy(IDLE)
    alert["reclaim"]["approval"] = "required"
    _, blocks = render_alert(alert)
    actions = next(b for b in blocks if b["type"] == "actions")
    approve = actions["elements"][-1]
    assert approve["action_id"] == APPROVE_ACTION
    assert approve["style"] == "primary"
    assert approve["confirm"]["confirm"]["text"] == "Release"
    assert "once an approver presses *Approve*" in texts(blocks)


def test_log_explosion_is_money_per_hour() -> None:
    text, blocks = render_alert(LOG_EXPLOSION)
    assert text == "[CRITICAL] log-flood · job=run-42: $42.50/h crossed max_rate ($10.00/h)"
    assert blocks[0]["text"]["text"] == ":rotating_light: log-flood"
    assert "▸ *max_rate* $10.00/h" in texts(blocks)


def test_fault_waste_lists_waste_by_fault_type_largest_first() -> None:
    _, blocks = render_alert(FAULT_WASTE)
    shown = texts(blocks)
    assert "`▓▓▓▓▓▓▓▓▓▓ 191%` of max_waste $500.00" in shown
    assert "*Waste* $956.16\n• node_failure $765.00\n• comm_timeout $191.16" in shown


def test_resolved_alert_says_so_and_drops_the_buttons() -> None:
    alert = record(**{**BUDGET, "state": "resolved", "previous_state": "firing",
                      "value": "7950.000000"})
    text, blocks = render_alert(alert)
    assert text == ("[RESOLVED] team-monthly · team=pretrain: "
                    "$7,950.00, back within warn_80 ($8,000.00)")
    assert blocks[0]["text"]["text"] == ":white_check_mark: Resolved: team-monthly"
    assert all(b["type"] != "actions" for b in blocks)


def test_resolved_idle_alert_cancels_the_release() -> None:
    alert = record(**{**IDLE, "state": "resolved", "value": "0.910000"})
    _, blocks = render_alert(alert)
    assert "`cluster-a/node-017` is busy again: its release is cancelled." in texts(blocks)


def test_silenced_alert_has_no_buttons() -> None:
    _, blocks = render_alert(record(**{**IDLE, "state": "silenced"}))
    assert blocks[0]["text"]["text"] == ":no_bell: Silenced: idle-gpus"
    assert all(b["type"] != "actions" for b in blocks)


def test_notes_from_buttons_appear_in_the_footer() -> None:
    _, blocks = render_alert(BUDGET, notes=[":no_bell: Snoozed for 4h by <@U042>"])
    assert blocks[-1]["elements"][-1]["text"] == ":no_bell: Snoozed for 4h by <@U042>"


def test_tag_values_cannot_inject_slack_markup() -> None:
    alert = record(**{**BUDGET, "group": {"team": "<!channel>"},
                      "summary": "<!here> & <https://x|y>"})
    shown = texts(render_alert(alert).blocks)
    assert "<!channel>" not in shown and "<!here>" not in shown
    assert "<!channel>" not in render_alert(alert).text
    assert "&lt;!here&gt; &amp;" in shown


def test_digest_puts_a_burst_in_one_message_with_a_menu_per_alert() -> None:
    text, blocks = render_digest(ALL_KINDS)
    assert text.startswith("5 cost alerts: team-monthly team=pretrain $8,123.45 crossed warn_80")
    assert blocks[0]["text"]["text"] == ":bell: 5 cost alerts"
    items = blocks[1:-1]
    assert len(items) == 5
    assert items[2]["text"]["text"] == (
        ":warning: *idle-gpus* · cluster `cluster-a` · job `run-42`\n"
        "2% utilization is under idle (5%)")
    menu = items[2]["accessory"]
    assert menu["action_id"] == DIGEST_MENU_ACTION
    assert [o["text"]["text"] for o in menu["options"]] == [
        "Snooze 1h", "Snooze 4h", "Snooze 1d", "Keep"]
    assert json.loads(menu["options"][3]["value"])["action"] == KEEP_ACTION
    assert block_errors(blocks) == []


def test_digest_of_many_alerts_stays_within_fifty_blocks() -> None:
    burst = [record(**{**BUDGET, "alert_id": f"team-monthly/{i:06x}",
                       "group": {"team": f"team-{i}"}}) for i in range(120)]
    text, blocks = render_digest(burst)
    assert block_errors(blocks) == []
    assert "and 80 more" in blocks[-1]["elements"][0]["text"]
    assert len(text) <= 3000


def test_thread_replies_say_what_changed() -> None:
    first = AlertChange.from_record(BUDGET)
    higher = AlertChange.from_record(record(**{**BUDGET, "line": "limit", "severity": "critical",
                                               "value": "10100.000000",
                                               "threshold": "10000.000000"}))
    resolved = AlertChange.from_record(record(**{**BUDGET, "state": "resolved"}))
    assert render_change_reply(higher, first) == (
        ":rotating_light: Escalated from warn_80 to *limit*: "
        "$10,100.00 crossed limit ($10,000.00).")
    assert render_change_reply(first, first).startswith(":repeat: Still firing:")
    assert render_change_reply(resolved, first).startswith(":white_check_mark: Resolved:")


def test_a_record_without_its_essentials_is_refused() -> None:
    broken = {k: v for k, v in BUDGET.items() if k != "value"}
    with pytest.raises(InvalidAlertRecord):
        render_alert(broken)
    with pytest.raises(InvalidAlertRecord):
        render_alert({**BUDGET, "state": "exploded"})


@pytest.mark.parametrize(("fraction", "bar"), [
    ("0", "░░░░░░░░░░ 0%"), ("0.82", "▓▓▓▓▓▓▓▓░░ 82%"), ("0.999", "▓▓▓▓▓▓▓▓▓░ 99%"),
    ("1", "▓▓▓▓▓▓▓▓▓▓ 100%"), ("1.5", "▓▓▓▓▓▓▓▓▓▓ 150%"),
])
def test_usage_bar_never_reads_full_before_the_line(fraction: str, bar: str) -> None:
    assert usage_bar(Decimal(fraction)) == bar


def test_money_keeps_small_amounts_visible() -> None:
    assert money(Decimal("1234567.891"), "USD") == "$1,234,567.89"
    assert money(Decimal("0.000200"), "USD") == "$0.0002"
    assert money(Decimal("12"), "CHF") == "12.00 CHF"


tag_values = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")),
                     min_size=1, max_size=256)


@settings(max_examples=60, deadline=None)
@given(group=st.dictionaries(st.from_regex(r"[a-z][a-z0-9_]{0,20}", fullmatch=True),
                             tag_values, max_size=32),
       value=st.decimals(min_value=0, max_value=10**12, places=6),
       kind=st.sampled_from(["budget", "growth", "idle", "log_explosion", "fault_waste"]))
def test_any_group_and_figure_render_within_slack_limits(
        group: dict[str, str], value: Decimal, kind: str) -> None:
    alert = record(**{**BUDGET, "kind": kind, "group": group, "value": str(value),
                      "top": [{"group": group, "value": str(value)}] * 5})
    text, blocks = render_alert(alert)
    assert block_errors(blocks) == []
    assert len(text) <= 40_000


def test_a_growth_of_a_quantity_is_not_burning_money() -> None:
    """Checkpoint GB-hours growing 641,318 an hour were shown as 'Burning $641,318.00/h'."""
    quantity = record(**{**GROWTH, "unit": "gb_hour", "value": "641318.000000",
                         "threshold": "494314.021429", "rate_per_hour": "106886.333333",
                         "lines": [{"name": "baseline", "value": "247157.010714"},
                                   {"name": "ratio", "value": "494314.021429"}]})
    text, blocks = render_alert(quantity)
    shown = texts(blocks)
    assert "Burning" not in shown and "$" not in text
    assert ":chart_with_upwards_trend: Rate *106,886.33 gb_hour/h*" in shown
    assert text.endswith("641,318 gb_hour crossed ratio (494,314.02 gb_hour)")
