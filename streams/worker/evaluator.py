"""Runs the rule engine for the worker and publishes alert changes to ``NS.alerts.v1``.

Evaluation is driven by data and by time. Several times a second (``COSTLINE_RULES_POLL_S``)
the evaluator reads the data generation, the sum of every partition's watermark (one MGET),
and as soon as it moved evaluates the rules that counted data moves (every kind but idle),
reusing the other rules' last findings. Every ``tick`` seconds it evaluates every rule, for
what time alone changes (``for``, idle, period rollover, forecasts). Answers about hours
before the last one or two are kept between evaluations (``costline.rules.kept_answers``), so an
evaluation reads little more than the spend of the last hour. Only the Faust leader
evaluates, so two workers never race on the alert book; by default it evaluates in a child
process of its own (``costline.streams.worker.evaluation_process``), so evaluating never slows the
aggregation.

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
from typing import Any, Protocol

from costline.connectors.alert_store import AlertStore
from costline.connectors.plugins import PLUGINS
from costline.connectors.redis_keys import wm_key
from costline.connectors.redis_state import RedisState
from costline.rules.engine import Engine, Evaluation
from costline.rules.findings import Finding
from costline.rules.kept_answers import KeptAnswers
from costline.rules.loader import RuleSet, RulesInvalid, load_rules, rule_files
from costline.rules.prices import PriceBook
from costline.streams.worker.health import Health
from costline.streams.worker.metrics import Metrics

log = logging.getLogger("costline.evaluator")

Publish = Callable[[bytes, bytes], Awaitable[None]]
# After an evaluation, data may trigger the next one only after a rest of this many times as
# long as it took: evaluating then takes at most half a core while the aggregation keeps up,
# and a fifth of one while it is behind (catching up a backlog, or overloaded), when the
# aggregation, Redis and Kafka need the CPU more than alerts need fresh partial sums.
REST_KEEPING_UP = 1.0
REST_BEHIND = 4.0


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
                rules = load_rules([self.path], self.timezone, plugins=PLUGINS)
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


class Runner(Protocol):
    """Where evaluations run: in this process (``InlineRunner``) or in a child process of
    their own (``costline.streams.worker.evaluation_process.ProcessRunner``)."""

    def evaluate(self, engine: Engine, now: float, full: bool) -> Evaluation: ...


class InlineRunner:
    """Evaluates in the calling thread against the state in Redis, keeping what the next
    evaluation can reuse: answers about past hours, and the findings of the rules data does
    not move (between ticks, those are reused instead of evaluated again)."""

    def __init__(self, state: RedisState, store: AlertStore) -> None:
        self.state, self.store = state, store
        self.kept = KeptAnswers()
        self._engine: Engine | None = None  # the engine of the last evaluation
        self._last: Evaluation | None = None

    def evaluate(self, engine: Engine, now: float, full: bool) -> Evaluation:
        reuse = None if full else self._reusable(engine)
        evaluation = engine.evaluate(self.state, now, self.store.book(),
                                     self.store.silences(now), kept=self.kept, reuse=reuse)
        self._engine, self._last = engine, evaluation
        return evaluation

    def _reusable(self, engine: Engine) -> dict[str, list[Finding]] | None:
        """The last findings of the rules data does not move, or ``None`` when every rule
        must be evaluated (new rules, or none evaluated yet)."""
        last = self._last
        if last is None or engine is not self._engine:
            return None
        timed = [rule.name for rule in engine.rules if not rule.data_driven]
        if any(name not in last.findings for name in timed):
            return None
        return {name: last.findings[name] for name in timed}


class Evaluator:
    """Decides when to evaluate, and publishes what changed; a ``Runner`` evaluates."""

    def __init__(self, *, source: RuleSource, state: RedisState, store: AlertStore,
                 publish: Publish, metrics: Metrics, tick_s: float = 30.0,
                 runner: Runner | None = None,
                 behind: Callable[[], bool] = lambda: False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.source, self.state, self.store = source, state, store
        self.behind = behind  # whether the aggregation has a backlog
        self.clock = clock  # seconds, monotonic: times evaluations and the rests after them
        self.publish, self.metrics, self.tick_s = publish, metrics, tick_s
        self.runner: Runner = runner if runner is not None else InlineRunner(state, store)
        self._generation: int | None = None
        self._last_full: float | None = None  # when every rule was last evaluated
        self._ready_at = 0.0  # monotonic time before which data does not trigger again
        self.last_evaluation: Evaluation | None = None

    def _data_generation(self) -> int:
        """Sum of all watermarks: it moves whenever any partition applied a batch. A partition
        with none yet counts as -1, so its first message (offset 0) moves the sum too. Each
        watermark is in its partition's slot: one pipeline, which a Redis Cluster client
        sends to each node its part."""
        slots = self.state.slots()
        if not slots:
            return -1
        pipe = self.state.redis.pipeline(transaction=False)
        for slot in slots:
            pipe.get(wm_key(slot))
        return sum(-1 if v is None else int(v) for v in pipe.execute())

    async def step(self, now: float | None = None) -> Evaluation | None:
        """Evaluate if data moved or the tick is due; publish the changes."""
        now = time.time() if now is None else now
        tick = self._last_full is None or now - self._last_full >= self.tick_s
        if not tick and self.clock() < self._ready_at:
            return None
        generation = await asyncio.to_thread(self._data_generation)
        if generation == self._generation and not tick:
            return None
        engine = self.source.current()
        if engine is None:
            return None
        evaluation, cost = await asyncio.to_thread(self._evaluate, engine, now, tick)
        # The rest leaves the CPU to the aggregation, Redis and Kafka (inline, evaluating would
        # otherwise starve the aggregation of the GIL). Measured: a shorter rest (half as long)
        # made the aggregation fall seconds behind on two CPUs. Asked here, on the event loop,
        # as the aggregation's state is changed only there.
        rest = REST_BEHIND if self.behind() else REST_KEEPING_UP
        self._ready_at = self.clock() + cost * rest
        for change in evaluation.changes:
            await self.publish(change["alert_id"].encode(), _json(change))
        await asyncio.to_thread(self.store.record_resolved, evaluation.changes)
        await asyncio.to_thread(self.store.save_book, evaluation.book)
        self._generation = generation
        if tick:
            self._last_full = now
        self.last_evaluation = evaluation
        self.metrics.inc("evaluations_total")
        self.metrics.inc("alert_changes_total", len(evaluation.changes))
        return evaluation

    def _evaluate(self, engine: Engine, now: float, full: bool) -> tuple[Evaluation, float]:
        """The evaluation and the seconds it took."""
        started = self.clock()
        evaluation = self.runner.evaluate(engine, now, full)
        cost = self.clock() - started
        self.metrics.observe("evaluation_seconds", cost)
        return evaluation, cost


def _json(change: dict[str, Any]) -> bytes:
    return json.dumps(change, separators=(",", ":")).encode()
