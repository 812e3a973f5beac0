"""The reduced chaos run (``bench/chaos.py``): 100,000 events and 5,000 malformed messages
through two workers while workers are killed, Redis and Kafka restart and rebalances are
forced. Totals, dead letters, Slack posts and reclamation must come out exact. It runs again,
shorter, on a Redis Cluster of the test's own, one master of which is killed each time
Redis would restart.

It restarts the Kafka and Redis of the ``costline stack`` that runs the services under test,
so it needs that stack's folder (``COSTLINE_STATE_DIR``). The figures are printed, not
asserted: on a shared machine they say how loaded it was, not whether the pipeline is right.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from bench import chaos
from tests.conftest import unavailable
from tests.integration.redis_stores import ClusterRedis

# Fewer events than the full run, as CI's 40 minutes are shared with every other test: the
# single-Redis run keeps every fault of the full one; the cluster run, shorter still, proves
# the same checks hold when one master of three dies.
RUNS = {
    "single": chaos.Config(events=100_000, malformed=5_000, kills=10),
    "cluster": chaos.Config(events=60_000, malformed=3_000, kills=4, redis_restarts=2,
                            kafka_restarts=1, rebalances=1),
}


@pytest.mark.parametrize("redis", list(RUNS))
def test_totals_dead_letters_alerts_and_releases_stay_exact_under_chaos(
        redis: str, stack_state_dir: Path, kafka_namespace: str, tmp_path: Path) -> None:
    store = ClusterRedis(tmp_path / "redis-cluster") if redis == "cluster" else None
    base = RUNS[redis]
    config = replace(base, state_dir=stack_state_dir,
                     redis_state_dir=store.state if store else None,
                     namespace=kafka_namespace, work_dir=tmp_path)
    try:
        report = chaos.run(config)
    except chaos.NoStack as exc:
        unavailable("a restartable costline stack", str(exc))
    finally:
        if store is not None:
            store.stop()
    print(report.render_text())
    (tmp_path / "report.json").write_text(report.to_json())
    failed = [f"{check.name}: {check.detail}" for check in report.checks if not check.ok]
    assert not failed, f"{failed}; logs and report.json in {tmp_path}"
    faults = report.fault_counts()
    assert faults["kill"] >= base.kills
    assert faults["redis"] == base.redis_restarts
