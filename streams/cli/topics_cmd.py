"""``costline topics create``: the five topics costline uses, idempotently; ``costline topics
check``: whether the broker keeps what exact counting relies on."""

from __future__ import annotations

import json
from dataclasses import asdict

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

    @group.command("check")
    def check(
        ctx: typer.Context,
        timeout_s: float = typer.Option(30.0, "--timeout", min=5.0,
                                        help="Seconds each step of the probe may wait."),
        as_json: bool = typer.Option(False, "--json", help="Print the verdicts as JSON."),
    ) -> None:
        """Check that the broker keeps what exact counting relies on: log ends, reads of
        committed records only, group offsets. Writes a known sequence of records to a topic
        of its own and deletes it after. Exit status 1 when a check fails, 2 when the broker
        could not be checked."""
        from kafka.errors import KafkaError

        from costline.connectors.broker_probe import ProbeIncomplete, probe_broker
        from costline.connectors.kafka import broker_info
        from costline.rules.broker_checks import failed, verdicts_of

        settings = settings_of(ctx)
        security = settings.kafka_security()
        try:
            check_login(settings.kafka_bootstrap, security)  # a refused password, at once
            broker = broker_info(settings.kafka_bootstrap, security=security)
            verdicts = verdicts_of(probe_broker(settings.kafka_bootstrap, settings.namespace,
                                                security=security, timeout_s=timeout_s))
        except (KafkaUnavailable, KafkaLoginFailed, TopicError, KafkaError,
                ProbeIncomplete) as exc:
            _err.print(f"[bold red]costline topics check:[/] the broker at "
                       f"{settings.kafka_bootstrap} could not be checked: {exc}")
            raise typer.Exit(2) from exc
        bad = failed(verdicts)
        if as_json:
            typer.echo(json.dumps({
                "broker": {"bootstrap": broker.bootstrap, "implementation": broker.implementation,
                           "protocol_version": broker.version},
                "ok": not bad,
                "checks": [asdict(v) for v in verdicts],
            }, indent=2))
        else:
            typer.echo(broker.describe())
            for v in verdicts:
                mark = {True: "ok  ", False: "FAIL", None: "n/a "}[v.ok]
                typer.echo(f"  {mark}  {v.name:<20} {v.saw}")
                if v.ok is False:
                    typer.echo(f"        {'':<20} {v.affects}: {v.otherwise}")
            money = sum(v.affects == "money" for v in bad)
            typer.echo(f"{len(verdicts)} checks: {sum(v.ok is True for v in verdicts)} ok, "
                       f"{len(bad)} failed ({money} on money, {len(bad) - money} on progress)")
        if bad:
            raise typer.Exit(1)
