"""``costline scrape prometheus`` against the real Debian ``prometheus-node-exporter`` and a
recorded dcgm-exporter page served over HTTP, through real Kafka into the real worker."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from kafka import KafkaConsumer, TopicPartition
from redis import Redis

from costline.connectors.redis_state import RedisState
from costline.rules.prices import PriceBook, exact, to_micro
from costline.streams.settings import Settings
from costline.streams.topics import create_topics
from tests.conftest import unavailable
from tests.integration.streamkit import (
    REPO,
    Worker,
    end_offsets,
    free_port,
    rows_by_group,
    run_cli,
    spend_json,
    wait_caught_up,
    worker_env,
)

pytestmark = pytest.mark.integration

DATA = REPO / "tests" / "data"
PRICES = PriceBook.load(REPO / "rules" / "prices" / "example.yaml")


def wait_for_port(port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"nothing listens on 127.0.0.1:{port} after {timeout_s}s")


@pytest.fixture
def node_exporter(tmp_path: Path) -> Iterator[str]:
    """The Debian node exporter on a spare loopback port."""
    binary = shutil.which("prometheus-node-exporter")
    if binary is None:
        unavailable("prometheus-node-exporter", "not installed (apt-get install "
                    "prometheus-node-exporter)")
    port = free_port()
    log = (tmp_path / "node-exporter.log").open("wb")
    proc = subprocess.Popen([binary, f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_port(port)
        yield f"http://127.0.0.1:{port}/metrics"
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


@pytest.fixture
def dcgm_exporter() -> Iterator[str]:
    """The recorded dcgm-exporter page, served by aiohttp as the exporter serves it."""
    page = (DATA / "dcgm-exporter-node-017.prom").read_bytes()
    port = free_port()
    loop = asyncio.new_event_loop()

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=page, headers={
            "Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)

    def serve() -> None:
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    wait_for_port(port)
    yield f"http://127.0.0.1:{port}/metrics"
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


@pytest.fixture
def worker(services: Any, kafka_namespace: str, tmp_path: Path) -> Iterator[Worker]:
    env = worker_env(kafka_namespace, services.bootstrap, services.redis_url)
    create_topics(Settings(kafka_bootstrap=services.bootstrap, namespace=kafka_namespace,
                           partitions=4))
    proc = Worker(env, tmp_path / "worker.log")
    proc.start()
    yield proc
    proc.stop()


def scrape_once(worker: Worker, url: str, mapping: str, *args: str) -> dict[str, Any]:
    done = run_cli(worker.env, "scrape", "prometheus", url, "--map", str(DATA / mapping),
                   "--once", "--json", *args)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def read_to_end(bootstrap: str, topic: str, ends: dict[int, int]) -> list[Any]:
    """Every message of ``topic`` up to ``ends``, without waiting for a quiet spell."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        parts = [TopicPartition(topic, p) for p in ends]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        records: list[Any] = []
        deadline = time.monotonic() + 30
        while any(consumer.position(tp) < ends[tp.partition] for tp in parts):
            assert time.monotonic() < deadline, "the topic did not reach its end offsets"
            for batch in consumer.poll(timeout_ms=200).values():
                records.extend(batch)
        return records
    finally:
        consumer.close()


def sent_events(worker: Worker, services: Any) -> list[dict[str, Any]]:
    """Every event on the usage topic, once the worker has counted them all."""
    namespace = worker.env["COSTLINE_NAMESPACE"]
    topic = f"{namespace}.usage.v1"
    ends = end_offsets(services.bootstrap, topic)
    redis = Redis.from_url(services.redis_url)
    try:
        wait_caught_up(worker.env, worker)
    finally:
        redis.close()
    return [event for record in read_to_end(services.bootstrap, topic, ends)
            for event in json.loads(record.value)]


def samples(worker: Worker, services: Any, metric: str) -> dict[str, Any]:
    state = RedisState(Redis.from_url(services.redis_url), worker.env["COSTLINE_NAMESPACE"],
                       "UTC")
    return {s.resource_id: s for s in state.samples(metric, {}, time.time() - 3600)}


def test_node_exporter_load_and_disk_reach_the_worker(
    services: Any, worker: Worker, node_exporter: str,
) -> None:
    """A gauge becomes a utilization sample; the root filesystem's size, held for the
    interval, becomes storage spend priced by the book."""
    round_ = scrape_once(worker, node_exporter, "node-exporter.yaml", "--interval", "60")
    assert round_["error"] is None
    assert round_["events"] == {"utilization": 1, "usage": 1}
    assert round_["sent_events"] == 2 and round_["skipped"]["counter_baseline"] >= 2

    events = sent_events(worker, services)
    instance = node_exporter.split("/")[2]
    load = next(e for e in events if e["kind"] == "utilization")
    disk = next(e for e in events if e["kind"] == "usage")
    assert (load["resource_id"], load["metric"]) == (instance, "load1")
    assert (disk["resource_id"], disk["resource_type"], disk["unit"]) == (
        f"{instance}/", "storage.ssd", "gb_hour")
    assert disk["tags"]["node"] == instance

    stored = samples(worker, services, "load1")[instance]
    assert stored.points[-1][1] == load["value"]
    expected = to_micro(exact(disk["quantity"]) * PRICES.prices["storage.ssd"].price)
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(disk["ts"]))
    spend = spend_json(worker.env, "--by", "resource_type", "--period", "day", "--at", at)
    assert rows_by_group(spend, ["resource_type"], "cost") == {("storage.ssd",): expected}


def test_a_running_scraper_turns_counters_into_usage_and_stops_on_sigterm(
    services: Any, worker: Worker, node_exporter: str,
) -> None:
    command = [sys.executable, "-m", "costline.streams", "scrape", "prometheus", node_exporter,
               "--map", str(DATA / "node-exporter.yaml"), "--interval", "1", "--json"]
    proc = subprocess.Popen(command, cwd=REPO, env=worker.env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    rounds = []
    try:
        assert proc.stdout is not None
        while len(rounds) < 3:
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else "scraper ended"
            rounds.append(json.loads(line))
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    assert all(r["error"] is None and r["failed_messages"] == 0 for r in rounds)
    assert rounds[0]["events"]["usage"] == 1  # counters only set their baseline
    assert all(r["events"]["usage"] > 1 for r in rounds[1:])

    events = sent_events(worker, services)
    cpu = [e for e in events if e["kind"] == "usage" and e["resource_type"] == "cpu.general"]
    assert cpu and all(e["unit"] == "vcpu_hour" and e["quantity"] >= 0 for e in cpu)
    assert len({e["event_id"] for e in events}) == len(events)
    assert sum(r["sent_events"] for r in rounds) <= len(events)


def test_the_recorded_dcgm_page_gives_the_worker_each_gpus_utilization(
    services: Any, worker: Worker, dcgm_exporter: str,
) -> None:
    round_ = scrape_once(worker, dcgm_exporter, "dcgm-exporter.yaml")
    assert (round_["events"], round_["sent_events"]) == ({"utilization": 24}, 24)
    sent_events(worker, services)

    util = samples(worker, services, "gpu_util")
    assert sorted(util) == [f"node-017/gpu{g}" for g in range(8)]
    assert util["node-017/gpu0"].points[-1][1] == pytest.approx(0.02)
    assert util["node-017/gpu7"].points[-1][1] == 0.0
    assert util["node-017/gpu0"].tags["slurm_job_id"] == "4242"
    assert "slurm_job_id" not in util["node-017/gpu7"].tags
    assert util["node-017/gpu0"].resource_type == "gpu.h100"
