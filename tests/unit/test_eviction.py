"""Which Redis memory settings may lose counts: a table of servers, one setting each."""

from __future__ import annotations

import pytest

from costline.rules.eviction import NodeMemory, risks

GIB = 1 << 30


@pytest.mark.parametrize(("policy", "maxmemory", "evicted", "risky"), [
    ("noeviction", GIB, 0, False),       # at the limit writes are refused and retried
    ("noeviction", 0, 0, False),
    ("allkeys-lru", 0, 0, False),        # no limit: nothing is ever evicted
    ("allkeys-lru", GIB, 0, True),
    ("allkeys-lfu", GIB, 0, True),
    ("allkeys-random", GIB, 0, True),
    ("volatile-lru", GIB, 0, True),      # costline's sums and dedup sets have a time to live
    ("volatile-ttl", GIB, 0, True),
    ("volatile-lfu", GIB, 12, True),
    ("volatile-random", GIB, 0, True),
])
def test_only_noeviction_or_no_limit_keeps_every_count(
        policy: str, maxmemory: int, evicted: int, risky: bool) -> None:
    found = risks([NodeMemory("127.0.0.1:6379", policy, maxmemory, evicted)])
    assert bool(found) is risky
    if risky:
        [line] = found
        assert f"maxmemory-policy {policy}" in line and "127.0.0.1:6379" in line
        assert "set maxmemory-policy noeviction" in line
        assert ("12 keys evicted" in line) is (evicted == 12)


def test_each_master_of_a_cluster_is_judged_on_its_own() -> None:
    nodes = [NodeMemory("a:7000", "noeviction", GIB, 0), NodeMemory("b:7001", "allkeys-lru",
                                                                    GIB, 3)]
    [line] = risks(nodes)
    assert line.startswith("Redis b:7001 ") and "3 keys evicted" in line
