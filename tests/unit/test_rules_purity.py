"""``rules/`` is the pure core: it imports neither the outer layers nor any network client."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

RULES = Path(__file__).parents[2] / "rules"
FORBIDDEN = (
    "connectors",
    "streams",
    "socket",
    "redis",
    "faust",
    "kafka",
    "aiokafka",
    "slack_sdk",
    "aiohttp",
    "requests",
    "httpx",
)


def imported(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def top(module: str) -> str:
    """The package a module belongs to: ``costline.connectors.kafka`` → ``connectors``."""
    parts = module.split(".")
    return parts[1] if parts[0] == "costline" and len(parts) > 1 else parts[0]


def test_a_module_of_an_outer_layer_is_named_by_its_layer() -> None:
    assert top("costline.connectors.kafka") == "connectors"
    assert top("costline.rules") == "rules"
    assert top("redis.asyncio") == "redis"


@pytest.mark.parametrize("path", sorted(RULES.rglob("*.py")), ids=lambda p: p.name)
def test_rules_modules_import_only_inward(path: Path) -> None:
    outward = {name for name in imported(path) if top(name) in FORBIDDEN}
    assert not outward, f"{path.relative_to(RULES.parent)} imports {sorted(outward)}"
