"""Watches that Redis will not evict costline's keys (``costline.rules.eviction``).

A Redis that may evict is shown in ``/healthz`` as ``redis_eviction`` (degraded: the counts
are exact only while nothing is evicted), in ``costline_redis_evicting_nodes`` and in one
error line each time what it says changes. The policy can change at run time (``CONFIG SET``),
so it is read again on every round.
"""

from __future__ import annotations

import asyncio
import logging

from redis.exceptions import NoPermissionError, ResponseError

from costline.connectors.redis_client import RedisClient
from costline.connectors.redis_memory import node_memory
from costline.rules.eviction import risks
from costline.streams.worker.health import Health

log = logging.getLogger("costline.redis")

PROBLEM = "redis_eviction"


class EvictionWatch:
    def __init__(self, redis: RedisClient, health: Health) -> None:
        self.redis, self.health = redis, health
        self.evicting = 0
        self._said: list[str] | None = None

    async def check(self) -> None:
        """One round; Redis being away is left to the callers' own reports."""
        try:
            nodes = await asyncio.to_thread(node_memory, self.redis)
        except (NoPermissionError, ResponseError) as exc:  # a user that may not run INFO
            self._say([], f"cannot tell whether Redis may evict costline's keys: {exc}")
            return
        found = risks(nodes)
        self.evicting = len(found)
        if found:
            self.health.failing(PROBLEM, "; ".join(found))
        else:
            self.health.recovered(PROBLEM)
        self._say(found)

    def _say(self, found: list[str], unknown: str | None = None) -> None:
        said = found or ([unknown] if unknown else [])
        if said == self._said:
            return
        if found:
            for line in found:
                log.error("%s (docs/OPERATIONS.md, Redis)", line)
        elif unknown:
            log.warning("%s", unknown)
        elif self._said:
            log.info("Redis no longer evicts costline's keys")
        self._said = said
