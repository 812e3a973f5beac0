"""``costline spend``: spend and waste per group for a calendar period, from Redis, exactly."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import typer
from pydantic import TypeAdapter, ValidationError

from costline.rules.events import TagKey
from costline.rules.globs import glob_match
from costline.rules.state import Measure, totals_each
from costline.streams.cli import command_group
from costline.streams.cli.root import AT_HELP, moment, zone_option

if TYPE_CHECKING:
    from costline.connectors.redis_state import RedisState
    from costline.rules.prices import PriceBook
    from costline.streams.settings import Settings

PERIODS = ("day", "week", "month")
# ``--basis`` → the measure and the key of ``--json`` rows: net spend is ``cost``.
BASES: dict[str, Measure] = {"net": "cost", "gross": "gross", "credits": "credits"}


_TAG_KEY = TypeAdapter(TagKey)


def tag_key(key: str, hint: str) -> str:
    """``key`` if an event could carry it as a tag key (pseudo-tags such as ``category`` are
    of the same form); else a usage error, with the lower-case key to try when it is one."""
    if _is_tag_key(key):
        return key
    lower = key.lower()
    suggestion = f": did you mean {lower!r}?" if _is_tag_key(lower) else ""
    raise typer.BadParameter(
        f"{key!r} cannot be a tag key (tag keys are lower-case letters, digits and _, "
        f"starting with a letter){suggestion}", param_hint=hint)


def _is_tag_key(key: str) -> bool:
    try:
        _TAG_KEY.validate_python(key)
    except ValidationError:
        return False
    return True


def group_keys(by: str, hint: str = "--by") -> list[str]:
    """``--by team,category`` → the keys, each one that could be a tag key."""
    return [tag_key(key.strip(), hint) for key in by.split(",") if key.strip()]


def absent_keys(report: Mapping[str, Any], by: Sequence[str]) -> list[str]:
    """Keys of ``--by`` that no row of the report has a value for: no event of the period
    carries them (a typo, or a tag the producers do not set)."""
    rows = report["rows"]
    return [key for key in by if rows and not any(row["group"].get(key) for row in rows)]


def parse_filters(pairs: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """``--where`` filters: each key → the globs its value may match. Different keys must all
    match; a key given again matches any of its values (``team=a`` and ``team=b``: either
    team), where keeping only the last one would quietly drop the others."""
    found: dict[str, tuple[str, ...]] = {}
    for pair in pairs:
        key, value = key_and_value(pair)
        tag_key(key, "--where")
        if value not in found.get(key, ()):
            found[key] = (*found.get(key, ()), value)
    return found


def key_and_value(pair: str, hint: str = "--where") -> tuple[str, str]:
    key, sep, value = pair.partition("=")
    if not sep or not key:
        raise typer.BadParameter(f"{pair!r}: expected KEY=VALUE", param_hint=hint)
    return key.strip(), value.strip()


Filters = Mapping[str, str | Sequence[str]]


def spend_report(state: Any, currency: str, by: Sequence[str], where: Filters,
                 start: float, end: float, peaks: bool = False, basis: str = "net"
                 ) -> dict[str, Any]:
    """The rows of ``spend --json``: one per group, sorted by the ``basis`` descending (net
    spend, the contract's order, by default).

    Every row has the three figures of money: ``cost`` is the net (what the bill says),
    ``gross`` the spend before credits, refunds and downward adjustments, ``credits`` those
    (as a positive amount); and ``waste``. ``where`` maps a key to a glob, or to several globs
    any of which it may match."""
    from costline.rules.durations import rfc3339
    from costline.rules.prices import format_micro

    query = GroupQuery(by, where)
    gross, credits, waste = query.totals(state, ("gross", "credits", "waste"), start, end)
    # The net from the two parts read rather than a third pass over the same fields.
    cost = {g: gross.get(g, 0) - credits.get(g, 0) for g in set(gross) | set(credits)}
    order = {"cost": cost, "gross": gross, "credits": credits}[BASES[basis]]
    peak = query.peaks(state, start, end) if peaks else {}
    rows = []
    groups = set(cost) | set(gross) | set(credits) | set(waste)
    for group in sorted(groups, key=lambda g: (-order.get(g, 0), g)):
        row: dict[str, Any] = {
            "group": dict(zip(by, group, strict=True)),
            "cost": format_micro(cost.get(group, 0)),
            "gross": format_micro(gross.get(group, 0)),
            "credits": format_micro(credits.get(group, 0)),
            "waste": format_micro(waste.get(group, 0)),
        }
        if peaks:
            row["peak_hourly"] = format_micro(peak.get(group, 0))
        rows.append(row)
    return {
        "currency": currency,
        "period": {"start": rfc3339(start), "end": rfc3339(end)},
        "rows": rows,
    }


class GroupQuery:
    """Groups and filters of a report, asked of a store whose match takes one glob per key.

    A key with several globs is grouped by as well, and only the groups whose value matches
    one of them are kept and summed onto the asked groups: the store reads the same buckets
    and decides each tag set once either way, and each tag set falls in one group, so
    overlapping globs (``team=a*``, ``team=ab``) still count it once.
    """

    def __init__(self, by: Sequence[str], where: Filters) -> None:
        self.by = list(by)
        self.match: dict[str, str] = {}
        self.either: dict[str, tuple[str, ...]] = {}
        for key, globs in where.items():
            alternatives = (globs,) if isinstance(globs, str) else tuple(dict.fromkeys(globs))
            if len(alternatives) == 1:
                self.match[key] = alternatives[0]
            else:
                self.either[key] = alternatives
        self.group_by = [*self.by, *self.either]

    def kept(self, group: tuple[str, ...]) -> tuple[str, ...] | None:
        """The asked group of a store's group, or ``None`` if it matches no alternative."""
        values = group[len(self.by):]
        for value, globs in zip(values, self.either.values(), strict=True):
            if not any(glob_match(value, glob) for glob in globs):
                return None
        return group[:len(self.by)]

    def totals(self, state: Any, measures: Sequence[Measure], start: float, end: float
               ) -> list[dict[tuple[str, ...], int]]:
        """Each measure's totals per asked group, in the order asked, from one read."""
        found = totals_each(state, measures, self.match, self.group_by, start, end)
        return [self._asked(found[measure]) for measure in measures]

    def _asked(self, totals: Mapping[tuple[str, ...], int]) -> dict[tuple[str, ...], int]:
        out: dict[tuple[str, ...], int] = {}
        for group, value in totals.items():
            asked = self.kept(group)
            if asked is not None:
                out[asked] = out.get(asked, 0) + value
        return out

    def peaks(self, state: Any, start: float, end: float) -> dict[tuple[str, ...], int]:
        """Highest hourly spend of each group in the period (peaks, not averages)."""
        until = min(end, time.time() + 3600)
        hourly: dict[tuple[str, ...], dict[int, int]] = {}
        series = state.series("cost", self.match, self.group_by, start, until, step=3600)
        for group, hours in series.items():
            asked = self.kept(group)
            if asked is not None:
                merged = hourly.setdefault(asked, {})
                for hour, value in hours.items():
                    merged[hour] = merged.get(hour, 0) + value
        return {group: max(hours.values()) for group, hours in hourly.items() if hours}


def _table(report: dict[str, Any], by: Sequence[str], basis: str = "net") -> None:
    from decimal import Decimal

    from rich.console import Console

    from costline.rules.money import money
    from costline.streams.cli.tables import titled

    period, currency = report["period"], report["currency"]
    table = titled(f"Spend {period['start']} → {period['end']}")
    for key in by:
        table.add_column(key)
    table.add_column(basis, justify="right")
    table.add_column("waste", justify="right")
    peaks = bool(report["rows"]) and "peak_hourly" in report["rows"][0]
    if peaks:
        table.add_column("peak/h", justify="right")
    cost = waste = Decimal(0)
    for row in report["rows"]:
        shown = Decimal(row[BASES[basis]])
        cost, waste = cost + shown, waste + Decimal(row["waste"])
        cells = [row["group"][key] or "—" for key in by]
        cells += [money(shown, currency), money(Decimal(row["waste"]), currency)]
        table.add_row(*cells, *([money(Decimal(row["peak_hourly"]), currency)] if peaks else []))
    if by:
        # A sum of hourly peaks is no one's peak: the total row leaves that column empty.
        table.add_section()
        table.add_row("total", *[""] * (len(by) - 1), money(cost, currency),
                      money(waste, currency), *([""] if peaks else []), style="bold")
    Console().print(table)


@dataclass(frozen=True)
class SpendAnswer:
    """What ``costline spend`` answers: the ``--json`` document, and the warnings it prints
    on stderr beside it."""

    report: dict[str, Any]
    warnings: list[str]


@dataclass(frozen=True)
class Reading:
    """Where a spend question is answered from: a long-lived reader (the API's) keeps one,
    so the tag sets it has read and the price book are not read again for every question."""

    state: RedisState
    prices: PriceBook


def spend_answer(settings: Settings, reading: Reading | None = None, *, by: str = "",
                 where: Sequence[str] = (), period: str = "month", at: str | None = None,
                 tz: str | None = None, peaks: bool = False, basis: str = "net",
                 per: str | None = None) -> SpendAnswer:
    """``costline spend`` for these options, as given on the command line (``by``
    comma-separated, each ``where`` ``KEY=VALUE``); a bad one is ``typer.BadParameter``.

    ``GET /api/v1/spend`` takes exactly the keyword-only arguments as its query parameters
    (``costline.streams.api.spend``), so both answer the same question the same way."""
    from costline.connectors.redis_client import connect
    from costline.connectors.redis_state import RedisState
    from costline.rules.durations import period_bounds
    from costline.rules.prices import PriceBook

    if period not in PERIODS:
        raise typer.BadParameter(f"{period!r}: one of day, week, month", param_hint="--period")
    if basis not in BASES:
        raise typer.BadParameter(f"{basis!r}: one of net, gross, credits", param_hint="--basis")
    if per not in (None, "tokens"):
        raise typer.BadParameter(f"{per!r}: only tokens", param_hint="--per")
    keys = group_keys(by)
    filters = parse_filters(where)
    zone = zone_option(tz) or settings.timezone
    start, end = period_bounds(moment(at, time.time(), zone), period, zone)  # type: ignore[arg-type]
    if reading is not None:
        return _answer(settings, reading, keys, filters, start, end, peaks, basis, per)
    # A Redis that never answers ends the command with an error instead of hanging it.
    state = RedisState(connect(settings.redis_url, timeout_s=30), settings.namespace,
                       settings.timezone)
    return _answer(settings, Reading(state, PriceBook.load(settings.prices)), keys, filters,
                   start, end, peaks, basis, per)


def _answer(settings: Settings, reading: Reading, keys: list[str], filters: Filters,
            start: float, end: float, peaks: bool, basis: str, per: str | None) -> SpendAnswer:
    state = reading.state
    report = spend_report(state, reading.prices.currency, keys, filters, start, end, peaks,
                          basis)
    if per is not None:
        from costline.streams.cli.training import with_tokens

        report = with_tokens(report, state, keys, filters, start, end)
    warnings = _short_warning(state, start, end)
    warnings += refused_warnings(settings, state, reading.prices, start, end)
    warnings += [f"no event in this period carries the key {key!r}: its column is empty (—) "
                 "in every row" for key in absent_keys(report, keys)]
    return SpendAnswer(report, warnings)


@command_group
def register(app: typer.Typer) -> None:
    @app.command()
    def spend(
        ctx: typer.Context,
        by: str = typer.Option("", metavar="KEY,...", help="Group by these keys (tags, "
                               "category, resource_type, billing, charge), comma-separated."),
        where: list[str] = typer.Option([], metavar="KEY=VALUE", help="Filter (a * glob is "
                                        "allowed); repeatable: different keys must all match, "
                                        "a key given again matches any of its values."),
        period: str = typer.Option("month", help="day, week or month."),
        at: str | None = typer.Option(None, metavar="TIME", help=AT_HELP),
        zone: str | None = typer.Option(None, "--tz", callback=zone_option, help="Time zone "
                                        "of the period; default COSTLINE_TIMEZONE."),
        peaks: bool = typer.Option(False, help="Also give each group's peak hourly spend."),
        basis: str = typer.Option("net", help="The money shown and sorted by: net (less "
                                  "credits, refunds and downward adjustments: the bill), "
                                  "gross (before them) or credits (them alone)."),
        per: str | None = typer.Option(None, metavar="tokens", help="tokens: also give each "
                                       "group's tokens and steps trained and its spend per "
                                       "million tokens and per step (progress events)."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON: currency, period "
                                     "(start, end) and rows (group, cost (the net), gross, "
                                     "credits, waste; peak_hourly with --peaks), amounts as "
                                     "decimal strings."),
    ) -> None:
        """Spend and waste per group for a day, week or month."""
        from costline.streams.cli.root import settings_of

        answer = spend_answer(settings_of(ctx), by=by, where=where, period=period, at=at,
                              tz=zone, peaks=peaks, basis=basis, per=per)
        for warning in answer.warnings:
            typer.echo(f"costline spend: {warning}", err=True)
        if as_json:
            typer.echo(json.dumps(answer.report, indent=2))
        elif per is not None:
            from costline.streams.cli.training import print_per_tokens

            print_per_tokens(answer.report, group_keys(by))
        else:
            _table(answer.report, group_keys(by), basis)


def _short_warning(state: Any, start: float, end: float) -> list[str]:
    """Say so when part of the period comes from buckets that may have expired (on stderr,
    so ``--json`` stays machine-readable)."""
    from costline.connectors.redis_keys import Retention

    kept = {"1h": f"hourly buckets are kept {Retention.hour // 86400} days",
            "5m": f"5-minute buckets are kept {Retention.five_min // 3600} hours"}
    parts = state.short_lived_parts(start, end, time.time())
    if not parts:
        return []
    return [f"warning: this period's edges are not whole days in the zone the buckets are "
            f"kept in and are read from finer buckets ({'; '.join(kept[p] for p in parts)}): "
            f"the totals may be short. Ask in the recorded zone (docs/OPERATIONS.md, Time "
            f"zone) for an exact answer."]


def refused_warnings(settings: Settings, state: RedisState, prices: PriceBook, start: float,
                     end: float) -> list[str]:
    """Input refused in the period, by reason, with its money where it can be told: that
    money is missing from the totals until the dead letters are replayed."""
    from costline.connectors.refusal_tally import RefusalTally
    from costline.rules.refusals import refused_lines

    tally = RefusalTally(state.redis, settings.namespace).read(start, end)
    return refused_lines(tally, prices)
