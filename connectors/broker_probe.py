"""The probe behind ``costline topics check``: a known sequence of records written to a topic
of its own, read back with the client and the isolation level the worker reads with
(aiokafka), for ``costline.rules.broker_checks`` to judge.

The topic is ``<namespace>.check.<random>``, with one partition; it and the probe's consumer
group are deleted at the end. The principal needs to create and delete that topic and to use
the transactional id of the same name (docs/SECURITY.md). The transactional id stays known to
the broker until it expires (``transactional.id.expiration.ms``, 7 days by default).

Every step waits at most the probe's timeout, each its own. A record the broker does not
acknowledge in that time makes the probe incomplete, not a verdict; a record acknowledged
that a read does not give back in that time is the checks' to judge.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from typing import Any

from costline.connectors.kafka import (
    TopicSpec,
    admin,
    api_versions,
    consumer,
    ensure_topics,
    producer,
)
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

log = logging.getLogger("costline.check")

# After the last record a read should give, how long it goes on reading for what it should not.
SETTLE_S = 2.0
# InitProducerId, AddPartitionsToTxn, EndTxn: a broker that offers them runs transactions.
TRANSACTION_APIS = (22, 24, 26)


class ProbeIncomplete(RuntimeError):
    """A record was not acknowledged within the probe's timeout, or the broker refused it."""


def probe_broker(bootstrap: str, namespace: str, *, security: KafkaSecurity = PLAINTEXT,
                 timeout_s: float = 30.0) -> Probe:
    """Write the probe's records to a topic of its own, read them back, and delete it."""
    from kafka.errors import KafkaError

    offered = api_versions(bootstrap, timeout_s=min(timeout_s, 5.0), security=security)
    transactions = all(key in offered for key in TRANSACTION_APIS)
    topic = f"{namespace}.check.{secrets.token_hex(4)}"
    client = admin(bootstrap, timeout_s=timeout_s, security=security)
    try:
        ensure_topics(client, [TopicSpec(topic, 1)])
        return _Steps(bootstrap, topic, security, timeout_s).run(transactions)
    finally:
        with contextlib.suppress(KafkaError):
            client.delete_topics([topic])
        with contextlib.suppress(KafkaError):
            # per group, "OK" or what went wrong (a list of pairs in older kafka-python)
            for group, outcome in dict(client.delete_groups([topic])).items():
                if outcome not in ("OK", None):
                    log.warning("the probe's group %s was not deleted: %s", group, outcome)
        client.close()


class _Steps:
    """The probe's steps, each waiting at most ``timeout_s``, on its own topic."""

    def __init__(self, bootstrap: str, topic: str, security: KafkaSecurity,
                 timeout_s: float) -> None:
        self.bootstrap, self.topic, self.security = bootstrap, topic, security
        self.timeout_s = timeout_s

    def run(self, transactions: bool) -> Probe:
        # a linger long enough that the batch's records go in one request
        plain = producer(self.bootstrap, client_id="costline-check", linger_ms=200,
                               timeout_s=self.timeout_s, security=self.security)
        try:
            self.sent(plain, [BEFORE])
            self.sent(plain, list(BATCHED))
            got, _, batch_end = self.read("read_uncommitted", BATCHED[-1], settle_s=0.0)
            batch_offsets = tuple(offset for offset, value in got if value in BATCHED)
            group_offset = self.group_offset()
            if not transactions:
                return Probe(batch_offsets, batch_end, transactions=False,
                             group_offset=group_offset)
            tx = producer(self.bootstrap, client_id="costline-check",
                                timeout_s=self.timeout_s, security=self.security,
                                transactional_id=self.topic)
            try:
                tx.init_transactions()
                tx.begin_transaction()
                self.sent(tx, [ABORTED])
                tx.abort_transaction()
                self.sent(plain, [AFTER_ABORT])
                tx.begin_transaction()
                self.sent(tx, [OPEN])
                self.sent(plain, [AFTER_OPEN])
                reads, position, stable_end = self.read("read_committed", AFTER_ABORT,
                                                        settle_s=SETTLE_S)
                tx.commit_transaction()
                after, _, _ = self.read("read_committed", AFTER_OPEN, settle_s=0.0)
            finally:
                tx.close(timeout=5)
        finally:
            plain.close(timeout=5)
        return Probe(batch_offsets, batch_end, transactions=True,
                     committed_reads=tuple(value for _, value in reads),
                     stable_end=stable_end, stable_position=position,
                     after_commit=tuple(value for _, value in after),
                     group_offset=group_offset)

    def sent(self, to: Any, values: list[bytes]) -> None:
        """Send ``values`` together with producer ``to`` and wait until each is
        acknowledged."""
        from kafka.errors import KafkaError

        futures = [to.send(self.topic, value, partition=0) for value in values]
        try:
            to.flush(timeout=self.timeout_s)
            for future in futures:
                future.get(timeout=self.timeout_s)
        except KafkaError as exc:
            shown = ", ".join(value.decode() for value in values)
            raise ProbeIncomplete(f"sending {shown}: {type(exc).__name__}: {exc}") from exc

    def read(self, isolation: str, last: bytes, *, settle_s: float
             ) -> tuple[list[tuple[int, bytes]], int, int]:
        """(offset, value) of what a consumer of ``isolation`` gives from the start until
        ``last`` and ``settle_s`` more; its position then, and where ListOffsets of the same
        isolation level says the log ends."""
        return asyncio.run(self._read(isolation, last, settle_s))

    async def _read(self, isolation: str, last: bytes, settle_s: float
                    ) -> tuple[list[tuple[int, bytes]], int, int]:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        tp = TopicPartition(self.topic, 0)
        reader = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None,
                                  enable_auto_commit=False, isolation_level=isolation,
                                  client_id="costline-check", **self.security.client_kwargs())
        await reader.start()
        try:
            reader.assign([tp])
            reader.seek(tp, 0)
            got: list[tuple[int, bytes]] = []
            deadline = time.monotonic() + self.timeout_s
            settled: float | None = None
            # a record never given is the checks' to judge (one that was sent is
            # acknowledged): give up waiting for it after the probe's timeout
            while time.monotonic() < (deadline if settled is None else settled):
                for records in (await reader.getmany(timeout_ms=200)).values():
                    got += [(record.offset, record.value) for record in records]
                if settled is None and any(value == last for _, value in got):
                    settled = time.monotonic() + settle_s
            position = await reader.position(tp)
            end = (await reader.end_offsets([tp]))[tp]
            return got, position, int(end)
        finally:
            await reader.stop()

    def group_offset(self) -> int | None:
        """Commit ``GROUP_OFFSET`` for a group (named as the topic) and read it back afresh."""
        from kafka import TopicPartition
        from kafka.structs import OffsetAndMetadata

        tp = TopicPartition(self.topic, 0)
        millis = int(self.timeout_s * 1000)
        options = {"group_id": self.topic, "enable_auto_commit": False,
                   "request_timeout_ms": millis + 1000}
        writer = consumer(self.bootstrap, security=self.security, **options)
        try:
            writer.commit({tp: OffsetAndMetadata(GROUP_OFFSET, "", -1)})
        finally:
            writer.close()
        fresh = consumer(self.bootstrap, security=self.security, **options)
        try:
            found: int | None = fresh.committed(tp)
            return found
        finally:
            fresh.close()
