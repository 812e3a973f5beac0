"""``costline import focus FILE.csv[.gz]``: a FOCUS billing export as usage events.

Events are sent in JSON-array messages of up to ``--batch`` events, and every event goes to the
partition its own ``event_id`` hashes to, exactly where ``costline produce`` would put it
alone. The worker remembers counted ids per partition, so this is what lets a re-import, a
re-export in another row order or a different batch size count nothing twice. The scrapers
send through the same ``usage_stream``.
"""

from __future__ import annotations

import csv
import hashlib
import json
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import typer
from redis.exceptions import LockError
from rich.console import Console

from costline.connectors.focus import (
    HELD,
    Converted,
    CostBasis,
    FocusConverter,
    missing_prices,
    price_book_lines,
)
from costline.connectors.focus_file import FocusFormatError, open_focus, read_rows
from costline.connectors.focus_ledger import LOCK_S, RowLedger
from costline.connectors.focus_tally import ImportTally
from costline.connectors.kafka import partition_of
from costline.connectors.redis_client import FAILURES, connect
from costline.rules.events import (
    MAX_BATCH,
    RunEndEvent,
    UsageEvent,
    UtilizationEvent,
    dump_event,
)
from costline.rules.money import money_micro
from costline.rules.prices import PriceBook
from costline.rules.yaml_source import SourceInvalid
from costline.streams.cli import command_group
from costline.streams.cli.focus_delivery import Chunks, Delivery, Recording
from costline.streams.cli.produce_cmd import (
    Message,
    Summary,
    _count,
    _ensure_topics,
    _finish,
    _kafka_sender,
    _progress,
)
from costline.streams.cli.root import settings_of
from costline.streams.settings import without_password

DEFAULT_BATCH = 1000
_err = Console(stderr=True, highlight=False, soft_wrap=True)


@dataclass
class PartitionBatcher:
    """Groups events into messages of at most ``size``, each of events of one partition.

    A message is keyed by its first event's id, so the default partitioner sends it to the
    partition every one of its events belongs to.
    """

    partitions: int
    size: int = DEFAULT_BATCH
    pending: dict[int, list[tuple[str, bytes]]] = field(default_factory=dict)

    def add(self, event_id: str, raw: bytes) -> Iterator[Message]:
        partition = partition_of(event_id, self.partitions)
        waiting = self.pending.setdefault(partition, [])
        waiting.append((event_id, raw))
        if len(waiting) >= self.size:
            yield self._take(partition)

    def flush(self) -> Iterator[Message]:
        for partition in sorted(self.pending):
            if self.pending[partition]:
                yield self._take(partition)

    def _take(self, partition: int) -> Message:
        events = self.pending.pop(partition)
        value = b"[" + b",".join(raw for _, raw in events) + b"]"
        return Message("usage", events[0][0].encode(), value, len(events))


UsageTopicEvent = UsageEvent | UtilizationEvent | RunEndEvent


@dataclass
class UsageStream:
    """Events in, partition-aligned batches out to the usage topic; ``flush`` ends a round."""

    client: Any
    send: Callable[[Message], None]
    batcher: PartitionBatcher

    def emit(self, event: UsageTopicEvent) -> None:
        for message in self.batcher.add(event.event_id, dump_event(event)):
            self.send(message)

    def flush(self, timeout_s: float = 60.0) -> None:
        """Send what is pending and wait for Kafka's acknowledgements."""
        for message in self.batcher.flush():
            self.send(message)
        self.client.flush(timeout=timeout_s)


