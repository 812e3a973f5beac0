"""``costline stack up --redis cluster``: three masters on loopback that come up idempotently,
keep their data across a stack brought back on other ports, leave nothing behind, and bring a
killed master back from its append-only file while costline's clients fail cleanly and then
carry on."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from redis.cluster import RedisCluster
from typer.testing import CliRunner

from costline.connectors import bucket_zone
from costline.connectors.reclaim_ledger import Pause, RedisReclaimLedger
from costline.connectors.redis_apply import BatchWriter
from costline.connectors.redis_client import FAILURES, connect, connect_async, connect_node
from costline.connectors.redis_keys import Calendar
from costline.connectors.redis_state import RedisState
from costline.streams import stack
from costline.streams.cli.root import _register, app
from costline.streams.stack.process import port_taken, read_record
from tests.conftest import unavailable
from tests.integration.conftest import StackUp
from tests.integration.redis_writer import ZONE, Writer
from tests.unit.rulefiles.builders import DAY, T0, usage

pytestmark = pytest.mark.integration

PARTITIONS = 6


@pytest.fixture(autouse=True)
def _redis_server() -> None:
    for binary in ("redis-server", "redis-cli"):
        if shutil.which(binary) is None:
            unavailable("a local Redis Cluster", f"{binary} is not installed")


def cluster_up(up: StackUp) -> str:
    info = up(kafka="none", redis="cluster")
    assert [(s.name, s.state) for s in info.services] == [("redis-cluster", "running")]
    return info.exports["COSTLINE_REDIS_URL"]


def node_ports(url: str) -> list[int]:
    with connect(url) as client:
        assert isinstance(client, RedisCluster)
        return sorted(node.port for node in client.get_primaries())


def test_the_cluster_comes_up_idempotently_keeps_its_data_and_goes_down(
        private_stack: tuple[Path, StackUp]) -> None:
    state, up = private_stack
    url = cluster_up(up)
    ports = node_ports(url)
    assert len(ports) == 3
    supervisor = read_record(state / "run" / "redis-cluster.pid")
    assert supervisor is not None
    with connect(url) as client:
        client.set("kept", "across down and up")

    assert cluster_up(up) == url  # already running: the same processes
    assert read_record(state / "run" / "redis-cluster.pid") == supervisor

    stack.down(state)
    assert not any(port_taken("127.0.0.1", port) for port in ports), "a node outlived down"
    again = cluster_up(up)  # free ports again: most likely others
    with connect(again) as client:
        assert client.get("kept") == b"across down and up"
    stack.down(state)
    assert stack.status(state).services == []


def _cli_spend(url: str, namespace: str) -> tuple[int, str, str, float]:
    _register()
    began = time.monotonic()
    done = CliRunner().invoke(app, ["--redis-url", url, "--namespace", namespace, "spend",
                                    "--by", "team", "--period", "day", "--at",
                                    "2026-11-30T12:00:00Z", "--json"])
    return done.exit_code, done.stdout, done.stderr, time.monotonic() - began


async def test_a_killed_master_comes_back_from_its_append_only_file_and_clients_recover(
        private_stack: tuple[Path, StackUp], namespace: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    state, up = private_stack
    url = cluster_up(up)
    with connect(url) as client:
        bucket_zone.claim(client, namespace, ZONE)
    writer = Writer(BatchWriter(connect_async(url), namespace, Calendar(ZONE), dedup_ttl=DAY),
                    namespace, partitions=PARTITIONS)
    await writer.write([usage(T0 + i, 1 + i, team=f"t{i % 2}") for i in range(2 * PARTITIONS)])
    # Long-lived clients, as the worker holds them.
    reader = RedisState(connect(url, timeout_s=2, connect_timeout_s=1), namespace, "UTC")
    ledger = RedisReclaimLedger(connect_async(url, timeout_s=2, connect_timeout_s=1), namespace)
    before = reader.totals("cost", {}, ("team",), T0 - DAY, T0 + DAY)
    code, out, _, _ = _cli_spend(url, namespace)
    assert code == 0
    spent = json.loads(out)["rows"]

    # A master serving a partition that holds sums, not the one the URL names if it can be.
    cluster = connect(url)
    assert isinstance(cluster, RedisCluster)
    masters = [cluster.get_node_from_key(slot) for slot in reader.slots()]
    victim = next((m for m in masters if m.port != urlsplit(url).port), masters[0])
    node = connect_node(f"redis://{victim.host}:{victim.port}/0")
    pid = int(node.info("server")["process_id"])
    node.close()

    # The supervisor is held so the master stays down while the clients are tried.
    supervisor = read_record(state / "run" / "redis-cluster.pid")
    assert supervisor is not None
    os.kill(supervisor.pid, signal.SIGSTOP)
    try:
        os.kill(pid, signal.SIGKILL)
        code, out, err, took = _cli_spend(url, namespace)
        assert code == 1 and out == "" and took < 30, (code, out, err, took)
        [line] = err.splitlines()
        assert line.startswith("costline spend: Redis at ") and "did not answer" in line
        with capsys.disabled():
            print(f"\n[costline] a master down: `costline spend` failed in {took:.2f}s: {line}")

        began = time.monotonic()
        with pytest.raises(FAILURES):
            reader.totals("cost", {}, ("team",), T0 - DAY, T0 + DAY)
        assert time.monotonic() - began < 30
    finally:
        os.kill(supervisor.pid, signal.SIGCONT)

    deadline = time.monotonic() + 60
    while {s.state for s in stack.status(state).services} != {"running"}:
        assert time.monotonic() < deadline, "the cluster did not recover"
        await asyncio.sleep(0.2)
    log = (state / "logs" / "redis-cluster.log").read_text()
    assert f"port {victim.port}: exited (-9)" in log and "append-only file" in log

    # The same clients carry on, with every sum the killed master held.
    assert reader.totals("cost", {}, ("team",), T0 - DAY, T0 + DAY) == before
    await ledger.pause(Pause(by="test", at=T0, reason="after the restart"))
    assert (await ledger.paused()) == Pause(by="test", at=T0, reason="after the restart")
    await writer.write([usage(T0 + 60 + i, 1, team="t0") for i in range(PARTITIONS)])
    after = reader.totals("cost", {}, ("team",), T0 - DAY, T0 + DAY)
    assert after[("t0",)] > before[("t0",)] and after[("t1",)] == before[("t1",)]
    code, out, _, _ = _cli_spend(url, namespace)
    assert code == 0 and json.loads(out)["rows"] != spent
