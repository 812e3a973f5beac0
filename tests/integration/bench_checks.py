"""How a bench's test runs it: its figures as JSON, and whether it left keys in Redis."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from bench.common import namespace_keys, redis_client


def figures_of(main: Callable[[list[str]], int], argv: list[str],
               capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    """The bench's exit code and the figures it printed with ``--json``."""
    code = main([*argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def keys_left(redis_url: str, namespace: str) -> list[bytes]:
    client = redis_client(redis_url)
    try:
        return namespace_keys(client, namespace)
    finally:
        client.close()
