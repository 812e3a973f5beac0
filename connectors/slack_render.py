"""Alert changes → Slack messages (Block Kit blocks plus a plain ``text`` fallback).

Pure functions: no clients, no clocks. The rule engine publishes one JSON record per alert
state change on ``NS.alerts.v1``; :class:`AlertChange` (``connectors/alert_change.py``) reads it.

Layout choices follow what a platform engineer reads on a phone: short lines, one fact per
line, no tables. ``text`` is what push notifications and screen readers show, so it alone
names the rule, the group, the figure and the line it crossed.

How an alert reads depends on its kind, and comes from the registered kind itself
(``KINDS[kind].presentation``): the unit of its figures when the record names none (money,
money per hour, a utilization fraction shown as a percentage), the words of its headline, and
whether its figure fills a bar toward the budget line. A new kind needs no edit here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any, NamedTuple

from costline.connectors.alert_change import (
    AlertChange,
    figure,
    headline,
    limit_line,
    optional_time,
    short_time,
    state_tag,
    unit_of,
)
from costline.rules.money import figure_in, money, percent

Block = dict[str, Any]

ACTIONS_BLOCK_ID = "costline.actions"
SNOOZE_ACTIONS = {"costline.snooze.1h": 3600, "costline.snooze.4h": 4 * 3600,
                  "costline.snooze.1d": 86400}
KEEP_ACTION = "costline.keep"
APPROVE_ACTION = "costline.approve"
LIFT_ACTION = "costline.lift"
DIGEST_MENU_ACTION = "costline.menu"

SEVERITY_EMOJI = {"info": ":information_source:", "warning": ":warning:",
                  "critical": ":rotating_light:"}
STATE_EMOJI = {"resolved": ":white_check_mark:", "silenced": ":no_bell:",
               "pending": ":hourglass_flowing_sand:"}
BAR_CELLS = 10
MAX_TOP = 5
MAX_DIGEST_ITEMS = 40
MAX_TEXT = 3000
OVERFLOW_VALUE_MAX = 150


class SlackMessage(NamedTuple):
    text: str
    blocks: list[Block]


# ── formatting ────────────────────────────────────────────────────────────────────────────


MONEY_OR_SHARE = ("currency", "currency_per_hour", "fraction")
"""Units whose alerts' rate per hour is money: spend, a spend rate, or an idle resource's cost
while its utilization (a share) is the figure."""


def usage_bar(fraction: Decimal) -> str:
    """``▓▓▓▓▓▓▓▓░░ 82%``: cells and percentage round down, so 99.9% never reads as full."""
    pct = int((fraction * 100).to_integral_value(rounding="ROUND_FLOOR"))
    filled = max(0, min(BAR_CELLS, pct // 10))
    return f"{'▓' * filled}{'░' * (BAR_CELLS - filled)} {pct}%"


def slack_time(moment: datetime) -> str:
    """A time Slack shows in each reader's own zone, with a UTC fallback for old clients."""
    epoch = int(moment.timestamp())
    return f"<!date^{epoch}^{{date_short_pretty}} {{time}}|{short_time(moment)}>"


def group_label(group: Mapping[str, str]) -> str:
    """``team=pretrain project=llm-70b``: the form used in ``text``, which Slack also parses."""
    return escape(" ".join(f"{k}={v}" for k, v in group.items())) or "all"


def group_mrkdwn(group: Mapping[str, str]) -> str:
    """``team `pretrain` · job `run-42```; a tag the resources do not carry reads _untagged_."""
    shown = (f"{k} `{v}`" if v else f"{k} _untagged_" for k, v in group.items())
    return escape(" · ".join(shown)) or "_all resources_"


