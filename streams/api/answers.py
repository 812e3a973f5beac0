"""The API's documents, each built by the code that builds the command line's: ``spend`` is
``costline spend --json``, ``alerts`` adds the silences and the resolved alerts to ``costline
alerts --json``, ``actions`` is ``costline actions --json``, ``dead-letters`` is ``costline
dead-letters list --json``; ``budgets`` is the report's budget charts as rows
(``costline.streams.api.budgets``) and ``refused`` the refusal tally ``costline spend`` warns
about.

One ``OpenData`` serves every request of a process: it keeps the Redis reader (the tag sets it
has read), the price book and the rule source. Reads are blocking Redis calls, run in a thread
so the event loop (the worker's) never waits on them, one at a time (the reader's caches are
not shared between threads).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import typer

from costline.connectors.alert_store import AlertStore
from costline.connectors.reclaim_ledger import LOG_MAX, RedisReclaimLedger
from costline.connectors.redis_client import AsyncRedisClient, RedisClient
from costline.connectors.redis_state import RedisState
from costline.connectors.refusal_tally import RefusalTally
from costline.rules.durations import period_bounds, rfc3339
from costline.rules.loader import RuleSet
from costline.rules.prices import PriceBook, format_micro
from costline.rules.refusals import priced
from costline.streams.api.budgets import budget_rows
from costline.streams.cli.alerts_cmd import alert_rows
from costline.streams.cli.dead_letters_cmd import dead_letter_rows, dead_letters
from costline.streams.cli.report import ReportRequest, budget_charts
from costline.streams.cli.root import moment, zone_option
from costline.streams.cli.spend_cmd import PERIODS, Reading, spend_answer
from costline.streams.settings import Settings

Rules = Callable[[], RuleSet]


class OpenData:
    """Answers the API's questions from one namespace's stores."""

    def __init__(self, settings: Settings, redis: RedisClient, async_redis: AsyncRedisClient,
                 rules: Rules) -> None:
        self.settings, self.redis, self.async_redis, self.rules = (
            settings, redis, async_redis, rules)
        self.prices = PriceBook.load(settings.prices)
        self.state = RedisState(redis, settings.namespace, settings.timezone)
        self.store = AlertStore(redis, settings.namespace)
        self.tally = RefusalTally(redis, settings.namespace)
        self.lock = threading.Lock()

    def spend(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """``costline spend --json`` with these options (``spend_answer``'s keywords)."""
        with self.lock:
            return spend_answer(self.settings, Reading(self.state, self.prices),
                                **options).report

    def alerts(self, resolved: int = 100) -> dict[str, Any]:
        """The alerts pending or firing (muted ones say by what until when), the silences in
        force, and the latest resolved alerts, newest first."""
        with self.lock:
            book = self.store.book()
            silences = [s.to_dict() for s in self.store.silences()]
            history = self.store.resolved(resolved)
        for silence in silences:
            silence["starts_at"] = rfc3339(silence["starts_at"])
            silence["ends_at"] = rfc3339(silence["ends_at"])
        return {"alerts": alert_rows(book), "silences": silences, "resolved": history}

    def budgets(self, at: str | None = None, points: bool = False) -> dict[str, Any]:
        """Every budget rule × group over the rule's period holding ``at`` (default now)."""
        now = time.time()
        moment_at = moment(at, now, self.settings.timezone)
        request = ReportRequest("month", moment_at, now, self.settings.timezone)
        rules = self.rules()
        with self.lock:
            book = self.store.book()
            charts = budget_charts(self.state, rules, book, request, hourly=points)
        return {"currency": self.prices.currency, "at": rfc3339(moment_at),
                "budgets": budget_rows(charts, rules, book, points)}

    def refused(self, period: str = "month", at: str | None = None, tz: str | None = None
                ) -> dict[str, Any]:
        """What was refused in the period, by reason, and its money at today's prices."""
        if period not in PERIODS:
            raise typer.BadParameter(f"{period!r}: one of day, week, month",
                                     param_hint="--period")
        zone = zone_option(tz) or self.settings.timezone
        start, end = period_bounds(moment(at, time.time(), zone), period, zone)  # type: ignore[arg-type]
        with self.lock:
            tally = self.tally.read(start, end)
        reasons = []
        for code, refused in tally.items():
            money = priced(refused, self.prices)
            reasons.append({
                "code": code, "messages": refused.messages, "events": refused.events,
                "amount": format_micro(money.amount),
                "unpriced": [{"resource_type": rtype, "unit": unit,
                              "quantity": format_micro(quantity)}
                             for (rtype, unit), quantity in money.unpriced.items()],
            })
        return {"currency": self.prices.currency,
                "period": {"start": rfc3339(start), "end": rfc3339(end)}, "reasons": reasons}

    def dead_letters(self, reason: str | None, since: str | None, limit: int
                     ) -> list[dict[str, Any]]:
        """``costline dead-letters list --json`` (reads the dead-letter topic)."""
        letters = dead_letters(self.settings, reason, since)
        with self.lock:
            return dead_letter_rows(letters, self.redis, self.settings.namespace)[:limit]

    async def actions(self, limit: int) -> list[dict[str, Any]]:
        """``costline actions --json``: the latest reclamation steps, newest first."""
        ledger = RedisReclaimLedger(self.async_redis, self.settings.namespace)
        found: list[dict[str, Any]] = await ledger.history(min(limit, LOG_MAX))
        return found
