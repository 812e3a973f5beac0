"""Rule evaluation in a child process of its own, so it never competes with the aggregation
for the worker's GIL, and its memory (the state it reads, the answers it keeps) is not the
aggregating process's.

The worker (its Faust leader) still decides when to evaluate, publishes the changes and saves
the alert book, in that order; the child only evaluates. It is started on the first evaluation,
reads Redis with its own connection, and keeps what an evaluation may reuse (answers about past
hours, the findings of the rules data does not move) between evaluations. The rules cross the
pipe once per rule set, the evaluation comes back whole.

A child that dies is started again on the next evaluation, which is then a full one; a worker
that dies closes the pipe, and the child exits.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from costline.rules.engine import Engine, Evaluation
from costline.rules.loader import RuleSet
from costline.rules.prices import PriceBook
from costline.streams.worker import child_process, collector

log = logging.getLogger("costline.evaluator")

PROCESS_NAME = "costline-rules"
_WAIT_S = 1.0  # how often a waiting worker checks that the child is still alive


class EvaluatorDied(RuntimeError):
    """The child process ended in the middle of an evaluation."""


class ProcessRunner:
    """Runs evaluations in a child process; one evaluation at a time (the caller awaits each).

    The child connects to Redis as ``settings`` say, and prices with the worker's own book.
    """

    def __init__(self, settings: Any, prices: PriceBook,
                 stopping: Callable[[], bool] = lambda: False) -> None:
        self.settings, self.prices = settings, prices
        # The worker is stopping (or has crashed): a SIGTERM to its process group may have
        # ended the child already, and no other is started.
        self.stopping = stopping
        self._process: Any = None
        self._conn: Connection | None = None
        self._rules: RuleSet | None = None  # the rule set the child holds
        self._stopped = False

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def evaluate(self, engine: Engine, now: float, full: bool) -> Evaluation:
        conn, process = self._child()
        if engine.rules is not self._rules:
            conn.send(("rules", engine.rules))
            self._rules = engine.rules
        conn.send(("evaluate", now, full))
        return self._answer(conn, process)

    def stop(self) -> None:
        """The worker stops: end the child, and start no other."""
        self._stopped = True
        self.close()

    def close(self) -> None:
        # The worker's stop may close while an evaluation waits in another thread: each
        # closes what it found, and a pipe closed twice is closed.
        conn, process = self._conn, self._process
        self._process = self._conn = self._rules = None
        if conn is not None:
            conn.close()
        if process is not None:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()

    def _child(self) -> tuple[Connection, BaseProcess]:
        if self._stopped or self.stopping():
            raise EvaluatorDied("the worker is stopping")
        conn, process = self._conn, self._process
        if process is not None and process.is_alive() and conn is not None:
            return conn, process
        if process is not None:
            log.error("the evaluation process ended (exit code %s); starting a new one",
                      process.exitcode)
            self.close()
        ours, theirs = multiprocessing.Pipe()
        process = child_process.start(PROCESS_NAME, child_main, self.settings, self.prices,
                                      theirs)
        theirs.close()
        self._process, self._conn = process, ours
        log.info("evaluation process started (pid %d)", process.pid)
        return ours, process

    def _answer(self, conn: Connection, process: BaseProcess) -> Evaluation:
        try:
            while not conn.poll(_WAIT_S):
                if not process.is_alive():
                    break
            kind, value = conn.recv()
        except (EOFError, OSError) as exc:
            self.close()
            if self._stopped or self.stopping():
                raise EvaluatorDied("the worker is stopping") from exc
            raise EvaluatorDied(
                f"the evaluation process ended (exit code {process.exitcode})") from exc
        except Exception as exc:  # an error that crossed but cannot be rebuilt here
            raise RuntimeError(f"the evaluation failed: {exc!r}") from exc
        if kind == "error":
            raise value
        return value  # type: ignore[no-any-return]


def child_main(settings: Any, prices: PriceBook, conn: Connection) -> None:
    """The child: evaluate what the worker asks for until the worker closes the pipe."""
    os.nice(settings.evaluator_nice)
    # Connected on the first evaluation, so a Redis that does not answer (or cannot tell
    # whether it is a cluster) fails that evaluation, as any Redis error does, and the next
    # one tries again.
    runner: Any = None
    engine = None
    collector.settle()
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return  # the worker is gone
        if request[0] == "rules":
            engine = Engine.for_prices(request[1], prices)
            continue
        _, now, full = request
        try:
            if engine is None:
                raise RuntimeError("no rules were sent before the evaluation")
            runner = runner or _runner(settings)
            answer: tuple[str, Any] = ("ok", runner.evaluate(engine, now, full))
        except Exception as exc:  # noqa: BLE001 - the worker reports it and retries
            answer = ("error", exc)
        try:
            _send(conn, answer)
        except (EOFError, OSError):
            return


def _runner(settings: Any) -> Any:
    from costline.connectors.alert_store import AlertStore
    from costline.connectors.redis_client import connect
    from costline.connectors.redis_state import RedisState
    from costline.streams.worker.evaluator import InlineRunner

    redis = connect(settings.redis_url)
    return InlineRunner(RedisState(redis, settings.namespace, settings.timezone),
                        AlertStore(redis, settings.namespace))


def _send(conn: Connection, answer: tuple[str, Any]) -> None:
    """An error crosses as itself when it can (a Redis error stays one, so the worker marks
    Redis failing), else as its traceback in words."""
    try:
        conn.send(answer)
    except (EOFError, OSError):
        raise
    except Exception:  # noqa: BLE001 - what cannot cross the pipe
        kind, value = answer
        text = "".join(traceback.format_exception(value)) if kind == "error" else repr(value)
        conn.send(("error", RuntimeError(f"the evaluation process could not send: {text}")))
