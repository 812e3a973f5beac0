"""When the worker evaluates: as soon as data moved (rules data moves, idle findings reused),
and every rule on the tick."""

from __future__ import annotations

import asyncio
from typing import Any

from costline.rules.alerts import AlertBook
from costline.rules.engine import Engine, Evaluation
from costline.rules.loader import RuleSet
from costline.rules.memory_state import InMemoryState
from costline.streams.worker import evaluator as evaluator_module
from costline.streams.worker.evaluator import Evaluator
from costline.streams.worker.metrics import Metrics
from tests.unit.rulefiles.builders import T0, book, rule, sample, usage

RULES = RuleSet((
    rule(kind="budget", name="team-day", group_by=["team"], period="day", limit=10),
    rule(kind="idle", name="gpu-idle", below=0.05, for_="10m"),
))


class Watermarks:
    """Every partition's watermark is ``applied``; ``None``: no message applied yet."""

    def __init__(self) -> None:
        self.applied: int | None = 0
        self.asked = 0

    def pipeline(self, transaction: bool) -> Watermarks:
        self.asked = 0
        return self

    def get(self, key: str) -> None:
        self.asked += 1

    def execute(self) -> list[bytes | None]:
        return [None if self.applied is None else str(self.applied).encode()] * self.asked


class State(InMemoryState):
    """An in-memory state with the watermarks the evaluator polls."""

    def __init__(self) -> None:
        super().__init__(book())
        self.redis = Watermarks()

    def slots(self) -> list[str]:
        return ["{ns:usage:0}"]


class Store:
    def __init__(self) -> None:
        self.saved = AlertBook()

    def book(self) -> AlertBook:
        return self.saved

    def silences(self, now: float) -> list[Any]:
        return []

    def save_book(self, saved: AlertBook) -> None:
        self.saved = saved

    def record_resolved(self, changes: Any) -> None:
        pass


class Source:
    def __init__(self) -> None:
        self.engine = Engine(RULES, "USD")

    def current(self) -> Engine:
        return self.engine

    def rules(self) -> RuleSet:
        return RULES


class Clock:
    """The evaluator's monotonic clock, moved only by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def evaluator(state: State, clock: Clock | None = None) -> Evaluator:
    async def publish(key: bytes, value: bytes) -> None:
        return None

    return Evaluator(source=Source(), state=state, store=Store(),  # type: ignore[arg-type]
                     publish=publish, metrics=Metrics(), tick_s=30,
                     clock=clock if clock is not None else Clock())


def step(found: Evaluator, now: float) -> Evaluation | None:
    # After an evaluation, data may trigger the next one only after a rest as long as it took
    # on the evaluator's clock; these tests' evaluations take none of it, so the rest is over
    # at once.
    return asyncio.run(found.step(now))


def test_data_triggers_the_rules_it_moves_and_the_tick_every_rule() -> None:
    state = State()
    state.add_all([sample(T0 - 20 * 60 + i * 60, 0.01) for i in range(21)])
    worker = evaluator(state)

    first = step(worker, T0)
    assert first is not None and first.reused == frozenset()
    assert first.findings["gpu-idle"]  # the idle GPU, found by the first (full) evaluation

    assert step(worker, T0 + 1) is None  # nothing moved, no tick due

    state.add(usage(T0, 1, team="a"))  # 2.50 of 10: below the line
    state.redis.applied += 1
    moved = step(worker, T0 + 2)
    assert moved is not None and moved.reused == frozenset({"gpu-idle"})
    assert moved.findings["gpu-idle"] == first.findings["gpu-idle"]
    assert moved.evaluated().keys() == {"team-day"}

    tick = step(worker, T0 + 31)
    assert tick is not None and tick.reused == frozenset()

    state.add(usage(T0, 4, team="a"))  # 12.50 of 10
    state.redis.applied += 1
    fired = step(worker, T0 + 32)
    assert fired is not None and [c["group"] for c in fired.changes] == [{"team": "a"}]


def test_the_first_message_of_a_partition_triggers_an_evaluation() -> None:
    state = State()
    state.redis.applied = None  # the partition exists, nothing applied yet
    worker = evaluator(state)
    assert step(worker, T0) is not None  # the first evaluation: every rule

    state.add(usage(T0, 5, team="a"))  # 12.50 of 10, at offset 0
    state.redis.applied = 0
    moved = step(worker, T0 + 1)  # well before the tick
    assert moved is not None and [c["group"] for c in moved.changes] == [{"team": "a"}]


def test_data_waits_longer_after_an_evaluation_while_the_aggregation_is_behind() -> None:
    """The rest after an evaluation is as long as it took while the aggregation keeps up, and
    ``REST_BEHIND`` times as long while it has a backlog."""
    clock = Clock()
    backlog = [False]
    state = State()
    worker = evaluator(state, clock)
    worker.behind = lambda: backlog[0]

    class Slow:
        """Evaluates as the engine does, taking two seconds of the test's clock."""

        def __init__(self, runner: Any) -> None:
            self.runner = runner

        def evaluate(self, engine: Engine, now: float, full: bool) -> Evaluation:
            clock.now += 2.0
            return self.runner.evaluate(engine, now, full)

    worker.runner = Slow(worker.runner)

    def moved_at(after: float) -> Evaluation | None:
        state.redis.applied += 1  # type: ignore[operator]
        clock.now += after
        return asyncio.run(worker.step(T0 + 1))

    asyncio.run(worker.step(T0))  # the first, full evaluation: two seconds, keeping up
    assert moved_at(1.9) is None  # still resting
    backlog[0] = True  # the next evaluation ends with a backlog
    assert moved_at(0.2) is not None  # rested as long as it took
    assert evaluator_module.REST_BEHIND > 1.5
    assert moved_at(2.1) is None  # resting longer than it would keeping up
    assert moved_at(2.0 * evaluator_module.REST_BEHIND - 2.2) is None
    backlog[0] = False
    assert moved_at(0.2) is not None
    assert moved_at(2.1) is not None  # caught up: as long as it took again
