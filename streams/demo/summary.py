"""What the demo prints at the end, for people: each table with the period it covers, money as
currency with totals, the alerts each over the period its rule counts, and what reclaiming the
idle boxes saved or would have saved, and what that saving counts."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from rich.console import Console
from rich.table import Table

from costline.rules.durations import parse_time, rfc3339
from costline.rules.money import money
from costline.rules.prices import PriceBook, format_micro
from costline.streams.cli.tables import titled
from costline.streams.demo.training_summary import print_training


def print_summary(out: Console, summary: dict[str, Any], days: int) -> None:
    """The spend and waste of the days played, the alerts, the reclamation, the Slack count."""
    currency, zone = summary["currency"], summary["period"]["zone"]
    played = span_text(parse_time(summary["period"]["start"]),
                       parse_time(summary["period"]["end"]), zone)
    for title, key, what in [("Spend by team", "spend_by_team", "spend"),
                             ("Spend by category", "spend_by_category", "spend"),
                             ("Fixed vs elastic", "fixed_vs_elastic", "spend"),
                             ("Waste by fault type", "waste_by_fault", "waste")]:
        out.print(amounts_table(f"{title}, {played} (the {days} days played)", what,
                                summary[key], currency))
    out.print(alerts_table(summary["alerts"], parse_time(summary["period"]["end"]), zone))
    reclaim = summary.get("reclamation", {})
    if reclaim:
        out.print(reclamation_text(reclaim, currency, zone))
    if summary.get("enforcement"):
        out.print(summary["enforcement"])
    print_training(out, summary)
    out.print(exactness_text(summary["exactness"], currency))
    sent = summary["slack_messages"]
    out.print(f"Slack messages posted: {sent if sent is not None else 'see Slack'} · "
              f"done in {summary['seconds']} s · namespace {summary['namespace']}")


def exactness_text(exactness: dict[str, Any], currency: str) -> str:
    """Whether what was counted is what was played, to the micro-unit."""
    figures = exactness["measures"]
    if exactness["equal"]:
        return ("[bold green]Counted exactly what was played[/], to the micro-unit, each event "
                "once: " + ", ".join(f"{measure} {money(Decimal(f['counted']), currency)} "
                                     f"({f['counted']})" for measure, f in figures.items()))
    return ("[bold red]Counted is not what was played[/]: " + "; ".join(
        f"{measure} counted {f['counted']}, played {f['played']}"
        for measure, f in figures.items() if f["counted"] != f["played"]))


def span_text(start: float, end: float, zone: str) -> str:
    """``Nov 23 23:16 → Dec 03 23:16 UTC``: a period as the demo's tables head it."""
    tz = ZoneInfo(zone)
    first, last = datetime.fromtimestamp(start, tz), datetime.fromtimestamp(end, tz)
    tail = last.strftime("%H:%M") if last.date() == first.date() else last.strftime("%b %d %H:%M")
    return f"{first.strftime('%b %d %H:%M')} → {tail} {zone}"


def amounts_table(title: str, what: str, amounts: dict[str, str], currency: str) -> Table:
    """One group per row, as currency, then the total; as wide as its title, which says the
    period it covers."""
    grid = titled(title)
    grid.add_column("group")
    grid.add_column(what, justify="right")
    for group, amount in amounts.items():
        grid.add_row(group, money(Decimal(amount), currency))
    grid.add_section()
    total = sum((Decimal(amount) for amount in amounts.values()), Decimal(0))
    grid.add_row("total", money(total, currency), style="bold")
    return grid


def alerts_table(rows: list[dict[str, Any]], now: float, zone: str) -> Table:
    """The alerts pending or firing (rule, then its group), each with the period its rule
    counted: a calendar budget its day or month, a window rule the last hours or minutes."""
    from costline.streams.cli.alerts_cmd import shown_figure, shown_state

    grid = titled("Alerts now, each over the period its rule counts")
    for column in ("alert", "value", "line", "counts"):
        grid.add_column(column, no_wrap=column != "alert", overflow="fold",
                        justify="right" if column in ("value", "line") else "left")
    for row in rows:
        state = shown_state(row)
        alert = row["rule"] if state == "firing" else f"{row['rule']} ({state})"
        group = ", ".join(row["group"].values())
        period = row.get("period") or {}
        counted = period_words(parse_time(period["start"]), parse_time(period["end"]), now,
                               zone) if period.get("start") and period.get("end") else ""
        grid.add_row(f"{alert}\n  {group}" if group else alert, shown_figure(row, "value"),
                     shown_figure(row, "threshold"), counted)
    return grid


