"""``costline produce FILE.jsonl...``: publish events, one JSON event (or ready batch) per line.

Every line is validated with the same parser the worker uses, so a bad line is reported
here with its file and line number instead of ending up in the dead-letter topic. Accepted
lines are sent byte for byte as written (``--batch`` only wraps them in a JSON array), keyed
by their event id: a resend of the same file lands on the same partitions, where the worker's
event-id dedup ignores it.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, nullcontext
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import IO, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from costline.connectors.kafka import (
    KafkaLoginFailed,
    KafkaUnavailable,
    TopicError,
    api_versions,
    partition_of,
    producer,
)
from costline.connectors.kafka_security import KafkaSecurity
from costline.rules.events import MAX_BATCH, Parsed, parse_message
from costline.streams.cli import command_group
from costline.streams.cli.root import settings_of
from costline.streams.topics import create_topics


class InputTopic(StrEnum):
    """The input topics, by their short names."""

    usage = "usage"
    faults = "faults"


# Which input topic carries each kind of event.
ROUTES = {"usage": "usage", "utilization": "usage", "fault": "faults"}
TOPICS = tuple(topic.value for topic in InputTopic)
SHOWN_REJECTIONS = 50
DEFAULT_BATCH = 500
"""Events per message unless ``--batch`` says otherwise: one message per event costs the
broker and the worker a message's overhead for each (46 events were 46 messages)."""
_BOM = b"\xef\xbb\xbf"

_err = Console(stderr=True, highlight=False, soft_wrap=True)


@dataclass(frozen=True)
class Rejected:
    """A line that was not sent, and why."""

    file: str
    line: int
    code: str
    reason: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.code}: {self.reason}"


@dataclass(frozen=True)
class Accepted:
    """A valid line: the topic it goes to, its first event id and how many events it holds."""

    topic: str
    first_id: str
    events: int
    batch: bool
    raw: bytes


@dataclass(frozen=True)
class Message:
    topic: str
    key: bytes
    value: bytes
    events: int


def _route(parsed: Parsed, forced: str | None) -> tuple[str, None] | tuple[None, str]:
    """The topic of a parsed line, or why it has none."""
    topics = {ROUTES[event.kind] for event in parsed.events}
    if forced is not None:
        for index, event in enumerate(parsed.events):
            if ROUTES[event.kind] != forced:
                where = f"event {index}: " if parsed.batch else ""
                return None, (f"{where}kind {event.kind!r} belongs on the "
                              f"{ROUTES[event.kind]} topic, not {forced}")
        return forced, None
    if len(topics) > 1:
        return None, "a batch mixes usage and fault events: one message goes to one topic"
    return topics.pop(), None


def check_line(raw: bytes, forced: str | None = None) -> Accepted | tuple[str, str]:
    """Validate one line; an ``Accepted`` or a ``(code, reason)`` pair."""
    parsed = parse_message(raw)
    if not isinstance(parsed, Parsed):
        return parsed.code, parsed.reason
    topic, problem = _route(parsed, forced)
    if topic is None:
        return "wrong_topic", problem or "no topic"
    return Accepted(topic, parsed.events[0].event_id, len(parsed.events), parsed.batch, raw)


@dataclass
class Batcher:
    """Groups single events into JSON-array messages of ``size`` events, per topic and per
    partition of their ``event_id``.

    A batch is keyed by its first event's id, so every event of it lands on the partition its
    own id would have gone to alone: a later resend of any of them, batched differently or
    not at all, meets the first copy's dedup memory there. ``partitions`` gives a topic's
    partition count. A line that already is a batch is sent as it is: its producer chose.
    """

    size: int
    partitions: Callable[[str], int] = lambda topic: 1
    pending: dict[tuple[str, int], list[Accepted]] = field(default_factory=dict)

    def add(self, line: Accepted) -> Iterator[Message]:
        if line.batch or self.size == 1:
            yield Message(line.topic, line.first_id.encode(), line.raw, line.events)
            return
        where = (line.topic, partition_of(line.first_id, self.partitions(line.topic)))
        waiting = self.pending.setdefault(where, [])
        waiting.append(line)
        if len(waiting) >= self.size:
            yield self._take(where)

    def flush(self) -> Iterator[Message]:
        for where in sorted(self.pending):
            if self.pending[where]:
                yield self._take(where)

    def _take(self, where: tuple[str, int]) -> Message:
        lines = self.pending.pop(where)
        value = b"[" + b",".join(line.raw for line in lines) + b"]"
        return Message(where[0], lines[0].first_id.encode(), value, len(lines))


