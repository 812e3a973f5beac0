"""Where intake parses and prices a take of input messages: in the worker's process, or in a
pool of child processes beside it.

Parsing and pricing are most of a worker's CPU; in child processes they do not share the
worker's interpreter lock with Faust, the Kafka clients and the Redis writes, so a worker uses
more than one core. The pool is the standard library's ``ProcessPoolExecutor`` (spawned
processes, pickled calls, as the rules' evaluation process uses): what crosses is a take's
message bytes one way and its refusals and encoded ledger records the other.

A child that dies breaks the pool; it is started again and the take priced again (after three
tries in a row, in the worker's process). The children ignore SIGINT and SIGTERM (a signal to
the worker's process group is the worker's to handle: it shuts the pool down) and exit when
the worker dies.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.connection import wait
from pathlib import Path
from typing import Protocol

from costline.rules.ledger import Intake, Taken
from costline.rules.prices import PriceBook
from costline.streams.worker import collector
from costline.streams.worker.child_process import ignore_stop_signals, name_this_process

log = logging.getLogger("costline.pricing")

PROCESS_NAME = "costline-pricer"
_TRIES_IN_POOL = 3

# The child's own intake (tag-set cache included), made once by ``_start``.
_intake: Intake | None = None


class Pricing(Protocol):
    async def start(self) -> None:
        """Be ready to price before the first take comes."""

    def submit(self, values: Sequence[bytes]) -> asyncio.Future[Taken]:
        """Parse, price and route a take of messages (``Intake.take``)."""

    def close(self) -> None:
        """Stop pricing; takes not answered yet are not."""


class InlinePricing:
    """Prices in the worker's own process, before ``submit`` returns."""

    def __init__(self, intake: Intake) -> None:
        self.intake = intake

    async def start(self) -> None:
        pass

    def submit(self, values: Sequence[bytes]) -> asyncio.Future[Taken]:
        answer: asyncio.Future[Taken] = asyncio.get_running_loop().create_future()
        answer.set_result(self.intake.take(values))
        return answer

    def close(self) -> None:
        pass


class PoolPricing:
    """Prices in ``processes`` child processes; takes are answered as they are priced."""

    def __init__(self, prices: Path, partitions: int, processes: int,
                 fallback: Intake) -> None:
        self.prices, self.partitions, self.processes = prices, partitions, processes
        self.fallback = fallback
        self._pool: ProcessPoolExecutor | None = None
        self._closed = False

    async def start(self) -> None:
        """Start every process now: each imports costline and loads the price book, which
        would otherwise delay the first takes and compete with them. The pool spawns a
        process for each call while none is idle, and answers once one has started. A pool
        that breaks here is started again by the first take."""
        pool = self._running_pool()
        try:
            await asyncio.gather(*(asyncio.wrap_future(pool.submit(_ready))
                                   for _ in range(self.processes)))
        except BrokenProcessPool:
            log.error("a pricing process died while starting; the first take starts it again")

    def submit(self, values: Sequence[bytes]) -> asyncio.Future[Taken]:
        return asyncio.ensure_future(self._price(list(values)))

    async def _price(self, values: list[bytes]) -> Taken:
        for _ in range(_TRIES_IN_POOL):
            pool = self._running_pool()
            try:
                return await asyncio.wrap_future(pool.submit(_take, values))
            except BrokenProcessPool:
                if self._closed:
                    raise
                log.error("a pricing process died; starting the pool again")
                if self._pool is pool:
                    self._pool = None
                pool.shutdown(wait=False, cancel_futures=True)
        log.error("pricing a take failed %d times in the pool: pricing it here",
                  _TRIES_IN_POOL)
        return self.fallback.take(values)

    def _running_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            level = logging.getLogger("costline").getEffectiveLevel()
            self._pool = ProcessPoolExecutor(
                max_workers=self.processes, mp_context=multiprocessing.get_context("spawn"),
                initializer=_start, initargs=(str(self.prices), self.partitions, level))
        return self._pool

    def close(self) -> None:
        self._closed = True
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


def _start(prices: str, partitions: int, level: int) -> None:
    """A pricing process's first step: its own intake, its name, and its signals."""
    global _intake
    ignore_stop_signals()
    logging.basicConfig(level=level,
                        format="[%(asctime)s] [%(process)d] [%(levelname)s] %(name)s: %(message)s")
    name_this_process(PROCESS_NAME)
    _intake = Intake(PriceBook.load(prices), partitions)
    collector.settle()
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_exit_with, args=(parent.sentinel,), daemon=True,
                         name="parent-watch").start()


def _exit_with(sentinel: int) -> None:
    """Exit as soon as the worker does (its sentinel becomes ready when it ends)."""
    wait([sentinel])
    os._exit(0)


def _ready() -> None:
    """Nothing: answered once a process has started (``_start``)."""


def _take(values: list[bytes]) -> Taken:
    assert _intake is not None, "a pricing process starts with _start"
    return _intake.take(values)