def escape(text: str) -> str:
    """Slack treats ``&``, ``<`` and ``>`` as markup; tag values must not become links."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# ── phrases ───────────────────────────────────────────────────────────────────────────────


def fallback_text(change: AlertChange) -> str:
    """Names rule, group, figure and line: all a push notification shows."""
    return (f"[{state_tag(change)}] {change.rule} · {group_label(change.group)}: "
            f"{headline(change)}")


def emoji(change: AlertChange) -> str:
    return STATE_EMOJI.get(change.state) or SEVERITY_EMOJI.get(change.severity, ":bell:")


# ── blocks ────────────────────────────────────────────────────────────────────────────────


def _section(markdown: str) -> Block:
    return {"type": "section", "text": {"type": "mrkdwn", "text": markdown[:MAX_TEXT]}}


def _header(change: AlertChange) -> Block:
    word = {"resolved": "Resolved: ", "silenced": "Silenced: ", "pending": "Pending: "}.get(
        change.state, "")
    return {"type": "header",
            "text": {"type": "plain_text", "text": f"{emoji(change)} {word}{change.rule}"[:150],
                     "emoji": True}}


def _about(change: AlertChange) -> Block:
    lines = [group_mrkdwn(change.group)]
    if change.summary:
        lines.append(escape(change.summary))
    return _section("\n".join(lines))


def _figure_section(change: AlertChange) -> Block:
    parts = [f"*{headline(change)}*"]
    limit = limit_line(change)
    if change.presentation.bar and limit is not None and limit.value > 0:
        parts.append(f"`{usage_bar(change.value / limit.value)}` of {limit.name} "
                     f"{figure(change, limit.value)}")
    for line in change.lines if len(change.lines) > 1 else ():
        mark = "▸" if line.name == change.line else "·"
        label = f"*{line.name}*" if line.name == change.line else line.name
        parts.append(f"{mark} {label} {figure(change, line.value)}")
    return _section("\n".join(parts))


def _trend_section(change: AlertChange) -> Block | None:
    parts = []
    if change.rate_per_hour is not None:
        unit = unit_of(change)
        if unit not in MONEY_OR_SHARE:
            # figures in a price book unit (GB-hours of checkpoints): so is their rate
            rate = figure_in(change.rate_per_hour, unit, change.currency)
            parts.append(f":chart_with_upwards_trend: Rate *{rate}/h*")
        else:
            rate = money(change.rate_per_hour, change.currency)
            parts.append(f":chart_with_upwards_trend: Burning *{rate}/h*")
    if change.forecast is not None:
        text = f":crystal_ball: Forecast *{figure(change, change.forecast.value)}* at period end"
        if change.forecast.crosses_at is not None:
            limit = limit_line(change)
            name = limit.name if limit else "the line"
            text += f"\ncrosses {name} {slack_time(change.forecast.crosses_at)}"
        parts.append(text)
    return _section("\n".join(parts)) if parts else None


def _top_section(change: AlertChange) -> Block | None:
    if not change.top:
        return None
    rows = ["*Top contributors*"]
    for item in change.top[:MAX_TOP]:
        amount = _contribution(change, item.value)
        share = ""
        if amount is not None and change.value > 0 and unit_of(change).startswith("currency"):
            share = f" ({percent(amount / change.value)})"
        shown = figure(change, amount) if amount is not None else money(item.value,
                                                                          change.currency)
        rows.append(f"• {group_mrkdwn(item.group)} {shown}{share}")
    return _section("\n".join(rows))


def _contribution(change: AlertChange, total: Decimal) -> Decimal | None:
    """A contributor's total in the alert's unit. Rates per hour are measured over the
    record's period (the rule's window), so a total over it is turned into its rate; None
    when the period does not say how long that was."""
    if unit_of(change) != "currency_per_hour":
        return total
    try:
        start, end = optional_time(change.period_start), optional_time(change.period_end)
    except ValueError:
        return None
    seconds = Decimal((end - start).total_seconds()) if start and end else Decimal(0)
    return total * 3600 / seconds if seconds > 0 else None


def _waste_section(change: AlertChange) -> Block | None:
    if not change.faults:
        return None
    total = sum(change.faults.values(), Decimal(0))
    title = f"*Waste* {money(total, change.currency)}"
    if change.presentation.spend and change.value > 0:
        title += f" ({percent(total / change.value)} of spend)"
    rows = [title]
    for fault, amount in sorted(change.faults.items(), key=lambda x: -x[1]):
        rows.append(f"• {fault} {money(amount, change.currency)}")
    return _section("\n".join(rows))


def next_step(change: AlertChange) -> str | None:
    """What happens to the resource next, so nobody is surprised by a release. An alert
    made outside the rule engine (an enforcement) brings its own."""
    if change.record.get("next_step"):
        return str(change.record["next_step"])
    reclaim = change.reclaim
    if reclaim is None:
        return None
    resource = f"`{escape(reclaim.resource_id)}`"
    if change.state == "resolved":
        return f"{resource} is busy again: its release is cancelled."
    if not change.is_open:
        return f"{resource} will not be released while this alert is silenced."
    when = f" at {slack_time(reclaim.execute_at)}" if reclaim.execute_at else ""
    if reclaim.needs_approval:
        text = (f"{resource} will be released{when} once an approver presses *Approve*; "
                f"*Keep* holds it.")
    else:
        text = f"{resource} will be released{when} unless someone presses *Keep*."
    if reclaim.mode == "dry_run" or change.mode == "dry_run":
        text += "\n_Dry run: the release is planned and logged, not executed._"
    return text


def _next_section(change: AlertChange) -> Block | None:
    step = next_step(change)
    return _section(f"*What happens next*\n{step}") if step else None


def action_value(change: AlertChange, action: str | None = None) -> str:
    """What a button carries back: enough to act without looking the message up."""
    payload: dict[str, str] = {"alert_id": change.alert_id, "rule": change.rule}
    if change.reclaim is not None:
        payload["resource_id"] = change.reclaim.resource_id
    enforce = change.record.get("enforce") or {}
    if enforce.get("subject"):
        payload["resource_id"] = str(enforce["subject"])
    if action is not None:
        payload["action"] = action
    return json.dumps(payload, separators=(",", ":"))


def _button(text: str, action_id: str, value: str, style: str | None = None) -> Block:
    button: Block = {"type": "button", "text": {"type": "plain_text", "text": text},
                     "action_id": action_id, "value": value}
    if style:
        button["style"] = style
    return button


def _actions(change: AlertChange) -> Block | None:
    if not change.is_open:
        return None
    value = action_value(change)
    buttons = [_button(f"Snooze {action_id.rsplit('.', 1)[1]}", action_id, value)
               for action_id in SNOOZE_ACTIONS]
    if change.reclaim is not None:
        buttons.append(_button("Keep", KEEP_ACTION, value))
        if change.reclaim.needs_approval:
            approve = _button("Approve", APPROVE_ACTION, value, style="primary")
            approve["confirm"] = {
                "title": {"type": "plain_text", "text": "Release the resource?"},
                "text": {"type": "mrkdwn",
                         "text": f"`{escape(change.reclaim.resource_id)}` will be released."},
                "confirm": {"type": "plain_text", "text": "Release"},
                "deny": {"type": "plain_text", "text": "Cancel"},
            }
            buttons.append(approve)
    buttons += _enforce_buttons(change, value)
    return {"type": "actions", "block_id": ACTIONS_BLOCK_ID, "elements": buttons}


def _enforce_buttons(change: AlertChange, value: str) -> list[Block]:
    """Approve and Lift on an enforcement's message (``enforce`` in the record)."""
    enforce = change.record.get("enforce") or {}
    subject = escape(str(enforce.get("subject", "")))
    buttons = []
    if enforce.get("approve"):
        buttons.append(_button("Approve", APPROVE_ACTION, value, style="primary"))
    if enforce.get("lift"):
        lift = _button("Lift", LIFT_ACTION, value, style="danger")
        lift["confirm"] = {
            "title": {"type": "plain_text", "text": "Lift the enforcement?"},
            "text": {"type": "mrkdwn", "text": f"`{subject}` may spend again this period."},
            "confirm": {"type": "plain_text", "text": "Lift"},
            "deny": {"type": "plain_text", "text": "Cancel"},
        }
        buttons.append(lift)
    return buttons


