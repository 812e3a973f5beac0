"""The aggregation against the real Kafka and Redis: exact totals, dead letters, crashes."""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from redis import Redis

from bench.common import child_processes
from costline.connectors.redis_client import connect
from costline.streams.settings import Settings
from costline.streams.topics import create_topics
from tests.conftest import unavailable
from tests.integration.conftest import StackUp, pids_of
from tests.integration.streamkit import (
    Ledger,
    Worker,
    end_offsets,
    free_port,
    produce,
    read_all,
    rows_by_group,
    settings_of,
    spend_json,
    usage_event,
    wait_caught_up,
    worker_env,
)

pytestmark = pytest.mark.integration

DAY = 1795824000  # 2026-11-28T00:00:00Z, in the past whenever the tests run
AT = "2026-11-28T12:00:00Z"


@pytest.fixture
def namespace(kafka_namespace: str) -> str:
    """A namespace of the test's own whose topics are deleted afterwards."""
    return kafka_namespace


@pytest.fixture
def folding() -> str:
    """Where the worker folds (COSTLINE_FOLDING); tests that must hold both parametrize it."""
    return "inline"


# The exactness holds whether the worker folds in its own process, in a child process, or in
# two (the second takes what the first cannot keep up with).
FOLDINGS = {
    "inline": {"COSTLINE_FOLDING": "inline"},
    "process": {"COSTLINE_FOLDING": "process", "COSTLINE_FOLDING_PROCESSES": "1"},
    "pool": {"COSTLINE_FOLDING": "process", "COSTLINE_FOLDING_PROCESSES": "2"},
}
every_folding = pytest.mark.parametrize("folding", list(FOLDINGS))


@pytest.fixture
def worker(services, namespace: str, tmp_path: Path, folding: str) -> Iterator[Worker]:
    env = worker_env(namespace, services.bootstrap, services.redis_url, **FOLDINGS[folding])
    create_topics(Settings(kafka_bootstrap=services.bootstrap, namespace=namespace, partitions=4))
    proc = Worker(env, tmp_path / "worker.log")
    proc.start()
    yield proc
    proc.stop()


def _malformed(rng: random.Random) -> list[bytes]:
    good = usage_event(rng, "m-x", DAY + 100)
    cases = [
        b"not json at all",
        b"\xff\xfe\x00",
        json.dumps({**good, "surprise": 1}).encode(),
        json.dumps({**good, "quantity": -1}).encode(),
        json.dumps({**good, "resource_type": "gpu.nonexistent"}).encode(),
        json.dumps({**good, "unit": "parsec"}).encode(),
        json.dumps({**good, "ts": time.time() + 86400}).encode(),
        json.dumps([good, {**good, "event_id": "bad id!"}]).encode(),
        b"[]",
        json.dumps({k: v for k, v in good.items() if k != "tags" and k != "quantity"}).encode(),
    ]
    return cases


def _stream(seed: int, n: int, batch_share: float = 0.2
            ) -> tuple[list[tuple[bytes, bytes]], Ledger, list[bytes]]:
    """Single events, batches, resends of the same event_id and malformed messages, shuffled
    timestamps within the day."""
    rng = random.Random(seed)
    ledger = Ledger()
    messages: list[tuple[bytes, bytes]] = []
    bad: list[bytes] = []
    i = 0
    while i < n:
        if rng.random() < batch_share:
            batch = [usage_event(rng, f"e{i + j}", DAY + rng.randrange(86400)) for j in range(50)]
            i += 50
            messages.append((batch[0]["event_id"].encode(), json.dumps(batch).encode()))
            for event in batch:
                ledger.count(event)
        else:
            event = usage_event(rng, f"e{i}", DAY + rng.randrange(86400))
            i += 1
            value = json.dumps(event).encode()
            messages.append((event["event_id"].encode(), value))
            ledger.count(event)
            if rng.random() < 0.1:  # a producer resend: same id, same key
                messages.append((event["event_id"].encode(), value))
        if rng.random() < 0.01:
            raw = rng.choice(_malformed(rng))
            bad.append(raw)
            messages.append((b"bad", raw))
    return messages, ledger, bad


