"""``costline runs``: each training run's spend, what it bought and what it wasted."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import typer

from costline.streams.cli import command_group


def runs_report(state: Any, currency: str, where: Mapping[str, Any], start: float, end: float
                ) -> dict[str, Any]:
    """``runs --json``: every run (``job``) with progress, checkpoints or an end in the
    span: how it ended, its spend and waste, tokens and steps, and what each cost."""
    from costline.rules.durations import rfc3339
    from costline.rules.events import RUN_TAG
    from costline.rules.inventory import by_run
    from costline.rules.prices import format_micro
    from costline.rules.runs import latest_ends
    from costline.streams.cli.training import efficiency_by, efficiency_fields

    found = efficiency_by(state, [RUN_TAG], where, start, end)
    ends = latest_ends(state.run_ends())
    checkpoints = by_run(state.checkpoints())
    runs = {group[0] for group, e in found.items() if e.tokens or e.steps}
    runs |= {run for run in set(ends) | set(checkpoints) if (run,) in found}
    rows = []
    for run in sorted(runs, key=lambda r: (-found[(r,)].cost, r)):
        efficiency, end_of = found[(run,)], ends.get(run)
        rows.append({
            "run": run, "status": end_of.status if end_of else "running",
            "ended_at": rfc3339(end_of.ts) if end_of else None,
            "cost": format_micro(efficiency.cost), "waste": format_micro(efficiency.waste),
            **efficiency_fields(efficiency),
            "checkpoints": sum(1 for c in checkpoints.get(run, []) if c.live),
        })
    return {"currency": currency, "period": {"start": rfc3339(start), "end": rfc3339(end)},
            "runs": rows}


def _table(report: Mapping[str, Any]) -> None:
    from rich.console import Console

    from costline.rules.money import money
    from costline.streams.cli.tables import titled
    from costline.streams.cli.training import per_text, tokens_text

    currency, period = report["currency"], report["period"]
    table = titled(f"Training runs {period['start']} → {period['end']}")
    for column in ("run", "status", "spend", "waste", "tokens", "per Mtok", "steps",
                   "per step", "checkpoints"):
        table.add_column(column, justify="left" if column in ("run", "status") else "right")
    for row in report["runs"]:
        table.add_row(row["run"], row["status"], money(Decimal(row["cost"]), currency),
                      money(Decimal(row["waste"]), currency), tokens_text(row["tokens"]),
                      per_text(row["cost_per_mtok"], currency), f"{int(row['steps']):,}",
                      per_text(row["cost_per_step"], currency), str(row["checkpoints"]))
    Console().print(table)


@command_group
def register(app: typer.Typer) -> None:
    @app.command()
    def runs(
        ctx: typer.Context,
        since: str = typer.Option("30d", metavar="DURATION", help="How far back: 7d, 30d…"),
        where: list[str] = typer.Option([], metavar="KEY=VALUE", help="Filter (a * glob is "
                                        "allowed); repeatable, as for costline spend."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON: currency, period and "
                                     "runs (run, status, ended_at, cost, waste, tokens, "
                                     "cost_per_mtok, steps, cost_per_step, checkpoints), "
                                     "amounts as decimal strings."),
    ) -> None:
        """Each training run's spend per million tokens and per step, its waste beside it."""
        from costline.streams.cli.spend_cmd import parse_filters
        from costline.streams.cli.training import duration, reading

        span = duration(since, "--since")
        filters = parse_filters(where)
        read = reading(ctx)
        now = time.time()
        report = runs_report(read.state, read.prices.currency, filters, now - span, now + 300)
        if as_json:
            typer.echo(json.dumps(report, indent=2))
        else:
            _table(report)
