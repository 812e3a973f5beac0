"""Helpers for tests that run the real worker against real Kafka and Redis."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from redis import Redis
from redis.exceptions import RedisError

from costline.connectors.redis_client import connect, connect_node
from costline.rules.prices import PriceBook, exact, to_micro

REPO = Path(__file__).resolve().parents[2]
PRICES = PriceBook.load(REPO / "rules" / "prices" / "example.yaml")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


WORKER = [sys.executable, "-m", "costline.streams", "worker", "--loglevel", "warning"]


@dataclass
class Worker:
    """``costline worker`` (or ``command``) as a child process with its own namespace and
    port, in a process group of its own."""

    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    command: list[str] = field(default_factory=lambda: list(WORKER))

    def start(self) -> None:
        self.starts += 1
        with self.log.open("ab") as handle:
            self.proc = subprocess.Popen(self.command, cwd=REPO, env=self.env, stdout=handle,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def kill9(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is None:  # once reaped, its pid may be another process group's
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def worker_env(namespace: str, bootstrap: str, redis_url: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        COSTLINE_NAMESPACE=namespace,
        COSTLINE_KAFKA_BOOTSTRAP=bootstrap,
        COSTLINE_REDIS_URL=redis_url,
        COSTLINE_WEB_PORT=str(free_port()),
        COSTLINE_PARTITIONS="4",
        # A killed worker stays in its group until its session times out: keep that short.
        COSTLINE_KAFKA_SESSION_TIMEOUT_S="6",
        COSTLINE_KAFKA_REBALANCE_TIMEOUT_S="10",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def run_cli(env: Mapping[str, str], *args: str, timeout: float = 120
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "costline.streams", *args], cwd=REPO,
                          env=dict(env), capture_output=True, text=True, timeout=timeout)


def cli_json(env: Mapping[str, str], *args: str) -> Any:
    """Run a costline command with ``--json`` and return what it printed."""
    done = run_cli(env, *args, "--json")
    assert done.returncode == 0, f"costline {' '.join(args)}: {done.stderr}"
    return json.loads(done.stdout)


def spend_json(env: Mapping[str, str], *args: str) -> dict[str, Any]:
    return cli_json(env, "spend", *args)  # type: ignore[no-any-return]


@dataclass
class Ledger:
    """The independent expectation: what the totals must be, computed without costline's fold."""

    seen: set[str] = field(default_factory=set)
    events: list[dict[str, Any]] = field(default_factory=list)

    def count(self, event: dict[str, Any]) -> None:
        if event["event_id"] not in self.seen:
            self.seen.add(event["event_id"])
            self.events.append(event)

    def total(self, measure: str, by: Sequence[str], where: Mapping[str, str],
              start: float, end: float) -> dict[tuple[str, ...], int]:
        out: dict[tuple[str, ...], int] = {}
        for event in self.events:
            micro, dims = _expected(event, measure)
            if micro is None or not (start <= _ts(event) < end):
                continue
            if any(dims.get(k, "") != v for k, v in where.items()):
                continue
            group = tuple(dims.get(k, "") for k in by)
            out[group] = out.get(group, 0) + micro
        return out


def _ts(event: Mapping[str, Any]) -> float:
    ts = event["ts"]
    if isinstance(ts, str):
        from datetime import datetime

        return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    return float(ts)


def _expected(event: Mapping[str, Any], measure: str) -> tuple[int | None, dict[str, str]]:
    price = PRICES.prices[event["resource_type"]]
    dims = {**event.get("tags", {}), "resource_type": event["resource_type"],
            "category": price.category.value, "billing": price.billing.value}
    if event["kind"] == "usage" and measure == "cost":
        if "category" in event:
            dims["category"] = event["category"]
        amount = exact(event["cost"]) if "cost" in event else exact(event["quantity"]) * price.price
        return to_micro(amount), dims
    if event["kind"] == "fault" and measure == "waste":
        seconds = exact(event["lost_seconds"]) + exact(event["recovery_seconds"])
        return to_micro(Decimal(event["units"]) * seconds / Decimal(3600) * price.price), dims
    return None, dims


def micro_of(text: str) -> int:
    return to_micro(Decimal(text))


def rows_by_group(report: Mapping[str, Any], by: Sequence[str], measure: str
                  ) -> dict[tuple[str, ...], int]:
    out = {}
    for row in report["rows"]:
        value = micro_of(row[measure])
        if value:
            out[tuple(row["group"].get(k, "") for k in by)] = value
    return out


def produce(bootstrap: str, topic: str, messages: Iterable[tuple[bytes, bytes]]) -> int:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=10,
                             enable_idempotence=True)
    sent = 0
    for key, value in messages:
        producer.send(topic, value, key=key)
        sent += 1
    producer.flush(60)
    producer.close()
    return sent


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        parts = consumer.partitions_for_topic(topic) or set()
        ends = consumer.end_offsets([TopicPartition(topic, p) for p in parts])
        return {tp.partition: offset for tp, offset in ends.items()}
    finally:
        consumer.close()


