"""``costline alerts`` and ``costline silence``: what is pending or firing, and muting it."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

import typer

from costline.streams.cli import command_group


def _store(ctx: typer.Context) -> Any:
    from costline.connectors.alert_store import AlertStore
    from costline.connectors.redis_client import connect
    from costline.streams.cli.root import settings_of

    settings = settings_of(ctx)
    # A Redis that never answers ends the command with an error instead of hanging it.
    return AlertStore(connect(settings.redis_url), settings.namespace)


def parse_matchers(pairs: Sequence[str]) -> dict[str, str]:
    """``--match KEY=VALUE`` (the value may be a ``*`` glob), one per key: a silence keeps one
    glob per key, so a key given twice is refused rather than keeping only the last value."""
    from costline.streams.cli.spend_cmd import key_and_value

    found: dict[str, str] = {}
    for pair in pairs:
        key, value = key_and_value(pair, "--match")
        if key in found and found[key] != value:
            raise typer.BadParameter(
                f"{key!r} is given twice ({found[key]!r}, {value!r}): one value per key (a "
                "* glob may cover several)", param_hint="--match")
        found[key] = value
    return found


def alert_rows(book: Any) -> list[dict[str, Any]]:
    """``alerts --json``: rule, group, state, severity, since, value, threshold."""
    from costline.rules.durations import rfc3339

    rows = []
    for alert in book.active():
        payload = alert.payload
        rows.append({
            "rule": alert.rule,
            "group": payload.get("group", {}),
            "state": alert.state,
            "severity": payload.get("severity"),
            "since": rfc3339(alert.since),
            "value": payload.get("value"),
            "threshold": payload.get("threshold"),
            "alert_id": alert.alert_id,
            "summary": payload.get("summary"),
            "muted": alert.mute.reason if alert.mute else None,
            "muted_by": alert.mute.by if alert.mute else None,
            "muted_until": rfc3339(alert.mute.until) if alert.mute else None,
            "kind": payload.get("kind"),
            "unit": alert_unit(payload),
            "currency": payload.get("currency"),
            "period": payload.get("period"),
        })
    return rows


def alert_unit(payload: Mapping[str, Any]) -> str:
    """What an alert's figures measure: the record's ``unit``, else its kind's."""
    from costline.rules.kinds import KINDS

    kind = str(payload.get("kind") or "")
    return str(payload.get("unit") or (KINDS[kind].presentation.unit if kind in KINDS
                                       else "currency"))


def shown_state(row: dict[str, Any]) -> str:
    """The state as people need it: ``firing, silenced until …`` when a silence or a fault's
    recovery mutes it (its notifications are held, the alert itself goes on)."""
    by = row.get("muted_by")
    if not by:
        return str(row["state"])
    how = "silenced" if str(by).startswith("silence:") else "muted by a fault"
    return f"{row['state']}, {how} until {row['muted_until']}"


def shown_figure(row: dict[str, Any], field: str) -> str:
    """``value`` or ``threshold`` in the alert's unit (``$1,804.92``, ``$42.50/h``, ``2%``)."""
    from decimal import Decimal, InvalidOperation

    from costline.rules.money import figure_in

    text = row.get(field)
    if not text:
        return ""
    try:
        amount = Decimal(str(text))
    except InvalidOperation:
        return str(text)
    return figure_in(amount, str(row.get("unit") or "currency"), str(row.get("currency") or ""))


def _print_alerts(rows: list[dict[str, Any]]) -> None:
    """One row per alert: the rule with its severity, state and group under it, the figure and
    the line in the alert's unit, and since when; it fits an 80-column terminal uncut."""
    from rich.console import Console

    from costline.streams.cli.tables import titled

    table = titled(f"{len(rows)} alert(s) pending or firing")
    for column in ("alert", "value", "line", "since"):
        table.add_column(column, no_wrap=column != "alert", overflow="fold",
                         justify="right" if column in ("value", "line") else "left")
    for row in rows:
        group = ", ".join(f"{k}={v}" for k, v in row["group"].items()) or "everything"
        alert = f"{row['rule']}\n{row['severity'] or 'warning'}, {shown_state(row)}\n{group}"
        table.add_row(alert, shown_figure(row, "value"), shown_figure(row, "threshold"),
                      _short_time(row["since"]))
    Console().print(table)


