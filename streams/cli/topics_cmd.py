"""``costline topics create``: the five topics costline uses, idempotently."""

from __future__ import annotations

import json

import typer
from rich.console import Console

from costline.connectors.kafka import (
    KafkaLoginFailed,
    KafkaUnavailable,
    TopicError,
    admin,
    api_versions,
    check_login,
    ensure_topics,
)
from costline.streams.cli import command_group
from costline.streams.cli.root import settings_of
from costline.streams.topics import topic_specs

_err = Console(stderr=True, highlight=False, soft_wrap=True)


@command_group
def register(app: typer.Typer) -> None:
    group = typer.Typer(help="Kafka topics of this namespace.", no_args_is_help=True)
    app.add_typer(group, name="topics")

    @group.command("create")
    def create(
        ctx: typer.Context,
        partitions: int | None = typer.Option(
            None, min=1, max=1024,
            # In parentheses: the help is Rich markup, where "[...]" would vanish as a tag.
            help="Partitions of the usage, faults and ledger topics (default: the partitions "
            "setting).",
        ),
        as_json: bool = typer.Option(False, "--json", help="Print created/existing as JSON."),
    ) -> None:
        """Create the missing topics; existing ones are left as they are."""
        from kafka.errors import KafkaError  # here: kafka-python is slow to import

        settings = settings_of(ctx)
        specs = topic_specs(settings, partitions)
        security = settings.kafka_security()
        try:
            # fail fast when unreachable (or when TLS does not agree)
            api_versions(settings.kafka_bootstrap, timeout_s=5.0, security=security)
            check_login(settings.kafka_bootstrap, security)
            client = admin(settings.kafka_bootstrap, timeout_s=20.0, security=security)
            try:
                created = ensure_topics(client, specs)
            finally:
                client.close()
        except (KafkaUnavailable, KafkaLoginFailed, TopicError) as exc:
            _err.print(f"[bold red]costline topics:[/] {exc}")
            raise typer.Exit(1) from exc
        except KafkaError as exc:
            _err.print(f"[bold red]costline topics:[/] Kafka at {settings.kafka_bootstrap}: {exc}")
            raise typer.Exit(1) from exc
        existing = [spec.name for spec in specs if spec.name not in created]
        if as_json:
            typer.echo(json.dumps({"created": created, "existing": existing}, indent=2))
            return
        for spec in specs:
            if spec.name in created:
                typer.echo(f"created  {spec.name}  ({spec.partitions} partitions)")
            else:
                typer.echo(f"exists   {spec.name}")
