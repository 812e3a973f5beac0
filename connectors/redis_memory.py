"""What each Redis server costline writes to says of its memory limit (``INFO``), for
``costline.rules.eviction`` to judge: every master of a Redis Cluster, or the one server."""

from __future__ import annotations

from typing import Any

from redis.cluster import ClusterNode, RedisCluster

from costline.connectors.redis_client import RedisClient
from costline.rules.eviction import NodeMemory


def _node(name: str, memory: dict[str, Any], stats: dict[str, Any]) -> NodeMemory:
    return NodeMemory(node=name, policy=str(memory.get("maxmemory_policy", "unknown")),
                      maxmemory=int(memory.get("maxmemory", 0)),
                      evicted_keys=int(stats.get("evicted_keys", 0)))


def node_memory(client: RedisClient) -> list[NodeMemory]:
    """``maxmemory``, ``maxmemory-policy`` and ``evicted_keys`` of every server that holds
    costline's keys."""
    if isinstance(client, RedisCluster):
        masters: list[ClusterNode] = client.get_primaries()  # type: ignore[no-untyped-call]
        return [_node(node.name, client.info("memory", target_nodes=node),
                      client.info("stats", target_nodes=node))
                for node in sorted(masters, key=lambda node: node.name)]
    options = client.connection_pool.connection_kwargs
    name = str(options.get("path") or f"{options.get('host')}:{options.get('port')}")
    return [_node(name, client.info("memory"), client.info("stats"))]
