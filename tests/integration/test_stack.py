"""``costline stack``: both flavors come up on spare ports, answer, survive restarts of one
service, refuse foreign ports quickly, and leave no process behind."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from costline.connectors.kafka import TopicSpec, admin, broker_info, ensure_topics
from costline.streams import stack
from costline.streams.stack.process import is_running
from costline.streams.stack.services import SERVICES, Service, register
from tests.conftest import unavailable
from tests.integration.conftest import StackUp, pids_of

pytestmark = pytest.mark.integration

COSTLINE = str(Path(sys.executable).with_name("costline"))


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([COSTLINE, *args], capture_output=True, text=True, timeout=timeout)


def report_time(capsys: pytest.CaptureFixture[str], what: str, seconds: float) -> None:
    """Put a figure in the CI log (pytest captures output unless told not to)."""
    with capsys.disabled():
        print(f"\n[costline] {what}: {seconds:.1f}s")


def test_embedded_stack_cli_comes_up_idempotently_and_goes_down(tmp_path: Path) -> None:
    """up twice reuses the same processes, status reports them, down leaves none running."""
    state = str(tmp_path / "state")
    ports = ["--kafka-port", "0", "--redis-port", "0", "--state-dir", state]
    first = cli("stack", "up", *ports, "--json")
    assert first.returncode == 0, first.stderr
    info = json.loads(first.stdout)
    exports = info["exports"]
    assert exports["COSTLINE_KAFKA_SESSION_TIMEOUT_S"] == "6"
    assert exports["COSTLINE_KAFKA_REBALANCE_TIMEOUT_S"] == "3"
    assert exports["COSTLINE_STATE_DIR"] == state
    records = pids_of(Path(state))
    try:
        assert {s["name"] for s in info["services"]} == {"tansu", "valkey"}
        assert all(is_running(record) for record in records) and len(records) == 2

        again = cli("stack", "up", *ports)
        assert again.returncode == 0, again.stderr
        assert "already running" in again.stderr
        assert f"export COSTLINE_KAFKA_BOOTSTRAP={exports['COSTLINE_KAFKA_BOOTSTRAP']}" in (
            again.stdout)
        assert sorted(r.pid for r in pids_of(Path(state))) == sorted(r.pid for r in records)

        status = cli("stack", "status", "--state-dir", state, "--json")
        assert status.returncode == 0, status.stderr
        states = {s["name"]: s["state"] for s in json.loads(status.stdout)["services"]}
        assert states == {"tansu": "running", "valkey": "running"}

        switch = cli("stack", "up", "--kafka", "apache", *ports)
        assert switch.returncode == 1
        assert "already runs here as tansu" in switch.stderr
    finally:
        down = cli("stack", "down", "--state-dir", state, "--json")
    assert down.returncode == 0, down.stderr
    assert not any(is_running(record) for record in records)
    assert not list((Path(state) / "run").glob("*.pid"))
    assert cli("stack", "status", "--state-dir", state).returncode == 0


def test_embedded_broker_serves_a_consumer_group_quickly(
    private_stack: tuple[Path, StackUp],
) -> None:
    """With the exported group timeouts, an aiokafka group gets its messages in seconds."""
    from aiokafka import AIOKafkaConsumer

    _, up = private_stack
    exports = up(kafka="embedded", redis="embedded").exports
    bootstrap = exports["COSTLINE_KAFKA_BOOTSTRAP"]
    client = admin(bootstrap)
    ensure_topics(client, [TopicSpec("group-check", 3)])
    client.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    for i in range(20):
        producer.send("group-check", key=f"k{i}".encode(), value=f"v{i}".encode())
    producer.flush()
    producer.close()

    async def consume() -> float:
        began = time.monotonic()
        consumer = AIOKafkaConsumer(
            "group-check", bootstrap_servers=bootstrap, group_id="group-check",
            auto_offset_reset="earliest",
            session_timeout_ms=int(float(exports["COSTLINE_KAFKA_SESSION_TIMEOUT_S"]) * 1000),
            rebalance_timeout_ms=int(float(exports["COSTLINE_KAFKA_REBALANCE_TIMEOUT_S"]) * 1000),
            heartbeat_interval_ms=1000,
        )
        await consumer.start()
        seen: set[bytes] = set()
        try:
            while len(seen) < 20 and time.monotonic() - began < 30:
                batches = await consumer.getmany(timeout_ms=500)
                seen.update(m.value for msgs in batches.values() for m in msgs)
        finally:
            await consumer.stop()
        assert len(seen) == 20
        return time.monotonic() - began

    assert asyncio.run(consume()) < 10.0


def _consume_one(bootstrap: str, topic: str) -> list[bytes]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, consumer_timeout_ms=3000)
    partition = TopicPartition(topic, 0)
    consumer.assign([partition])
    consumer.seek_to_beginning(partition)
    values = [message.value for message in consumer]
    consumer.close()
    return values


def test_apache_stack_keeps_data_across_restarts(
    private_stack: tuple[Path, StackUp], kafka_libs: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """Real Apache Kafka and redis-server: a restart of either keeps what was written."""
    if shutil.which("redis-server") is None:
        unavailable("redis-server", "not installed")
    state, up = private_stack
    began = time.monotonic()
    info = up(kafka="apache", redis="system", kafka_libs=kafka_libs)
    report_time(capsys, "stack up --kafka apache --redis system", time.monotonic() - began)
    bootstrap = info.exports["COSTLINE_KAFKA_BOOTSTRAP"]
    url = info.exports["COSTLINE_REDIS_URL"]
    assert broker_info(bootstrap).implementation.startswith("Apache Kafka")

    client = admin(bootstrap)
    ensure_topics(client, [TopicSpec("kept", 1)])
    client.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    producer.send("kept", b"before restart").get(timeout=30)
    producer.close()
    store = redis.Redis.from_url(url)
    store.set("kept", "before restart")

    stack.restart(state, "redis")
    assert store.get("kept") == b"before restart"
    began = time.monotonic()
    stack.restart(state, "kafka")
    report_time(capsys, "restart of apache-kafka", time.monotonic() - began)
    assert _consume_one(bootstrap, "kept") == [b"before restart"]
    assert {s.state for s in stack.status(state).services} == {"running"}


def test_a_foreign_listener_on_the_port_is_a_clear_error(tmp_path: Path) -> None:
    """A port held by something the stack did not start fails fast and names the port."""
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        began = time.monotonic()
        with pytest.raises(stack.StackError, match=f"port {port} .*already in use"):
            stack.up(tmp_path / "state", kafka="embedded", redis="embedded",
                     kafka_port=0, redis_port=port)
        result = cli("stack", "up", "--kafka-port", str(port), "--redis-port", "0",
                     "--state-dir", str(tmp_path / "state"))
    assert time.monotonic() - began < 10
    assert result.returncode == 1
    assert f"port {port}" in result.stderr
    assert not pids_of(tmp_path / "state"), "nothing may be left running after a failed up"


def test_the_broker_under_test_reports_its_version(
    kafka_bootstrap: str, capsys: pytest.CaptureFixture[str],
) -> None:
    """The CI log shows which broker the suite ran against (Apache Kafka in CI)."""
    info = broker_info(kafka_bootstrap)
    with capsys.disabled():
        print(f"\n[costline] broker under test: {info.describe()}")
    assert info.api_keys > 0 and info.version
    if os.environ.get("COSTLINE_EXPECT_APACHE_KAFKA") == "1":
        assert info.implementation.startswith("Apache Kafka"), info.describe()


# Exits at once on its first start (as a service whose port was taken meanwhile does), then
# listens on its port.
ONCE_DEAD = """\
import pathlib, socket, sys, time
marker, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
if not pathlib.Path(marker).exists():
    pathlib.Path(marker).touch()
    sys.exit(3)
with socket.create_server((host, port)) as server:
    while True:
        server.accept()[0].close()
"""


class OnceDead(Service):
    name = "once-dead"
    role = "redis"
    flavor = "once-dead"
    default_port = 0
    start_timeout_s = 10.0

    def argv(self) -> list[str]:
        marker = self.layout.root / "once-dead.started"
        return [sys.executable, "-c", ONCE_DEAD, str(marker), self.host, str(self.port)]

    def answers(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=1):
                return True
        except OSError:
            return False

    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def exports(self) -> dict[str, str]:
        return {}


@pytest.fixture
def once_dead() -> Iterator[None]:
    register(OnceDead)
    yield
    del SERVICES[OnceDead.name]


def test_a_service_that_dies_while_starting_is_started_once_more_on_a_fresh_port(
        once_dead: None, private_stack: tuple[Path, StackUp]) -> None:
    state, up = private_stack
    said: list[str] = []
    info = up(kafka="none", redis="once-dead", report=said.append)
    [service] = info.services
    assert service.state == "running"
    first, second = [line for line in said if line.startswith("once-dead: starting on ")]
    assert first != second  # a port picked as free is picked again
    assert any("once-dead exited while starting" in line and "once more" in line for line in said)
