"""``costline enforce``: budget enforcement's lift, pause, resume and status."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import typer

from costline.streams.cli import command_group
from costline.streams.cli.actions_cmd import acting_user

T = TypeVar("T")


def _with_enforcer(ctx: typer.Context, use: Callable[[Any], Awaitable[T]]) -> T:
    """Run ``use(enforcer)`` against the namespace's ledger, the rules and the connectors:
    a lift by hand restores the values here, as the worker would."""
    from costline.connectors.enforce_ledger import redis_enforce_ledger
    from costline.connectors.plugins import PLUGINS
    from costline.connectors.redis_client import connect_async
    from costline.rules.loader import load_rules
    from costline.rules.prices import PriceBook
    from costline.streams.cli.root import settings_of
    from costline.streams.worker.enforcer import Enforcer

    settings = settings_of(ctx)
    rules = load_rules([settings.rules], settings.timezone, plugins=PLUGINS)
    # The records stay in the ledger's outbox: the worker publishes them on its next tick.
    logging.getLogger("costline.enforce").setLevel(logging.ERROR)

    async def run() -> T:
        async def keep_for_the_worker(entry: dict[str, Any]) -> None:
            raise RuntimeError("published by the worker")

        redis = connect_async(settings.redis_url)
        enforcer = Enforcer(rules=rules, ledger=redis_enforce_ledger(redis, settings.namespace),
                            sink=keep_for_the_worker,
                            currency=PriceBook.load(settings.prices).currency)
        try:
            return await use(enforcer)
        finally:
            await redis.aclose()

    return asyncio.run(run())


def subject_of(ctx: typer.Context, rule: str, pairs: list[str]) -> str:
    """``--group team=pretrain`` → the group's key, in the rule's ``group_by`` order."""
    from costline.connectors.plugins import PLUGINS
    from costline.rules.enforce import group_key
    from costline.rules.loader import load_rules
    from costline.streams.cli.root import settings_of

    settings = settings_of(ctx)
    found = load_rules([settings.rules], settings.timezone, plugins=PLUGINS).get(rule)
    given = dict(pair.split("=", 1) for pair in pairs if "=" in pair)
    if len(given) != len(pairs):
        raise typer.BadParameter("--group takes KEY=VALUE", param_hint="--group")
    keys = list(getattr(found, "group_by", ()) or given)
    if found is not None and sorted(given) != sorted(keys):
        raise typer.BadParameter(f"rule {rule} groups by {', '.join(keys) or 'nothing'}",
                                 param_hint="--group")
    return group_key({key: given[key] for key in keys})


@command_group
def register(app: typer.Typer) -> None:
    enforce = typer.Typer(help="Budget enforcement: lift, pause, resume, status.",
                          no_args_is_help=True)
    app.add_typer(enforce, name="enforce")

    @enforce.command("lift")
    def lift(
        ctx: typer.Context,
        rule: str = typer.Option(..., help="The budget rule."),
        group: list[str] = typer.Option([], help="The group, KEY=VALUE (repeat per key)."),
        by: str | None = typer.Option(None, help="Who; default the current user."),
    ) -> None:
        """Lift a group's enforcement now: restore what was changed; not enforced again
        before the period ends."""
        subject = subject_of(ctx, rule, group)
        who = acting_user(by)

        async def go(enforcer: Any) -> str:
            said: str = await enforcer.lift(rule, subject, who)
            return said

        try:
            typer.echo(f"{subject}: {_with_enforcer(ctx, go)}")
        except (LookupError, RuntimeError) as exc:
            typer.echo(f"costline enforce lift: {exc}", err=True)
            raise typer.Exit(1) from None

    @enforce.command("pause")
    def pause(
        ctx: typer.Context,
        reason: str = typer.Option("", help="Why (shown by status)."),
        by: str | None = typer.Option(None, help="Who; default the current user."),
    ) -> None:
        """Stop new enforcements (lifts go on); groups are planned afresh after resume."""
        who = acting_user(by)

        async def stop(enforcer: Any) -> None:
            await enforcer.pause(who, reason)

        _with_enforcer(ctx, stop)
        typer.echo(f"enforcement paused by {who}")

    @enforce.command("resume")
    def resume(ctx: typer.Context) -> None:
        """Resume enforcement."""

        async def go(enforcer: Any) -> bool:
            resumed: bool = await enforcer.resume()
            return resumed

        typer.echo("enforcement resumed" if _with_enforcer(ctx, go) else
                   "enforcement was not paused")

    @enforce.command("status")
    def status(
        ctx: typer.Context,
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """Whether enforcement is paused, and every group planned, enforced or being lifted."""
        from costline.rules.durations import rfc3339
        from costline.rules.enforce import due_time

        async def read(enforcer: Any) -> dict[str, Any]:
            pause = await enforcer.ledger.paused()
            return {
                "paused": pause is not None,
                "paused_by": getattr(pause, "by", None),
                "reason": getattr(pause, "reason", None),
                "enforcements": [
                    {"plan_id": t.plan.plan_id, "rule": t.plan.rule, "group": t.plan.group,
                     "state": t.state, "connector": t.plan.connector, "mode": t.plan.mode,
                     "execute_at": rfc3339(due_time(t, enforcer.rule(t.plan.rule))),
                     "until": rfc3339(t.plan.period_end),
                     "approved_by": t.approved_by, "before": dict(t.before)}
                    for t in await enforcer.ledger.plans()],
            }

        report = _with_enforcer(ctx, read)
        if as_json:
            typer.echo(json.dumps(report, indent=2))
            return
        typer.echo(f"paused by {report['paused_by']}" if report["paused"] else "running")
        for item in report["enforcements"]:
            group = ",".join(f"{k}={v}" for k, v in item["group"].items()) or "*"
            typer.echo(f"  {item['state']:<9} {item['rule']} {group} via {item['connector']} "
                       f"({item['mode']}) from {item['execute_at']} until {item['until']}")
        typer.echo(f"{len(report['enforcements'])} enforcement(s) at {time.strftime('%H:%M')}")
