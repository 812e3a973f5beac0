"""Alert changes → email: a subject, a plain text body and the same in HTML.

Pure functions: no clients, no clocks. One alert reads top to bottom as a person triages it:
what crossed which line, the summary, the lines and the trend, who spends most, what happens
next, and where the alert comes from. A digest lists its alerts one line each; a change in an
alert's thread says what changed, then shows the alert as it is now.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from costline.connectors.alert_change import (
    AlertChange,
    change_phrase,
    figure,
    group_text,
    headline,
    limit_line,
    short_time,
    title,
)
from costline.rules.money import money

MAX_SUBJECT = 200
MAX_TOP = 5


@dataclass(frozen=True)
class Email:
    subject: str
    text: str
    html: str


def alert_email(change: AlertChange, link: str) -> Email:
    """The first message of one alert's thread."""
    return _email(_subject(title(change)), [_facts(change, link)])


def digest_email(changes: Sequence[AlertChange], link: str) -> Email:
    """The first message of a burst of new alerts sent together."""
    rules = ", ".join(dict.fromkeys(change.rule for change in changes))
    subject = _subject(f"{len(changes)} cost alerts: {rules}")
    listing = [f"{title(change)}" for change in changes]
    sections = [_Section("Alerts", listing),
                _Section("", ["Each alert's changes follow in this thread.", link])]
    return _email(subject, sections)


def change_email(change: AlertChange, previous: AlertChange | None, root_subject: str,
                 link: str, again: bool = False) -> Email:
    """A later change of an alert, in its thread: what changed, then the alert now."""
    lead = change_phrase(change, previous)
    if again:
        lead += " (sent again: an earlier attempt was interrupted)"
    return _email(reply_subject(root_subject), [_Section("", [lead]), _facts(change, link)])


def reply_subject(root_subject: str) -> str:
    return root_subject if root_subject.startswith("Re: ") else f"Re: {root_subject}"


@dataclass(frozen=True)
class _Section:
    heading: str
    lines: list[str]


def _facts(change: AlertChange, link: str) -> _Section:
    lines = [f"{change.rule} · {group_text(change.group)}", headline(change)]
    if change.summary:
        lines.append(change.summary)
    limit = limit_line(change)
    shown = [f"{line.name} {figure(change, line.value)}" for line in change.lines]
    if shown:
        lines.append("Lines: " + " · ".join(shown))
    if change.forecast is not None:
        name = limit.name if limit else "the line"
        crosses = (f", crosses {name} {short_time(change.forecast.crosses_at)}"
                   if change.forecast.crosses_at else "")
        lines.append(f"Forecast at period end: {figure(change, change.forecast.value)}{crosses}")
    if change.rate_per_hour is not None:
        lines.append(f"Burning {money(change.rate_per_hour, change.currency)}/h")
    for item in change.top[:MAX_TOP]:
        lines.append(f"Top: {group_text(item.group)} {money(item.value, change.currency)}")
    for fault, amount in sorted((change.faults or {}).items(), key=lambda x: -x[1]):
        lines.append(f"Waste from {fault}: {money(amount, change.currency)}")
    if change.reclaim is not None:
        when = (f" at {short_time(change.reclaim.execute_at)}"
                if change.reclaim.execute_at else "")
        lines.append(f"Next: {change.reclaim.resource_id} is to be released{when} "
                     f"({change.reclaim.mode}).")
    moment = change.since if change.is_open and change.since else change.at
    lines.append(f"Alert {change.alert_id} · {change.state} "
                 f"{'since' if change.is_open else 'at'} {short_time(moment)}")
    lines.append(link)
    return _Section("", lines)


def _email(subject: str, sections: Sequence[_Section]) -> Email:
    text_parts = []
    html_parts = []
    for section in sections:
        head = f"{section.heading}\n" if section.heading else ""
        text_parts.append(head + "\n".join(section.lines))
        items = "".join(f"<p>{_html_line(line)}</p>" for line in section.lines)
        html_parts.append((f"<h3>{escape(section.heading)}</h3>" if section.heading else "")
                          + items)
    html = ("<!doctype html><html><body style=\"font-family: sans-serif\">"
            + "<hr>".join(html_parts) + "</body></html>")
    return Email(subject, "\n\n".join(text_parts) + "\n", html)


def _html_line(line: str) -> str:
    if line.startswith(("http://", "https://")):
        return f'<a href="{escape(line)}">{escape(line)}</a>'
    return escape(line)


def _subject(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= MAX_SUBJECT else flat[: MAX_SUBJECT - 1] + "…"
