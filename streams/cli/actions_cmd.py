"""``costline actions`` and ``costline reclaim``: the audit log of reclamation and budget
enforcement, and the reclamation's pause and resume."""

from __future__ import annotations

import asyncio
import getpass
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import typer

from costline.streams.cli import command_group

T = TypeVar("T")


def _with_ledger(ctx: typer.Context, use: Callable[[Any], Awaitable[T]]) -> T:
    """Run ``use(ledger)`` against the namespace's Redis ledger."""
    from costline.connectors.reclaim_ledger import RedisReclaimLedger
    from costline.connectors.redis_client import connect_async
    from costline.streams.cli.root import settings_of

    settings = settings_of(ctx)
    redis = connect_async(settings.redis_url)

    async def run() -> T:
        try:
            return await use(RedisReclaimLedger(redis, settings.namespace))
        finally:
            await redis.aclose()

    return asyncio.run(run())


def action_line(record: dict[str, Any]) -> str:
    """One step for people: when, what, which resource, how, the money, and why."""
    return (f"{record.get('at', '?')} {record.get('step', '?'):<8} {record.get('rule', '?')} "
            f"{record.get('resource_id', '?')} via {record.get('connector', '?')} "
            f"({record.get('mode', '?')}){_saving(record)}: {record.get('reason', '')}")


def _saving(record: dict[str, Any]) -> str:
    """`` saved $12.34`` for a release, `` would save $12.34`` for a dry run's, else nothing."""
    from decimal import Decimal, InvalidOperation

    from costline.rules.money import money

    currency = str(record.get("currency") or "")
    for field, words in (("saved", "saved"), ("would_save", "would save")):
        try:
            amount = Decimal(str(record.get(field) or 0))
        except InvalidOperation:
            continue
        if amount:
            return f" {words} {money(amount, currency)}"
    return ""


def status_report(pause: Any, plans: list[Any], now: float,
                  rules: Any | None = None) -> dict[str, Any]:
    """Paused or not, and the open plans: what ``reclaim status --json`` prints. A plan is
    due when its grace ends under its rule as loaded now (``rules``: a grace lengthened since
    the warning applies), or as planned without them."""
    from costline.rules.durations import rfc3339
    from costline.rules.kinds.idle import IdleRule
    from costline.rules.reclaim import due_time

    def row(tracked: Any) -> dict[str, Any]:
        plan, rule = tracked.plan, rules.get(tracked.plan.rule) if rules is not None else None
        due = due_time(tracked, rule if isinstance(rule, IdleRule) else None)
        return {"plan_id": plan.plan_id, "rule": plan.rule, "resource_id": plan.resource_id,
                "connector": plan.connector, "mode": plan.mode, "state": tracked.state,
                "execute_at": rfc3339(due), "due": due <= now,
                "approved_by": tracked.approved_by}

    return {
        "paused": pause is not None,
        "paused_by": getattr(pause, "by", None),
        "paused_at": rfc3339(pause.at) if pause is not None else None,
        "reason": getattr(pause, "reason", None),
        "plans": [row(t) for t in plans],
    }


def rules_now(ctx: typer.Context) -> Any | None:
    """The rule set as the worker would load it now, or ``None`` (with a line on stderr)
    when it does not load: the status still shows the plans, at their planned times."""
    from costline.connectors.plugins import PLUGINS
    from costline.rules.loader import RulesInvalid, load_rules
    from costline.streams.cli.root import settings_of

    settings = settings_of(ctx)
    try:
        return load_rules([settings.rules], settings.timezone, plugins=PLUGINS)
    except RulesInvalid:
        typer.echo(f"the rules in {settings.rules} do not load (costline rules validate): "
                   "plans shown at the times they were planned", err=True)
        return None


def acting_user(by: str | None) -> str:
    """Who an operator's command is recorded as: ``--by``, else the login name."""
    if by:
        return by
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


@command_group
def register(app: typer.Typer) -> None:
    @app.command()
    def actions(
        ctx: typer.Context,
        limit: int = typer.Option(50, min=1, max=10_000, help="How many steps to show."),
        as_json: bool = typer.Option(False, "--json", help="Print the action records as JSON."),
    ) -> None:
        """The latest steps of reclamation and budget enforcement (planned, warned,
        executed, skipped, failed, lifted), newest first."""
        from costline.connectors.enforce_ledger import redis_enforce_ledger

        async def latest(ledger: Any) -> list[dict[str, Any]]:
            found: list[dict[str, Any]] = await ledger.history(limit)
            enforce = redis_enforce_ledger(ledger.redis, ledger.namespace)
            found += await enforce.history(limit)
            found.sort(key=lambda record: str(record.get("at", "")), reverse=True)
            return found[:limit]

        records = _with_ledger(ctx, latest)
        if as_json:
            typer.echo(json.dumps(records, indent=2))
            return
        for record in records:
            typer.echo(action_line(record))
        typer.echo(f"{len(records)} step(s), newest first")

    reclaim = typer.Typer(help="Automatic reclamation: pause, resume, status.",
                          no_args_is_help=True)
    app.add_typer(reclaim, name="reclaim")

    @reclaim.command("pause")
    def pause(
        ctx: typer.Context,
        reason: str = typer.Option("", help="Why (shown by status)."),
        by: str | None = typer.Option(None, help="Who; default the current user."),
    ) -> None:
        """Stop all reclamation now: no new plans, due plans are skipped, nothing released."""
        from costline.connectors.reclaim_ledger import Pause

        who = acting_user(by)

        async def stop(ledger: Any) -> None:
            await ledger.pause(Pause(who, time.time(), reason))

        _with_ledger(ctx, stop)
        typer.echo(f"reclamation paused by {who}")

    @reclaim.command("resume")
    def resume(ctx: typer.Context) -> None:
        """Resume reclamation (resources are planned afresh, each with its full grace)."""

        async def go(ledger: Any) -> bool:
            resumed: bool = await ledger.resume()
            return resumed

        was_paused = _with_ledger(ctx, go)
        typer.echo("reclamation resumed" if was_paused else "reclamation was not paused")

    @reclaim.command("status")
    def status(
        ctx: typer.Context,
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """Whether reclamation is paused, and the plans waiting for their grace or approval."""

        rules = rules_now(ctx)

        async def read(ledger: Any) -> dict[str, Any]:
            return status_report(await ledger.paused(), await ledger.plans(), time.time(),
                                 rules)

        report = _with_ledger(ctx, read)
        if as_json:
            typer.echo(json.dumps(report, indent=2))
            return
        if report["paused"]:
            why = f": {report['reason']}" if report["reason"] else ""
            typer.echo(f"paused by {report['paused_by']} at {report['paused_at']}{why}")
        else:
            typer.echo("running")
        for plan in report["plans"]:
            typer.echo(f"  {plan['state']:<9} {plan['rule']} {plan['resource_id']} via "
                       f"{plan['connector']} ({plan['mode']}) at {plan['execute_at']}")
        typer.echo(f"{len(report['plans'])} open plan(s)")
