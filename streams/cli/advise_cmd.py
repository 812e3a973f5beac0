"""``costline advise checkpoints``: each run's checkpoint interval now and the one that costs
least, and what each costs a day (``costline.rules.interval``)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import typer

from costline.streams.cli import command_group

HOUR_S = Decimal(3600)


def _daily(cost: Any) -> dict[str, str]:
    from costline.rules.prices import format_micro

    return {"recompute": format_micro(cost.recompute), "overhead": format_micro(cost.overhead),
            "storage": format_micro(cost.storage), "total": format_micro(cost.total)}


def _seconds(value: Decimal) -> str:
    return f"{value:.1f}"


def advice_report(found: list[Any], currency: str) -> dict[str, Any]:
    """``advise checkpoints --json``: per run, the figures the advice rests on, the two
    intervals, and what each costs a day; money as six-place decimal strings."""
    from costline.rules.prices import format_micro

    runs = []
    for run in found:
        advice, rate, inputs = run.advice, run.rate, run.advice.inputs
        runs.append({
            "run": run.run, "group": run.group,
            "accelerators": f"{inputs.accelerators:.2f}",
            "burn_per_hour": f"{inputs.burn_per_hour:.6f}",
            "fault_rate": {"per_accelerator_day": f"{rate.per_accelerator_hour * 24:.9f}",
                           "faults": rate.faults,
                           "accelerator_hours": f"{rate.accelerator_hours:.2f}",
                           "measured": rate.measured},
            "mtbf_hours": f"{inputs.mtbf_seconds / HOUR_S:.2f}",
            "write_seconds": _seconds(inputs.write_seconds),
            "storage_per_hour": f"{inputs.storage_per_hour:.6f}",
            "checkpoints_kept": run.checkpoints,
            "interval_seconds": _seconds(inputs.interval_seconds),
            "optimal_seconds": _seconds(advice.optimal_seconds),
            "young_seconds": _seconds(advice.young_seconds),
            "now": _daily(advice.now), "optimal": _daily(advice.best),
            "at_stake_per_day": format_micro(advice.at_stake),
            "excess": f"{advice.excess:.4f}",
        })
    return {"currency": currency, "runs": runs}


def _print(report: Mapping[str, Any]) -> None:
    from rich.console import Console

    from costline.rules.kinds.checkpoint_interval import interval_text
    from costline.rules.money import money
    from costline.streams.cli.tables import titled

    console, currency = Console(), report["currency"]
    if not report["runs"]:
        console.print("No run to advise: a run needs two checkpoints, accelerator spend in "
                      "the window and a fault rate (measured, or the rule's fault_rate).")
    for run in report["runs"]:
        rate = run["fault_rate"]
        source = (f"{rate['faults']} faults in {Decimal(rate['accelerator_hours']):,.0f} "
                  "accelerator-hours" if rate["measured"] else
                  f"assumed {Decimal(rate['per_accelerator_day']):.6f} per accelerator-day")
        table = titled(
            f"{run['run']}: {Decimal(run['accelerators']):,.0f} accelerators at "
            f"{money(Decimal(run['burn_per_hour']), currency)}/h; MTBF "
            f"{run['mtbf_hours']} h ({source}); {run['write_seconds']} s to write a "
            f"checkpoint; {run['checkpoints_kept']} kept, "
            f"{money(Decimal(run['storage_per_hour']), currency)}/h")
        table.add_column("a day")
        now = interval_text(Decimal(run["interval_seconds"]))
        best = interval_text(Decimal(run["optimal_seconds"]))
        table.add_column(f"every {now} (now)", justify="right")
        table.add_column(f"every {best} (optimal)", justify="right")
        for part in ("recompute", "overhead", "storage", "total"):
            table.add_row(part, money(Decimal(run["now"][part]), currency),
                          money(Decimal(run["optimal"][part]), currency),
                          style="bold" if part == "total" else None)
        console.print(table)
        excess = Decimal(run["excess"]) * 100
        console.print(f"  at stake: {money(Decimal(run['at_stake_per_day']), currency)} a day "
                      f"({excess:.0f}% above the optimum; Young's interval without storage: "
                      f"{interval_text(Decimal(run['young_seconds']))})\n")


@command_group
def register(app: typer.Typer) -> None:
    advise = typer.Typer(help="Advice worked out from what was counted.", no_args_is_help=True)
    app.add_typer(advise, name="advise")

    @advise.command("checkpoints")
    def checkpoints(
        ctx: typer.Context,
        rule: str | None = typer.Option(None, metavar="NAME", help="Take the settings of this "
                                        "checkpoint_interval rule (COSTLINE_RULES)."),
        where: list[str] = typer.Option([], metavar="KEY=VALUE", help="The runs to advise "
                                        "(a * glob is allowed; one value per key)."),
        fault_rate: float | None = typer.Option(None, metavar="PER_DAY", help="Interruptions "
                                                "per accelerator-day to assume while too few "
                                                "faults are measured (Llama 3: 0.000474)."),
        at: str | None = typer.Option(None, metavar="TIME", help="Advise as of this moment: "
                                      "RFC 3339 with an offset, Unix seconds, or a time ago "
                                      "such as -2h; default now."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON, money as decimal "
                                     "strings."),
    ) -> None:
        """Each run's checkpoint interval now and the one that costs least (Young/Daly), and
        what recompute, checkpoint overhead and storage cost a day at each."""
        from costline.connectors.plugins import PLUGINS
        from costline.rules.kinds.checkpoint_interval import CheckpointIntervalRule
        from costline.rules.loader import load_rules
        from costline.streams.cli.alerts_cmd import parse_matchers
        from costline.streams.cli.root import moment
        from costline.streams.cli.training import reading

        read = reading(ctx)
        chosen: Any = None
        if rule is not None:
            chosen = load_rules([read.settings.rules], read.settings.timezone,
                                plugins=PLUGINS).get(rule)
            if not isinstance(chosen, CheckpointIntervalRule):
                raise typer.BadParameter(f"{rule!r} is not a checkpoint_interval rule of "
                                         f"{read.settings.rules}", param_hint="--rule")
        if chosen is None:
            chosen = CheckpointIntervalRule.model_validate(
                {"name": "advice", "kind": "checkpoint_interval"})
        update: dict[str, Any] = {}
        if where:
            update["match"] = parse_matchers(where)
        if fault_rate is not None:
            if not 0 < fault_rate <= 1:
                raise typer.BadParameter("a rate per accelerator-day in (0, 1]",
                                         param_hint="--fault-rate")
            update["fault_rate"] = Decimal(str(fault_rate))
        advised = chosen.model_copy(update=update)
        now = moment(at, time.time(), read.settings.timezone)
        report = advice_report(advised.advice(read.state, now), read.prices.currency)
        if as_json:
            typer.echo(json.dumps(report, indent=2))
        else:
            _print(report)
