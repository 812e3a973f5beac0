"""``costline rules``: validate, schema, reference, test and backtest rule files (README).

Everything here is offline: these commands read files and run the pure engine, so they work
in CI and in an editor hook without Kafka or Redis.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer

from costline.connectors.plugins import PLUGINS
from costline.rules.backtest import (
    LONGEST_AFTER_S,
    Progress,
    Recording,
    read_events,
    replay_span,
    run_backtest,
)
from costline.rules.durations import parse_time, rfc3339
from costline.rules.engine import Engine
from costline.rules.loader import load_rules, rule_files, rules_json_schema
from costline.rules.memory_state import InMemoryState
from costline.rules.prices import PriceBook
from costline.rules.reference import reference_markdown
from costline.rules.ruletest import RuleTestReport, run_rule_tests
from costline.rules.yaml_source import SourceError, SourceInvalid
from costline.streams.cli import command_group
from costline.streams.cli.root import settings_of

rules_app = typer.Typer(
    name="rules",
    help="Rule files: validate, print the JSON Schema or the reference, run rule tests, "
    "backtest.",
    no_args_is_help=True,
)


@rules_app.command("validate")
def validate(
    ctx: typer.Context,
    paths: list[Path] = typer.Argument(..., help="Rule files or directories of them."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON: valid, rules, files and "
                                 "problems (file, line, column, message)."),
) -> None:
    """Exit 0 if every rule file is valid; else print FILE:LINE:COL: message per problem."""
    settings = settings_of(ctx)
    try:
        ruleset = load_rules(paths, settings.timezone, plugins=PLUGINS)
    except SourceInvalid as exc:
        if not as_json:
            _problems(exc)
        typer.echo(json.dumps(validation(exc.errors), indent=2))
        raise typer.Exit(1) from exc
    files = len(rule_files(paths))
    if as_json:
        typer.echo(json.dumps(validation([], len(ruleset), files), indent=2))
        return
    typer.echo(f"ok: {_count(len(ruleset), 'rule')} in {_count(files, 'file')}")


def validation(problems: list[SourceError], rules: int = 0, files: int = 0) -> dict[str, Any]:
    """What ``rules validate --json`` prints: the verdict, what loaded, and every problem."""
    return {
        "valid": not problems,
        "rules": rules,
        "files": files,
        "problems": [{"file": p.file, "line": p.line, "column": p.col, "message": p.message}
                     for p in problems],
    }


@rules_app.command("schema")
def schema() -> None:
    """Print the JSON Schema of rule files (for editors and CI)."""
    typer.echo(json.dumps(rules_json_schema(PLUGINS), indent=2))


@rules_app.command("reference")
def reference() -> None:
    """Print the rule reference (docs/RULES.md): every kind and connector with its keys."""
    typer.echo(reference_markdown(PLUGINS), nl=False)


@rules_app.command("test")
def test(
    ctx: typer.Context,
    file: Path = typer.Argument(..., help="A rule test file (rule_files, prices, tests)."),
) -> None:
    """Run rule unit tests: given events, expect alerts. Exit 1 if any test fails."""
    settings = settings_of(ctx)
    try:
        report = run_rule_tests(file, settings.prices, settings.timezone, plugins=PLUGINS)
    except SourceInvalid as exc:
        _problems(exc)
    _print_report(report)
    if not report.passed:
        raise typer.Exit(1)


@rules_app.command("backtest")
def backtest(
    ctx: typer.Context,
    rules: Path = typer.Option(..., "--rules", help="Rule file or directory."),
    events: Path = typer.Option(..., "--events", help="Recorded events, JSON lines."),
    until: str | None = typer.Option(
        None, "--until", help="Evaluate up to this time (RFC 3339), at most 31 days after "
        "the last event; default: the last event."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the alert changes as JSON."),
) -> None:
    """Show which alerts the rules would have raised on recorded events, and when.

    Lines the worker would refuse are reported on stderr as FILE:LINE: reason and left out.
    """
    settings = settings_of(ctx)
    try:
        end = None if until is None else parse_time(until)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--until") from exc
    try:
        prices = PriceBook.load(settings.prices)
        engine = Engine.for_prices(
            load_rules([rules], settings.timezone, plugins=PLUGINS), prices
        )
    except SourceInvalid as exc:
        _problems(exc)
    try:
        recording = read_events(events, prices)
    except OSError as exc:
        typer.echo(f"{events}: cannot read: {exc.strerror}", err=True)
        raise typer.Exit(1) from exc
    for problem in recording.rejected:
        typer.echo(problem, err=True)
    if recording.rejected:
        typer.echo(f"costline rules backtest: {_count(len(recording.rejected), 'line')} left out: "
                   "the worker would refuse them", err=True)
    _check_until(end, recording)
    with _progress_bar() as progress:
        result = run_backtest(engine, InMemoryState(prices), recording.events, end,
                              progress=progress)
    if as_json:
        typer.echo(json.dumps(result.changes, indent=2))
        return
    for change in result.changes:
        typer.echo(_change_line(change))
    fired = len({c["alert_id"] for c in result.changes if c["state"] == "firing"})
    typer.echo(
        f"{result.counted} events, {len(result.changes)} alert changes, "
        f"{fired} alert{'' if fired == 1 else 's'} fired"
    )


def _check_until(until: float | None, recording: Recording) -> None:
    span = replay_span(recording.events)
    if until is None or span is None or until <= span[1] + LONGEST_AFTER_S:
        return
    raise typer.BadParameter(
        f"{rfc3339(until)} is more than {LONGEST_AFTER_S // 86400} days after the last "
        f"event ({rfc3339(span[1])})", param_hint="--until")


@contextmanager
def _progress_bar() -> Iterator[Progress]:
    """A bar on stderr while the replay runs (only on a terminal: stdout stays the answer)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
    from rich.progress import Progress as Bar

    console = Console(stderr=True)
    with Bar(TextColumn("[bold]backtest[/]"), BarColumn(), MofNCompleteColumn(),
             TextColumn("5-minute steps"), TimeRemainingColumn(),
             console=console, transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task("steps", total=None)

        def advance(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield advance


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _problems(exc: SourceInvalid) -> None:
    for error in exc.errors:
        typer.echo(str(error))
    raise typer.Exit(1)


def _print_report(report: RuleTestReport) -> None:
    for outcome in report.outcomes:
        typer.echo(f"{'PASS' if outcome.passed else 'FAIL'}  {outcome.name}")
        for problem in outcome.problems:
            typer.echo(f"      {problem}")
    failed = sum(not o.passed for o in report.outcomes)
    verdict = "FAILED" if failed else "SUCCESS"
    typer.echo(f"{verdict}: {len(report.outcomes) - failed} passed, {failed} failed")


def _change_line(change: dict[str, Any]) -> str:
    group = ",".join(f"{k}={v}" for k, v in (change.get("group") or {}).items()) or "-"
    return (
        f"{change['at']}  {change['state']:<9} {change['rule']:<24} {group:<32} "
        f"{change['line']:<10} {change['value']} (line {change['threshold']})"
    )


@command_group
def register(app: typer.Typer) -> None:
    app.add_typer(rules_app, name="rules")