def _footer(change: AlertChange, notes: Sequence[str]) -> Block:
    facts = [f"`{escape(change.alert_id)}`"]
    if not change.is_open:
        facts.append(f"{change.state} {slack_time(change.at)}")
    elif change.since is not None:
        facts.append(f"{change.state} since {slack_time(change.since)}")
    if change.mode == "dry_run":
        facts.append("dry run")
    elements = [{"type": "mrkdwn", "text": " · ".join(facts)}]
    elements += [{"type": "mrkdwn", "text": note[:MAX_TEXT]} for note in notes[-9:]]
    return {"type": "context", "elements": elements}


def render_alert(record: AlertChange | Mapping[str, Any],
                 notes: Sequence[str] = ()) -> SlackMessage:
    """One alert → one message: the thread root every later change of it updates."""
    change = record if isinstance(record, AlertChange) else AlertChange.from_record(record)
    optional = (_trend_section(change), _top_section(change), _waste_section(change),
                _next_section(change))
    blocks = [_header(change), _about(change), _figure_section(change)]
    blocks += [block for block in optional if block is not None]
    actions = _actions(change)
    if actions is not None:
        blocks.append(actions)
    blocks.append(_footer(change, notes))
    return SlackMessage(fallback_text(change), blocks)


# ── digests and thread replies ────────────────────────────────────────────────────────────


