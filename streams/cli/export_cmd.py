"""``costline export focus``: a period of costline's own spend as a FOCUS 1.0 file, for
chargeback in the FinOps tools that read the clouds' bills.

The rows come from the hourly buckets (``costline.connectors.focus_export`` makes them), read a
day of hours at a time. A period still running is exported up to the start of the current
hour: a FOCUS row states a whole charge period, and the hour now is in is still growing. The
file's gross and credits are then checked against the totals of what it covers as
``costline spend`` reads them: hourly buckets are kept 35 days, so the hours of an older period
may be gone while its days remain, and an export that does not add up says so and exits 1
instead of passing for the bill. Totals that moved while the file was written (late events
for its hours) say that instead.
"""

from __future__ import annotations

import csv
import gzip
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import IO, Any, Protocol

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from costline.connectors.focus_export import (
    FOCUS_COLUMNS,
    MEASURES,
    FocusRows,
    Interval,
    days_of,
    hours_in,
)
from costline.connectors.redis_keys import Retention
from costline.rules.prices import format_micro
from costline.rules.state import Dimensions, Group, Measure
from costline.streams.cli import command_group
from costline.streams.cli.root import settings_of, zone_option
from costline.streams.cli.spend_cmd import PERIODS

_err = Console(stderr=True, highlight=False, soft_wrap=True)


class HourlyReader(Protocol):
    """What the export reads: ``RedisState`` answers it."""

    def interval_cells(self, measures: Sequence[Measure],
                       intervals: Sequence[tuple[float, float]]
                       ) -> list[dict[Dimensions, dict[Measure, int]]]: ...

    def totals_each(self, measures: Sequence[Measure], match: dict[str, str],
                    group_by: Sequence[str], start: float, end: float
                    ) -> dict[Measure, dict[Group, int]]: ...


