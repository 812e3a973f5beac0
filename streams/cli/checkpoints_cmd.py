"""``costline checkpoints``: the inventory and its storage cost by tier, what the lifecycle
rules ask now, pins, approvals, the lifecycle's audit log, pause and resume."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from decimal import Decimal
from typing import Any, TypeVar

import typer

from costline.streams.cli import command_group

T = TypeVar("T")
DAY_H = 24


def size_text(size: int) -> str:
    """``1.10 TB``, ``512.0 GB``, ``900 B`` (decimal units, as storage is billed)."""
    for unit, scale in (("PB", 10**15), ("TB", 10**12), ("GB", 10**9), ("MB", 10**6)):
        if size >= scale:
            return f"{size / scale:,.2f} {unit}"
    return f"{size:,} B"


def inventory_report(state: Any, currency: str, now: float, run: str | None = None,
                     everything: bool = False) -> dict[str, Any]:
    """``checkpoints --json``: storage by tier, then each run's checkpoints (live ones, or
    all with ``everything``), each with what it costs a day and has cost so far."""
    from costline.rules.durations import rfc3339
    from costline.rules.inventory import by_run, by_tier, latest_of, storage_now, storage_so_far
    from costline.rules.prices import format_micro

    checkpoints = [c for c in state.checkpoints() if run is None or c.run == run]
    pins = state.pins()
    runs = []
    for name, found in by_run(checkpoints).items():
        latest = latest_of(found)
        rows = []
        for checkpoint in found:
            if not (checkpoint.live or everything):
                continue
            pin = pins.get(checkpoint.checkpoint_id)
            pinned = pin is not None and pin.until > now
            rows.append({
                "checkpoint_id": checkpoint.checkpoint_id, "step": checkpoint.step,
                "bytes": checkpoint.bytes, "tier": checkpoint.tier,
                "location": checkpoint.location, "written_at": rfc3339(checkpoint.written_at),
                "write_seconds": checkpoint.write_seconds,
                "deleted_at": rfc3339(checkpoint.deleted_at) if checkpoint.deleted_at else None,
                "per_day": format_micro(storage_now(checkpoint) * DAY_H),
                "so_far": format_micro(storage_so_far(checkpoint, now)),
                "latest": latest is not None and latest.checkpoint_id == checkpoint.checkpoint_id,
                "pinned_by": pin.by if pin and pinned else None,
                "pinned_until": rfc3339(pin.until) if pin and pinned else None,
            })
        runs.append({"run": name, "checkpoints": rows})
    tiers = [{"tier": tier, "checkpoints": total.count, "bytes": total.bytes,
              "runs": len(total.runs), "per_day": format_micro(total.hourly * DAY_H),
              "so_far": format_micro(total.so_far)}
             for tier, total in by_tier(checkpoints, now).items()]
    return {"currency": currency, "at": rfc3339(now), "tiers": tiers, "runs": runs}


def _print_inventory(report: Mapping[str, Any]) -> None:
    from rich.console import Console

    from costline.rules.durations import format_duration, parse_time
    from costline.rules.money import money
    from costline.streams.cli.tables import titled

    console, currency = Console(), report["currency"]
    now = parse_time(report["at"])
    tiers = titled(f"Checkpoint storage by tier at {report['at']}")
    for column in ("tier", "checkpoints", "runs", "size", "per day", "so far"):
        tiers.add_column(column, justify="left" if column == "tier" else "right")
    for tier in report["tiers"]:
        tiers.add_row(tier["tier"], str(tier["checkpoints"]), str(tier["runs"]),
                      size_text(tier["bytes"]), money(Decimal(tier["per_day"]), currency),
                      money(Decimal(tier["so_far"]), currency))
    console.print(tiers)
    for run in report["runs"]:
        table = titled(f"{run['run']}: {len(run['checkpoints'])} checkpoint(s)")
        for column in ("step", "tier", "size", "age", "per day", "so far", "note",
                       "location"):
            table.add_column(column, justify="right" if column in (
                "step", "size", "age", "per day", "so far") else "left",
                overflow="fold")
        for row in run["checkpoints"]:
            notes = ["latest"] if row["latest"] else []
            if row["pinned_by"]:
                notes.append(f"pinned by {row['pinned_by']}")
            if row["deleted_at"]:
                notes.append(f"deleted {row['deleted_at']}")
            age = format_duration(max(0, int(now - parse_time(row["written_at"]))) // 60 * 60)
            table.add_row(f"{row['step']:,}", row["tier"], size_text(row["bytes"]), age,
                          money(Decimal(row["per_day"]), currency),
                          money(Decimal(row["so_far"]), currency), ", ".join(notes),
                          row["location"])
        console.print(table)


def plan_report(state: Any, rules: Any, prices: Any, now: float) -> list[dict[str, Any]]:
    """``checkpoints plan --json``: what each lifecycle rule asks now, with what it saves a
    day; nothing is done (the worker acts, after a grace and a re-check)."""
    from costline.rules.kinds.checkpoint_lifecycle import CheckpointLifecycleRule
    from costline.rules.prices import format_micro

    found = []
    for rule in rules:
        if not isinstance(rule, CheckpointLifecycleRule):
            continue
        for run, actions in rule.actions(state, now).items():
            for action in actions:
                checkpoint = action.checkpoint
                found.append({
                    "rule": rule.name, "run": run, "checkpoint_id": checkpoint.checkpoint_id,
                    "step": checkpoint.step, "action": action.action,
                    "to_tier": action.to_tier, "location": checkpoint.location,
                    "reason": action.reason, "mode": rule.mode,
                    "connector": rule.act.connector if rule.act else None,
                    "saves_per_day": format_micro(action.saves_per_hour(prices) * DAY_H),
                })
    return found


def _with_ledger(ctx: typer.Context, use: Callable[[Any], Awaitable[T]]) -> T:
    """Run ``use(ledger)`` against the namespace's checkpoint lifecycle ledger."""
    from costline.connectors.reclaim_ledger import RedisReclaimLedger
    from costline.connectors.redis_client import connect_async
    from costline.streams.cli.root import settings_of

    settings = settings_of(ctx)
    redis = connect_async(settings.redis_url)

    async def run() -> T:
        try:
            return await use(RedisReclaimLedger(redis, settings.namespace, "checkpoints"))
        finally:
            await redis.aclose()

    return asyncio.run(run())