def _digest_menu(change: AlertChange) -> Block | None:
    """A compact action menu per digest line, so a burst does not cost the buttons."""
    if not change.is_open:
        return None
    choices = [(f"Snooze {a.rsplit('.', 1)[1]}", a) for a in SNOOZE_ACTIONS]
    if change.reclaim is not None:
        choices.append(("Keep", KEEP_ACTION))
    options = []
    for label, action in choices:
        value = action_value(change, action)
        if len(value) > OVERFLOW_VALUE_MAX:
            return None
        options.append({"text": {"type": "plain_text", "text": label}, "value": value})
    return {"type": "overflow", "action_id": DIGEST_MENU_ACTION, "options": options}


def _digest_item(change: AlertChange) -> Block:
    block = _section(f"{emoji(change)} *{change.rule}* · {group_mrkdwn(change.group)}\n"
                     f"{headline(change)}")
    menu = _digest_menu(change)
    if menu is not None:
        block["accessory"] = menu
    return block


def render_digest(records: Sequence[AlertChange | Mapping[str, Any]],
                  notes: Sequence[str] = ()) -> SlackMessage:
    """Many alerts for one channel → one message, so a burst does not flood it."""
    changes = [r if isinstance(r, AlertChange) else AlertChange.from_record(r) for r in records]
    firing = sum(1 for c in changes if c.is_open)
    title = f":bell: {len(changes)} cost alerts"
    if firing != len(changes):
        title += f" ({firing} open)"
    blocks: list[Block] = [{"type": "header", "text": {"type": "plain_text", "text": title,
                                                       "emoji": True}}]
    blocks += [_digest_item(c) for c in changes[:MAX_DIGEST_ITEMS]]
    rest = len(changes) - MAX_DIGEST_ITEMS
    context = [f"and {rest} more, each in this thread" if rest > 0 else
               "Each alert's changes follow in this thread."]
    context += list(notes[-9:])
    blocks.append({"type": "context",
                   "elements": [{"type": "mrkdwn", "text": c[:MAX_TEXT]} for c in context]})
    summary = "; ".join(f"{c.rule} {group_label(c.group)} {headline(c)}" for c in changes)
    text = f"{len(changes)} cost alerts: {summary}"
    return SlackMessage(text[: MAX_TEXT - 1] + "…" if len(text) > MAX_TEXT else text, blocks)


def render_change_reply(change: AlertChange, previous: AlertChange | None) -> str:
    """The thread reply that tells what changed since the last message about this alert."""
    what = headline(change)
    if change.state == "resolved":
        return f":white_check_mark: Resolved: {what}."
    if change.state == "silenced":
        return f":no_bell: Silenced: {what}."
    if previous is not None and previous.line != change.line and change.line:
        return (f"{emoji(change)} Escalated from {previous.line or previous.state} "
                f"to *{change.line}*: {what}.")
    if previous is not None and previous.state != change.state:
        return f"{emoji(change)} Now {change.state}: {what}."
    return f":repeat: Still {change.state}: {what}."


def message_for(changes: Sequence[AlertChange], notes: Sequence[str] = ()) -> SlackMessage:
    """The thread root for one alert or a digest of several, from the members' latest state."""
    if len(changes) == 1:
        return render_alert(changes[0], notes)
    return render_digest(changes, notes)

