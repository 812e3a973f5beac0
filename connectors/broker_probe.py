"""The probe behind ``costline topics check``: a known sequence of records written to a topic
of its own, read back the way costline's consumers read, for ``costline.rules.broker_checks``
to judge.

The topic is ``<namespace>.check.<random>``, with one partition; it and the probe's consumer
group are deleted at the end. The principal needs to create and delete that topic and to use
the transactional id of the same name (docs/SECURITY.md). The transactional id stays known to
the broker until it expires (``transactional.id.expiration.ms``, 7 days by default).
"""

from __future__ import annotations

import contextlib
import secrets
import time
from typing import Any

from costline.connectors.kafka import TopicSpec, admin, consumer, ensure_topics, producer
from costline.connectors.kafka_security import PLAINTEXT, KafkaSecurity
from costline.rules.broker_checks import (
    ABORTED,
    AFTER_ABORT,
    AFTER_OPEN,
    BATCHED,
    BEFORE,
    GROUP_OFFSET,
    OPEN,
    Probe,
)

# After the last record a read should give, how long to go on reading for what it should not.
SETTLE_S = 2.0


def probe_broker(bootstrap: str, namespace: str, *, security: KafkaSecurity = PLAINTEXT,
                 timeout_s: float = 30.0) -> Probe:
    """Write the probe's records to a topic of its own, read them back, and delete it."""
    from kafka.errors import KafkaError

    topic = f"{namespace}.check.{secrets.token_hex(4)}"
    client = admin(bootstrap, timeout_s=timeout_s, security=security)
    try:
        ensure_topics(client, [TopicSpec(topic, 1)])
        try:
            return _probe(bootstrap, topic, security, timeout_s)
        finally:
            for delete in (client.delete_topics, client.delete_groups):
                with contextlib.suppress(KafkaError):
                    delete([topic])
    finally:
        client.close()


def _probe(bootstrap: str, topic: str, security: KafkaSecurity, timeout_s: float) -> Probe:
    from kafka import KafkaProducer, TopicPartition
    from kafka.errors import KafkaError

    tp = TopicPartition(topic, 0)
    deadline = time.monotonic() + timeout_s
    # a linger long enough that the batch's records go in one request
    plain = producer(bootstrap, client_id="costline-check", linger_ms=200, timeout_s=timeout_s,
                     security=security)
    readers: list[Any] = []

    def reader(isolation: str) -> Any:
        made = consumer(bootstrap, security=security, group_id=None, enable_auto_commit=False,
                        isolation_level=isolation, client_id="costline-check")
        made.assign([tp])
        made.seek(tp, 0)
        readers.append(made)
        return made

    def send(value: bytes) -> None:
        plain.send(topic, value, partition=0)
        plain.flush()

    try:
        send(BEFORE)
        for value in BATCHED:
            plain.send(topic, value, partition=0)
        plain.flush()
        uncommitted = reader("read_uncommitted")
        got = _read(uncommitted, BATCHED[-1], deadline, settle_s=0.0)
        batch_offsets = tuple(offset for offset, value in got if value in BATCHED)
        batch_end = uncommitted.end_offsets([tp])[tp]
        group_offset = _group_offset(bootstrap, topic, security)
        tx = KafkaProducer(bootstrap_servers=bootstrap, client_id="costline-check",
                           transactional_id=topic, max_block_ms=int(timeout_s * 1000),
                           **security.client_kwargs())
        try:
            try:
                tx.init_transactions()
            except KafkaError as exc:  # a broker without transactions
                return Probe(batch_offsets, batch_end, f"{type(exc).__name__}: {exc}",
                             group_offset=group_offset)
            tx.begin_transaction()
            tx.send(topic, ABORTED, partition=0)
            tx.flush()
            tx.abort_transaction()
            send(AFTER_ABORT)
            tx.begin_transaction()
            tx.send(topic, OPEN, partition=0)
            tx.flush()
            send(AFTER_OPEN)
            committed = reader("read_committed")
            reads = _read(committed, AFTER_ABORT, deadline, settle_s=SETTLE_S)
            stable_position = committed.position(tp)
            stable_end = committed.end_offsets([tp])[tp]
            tx.commit_transaction()
            after = _read(committed, AFTER_OPEN, deadline, settle_s=0.0)
        finally:
            tx.close(timeout=5)
    finally:
        plain.close(timeout=5)
        for made in readers:
            made.close()
    return Probe(batch_offsets, batch_end, None,
                 committed_reads=tuple(value for _, value in reads),
                 stable_end=stable_end, stable_position=stable_position,
                 after_commit=tuple(value for _, value in after),
                 group_offset=group_offset)


def _read(reader: Any, last: bytes, deadline: float, settle_s: float
          ) -> list[tuple[int, bytes]]:
    """(offset, value) of what ``reader`` gives until ``last`` came and ``settle_s`` more
    passed, or until ``deadline``."""
    got: list[tuple[int, bytes]] = []
    settled: float | None = None
    while time.monotonic() < deadline and (settled is None or time.monotonic() < settled):
        for messages in reader.poll(timeout_ms=200).values():
            got.extend((message.offset, message.value) for message in messages)
        if settled is None and any(value == last for _, value in got):
            settled = time.monotonic() + settle_s
    return got


def _group_offset(bootstrap: str, topic: str, security: KafkaSecurity) -> int | None:
    """Commit ``GROUP_OFFSET`` for a group (named as the topic) and read it back afresh."""
    from kafka import TopicPartition
    from kafka.structs import OffsetAndMetadata

    tp = TopicPartition(topic, 0)
    writer = consumer(bootstrap, security=security, group_id=topic, enable_auto_commit=False)
    try:
        writer.commit({tp: OffsetAndMetadata(GROUP_OFFSET, "", -1)})
    finally:
        writer.close()
    fresh = consumer(bootstrap, security=security, group_id=topic, enable_auto_commit=False)
    try:
        found: int | None = fresh.committed(tp)
        return found
    finally:
        fresh.close()