@command_group
def register(app: typer.Typer) -> None:
    group = typer.Typer(help="Checkpoints: the inventory and its storage cost, the lifecycle's "
                        "plan, pins, approvals and audit log.", invoke_without_command=True)
    app.add_typer(group, name="checkpoints")

    @group.callback()
    def checkpoints(ctx: typer.Context) -> None:
        """Each run's checkpoints and their storage cost by tier (``list``) unless a command
        is named."""
        if ctx.invoked_subcommand is None:
            ctx.invoke(listing, ctx=ctx, run=None, everything=False, as_json=False)

    @group.command("list")
    def listing(
        ctx: typer.Context,
        run: str | None = typer.Option(None, metavar="RUN", help="Only this run (its job)."),
        everything: bool = typer.Option(False, "--all", help="Deleted checkpoints too."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON: tiers and runs, "
                                     "amounts as decimal strings."),
    ) -> None:
        """Each run's checkpoints and their storage cost by tier, a day and so far."""
        from costline.streams.cli.training import reading

        read = reading(ctx)
        report = inventory_report(read.state, read.prices.currency, time.time(), run,
                                  everything)
        if as_json:
            typer.echo(json.dumps(report, indent=2))
        else:
            _print_inventory(report)

    @group.command("plan")
    def plan(
        ctx: typer.Context,
        as_json: bool = typer.Option(False, "--json", help="Print the actions as JSON."),
    ) -> None:
        """What the checkpoint_lifecycle rules ask now: a dry run that touches nothing."""
        from costline.connectors.plugins import PLUGINS
        from costline.rules.loader import load_rules
        from costline.rules.money import money
        from costline.streams.cli.training import reading

        read = reading(ctx)
        rules = load_rules([read.settings.rules], read.settings.timezone, plugins=PLUGINS)
        found = plan_report(read.state, rules, read.prices, time.time())
        if as_json:
            typer.echo(json.dumps(found, indent=2))
            return
        for item in found:
            where = f" to {item['to_tier']}" if item["to_tier"] else ""
            typer.echo(f"{item['rule']} {item['run']} step {item['step']}: {item['action']}"
                       f"{where} ({item['reason']}), saves "
                       f"{money(Decimal(item['saves_per_day']), read.prices.currency)}/day "
                       f"[{item['mode']}]: {item['location']}")
        total = sum((Decimal(i["saves_per_day"]) for i in found), Decimal(0))
        typer.echo(f"{len(found)} action(s), {money(total, read.prices.currency)}/day of "
                   "storage; nothing was touched")

    @group.command("pin")
    def pin(
        ctx: typer.Context,
        checkpoint_id: str = typer.Argument(..., metavar="CHECKPOINT", help="Its id or "
                                            "location."),
        hold: str = typer.Option("30d", "--for", metavar="DURATION", help="How long."),
        by: str | None = typer.Option(None, help="Who; default the current user."),
        reason: str = typer.Option("", help="Why (shown in the inventory and the audit log)."),
    ) -> None:
        """Keep a checkpoint out of every lifecycle rule's reach for a while."""
        from costline.connectors.checkpoint_store import CheckpointStore
        from costline.rules.durations import rfc3339
        from costline.rules.inventory import Pin
        from costline.streams.cli.actions_cmd import acting_user
        from costline.streams.cli.training import duration, reading

        until = time.time() + duration(hold, "--for")
        read = reading(ctx)
        who = acting_user(by)
        CheckpointStore(read.state.redis, read.settings.namespace).pin(
            checkpoint_id, Pin(who, until, reason))
        typer.echo(f"{checkpoint_id} pinned by {who} until {rfc3339(until)}")

    @group.command("unpin")
    def unpin(ctx: typer.Context, checkpoint_id: str = typer.Argument(..., metavar="CHECKPOINT")
              ) -> None:
        """Let the lifecycle rules decide about a pinned checkpoint again."""
        from costline.connectors.checkpoint_store import CheckpointStore
        from costline.streams.cli.training import reading

        read = reading(ctx)
        done = CheckpointStore(read.state.redis, read.settings.namespace).unpin(checkpoint_id)
        typer.echo(f"{checkpoint_id} unpinned" if done else f"{checkpoint_id} was not pinned")

    @group.command("approve")
    def approve(
        ctx: typer.Context,
        rule: str = typer.Argument(..., metavar="RULE"),
        checkpoint_id: str = typer.Argument(..., metavar="CHECKPOINT"),
        by: str | None = typer.Option(None, help="Who; default the current user."),
    ) -> None:
        """Approve a planned move or deletion of a rule with approval: manual."""
        from costline.streams.cli.actions_cmd import acting_user

        who = acting_user(by)

        async def go(ledger: Any) -> bool:
            holder = await ledger.holder(rule, checkpoint_id)
            return bool(holder) and bool(await ledger.approve(holder, who))

        if not _with_ledger(ctx, go):
            typer.echo(f"no planned action on {checkpoint_id} for rule {rule}", err=True)
            raise typer.Exit(1)
        typer.echo(f"approved by {who}: acted on after its grace and re-check")

    @group.command("actions")
    def actions(
        ctx: typer.Context,
        limit: int = typer.Option(50, min=1, max=10_000, help="How many steps to show."),
        as_json: bool = typer.Option(False, "--json", help="Print the action records."),
    ) -> None:
        """The lifecycle's latest steps (planned, warned, executed, skipped, failed)."""

        async def latest(ledger: Any) -> list[dict[str, Any]]:
            found: list[dict[str, Any]] = await ledger.history(limit)
            return found

        records = _with_ledger(ctx, latest)
        if as_json:
            typer.echo(json.dumps(records, indent=2))
            return
        for record in records:
            typer.echo(f"{record.get('at')} {record.get('step', '?'):<8} {record.get('rule')} "
                       f"{record.get('resource_id')} ({record.get('mode')}): "
                       f"{record.get('reason')}")
        typer.echo(f"{len(records)} step(s), newest first")

    @group.command("pause")
    def pause(ctx: typer.Context, reason: str = typer.Option("", help="Why."),
              by: str | None = typer.Option(None, help="Who; default the current user.")
              ) -> None:
        """Stop the checkpoint lifecycle now: nothing is planned, moved or deleted."""
        from costline.connectors.reclaim_ledger import Pause
        from costline.streams.cli.actions_cmd import acting_user

        who = acting_user(by)

        async def stop(ledger: Any) -> None:
            await ledger.pause(Pause(who, time.time(), reason))

        _with_ledger(ctx, stop)
        typer.echo(f"checkpoint lifecycle paused by {who}")

    @group.command("resume")
    def resume(ctx: typer.Context) -> None:
        """Resume the checkpoint lifecycle (due plans are re-checked afresh)."""

        async def go(ledger: Any) -> bool:
            resumed: bool = await ledger.resume()
            return resumed

        was = _with_ledger(ctx, go)
        typer.echo("checkpoint lifecycle resumed" if was else "it was not paused")