def write_rows(reader: HourlyReader, rows: FocusRows, intervals: list[Interval], out: IO[str],
               advance: Callable[[int], None]) -> None:
    """Every interval's rows to ``out`` as CSV (NULL is an empty cell), a day at a time."""
    writer = csv.DictWriter(out, fieldnames=FOCUS_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for day in days_of(intervals):
        cells = reader.interval_cells(MEASURES, [(i.start, i.end) for i in day])
        for interval, found in zip(day, cells, strict=True):
            writer.writerows(rows.of(interval, found))
        advance(len(day))


def period_totals(reader: HourlyReader, start: float, end: float) -> dict[str, int]:
    """The gross and credits of [start, end), as ``costline spend`` reads them."""
    totals = reader.totals_each(("gross", "credits"), {}, [], start, end)
    return {measure: sum(totals[measure].values()) for measure in ("gross", "credits")}


def shortfall(period: dict[str, int], rows: FocusRows) -> dict[str, tuple[int, int]]:
    """Where the file differs from the totals: measure → (period, file)."""
    exported = {"gross": rows.gross_micro, "credits": rows.credits_micro}
    return {m: (period[m], exported[m]) for m in period if period[m] != exported[m]}


def exported_until(start: float, end: float, now: float) -> float:
    """Where the export of [start, end) stops: its end, or for a period still running the
    start of the hour now is in (its whole hours so far)."""
    if end <= now:
        return end
    return max(start, min(end, float(int(now // 3600) * 3600)))


@contextmanager
def _output(path: Path | None) -> Iterator[IO[str]]:
    """The file (gzip when its name ends in ``.gz``), written beside it and renamed when
    complete, so a failed export never leaves a file that looks whole; stdout without one."""
    if path is None:
        yield typer.get_text_stream("stdout")
        return
    partial = path.with_name(f".{path.name}.partial")
    raw: IO[str] = (gzip.open(partial, "wt", encoding="utf-8", newline="")  # noqa: SIM115
                    if path.suffix == ".gz" else partial.open("w", encoding="utf-8", newline=""))
    try:
        with raw:
            yield raw
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def _progress(total: int, enabled: bool) -> tuple[Any, Callable[[int], None]]:
    if not enabled:
        return nullcontext(), lambda _: None
    bar = Progress(TextColumn("[bold]export[/] hours"), BarColumn(),
                   TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                   console=_err, transient=True)
    task = bar.add_task("hours", total=total)
    return bar, lambda done: bar.advance(task, done)


def summary(rows: FocusRows, span: tuple[float, float, float], currency: str, file: Path | None,
            hours: int, seconds: float, missing: dict[str, tuple[int, int]],
            moved: bool = False) -> dict[str, Any]:
    """The export's summary; ``span`` is the period's start and end and where the file ends."""
    from costline.rules.durations import rfc3339

    start, end, until = span
    return {
        "file": str(file) if file else None,
        "period": {"start": rfc3339(start), "end": rfc3339(end)},
        "until": rfc3339(until),
        "currency": currency,
        "rows": rows.rows,
        "tag_sets": len(rows.tag_sets),
        "hours": hours,
        "cost_total": format_micro(rows.gross_micro - rows.credits_micro),
        "gross_total": format_micro(rows.gross_micro),
        "credits_total": format_micro(rows.credits_micro),
        "complete": not missing,
        "changed_while_exporting": moved,
        "missing": {measure: {"period": format_micro(period), "file": format_micro(found)}
                    for measure, (period, found) in missing.items()},
        "seconds": round(seconds, 3),
    }


export_app = typer.Typer(name="export", help="Export costline's spend as billing data.",
                         no_args_is_help=True)


@export_app.command("focus")
def focus(
    ctx: typer.Context,
    period: str = typer.Option("month", help="day, week or month."),
    at: str | None = typer.Option(None, help="A moment inside the period (RFC 3339 or Unix "
                                  "seconds); default now."),
    zone: str | None = typer.Option(None, "--tz", callback=zone_option,
                                    help="Time zone of the period; default COSTLINE_TIMEZONE."),
    output: Path | None = typer.Option(None, "-o", "--output", metavar="FILE",
                                       help="Write here (gzip for .gz); default stdout."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON on stdout "
                                 "(needs -o)."),
) -> None:
    """Write a period's spend as FOCUS 1.0 rows: one per tag set, hour, resource type and
    charge category, gross and credits apart.

    Exit code 1 when the file does not add up to the period's totals (hourly buckets are kept
    35 days), 2 for bad arguments.
    """
    from costline.connectors.redis_client import connect
    from costline.connectors.redis_state import RedisState
    from costline.rules.durations import parse_time, period_bounds
    from costline.rules.prices import PriceBook

    settings = settings_of(ctx)
    if period not in PERIODS:
        raise typer.BadParameter(f"{period!r}: one of day, week, month", param_hint="--period")
    if as_json and output is None:
        raise typer.BadParameter("the summary goes to stdout: give the file with -o",
                                 param_hint="--json")
    now = time.time()
    try:
        moment = parse_time(at) if at is not None else now
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--at") from exc
    start, end = period_bounds(moment, period, zone or settings.timezone)  # type: ignore[arg-type]
    until = exported_until(start, end, now)
    book = PriceBook.load(settings.prices)
    state = RedisState(connect(settings.redis_url, timeout_s=30), settings.namespace,
                       settings.timezone)
    rows = FocusRows(book, account=settings.namespace)
    intervals = hours_in(start, until)
    began = time.perf_counter()
    bar, advance = _progress(len(intervals), output is not None and _err.is_terminal)
    before = period_totals(state, start, until)
    with bar, _output(output) as out:
        write_rows(state, rows, intervals, out, advance)
    after = period_totals(state, start, until)
    missing = shortfall(after, rows)
    report = summary(rows, (start, end, until), book.currency, output, len(intervals),
                     time.perf_counter() - began, missing, moved=bool(missing) and before != after)
    if as_json:
        typer.echo(json.dumps(report, indent=2))
    else:
        _print(report)
    if missing:
        raise typer.Exit(1)


def _print(report: dict[str, Any]) -> None:
    """The summary on stderr: stdout may be the file itself."""
    money = report["currency"]
    where = report["file"] or "stdout"
    running = "" if report["until"] == report["period"]["end"] else \
        f", the period's whole hours so far (it ends {report['period']['end']})"
    _err.print(f"wrote {report['rows']} rows ({report['tag_sets']} tag sets, "
               f"{report['hours']} hours from {report['period']['start']} to "
               f"{report['until']}{running}) to {where}: {report['cost_total']} {money} net "
               f"({report['gross_total']} gross, {report['credits_total']} credits)",
               markup=False)
    why = ("its hours' spend changed while they were read (events still arriving for them): "
           "export again" if report["changed_while_exporting"] else
           f"hourly buckets are kept {Retention.hour // 86400} days, and part of this period's "
           "may be gone")
    for measure, figures in report["missing"].items():
        _err.print(f"[bold red]costline export:[/] the file's {measure} is "
                   f"{figures['file']} {money} but the period's is {figures['period']} {money}: "
                   f"{why}")


@command_group
def register(app: typer.Typer) -> None:
    app.add_typer(export_app, name="export")