@every_folding
def test_spend_equals_independent_totals_and_dead_letters_are_exact(services, worker, namespace):
    messages, ledger, bad = _stream(seed=7, n=6000)
    for raw in _malformed(random.Random(1)):  # every malformed kind at least once
        messages.append((b"bad", raw))
        bad.append(raw)
    topic = f"{namespace}.usage.v1"
    produce(services.bootstrap, topic, messages)
    wait_caught_up(worker.env, worker)

    env = worker.env
    day_start, day_end = DAY, DAY + 86400
    for by, where in [((), {}), (("team",), {}), (("team", "env"), {"env": "prod"}),
                      (("category", "resource_type"), {}), (("job",), {"team": "eval"}),
                      (("billing",), {})]:
        args = ["--period", "day", "--at", AT]
        if by:
            args += ["--by", ",".join(by)]
        for key, value in where.items():
            args += ["--where", f"{key}={value}"]
        report = spend_json(env, *args)
        expected = ledger.total("cost", by, where, day_start, day_end)
        assert rows_by_group(report, by, "cost") == {k: v for k, v in expected.items() if v}, (
            by, where)
        costs = [row["cost"] for row in report["rows"]]
        assert costs == sorted(costs, key=float, reverse=True)

    letters = {m.key: json.loads(m.value) for m in read_all(services.bootstrap,
                                                            f"{namespace}.dlq.v1")}
    assert sorted(base_raw(v) for v in letters.values()) == sorted(bad)
    assert all(v["reason"] and v["source_topic"] == topic for v in letters.values())


def base_raw(letter: dict) -> bytes:
    import base64

    return base64.b64decode(letter["raw_b64"])


def test_faults_add_waste_and_leave_spend_unchanged(services, worker, namespace):
    rng = random.Random(3)
    usage = [usage_event(rng, f"u{i}", DAY + 3600 + i) for i in range(200)]
    faults = [
        {"event_id": "f-1", "kind": "fault", "ts": DAY + 7200, "fault": "node_failure",
         "resource_type": "gpu.h100", "units": 512, "lost_seconds": 1800,
         "recovery_seconds": 900, "tags": {"team": "pretrain", "job": "run-42"}},
        {"event_id": "f-2", "kind": "fault", "ts": DAY + 7300, "fault": "comm_timeout",
         "resource_type": "gpu.h100", "units": 64, "lost_seconds": 600.5,
         "recovery_seconds": 120, "tags": {"team": "pretrain", "job": "run-42"}},
    ]
    produce(services.bootstrap, f"{namespace}.usage.v1",
            [(e["event_id"].encode(), json.dumps(e).encode()) for e in usage])
    wait_caught_up(worker.env, worker)
    before = spend_json(worker.env, "--period", "day", "--at", AT)
    produce(services.bootstrap, f"{namespace}.faults.v1",
            [(e["event_id"].encode(), json.dumps(e).encode()) for e in faults] * 2)
    wait_caught_up(worker.env, worker)
    after = spend_json(worker.env, "--period", "day", "--at", AT, "--by", "team")
    total_cost = sum(int(r["cost"].replace(".", "")) for r in after["rows"])
    assert total_cost == int(before["rows"][0]["cost"].replace(".", ""))
    pretrain = next(r for r in after["rows"] if r["group"]["team"] == "pretrain")
    # 512 × 2700 s and 64 × 720.5 s of gpu.h100 at 2.49/h, each counted once
    assert pretrain["waste"] == "988.054133"


