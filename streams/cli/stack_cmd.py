"""``costline stack up|down|status``: Kafka and Redis on loopback, for development and CI.

``up`` prints only ``export`` lines on stdout (progress goes to stderr), so a shell can take
them in one step: ``eval "$(costline stack up)"``.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from costline.streams import stack
from costline.streams.cli import command_group
from costline.streams.cli.root import settings_of
from costline.streams.cli.tables import titled

_err = Console(stderr=True, highlight=False, soft_wrap=True)


def _state_dir(ctx: typer.Context, given: Path | None) -> Path:
    return given or settings_of(ctx).state_dir


def _say(message: str) -> None:
    _err.print(f"[dim]stack:[/] {message}")


def _fail(exc: stack.StackError) -> typer.Exit:
    _err.print(f"[bold red]costline stack:[/] {exc}")
    return typer.Exit(1)


def _print_exports(exports: dict[str, str]) -> None:
    for key, value in exports.items():
        typer.echo(f"export {key}={shlex.quote(value)}")


def _table(info: stack.StackInfo) -> Table:
    table = titled("costline stack", title_justify="left")
    for column in ("service", "role", "flavor", "endpoint", "pid", "state"):
        table.add_column(column, no_wrap=True)
    colors = {"running": "green", "not answering": "yellow", "stopped": "red"}
    for svc in info.services:
        state = f"[{colors.get(svc.state, 'white')}]{svc.state}[/]"
        pid = str(svc.pid) if svc.pid else "-"
        table.add_row(svc.name, svc.role, svc.flavor, svc.endpoint, pid, state)
    logs = sorted({str(Path(svc.log).parent) for svc in info.services})
    table.caption = "logs in " + ", ".join(logs)
    table.caption_justify = "left"
    return table


def _choices(role: str) -> str:
    return "[" + "|".join([*stack.flavors(role), stack.NONE]) + "]"


def _flavor(role: str) -> Callable[[str], str]:
    """Validate a flavor against the service registry (new kinds need no CLI change)."""

    def check(value: str) -> str:
        if value not in (*stack.flavors(role), stack.NONE):
            raise typer.BadParameter(f"{value!r} is not one of {_choices(role)}")
        return value

    return check


STATE_DIR_HELP = "Folder of pid files, logs and data (default: the state_dir setting)."


@command_group
def register(app: typer.Typer) -> None:
    group = typer.Typer(
        help="Local Kafka and Redis on 127.0.0.1 (pid files, logs and data in one folder).",
        no_args_is_help=True,
    )
    app.add_typer(group, name="stack")

    @group.command("up")
    def up(
        ctx: typer.Context,
        kafka: str = typer.Option(
            "embedded", callback=_flavor("kafka"), metavar=_choices("kafka"),
            help="embedded: Tansu, in memory, instant; it gives consumers what a transaction "
            "aborted (costline topics check). apache: Apache Kafka 4.1 (KRaft, on disk). none: "
            "no Kafka here.",
        ),
        redis: str = typer.Option(
            "embedded", callback=_flavor("redis"), metavar=_choices("redis"),
            help="embedded: Valkey from the wheel. system: the installed redis-server. "
            "cluster: a Redis Cluster of three redis-server masters (ports REDIS_PORT to "
            "REDIS_PORT+5). none: no Redis here.",
        ),
        kafka_port: int = typer.Option(9092, min=0, max=65534, help="0 picks a free port."),
        redis_port: int = typer.Option(6379, min=0, max=65535, help="0 picks free ports."),
        state_dir: Path | None = typer.Option(None, help=STATE_DIR_HELP),
        kafka_libs: Path | None = typer.Option(
            None, envvar="COSTLINE_KAFKA_LIBS",
            help="Cache of Apache Kafka jars (default: STATE_DIR/kafka-libs).",
        ),
        as_json: bool = typer.Option(False, "--json", help="Print services and exports as JSON."),
    ) -> None:
        """Start Kafka and Redis (reusing any that already run) and print the exports."""
        settings = settings_of(ctx)
        try:
            info = stack.up(
                _state_dir(ctx, state_dir), kafka=kafka, redis=redis, kafka_port=kafka_port,
                redis_port=redis_port, kafka_libs=kafka_libs, report=_say,
            )
        except stack.StackError as exc:
            raise _fail(exc) from exc
        exports = {**settings.exports(), **info.exports}
        if as_json:
            typer.echo(json.dumps({**info.as_dict(), "exports": exports}, indent=2))
            return
        _print_exports(exports)
        _err.print('[dim]stack: take these settings with: eval "$(costline stack up ...)"[/]')

    @group.command("down")
    def down(
        ctx: typer.Context,
        state_dir: Path | None = typer.Option(None, help=STATE_DIR_HELP),
        as_json: bool = typer.Option(False, "--json", help="Print what was stopped as JSON."),
    ) -> None:
        """Stop exactly the services this state folder started; data and logs stay."""
        try:
            stopped = stack.down(_state_dir(ctx, state_dir), report=_say)
        except stack.StackError as exc:
            raise _fail(exc) from exc
        if as_json:
            typer.echo(json.dumps([svc.as_dict() for svc in stopped], indent=2))
        elif not stopped:
            _say("nothing to stop")

    @group.command("status")
    def status(
        ctx: typer.Context,
        state_dir: Path | None = typer.Option(None, help=STATE_DIR_HELP),
        as_json: bool = typer.Option(False, "--json", help="Print the status as JSON."),
    ) -> None:
        """What runs where. Exit code 3 when a known service is not running or not answering."""
        info = stack.status(_state_dir(ctx, state_dir))
        if as_json:
            typer.echo(json.dumps(info.as_dict(), indent=2))
        elif not info.services:
            _say(f"no services in {_state_dir(ctx, state_dir)}")
        else:
            Console().print(_table(info))
        if any(svc.state != "running" for svc in info.services):
            raise typer.Exit(3)
