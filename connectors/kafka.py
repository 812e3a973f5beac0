"""Kafka plumbing: reachability probe, broker identity, topic creation, log ends and a tuned
producer.

Plain parameters only (bootstrap strings, names, numbers, a ``KafkaSecurity``) so that any
layer can use it without the application's settings. Everything here talks kafka-python, except
``api_versions``: a readiness probe must answer in milliseconds and never start background
threads or retry, so it speaks the one ApiVersions v0 frame over a bare socket (inside TLS when
the connection asks for it). kafka-python is imported where it is used: every ``costline``
command loads this module, and importing kafka-python takes about 0.1 s.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from costline.connectors.kafka_security import PLAINTEXT, KafkaSecurity

log = logging.getLogger("costline.kafka")

API_VERSIONS_KEY = 18
TOPIC_ALREADY_EXISTS = 36
# A batch of 10,000 events (README, Events) is a few MiB of JSON: topics and producer allow it.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
# The codec costline's producers write: it shrinks JSON events nearly as well as gzip for a
# fraction of the CPU. kafka-python writes it with ``lz4``; the worker's aiokafka reads it (and
# zstd and snappy) with ``cramjam``: both are dependencies.
COMPRESSION = "lz4"
# The codec of what the worker writes (the ledger, dead letters, alerts, actions). aiokafka
# writes lz4 at level 9 only (its high-compression mode), which made compressing the ledger a
# sixth of the worker's CPU; zstd at its level 3 takes a fifth of that CPU and leaves a quarter
# fewer bytes (bench/stages.py, "compressing the ledger records"). kafka-python, which
# costline's commands read those topics with, decodes zstd with ``zstandard``, a dependency.
WORKER_COMPRESSION = "zstd"


class KafkaUnavailable(RuntimeError):
    """No bootstrap server answered a Kafka request."""


class TopicError(RuntimeError):
    """The broker refused to create a topic for a reason other than "it already exists"."""


class KafkaLoginFailed(RuntimeError):
    """The broker refused costline's SASL credentials (retrying will not help)."""