def settings_of(env: Mapping[str, str]) -> Any:
    """The worker's settings as ``env`` gives them (a test's own environment left alone)."""
    from unittest import mock

    from costline.streams.settings import Settings

    with mock.patch.dict(os.environ, env, clear=True):
        return Settings()


def wait_caught_up(env: Mapping[str, str], worker: Worker | None = None,
                   timeout: float = 180) -> None:
    """Until everything produced to the namespace's input topics is counted in Redis:
    intake committed every input message, and Redis's watermarks reached the ledger's ends."""
    from costline.streams.progress import behind

    settings = settings_of(env)
    redis = connect(settings.redis_url)
    deadline = time.time() + timeout
    try:
        while time.time() < deadline:
            left = behind(settings, redis)
            if left.counted:
                return
            if worker is not None and not worker.alive():
                raise AssertionError(f"worker died; see {worker.log}")
            time.sleep(0.25)
    finally:
        redis.close()
    raise AssertionError(f"not counted after {timeout}s: {left}")


def ledger_applied(redis: Redis, namespace: str, partitions: int) -> int:
    """Ledger records applied to Redis so far, over every home partition."""
    return sum(int(redis.get(f"{{{namespace}:ledger:{p}}}:wm") or -1) + 1
               for p in range(partitions))


def read_all(bootstrap: str, topic: str, timeout_s: float = 10) -> list[Any]:
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                             enable_auto_commit=False, consumer_timeout_ms=int(timeout_s * 1000))
    try:
        return list(consumer)
    finally:
        consumer.close()


def usage_event(rng: random.Random, event_id: str, ts: float) -> dict[str, Any]:
    kind = rng.choice(["gpu", "gpu", "gpu", "ssd", "egress", "logs"])
    shape = {
        "gpu": ("gpu.h100", "gpu_hour", round(rng.uniform(0.1, 8.0), 3)),
        "ssd": ("storage.ssd", "gb_hour", round(rng.uniform(10, 5000), 2)),
        "egress": ("network.egress", "gb", round(rng.uniform(0.01, 50), 4)),
        "logs": ("logs.ingest", "gb", round(rng.uniform(0.001, 3), 5)),
    }[kind]
    return {
        "event_id": event_id, "kind": "usage", "ts": ts, "resource_id": f"node-{rng.randrange(64)}",
        "resource_type": shape[0], "unit": shape[1], "quantity": shape[2],
        "tags": {"team": rng.choice(["pretrain", "posttrain", "eval", "infra"]),
                 "env": rng.choice(["prod", "dev"]), "job": f"run-{rng.randrange(40)}"},
    }


def redis_answers(url: str, seconds: float) -> bool:
    """Whether the Redis at ``url`` answers PING within ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if Redis.from_url(url, socket_timeout=1).ping():
                return True
        except Exception:  # noqa: BLE001 - not up yet
            time.sleep(0.05)
    return False


def kill_master(node_url: str, within_s: float = 60) -> None:
    """SIGKILL the Redis at ``node_url``, a master of a ``costline stack`` Redis Cluster, and
    wait until the stack's supervisor has started it again and it has loaded its append-only
    file (a new process id, no longer loading)."""
    with connect_node(node_url, timeout_s=5) as master:
        killed = int(master.info("server")["process_id"])
    os.kill(killed, signal.SIGKILL)
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            with connect_node(node_url, timeout_s=1, connect_timeout_s=1) as master:
                info = master.info()  # INFO answers while the file loads; PING does not
                if int(info["process_id"]) != killed and info.get("loading") == 0:
                    return
        except (RedisError, OSError):
            pass  # not started again yet
        time.sleep(0.05)
    raise TimeoutError(f"the Redis Cluster master at {node_url} did not come back in "
                       f"{within_s:.0f} s")


@contextmanager
def configured_or_private_redis(workdir: Path) -> Iterator[str]:
    """``COSTLINE_REDIS_URL`` when set, else a private redis-server on a spare port."""
    from tests.conftest import unavailable

    configured = os.environ.get("COSTLINE_REDIS_URL")
    if configured:
        if not redis_answers(configured, 3):
            unavailable("Redis", f"COSTLINE_REDIS_URL={configured} does not answer")
        yield configured
        return
    binary = shutil.which("redis-server")
    if binary is None:
        unavailable("Redis", "COSTLINE_REDIS_URL unset and redis-server not installed")
    port = free_port()
    process = subprocess.Popen(
        [str(binary), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(workdir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        if not redis_answers(url, 10):
            unavailable("Redis", "a private redis-server did not start")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)
