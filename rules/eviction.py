"""Whether a Redis may evict costline's keys: only ``noeviction`` keeps every count.

Redis at ``maxmemory`` makes room by its ``maxmemory-policy``. Every policy but ``noeviction``
removes keys: the ``allkeys-*`` ones any key, the ``volatile-*`` ones keys with a time to live,
which costline's bucket sums and dedup memory all have. A removed sum is spend lost; a
removed dedup set lets an event sent again be counted twice. Under ``noeviction`` a write at
``maxmemory`` is refused (``OOM``) and the worker retries it until there is room, so nothing is
lost; with ``maxmemory 0`` (no limit) nothing is evicted, whatever the policy.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

SAFE_POLICY = "noeviction"


@dataclass(frozen=True)
class NodeMemory:
    """What one Redis server's ``INFO`` says of its memory limit (a cluster has one a master)."""

    node: str
    policy: str
    maxmemory: int
    evicted_keys: int


def risks(nodes: Iterable[NodeMemory]) -> list[str]:
    """One line for each server that may evict costline's keys, naming what to change."""
    found = []
    for node in nodes:
        if node.policy == SAFE_POLICY or node.maxmemory == 0:
            continue
        evicted = f"; {node.evicted_keys:,} keys evicted since it started" \
            if node.evicted_keys else ""
        found.append(
            f"Redis {node.node} may evict costline's keys (maxmemory-policy {node.policy} at "
            f"maxmemory {node.maxmemory:,} bytes{evicted}): an evicted sum is spend lost, an "
            f"evicted dedup set counts an event sent again twice; set maxmemory-policy "
            f"{SAFE_POLICY}"
        )
    return found
