"""What the demo says of run-42's economics at the end: its dollars per million tokens and per
step with its waste beside them, its checkpoint inventory by tier, the lifecycle's expiry dry
run, and the checkpoint interval advice — each read back the way its command reads it
(``costline runs``, ``checkpoints``, ``advise checkpoints``)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from rich.console import Console

from costline.rules.money import money
from costline.streams.cli.tables import titled

RUN = "run-42"


def training_summary(state: Any, settings: Any, start: float, end: float) -> dict[str, Any]:
    """The figures, as ``--json`` prints them."""
    from costline.connectors.plugins import PLUGINS
    from costline.rules.kinds.checkpoint_interval import CheckpointIntervalRule
    from costline.rules.loader import load_rules
    from costline.rules.prices import PriceBook
    from costline.streams.cli.advise_cmd import advice_report
    from costline.streams.cli.checkpoints_cmd import inventory_report
    from costline.streams.cli.runs_cmd import runs_report

    currency = PriceBook.load(settings.prices).currency
    runs = runs_report(state, currency, {}, start, end)
    interval = next((r for r in load_rules([settings.rules], settings.timezone,
                                           plugins=PLUGINS)
                     if isinstance(r, CheckpointIntervalRule)), None)
    advice = advice_report(interval.advice(state, time.time()) if interval else [], currency)
    inventory = inventory_report(state, currency, time.time(), RUN)
    return {"runs": runs["runs"], "checkpoint_tiers": inventory["tiers"],
            "checkpoints": len(inventory["runs"][0]["checkpoints"]) if inventory["runs"] else 0,
            "advice": advice["runs"]}


def expiry(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The checkpoint lifecycle's dry run: what it would move and delete, and what that saves
    a day (the lifecycle's records carry ``saves_per_day``)."""
    closed = [r for r in records if "saves_per_day" in r and r.get("dry_run")]
    actions: dict[str, int] = {}
    for record in closed:
        name = "delete" if record["action"] == "delete" else f"move to {record['to_tier']}"
        actions[name] = actions.get(name, 0) + 1
    saves = sum((Decimal(r["saves_per_day"]) for r in closed), Decimal("0.000000"))
    return {"actions": actions, "saves_per_day": str(saves)}


def print_training(out: Console, summary: Mapping[str, Any]) -> None:
    currency = summary["currency"]
    runs = {row["run"]: row for row in summary.get("runs", [])}
    run = runs.get(RUN)
    if run is not None:
        out.print(
            f"[bold]{RUN}[/]: {money(Decimal(run['cost']), currency)} for "
            f"{int(run['tokens']) / 1e9:,.1f}B tokens in {int(run['steps']):,} steps: "
            f"[bold]{money(Decimal(run['cost_per_mtok'] or 0), currency)} per million tokens"
            f"[/], {money(Decimal(run['cost_per_step'] or 0), currency)} a step; waste "
            f"{money(Decimal(run['waste']), currency)} beside it.")
    failed = [row for row in runs.values() if row["status"] == "failed"]
    if failed:
        lost = sum((Decimal(row["waste"]) for row in failed), Decimal(0))
        names = ", ".join(sorted(row["run"] for row in failed))
        out.print(f"Failed runs: {names} — their whole spend, {money(lost, currency)}, is "
                  "waste (failed_run).")
    tiers = titled(f"{RUN}'s {summary.get('checkpoints', 0)} checkpoints by tier")
    for column in ("tier", "checkpoints", "per day", "so far"):
        tiers.add_column(column, justify="left" if column == "tier" else "right")
    for tier in summary.get("checkpoint_tiers", []):
        tiers.add_row(tier["tier"], str(tier["checkpoints"]),
                      money(Decimal(tier["per_day"]), currency),
                      money(Decimal(tier["so_far"]), currency))
    out.print(tiers)
    dry = summary.get("expiry_dry_run") or {}
    if dry.get("actions"):
        said = ", ".join(f"{count} to {name}" for name, count in sorted(dry["actions"].items()))
        out.print(f"Checkpoint expiry, a dry run: {said}, saving "
                  f"{money(Decimal(dry['saves_per_day']), currency)} a day; nothing was "
                  "touched (costline checkpoints plan).")
    for advice in summary.get("advice", []):
        out.print(_advice_line(advice, currency))


def _advice_line(advice: Mapping[str, Any], currency: str) -> str:
    from costline.rules.kinds.checkpoint_interval import interval_text

    now, best = advice["now"], advice["optimal"]
    return (f"Checkpoint interval of {advice['run']}: every "
            f"{interval_text(Decimal(advice['interval_seconds']))} costs "
            f"{money(Decimal(now['total']), currency)} a day (recompute "
            f"{money(Decimal(now['recompute']), currency)}, overhead "
            f"{money(Decimal(now['overhead']), currency)}, storage "
            f"{money(Decimal(now['storage']), currency)}); every "
            f"{interval_text(Decimal(advice['optimal_seconds']))} would cost "
            f"{money(Decimal(best['total']), currency)}: [bold]"
            f"{money(Decimal(advice['at_stake_per_day']), currency)} a day at stake[/] "
            f"(MTBF {advice['mtbf_hours']} h, {advice['write_seconds']} s to write; "
            "costline advise checkpoints).")
