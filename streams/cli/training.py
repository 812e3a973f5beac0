"""What the training commands share: the state they read, and what a group's spend bought.

``costline runs``, ``costline spend --per tokens``, ``costline checkpoints`` and ``costline
advise checkpoints`` read Redis the way ``costline spend`` does; the figures are
``costline.rules.runs``' (money per million tokens and per step, exact micro-units), shown
for people here and as six-place decimal strings in ``--json``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import typer

from costline.rules.runs import PROGRESS_STEPS, PROGRESS_TOKENS, Efficiency, efficiencies
from costline.rules.state import PSEUDO_TAGS
from costline.streams.cli.spend_cmd import Filters
from costline.streams.cli.spend_cmd import GroupQuery as Query


@dataclass
class Reading:
    """The settings, the state and the price book of one command."""

    settings: Any
    state: Any
    prices: Any


def reading(ctx: typer.Context) -> Reading:
    from costline.connectors.redis_client import connect
    from costline.connectors.redis_state import RedisState
    from costline.rules.prices import PriceBook
    from costline.streams.cli.root import settings_of

    settings = settings_of(ctx)
    # A Redis that never answers ends the command with an error instead of hanging it.
    state = RedisState(connect(settings.redis_url, timeout_s=30), settings.namespace,
                       settings.timezone)
    return Reading(settings, state, PriceBook.load(settings.prices))


def duration(text: str, hint: str) -> int:
    from costline.rules.durations import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=hint) from exc


def efficiency_by(state: Any, by: Sequence[str], where: Filters, start: float, end: float
                  ) -> dict[tuple[str, ...], Efficiency]:
    """Each group's spend, waste, tokens and steps over [start, end). Progress is read with
    the tags of ``where`` only: its pseudo-tags (``resource_type``…) select spend."""
    cost, waste = Query(by, where).totals(state, ("cost", "waste"), start, end)
    tags = {key: globs for key, globs in where.items() if key not in PSEUDO_TAGS}
    [tokens] = Query(by, {**tags, "resource_type": PROGRESS_TOKENS}).totals(
        state, ("quantity",), start, end)
    [steps] = Query(by, {**tags, "resource_type": PROGRESS_STEPS}).totals(
        state, ("quantity",), start, end)
    return efficiencies(cost, waste, tokens, steps)


def efficiency_fields(found: Efficiency) -> dict[str, Any]:
    """``--json`` fields: tokens and steps as whole numbers, money as decimal strings."""
    from costline.rules.prices import format_micro

    per_mtok, per_step = found.per_mtok, found.per_step
    return {"tokens": str(found.tokens), "cost_per_mtok": _maybe(per_mtok, format_micro),
            "steps": str(found.whole_steps), "cost_per_step": _maybe(per_step, format_micro)}


def _maybe(micro: int | None, shown: Any) -> str | None:
    return None if micro is None else str(shown(micro))


def with_tokens(report: dict[str, Any], state: Any, by: Sequence[str], where: Filters,
                start: float, end: float) -> dict[str, Any]:
    """``spend --per tokens``: each row of a spend report with its tokens and steps and its
    spend per million tokens and per step."""
    found = efficiency_by(state, by, where, start, end)
    for row in report["rows"]:
        group = tuple(row["group"][key] for key in by)
        row.update(efficiency_fields(found.get(group, Efficiency(0, 0, 0, 0))))
    return report


def tokens_text(tokens: int | str) -> str:
    """``1.28B``, ``640.0M``, ``12,345``: tokens for people."""
    count = int(tokens)
    if count >= 10**9:
        return f"{count / 10**9:,.2f}B"
    if count >= 10**6:
        return f"{count / 10**6:,.1f}M"
    return f"{count:,}"


def per_text(amount: str | None, currency: str) -> str:
    from costline.rules.money import money

    return "—" if amount is None else money(Decimal(amount), currency)


def print_per_tokens(report: Mapping[str, Any], by: Sequence[str]) -> None:
    """``spend --per tokens`` for people."""
    from rich.console import Console

    from costline.rules.money import money
    from costline.streams.cli.tables import titled

    currency, period = report["currency"], report["period"]
    table = titled(f"Spend and what it bought {period['start']} → {period['end']}")
    for key in by:
        table.add_column(key)
    for column in ("cost", "waste", "tokens", "per Mtok", "steps", "per step"):
        table.add_column(column, justify="right")
    for row in report["rows"]:
        table.add_row(*[row["group"][key] or "—" for key in by],
                      money(Decimal(row["cost"]), currency), money(Decimal(row["waste"]), currency),
                      tokens_text(row["tokens"]), per_text(row["cost_per_mtok"], currency),
                      f"{int(row['steps']):,}", per_text(row["cost_per_step"], currency))
    Console().print(table)
