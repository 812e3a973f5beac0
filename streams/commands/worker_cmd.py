"""``costline worker``: run the stream processors in the foreground."""

from __future__ import annotations

import logging

import typer

from streams.commands import command_group


@command_group
def register(app: typer.Typer) -> None:
    @app.command()
    def worker(
        ctx: typer.Context,
        loglevel: str = typer.Option("info", help="debug, info, warning or error."),
    ) -> None:
        """Run the Faust stream processors (aggregation into Redis) until stopped."""
        import faust

        from streams.app import build_app
        from streams.cli import settings_of
        from streams.topics import create_topics

        settings = settings_of(ctx)
        create_topics(settings)
        app, _ = build_app(settings)
        worker = faust.Worker(app, loglevel=loglevel, quiet=True)
        logging.getLogger("costline").setLevel(loglevel.upper())
        worker.execute_from_commandline()
