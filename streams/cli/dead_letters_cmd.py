"""``costline dead-letters``: what the worker refused (``list``), and sending it again once
the price book or the producer is fixed (``replay``).

A replayed message goes back to its source topic with its exact bytes and is priced again
like any input: the events it holds that were counted before (none, as a message is refused
whole; or all of them, when an earlier replay already counted them) are found by their event
ids and counted once. A message refused again gets a new dead letter. Each dead letter is
replayed once: the refusal tally (``costline.connectors.refusal_tally``) marks it, and takes
its money out of the refused money ``costline spend`` warns about.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import typer

from costline.streams.cli import command_group
from costline.streams.cli.root import moment

if TYPE_CHECKING:
    from costline.connectors.dead_letter_log import DeadLetter
    from costline.connectors.redis_client import RedisClient
    from costline.streams.settings import Settings

SINCE_HELP = ("Only what was refused at or after this time: RFC 3339, Unix seconds, today, "
              "yesterday, or a time ago such as -2h or -7d.")
LIST_MOST = 10_000


def dead_letters(settings: Settings, reason: str | None = None, since: str | None = None
                 ) -> list[DeadLetter]:
    """The namespace's dead letters (of one reason, since a time), oldest first."""
    from costline.connectors.dead_letter_log import read_dead_letters

    start = moment(since, time.time(), settings.timezone) if since else None
    found = read_dead_letters(settings.kafka_bootstrap, settings.topic("dlq"), since=start,
                              security=settings.kafka_security())
    return [letter for letter in found if reason is None or letter.code == reason]


def dead_letter_rows(letters: Sequence[DeadLetter], redis: RedisClient, namespace: str
                     ) -> list[dict[str, Any]]:
    """``dead-letters list --json`` (and ``/api/v1/dead-letters``): newest first, each with
    where it came from, why it was refused, whether it was replayed, and its text."""
    from costline.connectors.refusal_tally import RefusalTally
    from costline.rules.durations import rfc3339

    tally = RefusalTally(redis, namespace)
    rows = []
    for letter in reversed(letters):
        record = letter.record
        raw = letter.raw()
        rows.append({
            "key": letter.key,
            "refused_at": rfc3339(letter.refused_at),
            "code": letter.code,
            "reason": record.get("reason"),
            "source_topic": letter.source_topic,
            "partition": record.get("partition"),
            "offset": record.get("offset"),
            "bytes": record.get("raw_size", len(raw) if raw is not None else 0),
            "state": tally.state(letter.key, record) or "refused",
            "raw": record.get("raw"),
        })
    return rows


def replay(settings: Settings, letters: Sequence[DeadLetter], redis: RedisClient,
           dry_run: bool = False) -> dict[str, int]:
    """Send each dead letter's message to its source topic once; returns how many were sent,
    skipped as replayed before, and left out (not an input topic of the namespace, or only a
    prefix kept)."""
    from costline.connectors.kafka import producer
    from costline.connectors.refusal_tally import REPLAYED, RefusalTally
    from costline.streams.topics import INPUTS

    inputs = {settings.topic(name) for name in INPUTS}
    tally = RefusalTally(redis, settings.namespace)
    sendable = []
    counts = {"sent": 0, "replayed_before": 0, "left_out": 0}
    for letter in letters:
        raw = letter.raw()
        if tally.state(letter.key, letter.record) == REPLAYED:
            counts["replayed_before"] += 1
        elif raw is None or letter.source_topic not in inputs:
            counts["left_out"] += 1
        else:
            sendable.append((letter, raw))
    if dry_run or not sendable:
        counts["sent"] = len(sendable) if dry_run else 0
        return counts
    client = producer(settings.kafka_bootstrap, client_id=f"{settings.namespace}-replay",
                      security=settings.kafka_security())
    try:
        for letter, raw in sendable:
            client.send(letter.source_topic, raw)
        client.flush()
    finally:
        client.close()
    for letter, _ in sendable:
        tally.replayed(letter.key, letter.record)
    counts["sent"] = len(sendable)
    return counts


def _line(row: dict[str, Any]) -> str:
    text = str(row.get("raw") or "")
    shown = text if len(text) <= 120 else text[:117] + "..."
    return (f"{row['refused_at']} {row['code']:<22} {row['state']:<8} {row['source_topic']}:"
            f"{row['partition']}:{row['offset']}  {row['reason']}\n    {shown}")


@command_group
def register(app: typer.Typer) -> None:
    group = typer.Typer(help="What the worker refused (the dead-letter topic), and replaying "
                        "it once the price book or the producer is fixed.",
                        no_args_is_help=True)
    app.add_typer(group, name="dead-letters")

    @group.command("list")
    def list_(
        ctx: typer.Context,
        reason: str | None = typer.Option(None, metavar="CODE", help="Only this reason, "
                                          "e.g. unknown_resource_type or unit_mismatch."),
        since: str | None = typer.Option(None, metavar="TIME", help=SINCE_HELP),
        limit: int = typer.Option(100, min=1, max=LIST_MOST, help="Most to show, newest "
                                  "first."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON, newest first."),
    ) -> None:
        """Refused input messages, newest first: when, why, from where, and their text."""
        from costline.connectors.redis_client import connect
        from costline.streams.cli.root import settings_of

        settings = settings_of(ctx)
        letters = dead_letters(settings, reason, since)
        rows = dead_letter_rows(letters, connect(settings.redis_url, timeout_s=30),
                                settings.namespace)[:limit]
        if as_json:
            typer.echo(json.dumps(rows, indent=2))
            return
        for row in rows:
            typer.echo(_line(row))
        typer.echo(f"{len(rows)} of {len(letters)} dead letter(s), newest first")

    @group.command("replay")
    def replay_(
        ctx: typer.Context,
        reason: str = typer.Option(..., metavar="CODE", help="Replay the dead letters of "
                                   "this reason (costline dead-letters list shows them)."),
        since: str | None = typer.Option(None, metavar="TIME", help=SINCE_HELP),
        dry_run: bool = typer.Option(False, "--dry-run", help="Say what would be sent, send "
                                     "nothing."),
    ) -> None:
        """Send refused messages to their source topic again: what was counted stays once."""
        from costline.connectors.redis_client import connect
        from costline.streams.cli.root import settings_of

        settings = settings_of(ctx)
        letters = dead_letters(settings, reason, since)
        counts = replay(settings, letters, connect(settings.redis_url, timeout_s=30), dry_run)
        verb = "would send" if dry_run else "sent"
        typer.echo(f"{reason}: {verb} {counts['sent']} message(s) to their source topics; "
                   f"{counts['replayed_before']} replayed before, {counts['left_out']} left "
                   f"out (not an input topic, or over 8 MiB: replay those from their source "
                   f"offset)")
