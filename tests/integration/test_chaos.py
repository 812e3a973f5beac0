"""The reduced chaos run (``bench/chaos.py``): 200,000 events and 10,000 malformed messages
through two workers while workers are killed, Redis and Kafka restart and rebalances are
forced. Totals, dead letters, Slack posts and reclamation must come out exact.

It restarts the Kafka and Redis of the ``costline stack`` that runs the services under test,
so it needs that stack's folder (``COSTLINE_STATE_DIR``). The figures are printed, not
asserted: on a shared machine they say how loaded it was, not whether the pipeline is right.
"""

from __future__ import annotations

from pathlib import Path

from bench import chaos
from tests.conftest import unavailable


def test_totals_dead_letters_alerts_and_releases_stay_exact_under_chaos(
        stack_state_dir: Path, kafka_namespace: str, tmp_path: Path) -> None:
    config = chaos.Config(events=200_000, malformed=10_000, kills=10, state_dir=stack_state_dir,
                          namespace=kafka_namespace, work_dir=tmp_path)
    try:
        report = chaos.run(config)
    except chaos.NoStack as exc:
        unavailable("a restartable costline stack", str(exc))
    print(report.render_text())
    (tmp_path / "report.json").write_text(report.to_json())
    failed = [f"{check.name}: {check.detail}" for check in report.checks if not check.ok]
    assert not failed, f"{failed}; logs and report.json in {tmp_path}"
    assert report.fault_counts()["kill"] >= 10
