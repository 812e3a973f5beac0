"""``costline demo``: the whole pipeline on the embedded stack, with a training-cluster story."""

from __future__ import annotations

import json

import typer

from costline.streams.cli import command_group


@command_group
def register(app: typer.Typer) -> None:
    @app.command()
    def demo(
        ctx: typer.Context,
        days: int = typer.Option(10, min=1, max=60, help="Days of history to play, ending "
                                 "now (the checkpoint growth is compared with the 7 days "
                                 "before its 6-hour window: it needs 8 or more)."),
        use_running: bool = typer.Option(False, help="Use the Kafka and Redis of the current "
                                         "settings instead of starting the embedded stack."),
        keep: bool = typer.Option(False, help="Leave the stack running afterwards."),
        as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    ) -> None:
        """Run the pipeline on the embedded stack with a realistic cluster scenario.

        Exits 1 when what was counted is not, to the micro-unit, what was played."""
        from costline.streams.cli.root import settings_of
        from costline.streams.demo.run import Demo

        summary = Demo(settings_of(ctx), days=days, use_running=use_running, keep=keep,
                       quiet=as_json).run()
        if as_json:
            typer.echo(json.dumps(summary, indent=2))
        if not summary["exactness"]["equal"]:
            raise typer.Exit(1)
