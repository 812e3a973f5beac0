"""Rule evaluation in a child process: the same answers as in the worker's own process, a
child that dies is replaced, a Redis outage still reads as one, and a gone worker ends it."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest
import redis

from costline.connectors.alert_store import AlertStore
from costline.connectors.redis_client import connect
from costline.connectors.redis_state import RedisState
from costline.rules.engine import Engine, Evaluation
from costline.rules.loader import RuleSet
from costline.rules.prices import PriceBook
from costline.streams.settings import DEFAULT_PRICES, Settings
from costline.streams.worker.evaluation_process import EvaluatorDied, ProcessRunner
from costline.streams.worker.evaluator import InlineRunner
from tests.conftest import DEFAULT_REDIS_URL
from tests.integration.redis_writer import Writer
from tests.integration.streamkit import free_port
from tests.unit.rulefiles.builders import MIN, T0, rule, sample, usage

pytestmark = pytest.mark.integration

PRICES = PriceBook.load(DEFAULT_PRICES)
BUDGETS = RuleSet((
    rule(kind="budget", name="team-day", group_by=["team"], period="day", limit=10,
         warn_at=[0.5]),
    rule(kind="growth", name="growth", group_by=["team"], window="1h", baseline="1d", ratio=2),
))
# A reclaim block with a connector's own parameters (``approval``): the child must get them
# with the rules, as they were validated where the rules were loaded.
IDLE = RuleSet((rule(kind="idle", name="gpu-idle", below=0.05, for_="10m",
                     reclaim={"connector": "dry_run", "grace": "1h", "approval": "manual"}),))
NIGHTLY = RuleSet((rule(kind="budget", name="team-night", group_by=["team"], period="day",
                        limit=1),))


@pytest.fixture
def runner(any_redis_url: str, namespace: str) -> Iterator[ProcessRunner]:
    found = ProcessRunner(
        Settings(redis_url=any_redis_url, namespace=namespace, timezone="UTC"), PRICES)
    yield found
    found.close()


def inline(any_redis_url: str, namespace: str) -> InlineRunner:
    client = connect(any_redis_url)
    return InlineRunner(RedisState(client, namespace, "UTC"), AlertStore(client, namespace))


def shown(evaluation: Evaluation) -> tuple[object, ...]:
    return (evaluation.at, evaluation.changes, evaluation.findings, evaluation.book,
            evaluation.reused)


async def test_the_child_answers_as_the_worker_would(
        runner: ProcessRunner, redis_writer: Writer, any_redis_url: str, namespace: str) -> None:
    await redis_writer.write([usage(T0 - 30 * MIN + i * MIN, 0.5, team=f"t{i % 3}")
                              for i in range(30)])  # 1.25 a minute: t0..t2 at 12.50 each
    engine, here = Engine.for_prices(BUDGETS, PRICES), inline(any_redis_url, namespace)

    there = runner.evaluate(engine, T0, full=True)
    assert shown(there) == shown(here.evaluate(engine, T0, full=True))
    assert {c["group"]["team"] for c in there.changes} == {"t0", "t1", "t2"}
    assert runner.pid != os.getpid()

    # Between ticks the child reuses what it kept: the same as the inline runner does.
    await redis_writer.write([usage(T0 + MIN, 4, team="t9")])
    there = runner.evaluate(engine, T0 + 60, full=False)
    assert shown(there) == shown(here.evaluate(engine, T0 + 60, full=False))
    assert "t9" in {f.group["team"] for f in there.findings["team-day"]}


async def test_reclaim_requests_come_back_with_their_connector_parameters(
        runner: ProcessRunner, redis_writer: Writer, any_redis_url: str, namespace: str) -> None:
    await redis_writer.write([sample(T0 - 20 * MIN + i * MIN, 0.01) for i in range(21)])
    engine = Engine.for_prices(IDLE, PRICES)
    there = runner.evaluate(engine, T0, full=True)
    assert shown(there) == shown(inline(any_redis_url, namespace).evaluate(engine, T0, full=True))
    [found] = there.findings["gpu-idle"]
    assert found.reclaim is not None and found.reclaim.params["approval"] == "manual"


async def test_a_new_rule_set_and_a_dead_child_are_taken_care_of(
        runner: ProcessRunner, redis_writer: Writer) -> None:
    await redis_writer.write([usage(T0 - MIN, 3, team="a")])  # over the warning line
    assert runner.evaluate(Engine.for_prices(BUDGETS, PRICES), T0, full=True).changes

    first = runner.pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    time.sleep(0.5)
    # A new child, which never saw a rule set: it is sent the rules in force.
    changed = runner.evaluate(Engine.for_prices(NIGHTLY, PRICES), T0 + 60, full=True)
    assert runner.pid not in (None, first)
    assert [(c["rule"], c["group"]) for c in changed.changes] == [("team-night", {"team": "a"})]


def test_a_child_ended_by_the_worker_s_stop_is_not_replaced(
        any_redis_url: str, namespace: str) -> None:
    """SIGTERM to the worker's process group ends the child at once, while the worker's stop
    takes its time: the evaluations its timers still ask for start no other child."""
    stopping = False
    runner = ProcessRunner(Settings(redis_url=any_redis_url, namespace=namespace,
                                    timezone="UTC"), PRICES, stopping=lambda: stopping)
    try:
        engine = Engine.for_prices(NIGHTLY, PRICES)
        runner.evaluate(engine, T0, full=True)
        child = runner.pid
        assert child is not None
        os.kill(child, signal.SIGTERM)  # what the signal to the group does to it
        stopping = True
        for _ in range(2):
            with pytest.raises(EvaluatorDied, match="stopping"):
                runner.evaluate(engine, T0 + 60, full=True)
        assert runner.pid == child, "a new evaluation process was started"
    finally:
        runner.close()


def test_the_worker_s_stop_ends_an_evaluation_still_waiting_for_its_answer(
        runner: ProcessRunner) -> None:
    """The stop closes the pipe (in a thread of its own) while an evaluation waits on it in
    another: the evaluation ends as stopped, not with an error of the closed pipe."""
    engine = Engine.for_prices(NIGHTLY, PRICES)
    runner.evaluate(engine, T0, full=True)
    child = runner.pid
    assert child is not None
    os.kill(child, signal.SIGSTOP)  # it will not answer
    outcome: list[BaseException] = []

    def evaluate() -> None:
        try:
            runner.evaluate(engine, T0 + 60, full=True)
        except BaseException as exc:  # noqa: BLE001 - the test looks at what it was
            outcome.append(exc)

    waiting = threading.Thread(target=evaluate)
    waiting.start()
    time.sleep(0.5)
    runner.stop()  # kills the stopped child after its join times out
    waiting.join(10)
    assert [type(exc) for exc in outcome] == [EvaluatorDied], outcome
    assert "stopping" in str(outcome[0])


def test_a_redis_outage_crosses_as_a_redis_error(namespace: str) -> None:
    closed = f"redis://127.0.0.1:{free_port()}/0"
    assert closed != DEFAULT_REDIS_URL
    runner = ProcessRunner(Settings(redis_url=closed, namespace=namespace), PRICES)
    try:
        with pytest.raises(redis.ConnectionError):
            runner.evaluate(Engine.for_prices(BUDGETS, PRICES), T0, full=True)
    finally:
        runner.close()


def test_the_child_ends_when_the_worker_is_gone(runner: ProcessRunner, any_redis_url: str) -> None:
    runner.evaluate(Engine.for_prices(NIGHTLY, PRICES), T0, full=True)
    process = runner._process
    assert process is not None and process.is_alive()
    runner._conn.close()  # what the worker's death does to the pipe
    process.join(timeout=10)
    assert process.exitcode == 0


def niceness(pid: int) -> int:
    """A process's nice value, as ``ps -o ni`` shows it (field 19 of ``/proc/PID/stat``)."""
    with open(f"/proc/{pid}/stat") as fh:
        after_name = fh.read().rsplit(")", 1)[1].split()
    return int(after_name[16])


@pytest.mark.parametrize(("nice", "expected"), [(None, 10), (0, 0), (5, 5)])
def test_the_child_evaluates_at_its_niceness(
        redis_url: str, namespace: str, nice: int | None, expected: int) -> None:
    given = {} if nice is None else {"evaluator_nice": nice}
    runner = ProcessRunner(Settings(redis_url=redis_url, namespace=namespace, **given), PRICES)
    try:
        runner.evaluate(Engine.for_prices(NIGHTLY, PRICES), T0, full=True)
        assert runner.pid is not None
        # niceness adds to the worker's own, up to the most there is (19)
        assert niceness(runner.pid) == min(19, niceness(os.getpid()) + expected)
    finally:
        runner.close()