@contextmanager
def usage_stream(ctx: typer.Context, summary: Summary, batch: int = DEFAULT_BATCH
                 ) -> Iterator[UsageStream]:
    """A ``UsageStream`` on the namespace's usage topic (created when missing); on exit the
    last messages are sent and whatever Kafka did not acknowledge counts as failed."""
    settings = settings_of(ctx)
    topic = settings.topic("usage")
    try:
        _ensure_topics(ctx)
        client, send = _kafka_sender(settings.kafka_bootstrap, {"usage": topic}, summary,
                                     settings.kafka_security())
        partitions = len(client.partitions_for(topic))
    except Exception as exc:  # noqa: BLE001 - kafka-python errors share no usable base
        _err.print(f"[bold red]costline:[/] Kafka at {settings.kafka_bootstrap}: "
                   f"{type(exc).__name__}: {exc}")
        raise typer.Exit(2) from exc
    stream = UsageStream(client, send, PartitionBatcher(partitions, batch))
    try:
        yield stream
        for message in stream.batcher.flush():
            send(message)
    finally:
        _finish(client, summary)


# -- the FOCUS import -------------------------------------------------------------------------


def _price_book(ctx: typer.Context) -> PriceBook:
    try:
        return PriceBook.load(settings_of(ctx).prices)
    except SourceInvalid as exc:
        _err.print(f"[bold red]costline import:[/] price book: {exc}")
        raise typer.Exit(2) from exc


def _refuse_without_prices(book: PriceBook, missing: set[str], prices: Path) -> None:
    """The worker would dead-letter every event: say which entries to add, and stop."""
    _err.print(f"[bold red]costline import:[/] the price book {prices} has no "
               f"{', '.join(sorted(missing))} priced per {book.currency.lower()!r}; "
               "add under prices:")
    for line in price_book_lines(book.currency, missing):
        _err.print(line, markup=False)
    raise typer.Exit(2)


def convert_file(source: IO[str], raw: IO[bytes], converter: FocusConverter,
                 delivery: Chunks, advance: Callable[[int], None], complete: bool = False
                 ) -> None:
    """Every row through the converter; the converted ones to ``delivery``."""
    done = 0
    rows = read_rows(source, converter.basis, converter.spread, complete)
    for number, row in enumerate(rows, start=1):
        outcome = converter.convert(row)
        if isinstance(outcome, Converted):
            delivery.add(outcome)
        else:
            delivery.tally.count(outcome)
        if number % 256 == 0:
            position = raw.tell()
            advance(position - done)
            done = position
    delivery.flush()
    advance(raw.tell() - done)


