"""How a bench's test runs it: its figures as JSON, and whether it left keys in Redis."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import redis

from bench import throughput


def figures_of(main: Callable[[list[str]], int], argv: list[str],
               capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    """The bench's exit code and the figures it printed with ``--json``."""
    code = main([*argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def keys_left(redis_url: str, namespace: str) -> list[bytes]:
    client = redis.Redis.from_url(redis_url)
    try:
        return throughput.redis_keys(client, namespace)
    finally:
        client.close()