def period_words(start: float, end: float, now: float, zone: str) -> str:
    """``last 6h`` for a window ending now; a calendar day, week or month by its name
    (``Dec 03``, ``week of Nov 30``, ``Dec 2026``)."""
    from costline.rules.durations import format_duration

    tz = ZoneInfo(zone)
    first, last = datetime.fromtimestamp(start, tz), datetime.fromtimestamp(end, tz)
    if first.time() == last.time() == datetime.min.time():
        days = (last.date() - first.date()).days
        if days == 1:
            return first.strftime("%b %d")
        if days == 7:
            return f"week of {first.strftime('%b %d')}"
        if first.day == last.day == 1:
            return first.strftime("%b %Y")
    if abs(now - end) < 600:
        # Minutes matter in a short window; past a day ("since the oldest checkpoint") they
        # are noise: "last 1w1d", not "last 1w1d1m".
        unit = 60 if end - start < 86_400 else 3600
        return f"last {format_duration(int(round((end - start) / unit)) * unit)}"
    return span_text(start, end, zone)


def reclamation_text(reclaim: dict[str, Any], currency: str, zone: str) -> str:
    """What releasing the idle boxes saved, or would have, and what that saving counts."""
    resources = ", ".join(reclaim["resources"]) or "none"
    if not reclaim["resources"]:
        return "Idle resources released: none"
    saving = Decimal(reclaim["saved"] if reclaim["live"] else reclaim["would_save"])
    verb = "were released" if reclaim["live"] else "would be released (dry run: nothing touched)"
    gpus = f"{reclaim['units']} GPUs, " if reclaim["units"] else ""
    until = reclaim.get("until")
    counted = (f"{money(Decimal(reclaim['hourly']), currency)}/h until "
               f"{_local(parse_time(until), zone)}, 09:00 on the next business day, when "
               "someone would have noticed them") if until else "their hourly cost"
    saved = "saved" if reclaim["live"] else "would save"
    return (f"Idle resources {resources} ({gpus}{len(reclaim['resources'])} boxes) {verb}: "
            f"that {saved} {money(saving, currency)} — {counted}.")


def _local(ts: float, zone: str) -> str:
    return datetime.fromtimestamp(ts, ZoneInfo(zone)).strftime(f"%a %b %d %H:%M {zone}")


def reclamation(records: list[dict[str, Any]], prices: PriceBook, zone: str, live: bool
                ) -> dict[str, Any]:
    """What reclamation did: resources released (or, in a dry run, that would have been), the
    GPUs they hold (their ``units`` tag), the money that saved and what it counts: each box's
    hourly cost until 09:00 on the next business day."""
    from costline.rules.reclaim import hourly_cost, next_business_morning

    executed = [r for r in records if r["step"] == "executed"]
    dry = [r for r in records if r["step"] == "skipped" and "would_save" in r]
    chosen = executed if live else dry
    hourly = sum(hourly_cost(prices, r.get("resource_type", ""), r.get("tags") or {})
                 for r in chosen)
    until = max((next_business_morning(parse_time(r["at"]), zone) for r in chosen),
                default=None)
    return {
        "live": live,
        "resources": sorted(r["resource_id"] for r in chosen),
        "units": sum(_units(r.get("tags") or {}) for r in chosen),
        "hourly": format_micro(hourly),
        "until": rfc3339(until) if until is not None else None,
        "saved": str(sum((Decimal(r["saved"]) for r in executed), Decimal("0.000000"))),
        "would_save": str(sum((Decimal(r["would_save"]) for r in dry), Decimal("0.000000"))),
        "steps": len(records),
    }


def _units(tags: dict[str, str]) -> int:
    """The accelerators a resource holds (its ``units`` tag), 1 when it does not say."""
    from costline.rules.reclaim import UNITS_TAG

    try:
        return max(1, int(Decimal(tags.get(UNITS_TAG, "1"))))
    except (ArithmeticError, ValueError):
        return 1