@dataclass
class ImportReport:
    """The summary printed at the end: the tally, what Kafka took, how fast."""

    files: list[str]
    basis: CostBasis
    currency: str
    dry_run: bool
    tally: ImportTally
    sent: Summary
    warnings: dict[str, int]
    seconds: float
    missing_prices: list[str]
    spread: bool = False
    memory_unread: str | None = None  # why a dry run did not read the row memory
    record_only: bool = False
    complete: bool = False
    max_withdraw: float = 100.0  # percent of an export's rows --complete may withdraw

    def as_dict(self) -> dict[str, Any]:
        sent = self.sent.as_dict()
        return {
            "file": self.files[0],  # the first of ``files``, for readers of one file
            "files": self.files,
            "cost_basis": self.basis.value,
            "currency": self.currency,
            "dry_run": self.dry_run,
            "record_only": self.record_only,
            "complete": self.complete,
            "spread": self.spread,
            "row_memory": "read" if self.memory_unread is None else "unread",
            **self.tally.as_dict(),
            "sent_events": sent["sent_events"],
            "sent_messages": sent["sent_messages"],
            "failed_messages": sent["failed_messages"],
            "errors": sent["errors"],
            "warnings": dict(sorted(self.warnings.items())),
            "missing_prices": self.missing_prices,
            "seconds": round(self.seconds, 3),
            "rows_per_second": round(self.tally.rows / self.seconds) if self.seconds else None,
        }

    def print(self) -> None:
        """The summary for people (amounts as currency; ``--json`` has them exact)."""
        tally = self.tally

        def money(micro: int) -> str:
            return money_micro(micro, self.currency)

        typer.echo(f"read {_count(tally.rows, 'row')} of {', '.join(self.files)} "
                   f"({self.basis.column}) in {self.seconds:.2f}s")
        amounts = (f"{money(tally.cost_micro)} net "
                   f"({money(tally.cost_micro + tally.credits_micro)} gross, "
                   f"{money(tally.credits_micro)} credits)")
        if self.record_only:
            typer.echo(f"recorded {_count(tally.recorded_rows, 'row')} as counted by an earlier "
                       "import, sent nothing")
        elif self.dry_run:
            typer.echo(f"dry run: would send {_count(tally.events, 'event')}, {amounts}")
            if self.memory_unread is not None:
                typer.echo(f"  the row memory was not read ({self.memory_unread}): every row "
                           "taken as new, which an import would not do for rows counted before")
        else:
            typer.echo(f"sent {_count(self.sent.sent_events, 'event')} in "
                       f"{_count(self.sent.sent_messages, 'message')}: {amounts}")
        if tally.unchanged_rows and self.record_only:
            typer.echo(f"  {_count(tally.unchanged_rows, 'row')} the row memory already held: "
                       "left as they are")
        elif tally.unchanged_rows:
            other = f" ({tally.other_basis_rows:,} on the other cost basis, which stays)" \
                if tally.other_basis_rows else ""
            typer.echo(f"  {_count(tally.unchanged_rows, 'row')} as an earlier import counted "
                       f"them{other}: nothing sent")
        if tally.revised_rows:
            moved = f"; {tally.moved_rows:,} under other tags or category now, moved there" \
                if tally.moved_rows else ""
            typer.echo(f"  {_count(tally.revised_rows, 'row')} revised since an earlier import: "
                       f"the difference sent as an adjustment{moved}")
        if tally.missing_rows:
            verb = "would withdraw" if self.dry_run else "withdrew"
            typer.echo(f"  {_count(tally.missing_rows, 'row')} counted before missing from this "
                       f"export of their billing period: {verb} "
                       f"{_count(tally.withdrawn_rows, 'row')}, "
                       f"{money(tally.withdrawn_micro)} as adjustments")
            if tally.missing_rows > tally.withdrawn_rows:
                typer.echo("    the others have nothing to withdraw here (nothing counted, "
                           "counted on the other cost basis, or on another period's bill now), "
                           "or their withdrawal still waits for Kafka (rows_unsent)")
        elif self.complete and self.memory_unread is not None:
            typer.echo("  which rows are missing is not known: the row memory was not read")
        elif self.complete and not tally.withdrawals_refused:
            typer.echo("  no row counted before is missing from this export")
        for label, gone, named in tally.withdrawals_refused:
            typer.echo(f"  NOT withdrawn: {gone:,} of the {named:,} rows of {label} are missing, "
                       f"more than {self.max_withdraw:g}%: the files may be cut short. Check "
                       "them; to withdraw the rows all the same, give --max-withdraw-percent 100")
        if tally.resent_rows:
            verb = "would be sent" if self.dry_run else "sent"
            typer.echo(f"  {_count(tally.resent_rows, 'row')} an earlier import left "
                       f"unacknowledged: {verb} again as they were (counted once)")
        if tally.unsent_rows:
            typer.echo(f"  {_count(tally.unsent_rows, 'row')} still unacknowledged by Kafka: "
                       "run the import again")
        for reason, rows in sorted(tally.skipped_rows.items()):
            if reason in HELD:
                typer.echo(f"  held {_count(rows, 'row')} ({reason.value}): "
                           f"{tally.skipped_text(reason)} of usage-based charges whose period "
                           "is not over, not counted (docs/FOCUS.md)")
                continue
            typer.echo(f"  skipped {_count(rows, 'row')} ({reason.value}): "
                       f"{tally.skipped_text(reason)} not counted")
        for name, number in sorted(self.warnings.items()):
            typer.echo(f"  warning: {name} × {number}")
        if self.sent.failed_messages:
            typer.echo(f"NOT delivered: {_count(self.sent.failed_messages, 'message')} "
                       f"({'; '.join(self.sent.errors)})")
        if self.missing_prices:
            typer.echo(f"the price book lacks {', '.join(self.missing_prices)}: "
                       "the worker would refuse these events")