def read_lines(stream: IO[bytes]) -> Iterator[tuple[int, bytes, int]]:
    """``(line number, stripped line, bytes read)`` for every non-blank line."""
    for number, line in enumerate(stream, start=1):
        text = line[len(_BOM):] if number == 1 and line.startswith(_BOM) else line
        text = text.strip()
        if text:
            yield number, text, len(line)


@dataclass
class Summary:
    """What ``produce`` did; printed at the end, as JSON with ``--json``.

    Only acknowledged messages count as sent. Acknowledgements arrive on the producer's I/O
    thread, hence the lock.
    """

    sent_events: int = 0
    sent_messages: int = 0
    failed_messages: int = 0
    topics: dict[str, dict[str, int]] = field(default_factory=dict)
    rejected: list[Rejected] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    queued_messages: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def delivered(self, message: Message, topic_name: str) -> None:
        with self._lock:
            self.sent_events += message.events
            self.sent_messages += 1
            counts = self.topics.setdefault(topic_name, {"events": 0, "messages": 0})
            counts["events"] += message.events
            counts["messages"] += 1

    def failed(self, error: BaseException) -> None:
        with self._lock:
            self.failed_messages += 1
            if len(self.errors) < 5:
                self.errors.append(f"{type(error).__name__}: {error}")

    def settle(self) -> None:
        """Count messages that were neither acknowledged nor refused (a flush timed out)."""
        with self._lock:
            lost = self.queued_messages - self.sent_messages - self.failed_messages
            if lost > 0:
                self.failed_messages += lost
                self.errors.append(f"{lost} messages unacknowledged when the flush timed out")

    def as_dict(self) -> dict[str, Any]:
        with self._lock:
            return {
                "sent_events": self.sent_events,
                "sent_messages": self.sent_messages,
                "failed_messages": self.failed_messages,
                "topics": {name: dict(counts) for name, counts in self.topics.items()},
                "rejected_lines": len(self.rejected),
                "rejected": [asdict(rejected) for rejected in self.rejected],
                "errors": list(self.errors),
            }


Send = Callable[[Message], None]


def produce_lines(
    sources: Iterable[tuple[str, IO[bytes]]],
    send: Send,
    summary: Summary,
    *,
    forced: str | None = None,
    batch: int = 1,
    advance: Callable[[int], None] = lambda _: None,
    partitions: Callable[[str], int] = lambda topic: 1,
) -> None:
    """Validate every line of every source, hand accepted messages to ``send``."""
    batcher = Batcher(batch, partitions)
    for name, stream in sources:
        for number, raw, size in read_lines(stream):
            checked = check_line(raw, forced)
            if isinstance(checked, Accepted):
                for message in batcher.add(checked):
                    send(message)
            else:
                summary.rejected.append(Rejected(name, number, *checked))
            advance(size)
    for message in batcher.flush():
        send(message)


# -- the command ---------------------------------------------------------------------------


def _open_all(stack: ExitStack, files: list[str]) -> list[tuple[str, IO[bytes]]]:
    sources: list[tuple[str, IO[bytes]]] = []
    for name in files:
        if name == "-":
            sources.append(("<stdin>", sys.stdin.buffer))
            continue
        path = Path(name)
        if not path.is_file():
            _err.print(f"[bold red]costline produce:[/] {name}: no such file")
            raise typer.Exit(2)
        sources.append((name, stack.enter_context(path.open("rb"))))
    return sources


