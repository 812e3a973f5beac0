"""Watches that Redis will not evict costline's keys (``costline.rules.eviction``).

A Redis that may evict is a setting, not a failure: the worker counts on. It is shown in
``/healthz`` under ``warnings`` as ``redis_eviction`` (the status stays ok, so a liveness probe
does not restart workers for it), in ``costline_redis_evicting_nodes`` (alert on it) and in one
error line each time what is found changes. The policy can change at run time (``CONFIG SET``),
so it is read again on every round.
"""

from __future__ import annotations

import asyncio
import logging

from redis.exceptions import ResponseError

from costline.connectors.redis_client import RedisClient
from costline.connectors.redis_memory import node_memory
from costline.rules.eviction import risks
from costline.streams.worker.health import Health

log = logging.getLogger("costline.redis")

WARNING = "redis_eviction"


class EvictionWatch:
    def __init__(self, redis: RedisClient, health: Health) -> None:
        self.redis, self.health = redis, health
        self._found: list[str] = []
        self._unreadable: str | None = None

    @property
    def evicting(self) -> int:
        """Servers found that may evict costline's keys (the gauge)."""
        return len(self._found)

    async def check(self) -> None:
        """One round; Redis being away is left to the callers' own reports."""
        try:
            nodes = await asyncio.to_thread(node_memory, self.redis)
        except ResponseError as exc:  # a user that may not run INFO: what was found stands
            if self._unreadable is None:
                log.warning("cannot tell whether Redis may evict costline's keys: %s", exc)
            self._unreadable = str(exc)
            return
        self._unreadable = None
        found = risks(nodes)
        if found != self._found:
            for line in found:
                log.error("%s (docs/OPERATIONS.md, Redis)", line)
            if self._found and not found:
                log.info("Redis no longer evicts costline's keys")
        self._found = found
        if found:
            self.health.warnings[WARNING] = "; ".join(found)
        else:
            self.health.warnings.pop(WARNING, None)