# How long a dry run waits for Redis before it goes without the row memory.
DRY_RUN_REDIS_S = 3.0
# What a file that is not a readable FOCUS CSV raises (a truncated gzip: EOFError).
UNREADABLE = (FocusFormatError, csv.Error, UnicodeDecodeError, OSError, EOFError, zlib.error)


class FileFailed(Exception):
    """A file of the import could not be read: which one, and why."""

    def __init__(self, file: Path, cause: BaseException) -> None:
        super().__init__(f"{file}: {cause}")


def check_parts(files: list[Path], basis: CostBasis, spread: bool,
                complete: bool = False) -> None:
    """Before anything is sent: every file is a FOCUS CSV with the columns needed, and none
    is another's copy. The files are numbered as one export's parts, so the same rows twice
    would be taken for split lines and counted twice."""
    seen: dict[str, Path] = {}
    for file in files:
        try:
            with open_focus(file) as (text, _):
                next(read_rows(text, basis, spread, complete), None)
            with file.open("rb") as raw:
                digest = hashlib.file_digest(raw, "sha256")
        except UNREADABLE as exc:
            raise FileFailed(file, exc) from exc
        first = seen.setdefault(digest.hexdigest(), file)
        if first is not file:
            raise FileFailed(file, ValueError(
                f"the same bytes as {first}: name each part of one export once (two exports "
                "are two imports)"))


@contextmanager
def _released(lock: Any) -> Iterator[None]:
    try:
        yield
    finally:
        with suppress(LockError):  # held past its timeout and taken over: nothing to release
            lock.release()


def _run_import(ctx: typer.Context, files: list[Path], basis: CostBasis, dry_run: bool,
                batch: int, show_progress: bool, spread: bool = False,
                record_only: bool = False, complete: bool = False,
                max_withdraw: float = 100.0) -> ImportReport:
    book = _price_book(ctx)
    missing = missing_prices(book)
    if missing and not dry_run and not record_only:
        _refuse_without_prices(book, missing, settings_of(ctx).prices)
    converter = FocusConverter(basis, book.currency, rates=book.rates, spread=spread,
                               hold=not record_only)
    tally, sent = ImportTally(), Summary()
    began = time.perf_counter()
    bar, advance = _progress([str(file) for file in files], show_progress)
    # One converter for every part of an export: rows of one identity in different parts are
    # distinct charges, numbered across the parts as within one file.
    check_parts(files, basis, spread, complete)
    settings = settings_of(ctx)
    ledger, unread = _row_memory(settings, dry_run)
    lock = None if ledger is None or dry_run else ledger.lock()
    if lock is not None and not lock.acquire(blocking=False):
        _err.print("[bold red]costline import:[/] another import of this namespace is running "
                   f"(it holds the lock for at most {LOCK_S // 60} minutes); run one at a time")
        raise typer.Exit(2)
    sending = not dry_run and not record_only
    with bar, (nullcontext() if lock is None else _released(lock)), \
            (usage_stream(ctx, sent, batch) if sending else nullcontext(None)) as stream:
        delivery: Chunks = Recording(tally, basis, ledger) if record_only and ledger else \
            Delivery(tally, basis, stream, ledger, sent, complete)
        for file in files:
            try:
                with open_focus(file) as (source, raw):
                    convert_file(source, raw, converter, delivery, advance, complete)
            except UNREADABLE as exc:
                done = f"; {tally.events:,} events were sent before" \
                    if tally.events and not dry_run else ""
                raise FileFailed(file, ValueError(
                    f"{exc}{done}: mend it and import all the files again (what was sent "
                    "counts once)")) from exc
        # Only once every file was read whole: a file that failed withdraws nothing.
        if complete and isinstance(delivery, Delivery):
            delivery.withdraw(converter.scopes, converter.skipped_ids, max_withdraw)
    return ImportReport([str(file) for file in files], basis, book.currency, dry_run, tally, sent,
                        dict(converter.warnings), time.perf_counter() - began, sorted(missing),
                        spread, unread, record_only, complete, max_withdraw)


