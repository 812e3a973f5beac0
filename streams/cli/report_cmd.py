"""``costline report``: the period's spend, budgets, waste and savings as one HTML page."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, cast

import typer

from costline.streams.cli import command_group
from costline.streams.cli.root import AT_HELP

if TYPE_CHECKING:
    from costline.rules.durations import Period

PERIODS = ("day", "week", "month")
DEFAULT_BY = "team,project,job"


def _period(period: str) -> Period:
    if period not in PERIODS:
        raise typer.BadParameter(f"{period!r}: one of day, week, month", param_hint="--period")
    return cast("Period", period)


def _keys(by: str) -> tuple[str, ...]:
    from costline.streams.cli.spend_cmd import group_keys

    keys = tuple(dict.fromkeys(group_keys(by)))
    if not keys:
        raise typer.BadParameter("name at least one key, e.g. team", param_hint="--by")
    return keys


def _write(page: str, target: Path) -> None:
    if str(target) == "-":
        typer.echo(page, nl=False)
        return
    partial = target.with_name(f".{target.name}.partial")
    partial.write_text(page, encoding="utf-8")
    partial.replace(target)


@command_group
def register(app: typer.Typer) -> None:
    @app.command()
    def report(
        ctx: typer.Context,
        html: Path = typer.Option(..., "--html", help="Write the page to this file ('-' for "
                                  "standard output)."),
        period: str = typer.Option("month", help="day, week or month."),
        at: str | None = typer.Option(None, metavar="TIME", help=AT_HELP),
        by: str = typer.Option(DEFAULT_BY, metavar="KEY,...", help="Top spenders by these "
                               "keys (tags, category, resource_type), comma-separated; one "
                               "chart each."),
    ) -> None:
        """A self-contained HTML report: spend against budgets, waste by fault type, top
        spenders and the idle hours reclaimed, for a day, week or month."""
        from costline.connectors.report_html import render
        from costline.rules.loader import RulesInvalid
        from costline.streams.cli.report import ReportRequest, gather
        from costline.streams.cli.root import moment, settings_of

        settings = settings_of(ctx)
        now = time.time()
        request = ReportRequest(period=_period(period), at=moment(at, now, settings.timezone),
                                now=now, zone=settings.timezone, by=_keys(by))
        try:
            page = render(gather(settings, request))
        except RulesInvalid as exc:
            for error in exc.errors:
                typer.echo(str(error), err=True)
            typer.echo("costline report: the rule set does not load", err=True)
            raise typer.Exit(1) from exc
        try:
            _write(page, html)
        except OSError as exc:
            typer.echo(f"costline report: cannot write {html}: {exc.strerror or exc}", err=True)
            raise typer.Exit(1) from exc
        if str(html) != "-":
            typer.echo(f"report written to {html} ({len(page.encode())} bytes)")
