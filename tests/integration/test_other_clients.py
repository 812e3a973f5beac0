"""Producers on clients costline did not write: Apache Kafka's own Java client (the one Kafka
Connect and Flink use) and librdkafka (confluent-kafka; the Go, .NET and Rust clients wrap
it). Each with its own partitioner and batching, its codecs, its idempotence and its
transactions, with resends out of old batches keyed another way: every event is counted
once, and nothing aborted is."""

from __future__ import annotations

import json
import queue
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from tests.conftest import unavailable
from tests.integration.streamkit import (
    Worker,
    end_offsets,
    wait_caught_up,
)
from tests.integration.team_spend import gpu_hours, pipeline_env, spend_by_team

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
PARTITIONS = 3
# the client and the codecs it loads as batches need them
CLASSPATH_JARS = ("kafka-clients-*.jar", "slf4j-api-*.jar", "lz4-java-*.jar",
                  "snappy-java-*.jar", "zstd-jni-*.jar")


class JavaProducer:
    """``LinesProducer`` (``tests/integration/java``) in a JVM of its own. Its answers are
    read by a thread, so a JVM that hangs fails the test instead of holding it."""

    ANSWER = "LinesProducer: "

    def __init__(self, classpath: str, bootstrap: str, topic: str, **configs: str) -> None:
        self.proc = subprocess.Popen(
            ["java", "-Xmx128m", "-XX:+DisplayVMOutputToStderr", "-cp", classpath,
             "LinesProducer", bootstrap, topic,
             *(f"{key.replace('_', '.')}={value}" for key, value in configs.items())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.answers: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._answers, daemon=True).start()

    def _answers(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(self.ANSWER):
                self.answers.put(line[len(self.ANSWER):].strip())

    @property
    def stdin(self) -> IO[str]:
        assert self.proc.stdin is not None
        return self.proc.stdin

    def send(self, key: str | None, value: Any) -> None:
        self.stdin.write(f"{key or '-'}\t{json.dumps(value)}\n")

    def do(self, command: str) -> None:
        """BEGIN, COMMIT, ABORT or FLUSH, once the client has done it without error."""
        self.stdin.write(command + "\n")
        self.stdin.flush()
        try:
            answer = self.answers.get(timeout=60)
        except queue.Empty:
            raise AssertionError(f"{command}: the Java producer did not answer") from None
        assert answer == "ok", f"{command}: the Java producer said {answer!r}"

    def close(self) -> None:
        self.stdin.close()
        assert self.proc.wait(60) == 0

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def java_producers() -> Iterator[list[JavaProducer]]:
    """JVMs the test starts; killed at the end if the test left any running."""
    started: list[JavaProducer] = []
    yield started
    for producer in started:
        producer.kill()


@pytest.fixture(scope="module")
def classpath(kafka_libs: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    if shutil.which("javac") is None:
        unavailable("a Java producer", "javac (a JDK) is not installed")
    jars = [str(next(kafka_libs.glob(pattern))) for pattern in CLASSPATH_JARS]
    classes = tmp_path_factory.mktemp("java")
    subprocess.run(["javac", "-d", str(classes), "-cp", jars[0],
                    str(HERE / "java" / "LinesProducer.java")], check=True, timeout=120)
    return ":".join([str(classes), *jars])


@pytest.fixture
def env(services: Any, kafka_namespace: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    env = pipeline_env(services, kafka_namespace, PARTITIONS, tmp_path / "state")
    worker = Worker(env, tmp_path / "worker.log")
    worker.start()
    yield env
    worker.stop()


def usage_topic(env: dict[str, str]) -> str:
    return f"{env['COSTLINE_NAMESPACE']}.usage.v1"


def test_batches_resends_and_codecs_of_the_java_client_count_once(
        classpath: str, services: Any, env: dict[str, str],
        java_producers: list[JavaProducer]) -> None:
    batches = [[gpu_hours(f"java-{b}-{n}", "java", 0.5) for n in range(50)] for b in range(20)]
    singles = [gpu_hours(f"single-{n}", "java", 0.5) for n in range(20)]
    zstd = JavaProducer(classpath, services.bootstrap, usage_topic(env),
                        compression_type="zstd", linger_ms="20")
    java_producers.append(zstd)
    for batch in batches:  # no key: the client's sticky partitioner spreads them
        zstd.send(None, batch)
    for n, event in enumerate(singles):
        zstd.send(f"node-{n % 7}", event)  # keyed by host
    zstd.do("FLUSH")
    zstd.close()
    # resends from another producer: single events out of old batches, keyed by job, and
    # one whole old batch again, gzip this time
    gzip = JavaProducer(classpath, services.bootstrap, usage_topic(env),
                        compression_type="gzip", enable_idempotence="false", acks="1")
    java_producers.append(gzip)
    for b in range(0, 20, 2):
        gzip.send(f"job-{b}", batches[b][b])
    gzip.send(None, batches[7])
    gzip.send("node-3", singles[3])
    gzip.do("FLUSH")
    gzip.close()
    # the producers' partitioning spread them over every partition, so a resend may meet its
    # first copy on another one
    assert sum(end > 0 for end in end_offsets(services.bootstrap, usage_topic(env)).values()) \
        == PARTITIONS
    wait_caught_up(env, timeout=120)
    # 1,020 events of half a GPU-hour at 2.49
    assert spend_by_team(env) == {"java": "1269.900000"}


def test_the_java_client_s_aborted_transactions_are_not_counted(
        classpath: str, apache_kafka: str, env: dict[str, str],
        java_producers: list[JavaProducer]) -> None:
    tx = JavaProducer(classpath, apache_kafka, usage_topic(env),
                      transactional_id=f"{usage_topic(env)}-sink", compression_type="lz4")
    java_producers.append(tx)
    kept = [[gpu_hours(f"kept-{b}-{n}", "kept") for n in range(10)] for b in range(10)]
    tx.do("BEGIN")
    for b, batch in enumerate(kept):
        tx.send(f"job-{b}", batch)
    tx.do("COMMIT")
    tx.do("BEGIN")
    for b in range(10):
        tx.send(f"job-{b}", [gpu_hours(f"aborted-{b}-{n}", "aborted") for n in range(10)])
    tx.do("FLUSH")
    tx.do("ABORT")
    tx.do("BEGIN")  # a sink's retry: some of what it committed again, and what came since
    tx.send(None, kept[4])
    tx.send("job-9", [gpu_hours(f"late-{n}", "late") for n in range(5)])
    tx.do("COMMIT")
    tx.close()
    wait_caught_up(env, timeout=120)
    assert spend_by_team(env) == {"kept": "249.000000", "late": "12.450000"}


# -- librdkafka ---------------------------------------------------------------------------


class Delivered:
    """confluent-kafka's delivery reports: every message acknowledged, or why not."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def __call__(self, error: Any, message: Any) -> None:
        if error is not None:
            self.errors.append(str(error))


def librdkafka(bootstrap: str, **config: Any) -> Any:
    try:
        import confluent_kafka
    except ImportError:
        unavailable("librdkafka's client", "confluent-kafka is not installed (the dev extra)")
    return confluent_kafka.Producer({"bootstrap.servers": bootstrap,
                                     **{key.replace("_", "."): value
                                        for key, value in config.items()}})


def flushed(producer: Any, delivered: Delivered) -> None:
    assert producer.flush(30) == 0, "messages left unsent"
    assert delivered.errors == []


def test_batches_resends_and_codecs_of_librdkafka_count_once(
        services: Any, env: dict[str, str]) -> None:
    topic, delivered = usage_topic(env), Delivered()
    batches = [[gpu_hours(f"rd-{b}-{n}", "rdkafka", 0.5) for n in range(50)] for b in range(20)]
    singles = [gpu_hours(f"rd-single-{n}", "rdkafka", 0.5) for n in range(20)]
    # its default partitioner (consistent_random: CRC32 of the key, a random partition
    # without one), not the Java client's murmur2
    lz4 = librdkafka(services.bootstrap, compression_type="lz4", linger_ms=20,
                     enable_idempotence=True)
    for batch in batches:
        lz4.produce(topic, json.dumps(batch).encode(), on_delivery=delivered)
    for n, event in enumerate(singles):
        lz4.produce(topic, json.dumps(event).encode(), key=f"node-{n % 7}",
                    on_delivery=delivered)
    flushed(lz4, delivered)
    snappy = librdkafka(services.bootstrap, compression_type="snappy", acks=1)
    for b in range(0, 20, 2):
        snappy.produce(topic, json.dumps(batches[b][b]).encode(), key=f"job-{b}",
                       on_delivery=delivered)
    snappy.produce(topic, json.dumps(batches[7]).encode(), on_delivery=delivered)
    snappy.produce(topic, json.dumps(singles[3]).encode(), key="node-3", on_delivery=delivered)
    flushed(snappy, delivered)
    assert sum(end > 0 for end in end_offsets(services.bootstrap, topic).values()) == PARTITIONS
    wait_caught_up(env, timeout=120)
    assert spend_by_team(env) == {"rdkafka": "1269.900000"}


def test_librdkafka_s_aborted_transactions_are_not_counted(
        apache_kafka: str, env: dict[str, str]) -> None:
    topic, delivered = usage_topic(env), Delivered()
    tx = librdkafka(apache_kafka, transactional_id=f"{topic}-rd", compression_type="zstd")
    tx.init_transactions(30)
    kept = [[gpu_hours(f"rd-kept-{b}-{n}", "kept") for n in range(10)] for b in range(10)]
    tx.begin_transaction()
    for b, batch in enumerate(kept):
        tx.produce(topic, json.dumps(batch).encode(), key=f"job-{b}", on_delivery=delivered)
    tx.commit_transaction(30)
    tx.begin_transaction()
    for b in range(10):  # no delivery report: librdkafka reports aborted messages as purged
        tx.produce(topic, json.dumps([gpu_hours(f"rd-aborted-{b}-{n}", "aborted")
                                      for n in range(10)]).encode(), key=f"job-{b}")
    tx.flush(30)
    tx.abort_transaction(30)
    tx.begin_transaction()
    tx.produce(topic, json.dumps(kept[4]).encode(), on_delivery=delivered)
    tx.produce(topic, json.dumps([gpu_hours(f"rd-late-{n}", "late") for n in range(5)]).encode(),
               key="job-9", on_delivery=delivered)
    tx.commit_transaction(30)
    flushed(tx, delivered)
    wait_caught_up(env, timeout=120)
    assert spend_by_team(env) == {"kept": "249.000000", "late": "12.450000"}