def test_batches_of_every_kafka_codec_are_counted(services, worker, namespace):
    """Producers are not only costline's: whichever codec a producer's batches use, the worker
    reads them (and costline's own producers use one it reads)."""
    from aiokafka import AIOKafkaProducer

    from costline.connectors.kafka import producer

    rng, ledger = random.Random(5), Ledger()
    topic = f"{namespace}.usage.v1"

    own = producer(services.bootstrap)  # costline's own, as the collectors and the demo use it
    assert own.config["compression_type"] == "lz4"
    for event in [usage_event(rng, f"own-{i}", DAY + 300 + i) for i in range(300)]:
        ledger.count(event)
        own.send(topic, json.dumps(event).encode(), key=event["event_id"].encode())
    own.flush(60)
    own.close()

    async def send(codec: str, events: list[dict]) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=services.bootstrap,
                                    compression_type=codec, linger_ms=20)
        await producer.start()
        try:
            sent = [await producer.send(topic, json.dumps(e).encode(), key=e["event_id"].encode())
                    for e in events]
            await asyncio.gather(*sent)
        finally:
            await producer.stop()

    for codec in ("gzip", "lz4", "zstd", "snappy"):
        events = [usage_event(rng, f"{codec}-{i}", DAY + 600 + i) for i in range(300)]
        for event in events:
            ledger.count(event)
        asyncio.run(send(codec, events))
    wait_caught_up(worker.env, worker)
    report = spend_json(worker.env, "--period", "day", "--at", AT, "--by", "team")
    expected = ledger.total("cost", ("team",), {}, DAY, DAY + 86400)
    assert rows_by_group(report, ("team",), "cost") == expected
    assert read_all(services.bootstrap, f"{namespace}.dlq.v1", timeout_s=2) == []


def test_calendar_day_follows_the_configured_time_zone(services, namespace, tmp_path):
    env = worker_env(namespace, services.bootstrap, services.redis_url,
                     COSTLINE_TIMEZONE="Asia/Shanghai")
    create_topics(Settings(kafka_bootstrap=services.bootstrap, namespace=namespace, partitions=4))
    proc = Worker(env, tmp_path / "worker.log")
    proc.start()
    try:
        late = {"event_id": "late", "kind": "usage", "ts": "2026-11-27T23:30:00Z",
                "resource_id": "n1", "resource_type": "gpu.h100", "quantity": 1, "unit":
                "gpu_hour", "tags": {"team": "pretrain"}}
        produce(services.bootstrap, f"{namespace}.usage.v1", [(b"late", json.dumps(late).encode())])
        wait_caught_up(proc.env, proc)
        nov27 = spend_json(env, "--period", "day", "--at", "2026-11-27T12:00:00+08:00")
        nov28 = spend_json(env, "--period", "day", "--at", "2026-11-28T12:00:00+08:00")
        assert nov27["rows"] == []
        assert nov28["rows"][0]["cost"] == "2.490000"
        assert nov28["period"]["start"] == "2026-11-27T16:00:00Z"
        utc = spend_json(env, "--period", "day", "--at", "2026-11-27T12:00:00Z", "--tz", "UTC")
        assert utc["rows"][0]["cost"] == "2.490000"
    finally:
        proc.stop()


@pytest.mark.parametrize("folding", ["inline", "pool"])  # "pool" is the default
def test_totals_stay_exact_when_the_worker_is_killed_repeatedly(services, worker, namespace):
    rng = random.Random(11)
    messages, ledger, _ = _stream(seed=11, n=200_000, batch_share=0.02)
    topic = f"{namespace}.usage.v1"
    produce(services.bootstrap, topic, messages)
    ends = end_offsets(services.bootstrap, topic)
    total = sum(ends.values())
    kills = 0
    for fraction in sorted(rng.uniform(0.05, 0.9) for _ in range(5)):
        _wait_progress(worker.env, total, fraction * total, worker)
        worker.kill9()
        kills += 1
        worker.start()
    wait_caught_up(worker.env, worker, timeout=300)
    report = spend_json(worker.env, "--period", "day", "--at", AT, "--by", "team,job")
    assert rows_by_group(report, ("team", "job"), "cost") == ledger.total(
        "cost", ("team", "job"), {}, DAY, DAY + 86400)
    assert kills == 5 and worker.starts == 6


@pytest.mark.parametrize("folding", ["pool"])
def test_the_pricing_processes_end_with_their_worker(services, worker, namespace):
    produce(services.bootstrap, f"{namespace}.usage.v1",
            _stream(seed=5, n=2000)[0])  # the children start with the first partitions
    deadline = time.time() + 60
    while not (children := child_processes(worker.proc.pid, "costline-pricer")):
        assert time.time() < deadline, f"no pricing process; see {worker.log}"
        time.sleep(0.1)
    os.kill(worker.proc.pid, signal.SIGKILL)  # the worker alone, as the OOM killer would
    worker.proc.wait(10)
    deadline = time.time() + 20
    while alive := [c for c in children if Path(f"/proc/{c}").exists() and _state(c) != "Z"]:
        assert time.time() < deadline, f"pricing processes {alive} outlived their worker"
        time.sleep(0.1)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return "gone"


