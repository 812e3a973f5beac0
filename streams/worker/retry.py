"""Waiting out an outage: what counts as Redis failing, and the backoff between attempts.

Neither Redis nor Kafka being away loses anything: a write is retried until it succeeds, never
dropped, and ``/healthz`` says what is failing meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.exceptions import BusyLoadingError, ConnectionError, RedisError, TimeoutError

from costline.streams.worker.health import Health
from costline.streams.worker.metrics import Metrics

log = logging.getLogger("costline.retry")
T = TypeVar("T")

# Redis unreachable, or still loading its data after a restart.
REDIS_DOWN = (ConnectionError, TimeoutError, BusyLoadingError, OSError)
# Any error from Redis, also one it answers with (READONLY on a replica after a failover, OOM
# at maxmemory, MISCONF when it cannot persist, CLUSTERDOWN while a shard is away).
REDIS_FAILING = (RedisError, OSError)


class Backoff:
    """Exponential backoff with a ceiling; one per wait for a success."""

    def __init__(self, first: float = 0.05, ceiling: float = 5.0) -> None:
        self.ceiling, self.delay = ceiling, first

    async def wait(self) -> None:
        await asyncio.sleep(self.delay)
        self.delay = min(self.delay * 2, self.ceiling)


async def until_redis_answers(call: Callable[[], Awaitable[T]], health: Health,
                              metrics: Metrics) -> T:
    """``call()``'s result, retried with backoff for as long as Redis fails it.

    An unreachable Redis is reported as ``redis`` (the probe's PING sees it too); one that
    answers but refuses (READONLY, OOM, ...) as ``redis_writes``, which only a write that
    succeeds clears."""
    backoff = Backoff()
    while True:
        try:
            result = await call()
        except REDIS_FAILING as exc:
            health.failing("redis" if isinstance(exc, REDIS_DOWN) else "redis_writes", exc)
            metrics.inc("redis_errors_total")
            log.warning("Redis failed, retrying: %s: %s", type(exc).__name__, exc)
            await backoff.wait()
            continue
        health.recovered("redis")
        health.recovered("redis_writes")
        return result
