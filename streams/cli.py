"""``costline``: the command line (CONTRACT §6).

The root callback turns the shared flags into one ``Settings`` object (flags win over the
environment); each command group lives in its own module and is registered here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from pydantic import ValidationError

from streams.settings import Settings

app = typer.Typer(
    name="costline",
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
    """The settings the root callback built for this invocation."""
    root = ctx.find_root()
    assert isinstance(root.obj, Settings)
    return root.obj


_registered: list[bool] = []


def _register() -> None:
    """Attach every command group, once. Imported late so ``costline --help`` stays fast."""
    from streams import commands

    if _registered:
        return
    for register in commands.load_all():
        register(app)
    _registered.append(True)


def main() -> None:
    _register()
    app()
