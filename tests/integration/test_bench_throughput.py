"""The throughput bench (``bench/throughput.py``) on small data sets: the ceiling and real
workers read both data sets, one and two workers split the partitions, Redis's total equals
the generator's in every run, the dedup memory and the memory per tag set are measured, and
nothing of its namespaces is left in Kafka or Redis. Its rates are printed, not asserted."""

from __future__ import annotations

import pytest

from bench import throughput
from bench.datasets import DATA_SETS
from costline.connectors.kafka import admin
from tests.conftest import Services
from tests.integration.bench_checks import figures_of, keys_left

pytestmark = pytest.mark.integration

EVENTS = 6000


def test_both_data_sets_are_counted_exactly_by_one_and_two_workers(
        services: Services, capsys: pytest.CaptureFixture[str]) -> None:
    code, report = figures_of(throughput.main, [
        "--events", str(EVENTS), "--tagsets", "600", "--partitions", "2", "--scale", "1,2",
        "--bootstrap", services.bootstrap, "--redis-url", services.redis_url], capsys)
    assert code == 0 and report["ok"] is True
    assert list(report["data_sets"]) == list(DATA_SETS)
    for name, found in report["data_sets"].items():
        [round_] = found["rounds"]
        assert round_["a"]["events"] == EVENTS and round_["a"]["rejected"] == 0
        assert set(round_["c"]) == {"1", "2"}
        for workers, run in round_["c"].items():
            assert run["total_ok"] and run["total_micro"] == found["summary"][
                "expected_cost_micro"], (name, workers)
            assert len(run["each"]) == int(workers)
            owned = [w["ledger_partitions"] for w in run["each"]]
            assert sorted(p for partitions in owned for p in partitions) == [0, 1], owned
            assert sum(w["events"] for w in run["each"]) == EVENTS
        assert round_["c_over_a"] == pytest.approx(
            round_["c"]["1"]["events_per_s"] / round_["a"]["events_per_s"])
        memory = found["memory"]
        assert memory["dedup_events"] == EVENTS and memory["by_kind"]["dedup"] > 0
        assert memory["tagsets"] == 600 <= memory["tagset_entries"]
    client = admin(services.bootstrap)
    try:
        topics = [t for t in client.list_topics() if t.startswith(report["run_id"])]
    finally:
        client.close()
    assert topics == []
    for name in DATA_SETS:
        assert keys_left(services.redis_url, f"{report['run_id']}{name[0]}") == []
