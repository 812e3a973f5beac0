"""``costline scrape prometheus|slurm``: telemetry and scheduler state as events, on a timer.

Each round collects a list of events, sends them through the same partition-aligned
``usage_stream`` as the FOCUS import and waits for Kafka's acknowledgement, so a round
reported as sent is in Kafka. A round that fails (the exporter or ``squeue`` did not answer)
is reported and the next one runs anyway: a scraper outlives the things it watches.
``--once`` runs one round and exits, for cron.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from costline.connectors.slurm_scrape import SQUEUE
from costline.rules.durations import rfc3339
from costline.rules.prices import PriceBook
from costline.rules.yaml_source import SourceInvalid
from costline.streams.cli import command_group
from costline.streams.cli.import_cmd import UsageStream, UsageTopicEvent, usage_stream
from costline.streams.cli.produce_cmd import Summary
from costline.streams.cli.root import settings_of

_err = Console(stderr=True, highlight=False, soft_wrap=True)

Collect = Callable[[float], Iterable[UsageTopicEvent]]


@dataclass
class Round:
    """What one round did, printed as one line (or one JSON object)."""

    source: str
    at: float
    events: Counter[str]
    skipped: dict[str, int]
    error: str | None = None
    delivered: int = 0
    failed: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "at": rfc3339(self.at), "events": dict(self.events),
                "sent_events": self.delivered, "failed_messages": self.failed,
                "skipped": self.skipped, "error": self.error}

    def line(self) -> str:
        if self.error:
            return f"{rfc3339(self.at)} {self.source}: FAILED: {self.error}"
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(self.events.items())) or "none"
        skipped = ", ".join(f"{k} {n}" for k, n in sorted(self.skipped.items()) if n)
        return (f"{rfc3339(self.at)} {self.source}: {self.delivered} events sent ({kinds})"
                + (f"; skipped: {skipped}" if skipped else "")
                + (f"; NOT delivered: {self.failed} messages" if self.failed else ""))


def run_round(source: str, collect: Collect, skipped: Callable[[], Counter[str]],
              stream: UsageStream, summary: Summary) -> Round:
    """Collect, send, wait for the acknowledgements; a failure becomes the round's error."""
    now = time.time()
    before_sent, before_failed = summary.sent_events, summary.failed_messages
    before_skipped = Counter(skipped())
    kinds: Counter[str] = Counter()
    try:
        for event in collect(now):
            kinds[event.kind] += 1
            stream.emit(event)
        stream.flush()
    except Exception as exc:  # noqa: BLE001 - one bad round must not end the scraper
        return Round(source, now, kinds, {}, f"{type(exc).__name__}: {exc}")
    done = Round(source, now, kinds, dict(skipped() - before_skipped))
    done.delivered = summary.sent_events - before_sent
    done.failed = summary.failed_messages - before_failed
    return done