def _host_port(item: str) -> tuple[str, int]:
    if item.startswith("["):  # [IPv6]:port
        host, _, rest = item[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") else 9092
    if item.count(":") == 1:
        host, port = item.split(":")
        return host, int(port)
    return item, 9092  # a bare host name or a bare IPv6 address


def parse_bootstrap(bootstrap: str) -> list[tuple[str, int]]:
    """``"a:9092,[::1]:9093"`` → ``[("a", 9092), ("::1", 9093)]``; a missing port means 9092."""
    servers = [_host_port(part.strip()) for part in bootstrap.split(",") if part.strip()]
    if not servers:
        raise ValueError(f"no Kafka bootstrap server in {bootstrap!r}")
    return servers


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        chunks += chunk
    return bytes(chunks)


def _api_versions_request(correlation_id: int, client_id: bytes) -> bytes:
    header = struct.pack(">hhih", API_VERSIONS_KEY, 0, correlation_id, len(client_id)) + client_id
    return struct.pack(">i", len(header)) + header


def _parse_api_versions(body: bytes, correlation_id: int) -> dict[int, tuple[int, int]]:
    got_id, error_code, count = struct.unpack_from(">ihi", body, 0)
    if got_id != correlation_id:
        raise ConnectionError(f"correlation id {got_id} does not match {correlation_id}")
    if error_code != 0:
        raise ConnectionError(f"ApiVersions answered with error code {error_code}")
    ranges: dict[int, tuple[int, int]] = {}
    for index in range(count):
        key, low, high = struct.unpack_from(">hhh", body, 10 + 6 * index)
        ranges[key] = (low, high)
    return ranges


def _api_versions_at(host: str, port: int, timeout_s: float, security: KafkaSecurity
                     ) -> dict[int, tuple[int, int]]:
    correlation_id = 0x636C  # any value: the answer must echo it
    with socket.create_connection((host, port), timeout=timeout_s) as raw, \
            security.wrap(raw, host) as sock:
        sock.sendall(_api_versions_request(correlation_id, b"costline-probe"))
        (size,) = struct.unpack(">i", _recv_exactly(sock, 4))
        if not 10 <= size <= 1 << 20:
            raise ConnectionError(f"not a Kafka answer (frame of {size} bytes)")
        return _parse_api_versions(_recv_exactly(sock, size), correlation_id)


def api_versions(bootstrap: str, timeout_s: float = 2.0,
                 security: KafkaSecurity = PLAINTEXT) -> dict[int, tuple[int, int]]:
    """The API key → (min, max) version ranges of the first bootstrap server that answers.

    Raises ``KafkaUnavailable`` naming every server tried when none speaks Kafka (a TLS
    handshake that fails is one way of not answering).
    """
    failures: list[str] = []
    for host, port in parse_bootstrap(bootstrap):
        try:
            return _api_versions_at(host, port, timeout_s, security)
        except (OSError, struct.error) as exc:
            failures.append(f"{host}:{port}: {exc or type(exc).__name__}")
    raise KafkaUnavailable("no Kafka broker answered: " + "; ".join(failures))


def check_login(bootstrap: str, security: KafkaSecurity, timeout_s: float = 10.0) -> None:
    """Log in once to the first bootstrap server, so a refused password is reported at once
    and with the broker's reason (which never repeats the password).

    kafka-python retries a refused login until its bootstrap timeout and then says only
    "Unable to bootstrap"; one aiokafka connection fails at once with the reason. Anything
    other than a refused login is left to the client that follows.
    """
    if not security.uses_sasl:
        return
    host, port = parse_bootstrap(bootstrap)[0]
    asyncio.run(_login(host, port, security, timeout_s))


async def _login(host: str, port: int, security: KafkaSecurity, timeout_s: float) -> None:
    from aiokafka.conn import create_conn
    from aiokafka.errors import KafkaError as AIOKafkaError

    try:
        conn = await asyncio.wait_for(create_conn(
            host, port, client_id="costline-login", request_timeout_ms=int(timeout_s * 1000),
            **security.client_kwargs()), timeout_s)
    except AIOKafkaError as exc:
        if "authentication" in str(exc).lower():
            raise KafkaLoginFailed(
                f"Kafka at {host}:{port} refused the login of {security.sasl_username!r} "
                f"({security.sasl_mechanism}): {exc}") from None
        return
    except (OSError, TimeoutError):
        return
    conn.close()


@dataclass(frozen=True)
class BrokerInfo:
    """What a broker says about itself, for logs and for telling implementations apart.

    Kafka has no "server version" request; the protocol version ranges imply the release
    (``version``), and only Apache Kafka's KRaft brokers finalize feature levels such as
    ``metadata.version``, which is why they decide ``implementation``.
    """

    bootstrap: str
    version: str
    implementation: str
    api_keys: int
    cluster_id: str | None = None
    features: Mapping[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        level = self.features.get("metadata.version", {}).get("finalized")
        extra = f", metadata.version level {level[1]}" if level else ""
        return (
            f"{self.implementation} at {self.bootstrap}: protocol of Kafka {self.version} "
            f"({self.api_keys} APIs{extra}), cluster id {self.cluster_id or 'unknown'}"
        )


def _implementation(features: Mapping[str, Any]) -> str:
    finalized = features.get("metadata.version", {}).get("finalized")
    return "Apache Kafka (KRaft)" if finalized else "Kafka-compatible broker"


def broker_info(bootstrap: str, timeout_s: float = 10.0,
                security: KafkaSecurity = PLAINTEXT) -> BrokerInfo:
    """Identify the broker behind ``bootstrap`` (version implied by its API ranges, features)."""
    from kafka.protocol.broker_version_data import infer_broker_version_from_api_versions

    ranges = api_versions(bootstrap, timeout_s=min(timeout_s, 5.0), security=security)
    version = ".".join(str(part) for part in infer_broker_version_from_api_versions(ranges))
    client = admin(bootstrap, timeout_s=timeout_s, security=security)
    try:
        features: dict[str, Any] = _features_of(client)
        cluster = client.describe_cluster()
    finally:
        client.close()
    return BrokerInfo(
        bootstrap=bootstrap,
        version=version,
        implementation=_implementation(features),
        api_keys=len(ranges),
        cluster_id=cluster.get("cluster_id"),
        features=features,
    )


def _features_of(client: Any) -> dict[str, Any]:
    """Feature flags, or none when the broker does not implement ApiVersions v3."""
    from kafka.errors import KafkaError

    try:
        return dict(client.describe_features())
    except KafkaError:  # a broker without feature flags is still a broker
        return {}


def admin(bootstrap: str, *, client_id: str = "costline-admin", timeout_s: float = 30.0,
          security: KafkaSecurity = PLAINTEXT) -> Any:
    """A ``KafkaAdminClient`` that gives up after ``timeout_s`` instead of retrying forever."""
    from kafka.admin import KafkaAdminClient

    millis = int(timeout_s * 1000)
    return KafkaAdminClient(
        bootstrap_servers=bootstrap,
        client_id=client_id,
        request_timeout_ms=millis,
        bootstrap_timeout_ms=millis,
        **security.client_kwargs(),
    )


def consumer(bootstrap: str, *topics: str, security: KafkaSecurity = PLAINTEXT,
             **options: Any) -> Any:
    """A ``KafkaConsumer`` (``options`` are kafka-python's) on the given connection."""
    from kafka import KafkaConsumer

    return KafkaConsumer(*topics, bootstrap_servers=bootstrap, **options,
                         **security.client_kwargs())


# How long a fetch at a log's end may wait for records: long enough that every broker answers
# it (Tansu leaves a fetch that may not wait at all unanswered), short enough that asking for
# a namespace's ends stays well under a second.
END_FETCH_WAIT_MS = 10


def log_ends(client: Any, partitions: list[Any], timeout_s: float = 5.0) -> dict[Any, int]:
    """Where each partition's log ends for ``client``, a consumer made with ``consumer(...,
    fetch_max_wait_ms=END_FETCH_WAIT_MS)`` whose isolation level is the one that matters (it
    is assigned ``partitions`` and moved).

    ListOffsets answers, and a fetch from its answer checks it. A fetch that returns nothing
    leaves ListOffsets' answer, which for read committed is the last stable offset. A broker
    that counts a record batch as one record there (``costline topics check``, ``log_end``)
    returns records past it: the end is then the fetch's high watermark, which also counts a
    transaction still open, so a wait on it lasts until that ends, and never ends early. A
    partition whose fetch is not answered within ``timeout_s`` keeps ListOffsets' answer,
    with a warning.
    """
    client.unsubscribe()  # no high watermark kept from an earlier assignment
    ends: dict[Any, int] = client.end_offsets(partitions) if partitions else {}
    if not ends:
        return {}
    client.assign(list(ends))
    for tp, end in ends.items():
        client.seek(tp, end)
    past: set[Any] = set()
    deadline = time.monotonic() + timeout_s
    while any(client.highwater(tp) is None for tp in ends) and time.monotonic() < deadline:
        fetched = client.poll(timeout_ms=END_FETCH_WAIT_MS)
        past.update(tp for tp, records in fetched.items() if records)
    unanswered = sorted(str(tp) for tp in ends if client.highwater(tp) is None)
    if unanswered:
        log.warning("no fetch answered within %g s for %s: taking ListOffsets' end for them",
                    timeout_s, ", ".join(unanswered))
    return {tp: max(end, client.highwater(tp) or 0, client.position(tp)) if tp in past else end
            for tp, end in ends.items()}


@dataclass(frozen=True)
class TopicSpec:
    """A topic as costline wants it; ``configs`` are Kafka topic configs (strings)."""

    name: str
    partitions: int
    replication_factor: int = 1
    configs: Mapping[str, str] = field(
        default_factory=lambda: {"max.message.bytes": str(MAX_MESSAGE_BYTES)}
    )


def ensure_topics(client: Any, specs: Iterable[TopicSpec]) -> list[str]:
    """Create the topics that do not exist yet; return the names actually created.

    Creating and tolerating "already exists" (rather than listing first) is race-free when
    several workers start at once. Existing topics are left as they are.
    """
    wanted = {
        spec.name: {
            "num_partitions": spec.partitions,
            "replication_factor": spec.replication_factor,
            "configs": dict(spec.configs),
        }
        for spec in specs
    }
    if not wanted:
        return []
    result = client.create_topics(wanted, raise_errors=False)
    created: list[str] = []
    refused: list[str] = []
    for topic in result["topics"]:
        code = topic["error_code"]
        if code == 0:
            created.append(topic["name"])
        elif code != TOPIC_ALREADY_EXISTS:
            refused.append(f"{topic['name']}: {topic.get('error_message') or f'error {code}'}")
    if refused:
        raise TopicError("could not create topics: " + "; ".join(refused))
    if created:
        client.wait_for_topics(created)
    return sorted(created)


def producer(
    bootstrap: str,
    *,
    client_id: str = "costline-producer",
    linger_ms: int = 20,
    compression: str | None = None,
    batch_bytes: int = 512 * 1024,
    timeout_s: float = 30.0,
    security: KafkaSecurity = PLAINTEXT,
    transactional_id: str | None = None,
) -> Any:
    """A durable, idempotent producer tuned for throughput.

    ``acks="all"`` with idempotence means a retried send is never written twice; a short
    linger lets many events share one compressed record batch. Topics are never created
    implicitly: a broker's auto-created topic would have its default size, not costline's.
    ``timeout_s`` bounds how long connecting, a full buffer or a broker's answer may block a
    call. With ``transactional_id`` it writes in transactions (``init_transactions`` first).
    """
    from kafka import KafkaProducer

    millis = int(timeout_s * 1000)
    return KafkaProducer(
        bootstrap_servers=bootstrap,
        client_id=client_id,
        acks="all",
        enable_idempotence=True,
        linger_ms=linger_ms,
        compression_type=compression or COMPRESSION,
        batch_size=batch_bytes,
        max_request_size=MAX_MESSAGE_BYTES,
        allow_auto_create_topics=False,
        bootstrap_timeout_ms=millis,
        max_block_ms=millis,
        **({"transactional_id": transactional_id, "request_timeout_ms": millis}
           if transactional_id else {}),
        **security.client_kwargs(),
    )


def partition_of(key: str, partitions: int) -> int:
    """The partition Kafka's default partitioner gives a message with this key."""
    from kafka.partitioner.default import murmur2

    return int(murmur2(key.encode()) & 0x7FFFFFFF) % partitions
