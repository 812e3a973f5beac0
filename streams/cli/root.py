"""``costline``: the command line.

The root callback turns the shared flags into one ``Settings`` object (flags win over the
environment); each command group lives in its own module and is registered here. The root
command also turns Redis failing any command into one line on stderr and exit code 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from pydantic import ValidationError
from redis.exceptions import (
    AuthenticationError,
    BusyLoadingError,
    ClusterDownError,
    RedisClusterException,
    RedisError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from typer.core import TyperGroup

from costline.connectors.redis_client import FAILURES, ClusterUrlError
from costline.streams.settings import Settings, known_zone, without_password

# How a command reports Redis failing it, most specific first. Redis being down, slow or
# still loading is the environment's doing, not a bug of the command: one line says enough.
REDIS_FAILURES: tuple[tuple[type[Exception], str], ...] = (
    (BusyLoadingError, "is still loading its data"),
    (AuthenticationError, "refused the login"),
    (RedisTimeoutError, "did not answer in time"),
    (RedisConnectionError, "did not answer"),
    (ClusterDownError, "is a Redis Cluster that is down"),
    (RedisError, "answered with an error"),
    (ClusterUrlError, "is a Redis Cluster"),
    (RedisClusterException, "is a Redis Cluster that did not answer"),
)
# ``ctx.meta`` key (shared by every context of one invocation): the command that asked for
# the settings, named in the failure line, e.g. ``costline reclaim status``.
_COMMAND = "costline.command"


def _one_line_summaries(group: Any) -> None:
    """Each command's line in a command list: its docstring's first paragraph on one line.
    Rich help keeps the docstring's own line breaks there, which split a summary in two."""
    for command in group.commands.values():
        if command.short_help is None and command.help:
            command.short_help = " ".join(command.help.split("\n\n")[0].split())
        if hasattr(command, "commands"):
            _one_line_summaries(command)


def redis_failure(command: str, redis_url: str, exc: Exception) -> str:
    """The one line a command prints when Redis fails it; the URL without its password."""
    what = next(text for kind, text in REDIS_FAILURES if isinstance(exc, kind))
    return f"{command}: Redis at {without_password(redis_url)} {what}: {exc}"


class _Costline(TyperGroup):
    """The root command: a Redis failure in any command ends it cleanly, with exit code 1."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _one_line_summaries(self)

    # ``Any``: the context's class is typer's vendored click, which it names only privately.
    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except FAILURES as exc:
            if not isinstance(ctx.obj, Settings):
                raise
            command = ctx.meta.get(_COMMAND, f"costline {ctx.invoked_subcommand}")
            typer.echo(redis_failure(command, ctx.obj.redis_url, exc), err=True)
            raise typer.Exit(1) from exc


app = typer.Typer(
    name="costline",
    cls=_Costline,
    help="Real-time cost governance for large-model training clusters.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(
    ctx: typer.Context,
    kafka_bootstrap: str | None = typer.Option(None, help="Kafka bootstrap servers."),
    redis_url: str | None = typer.Option(None, help="Redis or Valkey URL."),
    namespace: str | None = typer.Option(None, help="Prefix of topics, groups and keys."),
    rules: Path | None = typer.Option(None, help="Rule file or directory."),
    prices: Path | None = typer.Option(None, help="Price book."),
    timezone: str | None = typer.Option(None, help="IANA zone for calendar periods."),
    web_port: int | None = typer.Option(None, help="Worker HTTP port."),
) -> None:
    overrides: dict[str, Any] = {
        key: value
        for key, value in {
            "kafka_bootstrap": kafka_bootstrap,
            "redis_url": redis_url,
            "namespace": namespace,
            "rules": rules,
            "prices": prices,
            "timezone": timezone,
            "web_port": web_port,
        }.items()
        if value is not None
    }
    try:
        ctx.obj = Settings(**overrides)
    except ValidationError as exc:
        for error in exc.errors(include_url=False):
            # A check across several settings has no single field: its message names them.
            field = ".".join(str(p) for p in error["loc"])
            where = f"setting {field}" if field else "settings"
            typer.echo(f"costline: {where}: {error['msg']}", err=True)
        raise typer.Exit(2) from exc


def settings_of(ctx: typer.Context) -> Settings:
    """The settings the root callback built for this invocation.

    Every command that uses Redis asks for them with its own context: that is where the root
    command learns which command to name if Redis then fails it.
    """
    ctx.meta[_COMMAND] = _command_name(ctx)
    root = ctx.find_root()
    assert isinstance(root.obj, Settings)
    return root.obj


def _command_name(ctx: Any) -> str:
    """``costline reclaim status``, also when started as ``python -m costline.streams``."""
    names: list[str] = []
    level: Any = ctx  # its parents are click's contexts, which typer may vendor
    while level.parent is not None:
        names.append(level.info_name or "")
        level = level.parent
    return " ".join(["costline", *reversed(names)])


def zone_option(value: str | None) -> str | None:
    """Option callback: an unknown time zone is a usage error (exit 2), as for ``--timezone``."""
    if value is None:
        return None
    try:
        return known_zone(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc


AT_HELP = ("A moment inside the period: RFC 3339 with an offset, Unix seconds, now, today, "
           "yesterday, or a time ago such as -2h or -7d; default now.")


def moment(at: str | None, now: float, zone: str) -> float:
    """``--at``: the moment asked for (``costline.rules.durations.parse_moment``), or now; a
    time that does not read, or that no calendar period can hold (past the year 9999), is a
    usage error (exit 2)."""
    from costline.rules.durations import parse_moment, period_bounds

    if at is None:
        return now
    try:
        found = parse_moment(at, now, zone)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--at") from exc
    try:
        for period in ("week", "month"):
            period_bounds(found, period, zone)
    except (OverflowError, OSError, ValueError) as exc:
        raise typer.BadParameter(f"{at!r}: no calendar period holds that moment",
                                 param_hint="--at") from exc
    return found


_registered: list[bool] = []


def _register() -> None:
    """Attach every command group, once. Imported late so ``costline --help`` stays fast."""
    from costline.streams import cli
    from costline.streams.cli import placeholders

    if _registered:
        return
    placeholders.install()
    for register in cli.load_all():
        register(app)
    _registered.append(True)


def main() -> None:
    _register()
    app()