def _stop_on_sigterm() -> threading.Event:
    """Set on SIGTERM or Ctrl-C, so the round in progress ends before the scraper does."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def run_rounds(ctx: typer.Context, source: str, collect: Collect,
               skipped: Callable[[], Counter[str]], interval_s: float, once: bool,
               as_json: bool) -> None:
    """Rounds every ``interval_s`` (on the clock's multiples of it) until stopped."""
    summary = Summary()
    stop = _stop_on_sigterm()
    failed_round = False
    with usage_stream(ctx, summary) as stream:
        while not stop.is_set():
            done = run_round(source, collect, skipped, stream, summary)
            failed_round = bool(done.error or done.failed)
            typer.echo(json.dumps(done.as_dict()) if as_json else done.line())
            if once:
                break
            stop.wait(interval_s - time.time() % interval_s)
    if failed_round and once:
        raise typer.Exit(2)


def _price_book(ctx: typer.Context) -> PriceBook:
    try:
        return PriceBook.load(settings_of(ctx).prices)
    except SourceInvalid as exc:
        _err.print(f"[bold red]costline scrape:[/] price book: {exc}")
        raise typer.Exit(2) from exc


scrape_app = typer.Typer(name="scrape", no_args_is_help=True,
                         help="Turn exporters' metrics and Slurm's jobs into events.")

INTERVAL = typer.Option(60.0, "--interval", min=1.0, help="Seconds between rounds.")
ONCE = typer.Option(False, "--once", help="One round, then exit (for cron).")
AS_JSON = typer.Option(False, "--json", help="One JSON object per round.")


@scrape_app.command("prometheus")
def prometheus(
    ctx: typer.Context,
    url: str = typer.Argument(..., help="The metrics page, e.g. http://node-017:9400/metrics."),
    mapping_file: Path = typer.Option(..., "--map", help="The YAML mapping (docs/SCRAPE.md)."),
    interval: float = INTERVAL,
    once: bool = ONCE,
    as_json: bool = AS_JSON,
    timeout: float = typer.Option(10.0, min=0.1, help="Seconds to wait for the page."),
) -> None:
    """Scrape a Prometheus text endpoint; mapped metrics become utilization or usage events."""
    from costline.connectors.prometheus_scrape import PrometheusScraper, load_mapping, scrape

    try:
        mapping = load_mapping(mapping_file, _price_book(ctx))
    except SourceInvalid as exc:
        for problem in exc.errors:
            _err.print(str(problem), markup=False)
        raise typer.Exit(2) from exc
    scraper = PrometheusScraper(url, mapping, interval)
    run_rounds(ctx, url, lambda now: list(scrape(scraper, now, timeout)),
               lambda: scraper.skipped, interval, once, as_json)


def _check_priced(book: PriceBook, resource_type: str, unit: str, option: str) -> None:
    price = book.prices.get(resource_type)
    if price is None or price.unit != unit:
        _err.print(f"[bold red]costline scrape:[/] {option} {resource_type}: the price book "
                   f"has no such type priced per {unit!r}")
        raise typer.Exit(2)


@scrape_app.command("slurm")
def slurm(
    ctx: typer.Context,
    interval: float = INTERVAL,
    once: bool = ONCE,
    as_json: bool = AS_JSON,
    gpu_default: str = typer.Option(
        "gpu.h100", help="Resource type of GPUs whose gres type the price book lacks."),
    cpu_type: str = typer.Option("cpu.general", help="Resource type of CPU-only jobs."),
    cluster: str = typer.Option("slurm", help="Cluster name when squeue does not give one."),
    squeue: str = typer.Option(" ".join(SQUEUE), help="The squeue command to run."),
    runs: list[str] = typer.Option([], "--runs", metavar="KEY=GLOB", help="Tags that make a "
                                   "job a training run, whose end is reported as a run_end "
                                   "event (repeatable; a key given again: any of its values); "
                                   "default stage=pretrain or stage=posttrain."),
) -> None:
    """Count running jobs' GPU-hours (CPU-only jobs: vCPU-hours) for each completed window,
    and report the end of every training run's job."""
    import shlex

    from costline.connectors.slurm_scrape import RUN_JOBS, SlurmScraper, parse_squeue, run_squeue
    from costline.streams.cli.spend_cmd import parse_filters

    book = _price_book(ctx)
    _check_priced(book, gpu_default, "gpu_hour", "--gpu-default")
    _check_priced(book, cpu_type, "vcpu_hour", "--cpu-type")
    scraper = SlurmScraper(interval, book, gpu_default, cpu_type, cluster,
                           runs=parse_filters(runs) if runs else dict(RUN_JOBS))
    command = shlex.split(squeue)
    run_rounds(ctx, "slurm", lambda now: scraper.events(parse_squeue(run_squeue(command),
                                                                     cluster), now),
               lambda: scraper.skipped, interval, once, as_json)


@command_group
def register(app: typer.Typer) -> None:
    app.add_typer(scrape_app, name="scrape")