def _wait_progress(env: dict[str, str], total: int, target: float, worker: Worker,
                   timeout: float = 180) -> None:
    """Until intake has taken ``target`` of the ``total`` input messages."""
    from costline.streams.progress import behind

    settings = settings_of(env)
    redis = connect(settings.redis_url)
    deadline = time.time() + timeout
    while time.time() < deadline:
        if total - behind(settings, redis).inputs >= target:
            return
        assert worker.alive(), f"worker died; see {worker.log}"
        time.sleep(0.05)
    raise AssertionError(f"no progress to {target} messages in {timeout}s")


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[tuple[str, Callable[..., None]]]:
    """A Redis of our own (appendonly, fsync every second) that the test may kill and restart."""
    binary = shutil.which("redis-server")
    if binary is None:
        unavailable("redis-server", "not installed")
    port = free_port()
    data = tmp_path / "redis"
    data.mkdir()
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data),
            "--appendonly", "yes", "--appendfsync", "everysec", "--save", ""]
    state = {"proc": subprocess.Popen(argv, stdout=subprocess.DEVNULL)}

    def restart(kill: bool, check_down: Callable[[], bool]) -> None:
        proc = state["proc"]
        proc.kill() if kill else proc.terminate()
        proc.wait(10)
        deadline = time.time() + 30
        while not check_down():  # the worker must notice and say so while Redis is away
            assert time.time() < deadline, "/healthz never reported the Redis outage"
            time.sleep(0.2)
        state["proc"] = subprocess.Popen(argv, stdout=subprocess.DEVNULL)

    url = f"redis://127.0.0.1:{port}/0"
    _wait_ping(url)
    yield url, restart
    state["proc"].kill()


def _health(env: dict[str, str]) -> dict:
    import urllib.error
    import urllib.request

    url = f"http://127.0.0.1:{env['COSTLINE_WEB_PORT']}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return json.loads(exc.read())


