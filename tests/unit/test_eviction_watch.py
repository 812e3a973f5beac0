"""What the worker says of a Redis's eviction policy as it changes: each change once, a server
that will not tell (``INFO`` refused) neither cleared nor blamed."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from redis.exceptions import NoPermissionError

from costline.streams.worker.eviction_watch import WARNING, EvictionWatch
from costline.streams.worker.health import Health


class Server:
    """What ``INFO`` answers, as redis-py gives it; ``refuse`` makes it refuse INFO."""

    def __init__(self) -> None:
        self.policy, self.maxmemory, self.refuse = "noeviction", 0, False
        self.connection_pool = SimpleNamespace(connection_kwargs={"host": "10.0.0.5",
                                                                  "port": 6379})

    def info(self, section: str) -> dict[str, Any]:
        if self.refuse:
            raise NoPermissionError("this user has no permissions to run the 'info' command")
        return {"memory": {"maxmemory": self.maxmemory, "maxmemory_policy": self.policy},
                "stats": {"evicted_keys": 0}}[section]


def test_each_change_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    server, health = Server(), Health()
    watch = EvictionWatch(server, health)  # type: ignore[arg-type]

    def rounds(n: int = 2) -> list[tuple[int, str]]:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="costline.redis"):
            for _ in range(n):
                asyncio.run(watch.check())
        return [(r.levelno, r.getMessage()) for r in caplog.records]

    assert rounds() == [] and not health.warnings
    server.policy, server.maxmemory = "allkeys-lru", 1 << 30
    [(level, line)] = rounds()
    assert level == logging.ERROR and line.startswith("Redis 10.0.0.5:6379 may evict")
    assert watch.evicting == 1 and health.ok and WARNING in health.report()["warnings"]

    server.refuse = True  # INFO refused: what was found stands, said once
    [(level, line)] = rounds()
    assert level == logging.WARNING and "cannot tell" in line
    assert watch.evicting == 1 and WARNING in health.warnings

    server.refuse = False
    assert rounds() == []  # the same finding as before the refusal: nothing new to say
    server.policy = "noeviction"
    assert rounds() == [(logging.INFO, "Redis no longer evicts costline's keys")]
    assert watch.evicting == 0 and "warnings" not in health.report()