def _row_memory(settings: Any, dry_run: bool) -> tuple[RowLedger | None, str | None]:
    """The namespace's row memory, and why a dry run goes without it. An import needs it (a
    Redis that does not answer fails the import); a dry run reads it when Redis answers, so
    that it says what the import would send, and otherwise takes every row as new."""
    if not dry_run:
        return RowLedger(connect(settings.redis_url, timeout_s=30), settings.namespace), None
    try:
        redis = connect(settings.redis_url, timeout_s=DRY_RUN_REDIS_S,
                        connect_timeout_s=DRY_RUN_REDIS_S)
        redis.ping()
    except (*FAILURES, OSError, ValueError) as exc:
        return None, f"Redis at {without_password(settings.redis_url)}: {type(exc).__name__}"
    return RowLedger(redis, settings.namespace), None


import_app = typer.Typer(name="import", help="Import billing data as usage events.",
                         no_args_is_help=True)


@import_app.command("focus")
def focus(
    ctx: typer.Context,
    files: list[Path] = typer.Argument(..., metavar="FILE.csv[.gz]...", help="A FOCUS 1.0 "
                                       "export: every part of it, when it comes in parts."),
    cost: CostBasis = typer.Option(
        CostBasis.effective, "--cost", help="effective: EffectiveCost (commitments amortised); "
        "billed: BilledCost (as invoiced)."),
    spread: bool = typer.Option(False, "--spread", help="Spread a charge over more than an hour "
                                "(a monthly fee) evenly over its hours, exactly."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Read and convert, send nothing."),
    record_only: bool = typer.Option(
        False, "--record-only", help="Record every row as counted, send nothing: for an export "
        "an import counted before the row memory existed (docs/FOCUS.md, upgrading)."),
    complete: bool = typer.Option(
        False, "--complete", help="The files are the whole export of their billing periods: "
        "withdraw what an earlier import counted for a row of the same provider, account and "
        "period that they no longer hold (docs/FOCUS.md)."),
    max_withdraw: float = typer.Option(
        10.0, "--max-withdraw-percent", min=0.0, max=100.0, help="With --complete, withdraw "
        "nothing of an export missing more than this share of its rows (a file cut short)."),
    batch: int = typer.Option(DEFAULT_BATCH, min=1, max=MAX_BATCH, help="Events per message."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Send every row of a FOCUS export as a usage event with the row's cost.

    A row an earlier import counted sends only what changed since (nothing, or the difference
    as an adjustment), so any later export of the same month can be imported at any time.
    Credits, refunds and corrections count with their sign; a row in another currency is
    converted with the price book's rates. Only rows that cannot be counted are skipped (NULL
    or non-numeric cost, a bad time, a currency without a rate): reported with their count and
    total. A usage-based charge whose period is not over is held until a later import. Exit
    code 1 when rows were skipped (held ones aside) or an export's missing rows were too many
    to withdraw, 2 when Kafka did not take every event.
    """
    for file in files:
        if not file.is_file():
            _err.print(f"[bold red]costline import:[/] {file}: no such file")
            raise typer.Exit(2)
    if dry_run and record_only:
        _err.print("[bold red]costline import:[/] --record-only writes the row memory and a dry "
                   "run writes nothing: give one of them")
        raise typer.Exit(2)
    if complete and record_only:
        _err.print("[bold red]costline import:[/] --record-only sends nothing, so it withdraws "
                   "nothing: give one of --record-only and --complete")
        raise typer.Exit(2)
    try:
        report = _run_import(ctx, files, cost, dry_run, batch,
                             _err.is_terminal and not as_json, spread, record_only, complete,
                             max_withdraw)
    except FileFailed as exc:
        _err.print(f"[bold red]costline import:[/] {exc}")
        raise typer.Exit(2) from exc
    if as_json:
        typer.echo(json.dumps(report.as_dict(), indent=2))
    else:
        report.print()
    if report.sent.failed_messages:
        raise typer.Exit(2)
    if report.tally.invalid_rows or report.tally.withdrawals_refused:
        raise typer.Exit(1)


@command_group
def register(app: typer.Typer) -> None:
    app.add_typer(import_app, name="import")
