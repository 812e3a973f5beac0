"""Runs the rule engine inside the worker and publishes alert changes to ``NS.alerts.v1``.

Evaluation is driven by data and by time: every couple of seconds the evaluator checks whether
any partition's watermark moved (new spend arrived) and evaluates if so, and it evaluates at
least every ``tick`` seconds for what time alone changes (``for``, idle, period rollover,
forecasts). Only the Faust leader evaluates, so two workers never race on the alert book.

Changes are published before the book is saved: a crash in between republishes them on the
next evaluation, and the Slack notifier's ledger recognises a change it already sent.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from connectors.alert_store import AlertStore
from connectors.redis_keys import wm_key
from connectors.redis_state import RedisState
from rules.engine import Engine, Evaluation
from rules.loader import RuleSet, RulesInvalid, load_rules, rule_files
from rules.prices import PriceBook
from streams.health import Health
from streams.metrics import Metrics

log = logging.getLogger("costline.evaluator")

Publish = Callable[[bytes, bytes], Awaitable[None]]


class RuleSource:
    """The rule files: reloaded when they change; a reload that fails keeps the last good set."""

    def __init__(self, path: Path, timezone: str, prices: PriceBook, health: Health) -> None:
        self.path, self.timezone, self.prices, self.health = path, timezone, prices, health
        self._signature: tuple[tuple[str, int, int], ...] = ()
        self.engine: Engine | None = None
        self.error: str | None = None

    def _fingerprint(self) -> tuple[tuple[str, int, int], ...]:
        files = []
        for file in rule_files([self.path]):
            try:
                stat = file.stat()
            except OSError:
                continue
            files.append((str(file), stat.st_mtime_ns, stat.st_size))
        return tuple(files)

    def rules(self) -> RuleSet:
        """The rule set in force (empty until the first good load)."""
        engine = self.current()
        return engine.rules if engine is not None else RuleSet((), ())

    def current(self) -> Engine | None:
        signature = self._fingerprint()
        if signature != self._signature:
            self._signature = signature
            try:
                rules = load_rules([self.path], self.timezone)
            except RulesInvalid as exc:
                self.error = str(exc)
                self.health.failing("rules", f"rule reload refused, keeping the last good set: "
                                             f"{len(exc.errors)} problem(s)")
                log.error("rule files refused, keeping the last good set:\n%s", exc)
            else:
                self.engine = Engine.for_prices(rules, self.prices)
                self.error = None
                self.health.recovered("rules")
                self.health.facts["rules"] = {"loaded": len(rules), "from": str(self.path),
                                              "at": time.time()}
                log.info("loaded %d rules from %s", len(rules), self.path)
        return self.engine


class Evaluator:
    def __init__(self, *, source: RuleSource, state: RedisState, store: AlertStore,
                 publish: Publish, metrics: Metrics, tick_s: float = 30.0) -> None:
        self.source, self.state, self.store = source, state, store
        self.publish, self.metrics, self.tick_s = publish, metrics, tick_s
        self._generation: int | None = None
        self._last = 0.0
        self._cost = 0.0  # seconds the last evaluation took
        self.last_evaluation: Evaluation | None = None

    def _data_generation(self) -> int:
        """Sum of all watermarks: it moves whenever any partition applied a batch."""
        slots = self.state.slots()
        if not slots:
            return -1
        values = self.state.redis.mget([wm_key(slot) for slot in slots])
        return sum(int(v) for v in values if v is not None)  # type: ignore[union-attr]

    async def step(self, now: float | None = None) -> Evaluation | None:
        """Evaluate if data moved or the tick is due; publish the changes."""
        now = time.time() if now is None else now
        since = now - self._last
        # An evaluation may take a while on a big state: keep it to a third of the time at
        # most, so that it never starves the aggregation it shares the process with.
        if since < 2 * self._cost:
            return None
        generation = await asyncio.to_thread(self._data_generation)
        if generation == self._generation and since < self.tick_s:
            return None
        engine = self.source.current()
        if engine is None:
            return None
        evaluation = await asyncio.to_thread(self._evaluate, engine, now)
        for change in evaluation.changes:
            await self.publish(change["alert_id"].encode(), _json(change))
        await asyncio.to_thread(self.store.save_book, evaluation.book)
        self._generation, self._last = generation, now
        self.last_evaluation = evaluation
        self.metrics.inc("evaluations_total")
        self.metrics.inc("alert_changes_total", len(evaluation.changes))
        return evaluation

    def _evaluate(self, engine: Engine, now: float) -> Evaluation:
        started = time.perf_counter()
        evaluation = engine.evaluate(self.state, now, self.store.book(), self.store.silences(now))
        self._cost = time.perf_counter() - started
        self.metrics.observe("evaluation_seconds", self._cost)
        return evaluation


def _json(change: dict[str, Any]) -> bytes:
    return json.dumps(change, separators=(",", ":")).encode()