def _eventually(check, seconds: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _wait_ping(url: str) -> None:
    client = Redis.from_url(url)
    for _ in range(100):
        try:
            if client.ping():
                return
        except Exception:  # noqa: BLE001 - not up yet
            time.sleep(0.1)
    raise AssertionError(f"redis at {url} did not start")


@pytest.mark.parametrize("kill", [False, True], ids=["restart", "kill-9"])
def test_totals_are_exact_after_redis_restarts_mid_stream(services, namespace, tmp_path,
                                                          private_redis, kill):
    url, restart = private_redis
    env = worker_env(namespace, services.bootstrap, url)
    create_topics(Settings(kafka_bootstrap=services.bootstrap, namespace=namespace, partitions=4))
    proc = Worker(env, tmp_path / "worker.log")
    proc.start()
    try:
        messages, ledger, _ = _stream(seed=5, n=60_000)
        topic = f"{namespace}.usage.v1"
        produce(services.bootstrap, topic, messages)
        ends = end_offsets(services.bootstrap, topic)
        _wait_progress(env, sum(ends.values()), 0.3 * sum(ends.values()), proc)
        restart(kill, check_down=lambda: _health(env)["status"] == "degraded")
        _wait_ping(url)
        wait_caught_up(proc.env, proc, timeout=240)
        assert proc.alive()
        # The Redis probe runs every 2 s: one that failed during the outage may report after
        # the last write succeeded, so the next one is what says ok.
        assert _eventually(lambda: _health(env)["status"] == "ok", seconds=10)
        report = spend_json(env, "--period", "day", "--at", AT, "--by", "team")
        assert rows_by_group(report, ("team",), "cost") == ledger.total(
            "cost", ("team",), {}, DAY, DAY + 86400)
    finally:
        proc.stop()



def test_lost_redis_state_is_rebuilt_from_kafka(services, worker, namespace):
    messages, ledger, _ = _stream(seed=13, n=3000)
    topic = f"{namespace}.usage.v1"
    produce(services.bootstrap, topic, messages)
    redis = connect(services.redis_url)
    wait_caught_up(worker.env, worker)
    worker.stop()
    # Redis loses everything of this namespace; Kafka's committed offsets are at the end.
    doomed = [*redis.scan_iter(f"{{{namespace}:*"), *redis.scan_iter(f"{namespace}:*")]
    assert doomed
    redis.delete(*doomed)
    worker.start()
    wait_caught_up(worker.env, worker)
    report = spend_json(worker.env, "--period", "day", "--at", AT, "--by", "team")
    assert rows_by_group(report, ("team",), "cost") == ledger.total(
        "cost", ("team",), {}, DAY, DAY + 86400)


@pytest.mark.parametrize("folding", ["pool"])
def test_sigterm_to_the_process_group_stops_everything_without_an_error(
        services, worker, namespace):
    produce(services.bootstrap, f"{namespace}.usage.v1", _stream(seed=9, n=3000)[0])
    wait_caught_up(worker.env, worker)  # the pricing processes and the evaluation have run
    children = child_processes(worker.proc.pid, "costline-pricer") + child_processes(
        worker.proc.pid, "costline-rules")
    assert children, f"no child process; see {worker.log}"
    os.killpg(worker.proc.pid, signal.SIGTERM)
    assert worker.proc.wait(30) == 0
    deadline = time.time() + 10
    while alive := [c for c in children if Path(f"/proc/{c}").exists() and _state(c) != "Z"]:
        assert time.time() < deadline, f"children {alive} outlived their worker"
        time.sleep(0.1)
    log = worker.log.read_text()
    assert not [line for line in log.splitlines()
                if any(word in line for word in ("ERROR", "CRITICAL", "Traceback"))], log[-3000:]
    assert "starting a new one" not in log and "starting the pool again" not in log


def test_a_stop_with_kafka_not_answering_ends_in_time_and_loses_nothing(
        services, namespace: str, tmp_path: Path, private_stack: tuple[Path, StackUp],
        kafka_libs: Path) -> None:
    """The broker stops answering (SIGSTOP) with input in flight, then the worker is told to
    stop: it exits at COSTLINE_STOP_TIMEOUT_S (status 1: cut short), where waiting out
    aiokafka's and Faust's own timeouts took 142 s, and the next worker counts everything
    once."""
    state, up = private_stack
    bootstrap = up(kafka="apache", redis="none", kafka_libs=kafka_libs).exports[
        "COSTLINE_KAFKA_BOOTSTRAP"]
    broker = next(record.pid for record in pids_of(state) if "kafka.Kafka" in record.argv)
    env = worker_env(namespace, bootstrap, services.redis_url, COSTLINE_STOP_TIMEOUT_S="8",
                     **FOLDINGS["pool"])
    create_topics(Settings(kafka_bootstrap=bootstrap, namespace=namespace, partitions=4))
    worker = Worker(env, tmp_path / "worker.log")
    worker.start()
    messages, ledger, _ = _stream(seed=21, n=3000)
    topic = f"{namespace}.usage.v1"
    half = len(messages) // 2
    try:
        produce(bootstrap, topic, messages[:half])
        wait_caught_up(env, worker)
        produce(bootstrap, topic, messages[half:])  # in flight when the broker stops
        os.kill(broker, signal.SIGSTOP)
        try:
            began = time.monotonic()
            os.killpg(worker.proc.pid, signal.SIGTERM)
            status = worker.proc.wait(30)
            took = time.monotonic() - began
        finally:
            os.kill(broker, signal.SIGCONT)
        log = worker.log.read_text()
        assert status == 1 and 8 <= took < 13, (status, took, log[-3000:])
        assert "still stopping after 8 s (COSTLINE_STOP_TIMEOUT_S" in log
        assert "Traceback" not in log, log[-3000:]
        worker.start()
        wait_caught_up(env, worker)
        report = spend_json(env, "--period", "day", "--at", AT, "--by", "team")
        assert rows_by_group(report, ("team",), "cost") == ledger.total(
            "cost", ("team",), {}, DAY, DAY + 86400)
    finally:
        worker.stop()