def _progress(files: list[str], enabled: bool) -> tuple[Any, Callable[[int], None]]:
    """A rich progress bar over the bytes of all files (a no-op when not on a terminal)."""
    if not enabled:
        return nullcontext(), lambda _: None
    total = None if "-" in files else sum(Path(name).stat().st_size for name in files)
    bar = Progress(
        TextColumn("[bold]produce[/]"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(), console=_err, transient=True,
    )
    task = bar.add_task("lines", total=total)
    return bar, lambda size: bar.advance(task, size)


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _print_summary(summary: Summary) -> None:
    per_topic = ", ".join(
        f"{topic}: {_count(counts['events'], 'event')} in "
        f"{_count(counts['messages'], 'message')}"
        for topic, counts in sorted(summary.topics.items())
    )
    typer.echo(f"sent {_count(summary.sent_events, 'event')} in "
               f"{_count(summary.sent_messages, 'message')}"
               + (f" ({per_topic})" if per_topic else ""))
    if summary.failed_messages:
        typer.echo(f"NOT delivered: {_count(summary.failed_messages, 'message')} "
                   f"({'; '.join(summary.errors)})")
    if summary.rejected:
        typer.echo(f"rejected {_count(len(summary.rejected), 'line')} (not sent):")
        for rejected in summary.rejected[:SHOWN_REJECTIONS]:
            typer.echo(f"  {rejected}")
        hidden = len(summary.rejected) - SHOWN_REJECTIONS
        if hidden > 0:
            typer.echo(f"  ... and {hidden} more (--json lists them all)")


def _kafka_sender(bootstrap: str, names: dict[str, str], summary: Summary,
                  security: KafkaSecurity) -> tuple[Any, Send]:
    from kafka.errors import KafkaError  # here: kafka-python is slow to import

    client = producer(bootstrap, client_id="costline-produce", security=security)

    def send(message: Message) -> None:
        topic_name = names[message.topic]
        summary.queued_messages += 1
        try:
            future = client.send(topic_name, key=message.key, value=message.value)
        except KafkaError as exc:  # e.g. the buffer stayed full, the message is too large
            summary.failed(exc)
            return
        future.add_callback(lambda _: summary.delivered(message, topic_name))
        future.add_errback(summary.failed)

    return client, send


def _finish(client: Any, summary: Summary) -> None:
    """Wait for the last acknowledgements; whatever is still unanswered counts as failed."""
    from kafka.errors import KafkaError

    try:
        client.flush(timeout=120)
    except KafkaError as exc:  # a timeout is reported, not raised
        summary.errors.append(f"flush: {type(exc).__name__}: {exc}")
    finally:
        client.close(timeout=10)
        summary.settle()


def _ensure_topics(ctx: typer.Context) -> None:
    """Create missing topics first: a message must never meet a topic of the wrong size.

    A quick ApiVersions probe first, so an unreachable broker fails in milliseconds rather
    than after the admin client's bootstrap timeout.
    """
    settings = settings_of(ctx)
    api_versions(settings.kafka_bootstrap, timeout_s=5.0, security=settings.kafka_security())
    create_topics(settings)


@command_group
def register(app: typer.Typer) -> None:
    @app.command("produce")
    def produce(
        ctx: typer.Context,
        files: list[str] = typer.Argument(..., metavar="FILE.jsonl", help="'-' reads stdin."),
        topic: InputTopic | None = typer.Option(
            None,
            help="Send every line to this topic; lines of other kinds are rejected "
            "(default: route each line by its kind)."),
        batch: int = typer.Option(
            DEFAULT_BATCH, min=1, max=MAX_BATCH, help="Events per message (a JSON array); 1 "
            "sends each line as a message of its own; lines that already are arrays are sent "
            "as they are."),
        as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    ) -> None:
        """Publish events, one JSON event (or array of events) per line.

        A bad line is reported with its file and line number and not sent; the others are.
        Exit code 1 when a line was rejected, 2 when Kafka did not take every message.
        """
        from kafka.errors import KafkaError

        settings = settings_of(ctx)
        names = {name: settings.topic(name) for name in TOPICS}
        summary = Summary()
        with ExitStack() as stack:
            sources = _open_all(stack, files)
            try:
                _ensure_topics(ctx)
                client, send = _kafka_sender(settings.kafka_bootstrap, names, summary,
                                             settings.kafka_security())
            except (KafkaError, KafkaUnavailable, KafkaLoginFailed, TopicError) as exc:
                _err.print(f"[bold red]costline produce:[/] Kafka at "
                           f"{settings.kafka_bootstrap}: {type(exc).__name__}: {exc}")
                raise typer.Exit(2) from exc
            bar, advance = _progress(files, _err.is_terminal and not as_json)
            with bar:
                try:
                    forced = topic.value if topic else None
                    produce_lines(sources, send, summary, forced=forced, batch=batch,
                                  advance=advance,
                                  partitions=lambda t: len(client.partitions_for(names[t])))
                finally:
                    _finish(client, summary)
        if as_json:
            typer.echo(json.dumps(summary.as_dict(), indent=2))
        else:
            _print_summary(summary)
        if summary.failed_messages:
            raise typer.Exit(2)
        if summary.rejected:
            raise typer.Exit(1)
