"""``costline spend``: spend and waste per group for a calendar period, from Redis, exactly."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

import typer

from streams.cli import zone_option
from streams.commands import command_group

PERIODS = ("day", "week", "month")


def parse_where(pairs: Sequence[str]) -> dict[str, str]:
    """``KEY=VALUE`` filters (the value may be a ``*`` glob) → a match mapping."""
    match: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{pair!r}: expected KEY=VALUE", param_hint="--where")
        match[key.strip()] = value.strip()
    return match


def spend_report(state: Any, currency: str, by: Sequence[str], where: Mapping[str, str],
                 start: float, end: float, peaks: bool = False) -> dict[str, Any]:
    """The rows of CONTRACT §6: one per group, cost and waste, sorted by cost descending."""
    from rules.durations import rfc3339
    from rules.prices import format_micro

    cost = state.totals("cost", where, by, start, end)
    waste = state.totals("waste", where, by, start, end)
    peak = _peaks(state, where, by, start, end) if peaks else {}
    rows = []
    for group in sorted(set(cost) | set(waste), key=lambda g: (-cost.get(g, 0), g)):
        row: dict[str, Any] = {
            "group": dict(zip(by, group, strict=True)),
            "cost": format_micro(cost.get(group, 0)),
            "waste": format_micro(waste.get(group, 0)),
        }
        if peaks:
            row["peak_hourly"] = format_micro(peak.get(group, 0))
        rows.append(row)
    return {
        "currency": currency,
        "period": {"start": rfc3339(start), "end": rfc3339(end)},
        "rows": rows,
    }


def _peaks(state: Any, where: Mapping[str, str], by: Sequence[str], start: float,
           end: float) -> dict[tuple[str, ...], int]:
    """Highest hourly spend of each group in the period (peaks, not averages)."""
    until = min(end, time.time() + 3600)
    series = state.series("cost", where, by, start, until, step=3600)
    return {group: max(hours.values()) for group, hours in series.items() if hours}


def _table(report: dict[str, Any], by: Sequence[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    period = report["period"]
    table = Table(title=f"Spend {period['start']} → {period['end']} ({report['currency']})")
    for key in by:
        table.add_column(key)
    table.add_column("cost", justify="right")
    table.add_column("waste", justify="right")
    peaks = bool(report["rows"]) and "peak_hourly" in report["rows"][0]
    if peaks:
        table.add_column("peak/h", justify="right")
    for row in report["rows"]:
        cells = [row["group"][key] or "—" for key in by] + [row["cost"], row["waste"]]
        table.add_row(*cells, *([row["peak_hourly"]] if peaks else []))
    Console().print(table)


@command_group
def register(app: typer.Typer) -> None:
    @app.command()
    def spend(
        ctx: typer.Context,
        by: str = typer.Option("", help="Group by these keys (tags, category, resource_type, "
                               "billing), comma-separated."),
        where: list[str] = typer.Option([], help="KEY=VALUE filter (a * glob is allowed); "
                                        "repeatable."),
        period: str = typer.Option("month", help="day, week or month."),
        at: str | None = typer.Option(None, help="A moment inside the period (RFC 3339 or "
                                      "Unix seconds); default now."),
        zone: str | None = typer.Option(None, "--tz", callback=zone_option, help="Time zone "
                                        "of the period; default COSTLINE_TIMEZONE."),
        peaks: bool = typer.Option(False, help="Also give each group's peak hourly spend."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON: currency, period "
                                     "(start, end) and rows (group, cost, waste; peak_hourly "
                                     "with --peaks), amounts as decimal strings."),
    ) -> None:
        """Spend and waste per group for a day, week or month."""
        from redis import Redis

        from connectors.redis_state import RedisState
        from rules.durations import parse_time, period_bounds
        from rules.prices import PriceBook
        from streams.cli import settings_of

        settings = settings_of(ctx)
        if period not in PERIODS:
            raise typer.BadParameter(f"{period!r}: one of day, week, month", param_hint="--period")
        keys = [k.strip() for k in by.split(",") if k.strip()]
        try:
            moment = parse_time(at) if at is not None else time.time()
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--at") from exc
        start, end = period_bounds(moment, period, zone or settings.timezone)  # type: ignore[arg-type]
        state = RedisState(Redis.from_url(settings.redis_url), settings.namespace,
                           settings.timezone)
        currency = PriceBook.load(settings.prices).currency
        report = spend_report(state, currency, keys, parse_where(where), start, end, peaks)
        if as_json:
            typer.echo(json.dumps(report, indent=2))
        else:
            _table(report, keys)