def _short_time(text: str) -> str:
    """``2026-12-03T23:40:15Z`` → ``Dec 03 23:40Z``: the minute is what a reader needs."""
    from datetime import datetime

    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).strftime("%b %d %H:%MZ")
    except ValueError:
        return text


def _duration(text: str) -> float:
    from costline.rules.durations import parse_duration

    try:
        return float(parse_duration(text))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc


@command_group
def register(app: typer.Typer) -> None:
    @app.command()
    def alerts(ctx: typer.Context,
               as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
        """Alerts now pending or firing."""
        rows = alert_rows(_store(ctx).book())
        if as_json:
            typer.echo(json.dumps(rows, indent=2))
        else:
            _print_alerts(rows)

    silence = typer.Typer(help="Mute alerts for a while (by rule and tag matchers).",
                          no_args_is_help=True)
    app.add_typer(silence, name="silence")

    @silence.command("add")
    def silence_add(
        ctx: typer.Context,
        duration: str = typer.Option(..., "--for", help="How long, e.g. 2h or 1d."),
        rule: str | None = typer.Option(None, help="Rule name (a * glob is allowed)."),
        match: list[str] = typer.Option([], metavar="KEY=VALUE",
                                   help="Tag matcher; repeatable."),
        comment: str = typer.Option("", help="Why."),
        by: str = typer.Option("", help="Who."),
    ) -> None:
        """Silence matching alerts until now + --for."""
        seconds = _duration(duration)
        matchers = parse_matchers(match)
        if rule is None and not matchers:
            raise typer.BadParameter("name a --rule, a --match, or both")
        made = _store(ctx).add_silence(ends_at=time.time() + seconds, rule=rule,
                                       matchers=matchers, created_by=by, comment=comment)
        typer.echo(f"silence {made.id} until {_when(made.ends_at)}")
        if rule is not None:
            _warn_if_no_rule(ctx, rule)

    @silence.command("list")
    def silence_list(ctx: typer.Context,
                     as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
        """Silences that have not ended."""
        found = [s.to_dict() for s in _store(ctx).silences()]
        if as_json:
            typer.echo(json.dumps(found, indent=2))
            return
        for s in found:
            matchers = ",".join(f"{k}={v}" for k, v in s["matchers"].items())
            typer.echo(f"{s['id']}  rule={s['rule'] or '*'}  {matchers}  until "
                       f"{_when(s['ends_at'])}  {s['comment']}")

    @silence.command("expire")
    def silence_expire(ctx: typer.Context, silence_id: str) -> None:
        """End a silence now."""
        if not _store(ctx).expire_silence(silence_id):
            typer.echo(f"no silence {silence_id}", err=True)
            raise typer.Exit(1)
        typer.echo(f"silence {silence_id} expired")


def _warn_if_no_rule(ctx: typer.Context, pattern: str) -> None:
    """A silence of a rule the loaded rule set does not have mutes nothing (yet): say so on
    stderr, since a typo in a rule name would otherwise leave the alert loud."""
    from costline.connectors.plugins import PLUGINS
    from costline.rules.globs import glob_match
    from costline.rules.loader import load_rules
    from costline.rules.yaml_source import SourceInvalid
    from costline.streams.cli.root import settings_of

    settings = settings_of(ctx)
    try:
        names = sorted(rule.name for rule in load_rules([settings.rules], settings.timezone,
                                                        plugins=PLUGINS))
    except SourceInvalid:
        typer.echo(f"costline silence add: warning: the rules in {settings.rules} do not load, "
                   "so the rule name could not be checked", err=True)
        return
    if not any(glob_match(name, pattern) for name in names):
        typer.echo(f"costline silence add: warning: no rule in {settings.rules} is named "
                   f"{pattern!r}, so the silence mutes nothing until one is (rules: "
                   f"{', '.join(names) or 'none'})", err=True)


def _when(ts: float) -> str:
    from costline.rules.durations import rfc3339

    return rfc3339(ts)
