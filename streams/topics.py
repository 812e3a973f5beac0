"""The topics costline uses, as the settings name and size them.

The ledger (``NS.ledger.v1``) is costline's own: intake writes every priced event to the home
partition of its event id there (``costline.rules.ledger``). Its partition count must not
change while events may still be resent within the dedup horizon (a resend's home would
move), and it keeps records long enough for Redis to be rebuilt from its watermarks after a
restart from an old snapshot.
"""

from __future__ import annotations

from costline.connectors.kafka import (
    MAX_MESSAGE_BYTES,
    TopicSpec,
    admin,
    check_login,
    consumer,
    ensure_topics,
)
from costline.connectors.kafka_security import KafkaSecurity
from costline.streams.settings import Settings

INPUTS = ("usage", "faults")
LEDGER = "ledger"
OUTPUTS = ("alerts", "actions", "dlq")
LEDGER_RETENTION_MS = 7 * 86_400_000


def topic_specs(settings: Settings, partitions: int | None = None) -> list[TopicSpec]:
    """Input topics and the ledger get ``partitions`` (the unit of parallelism); outputs are
    low-volume."""
    wide = partitions or settings.partitions
    specs = [TopicSpec(settings.topic(name), wide) for name in INPUTS]
    specs.append(TopicSpec(settings.topic(LEDGER), wide, configs={
        "max.message.bytes": str(MAX_MESSAGE_BYTES), "cleanup.policy": "delete",
        "retention.ms": str(LEDGER_RETENTION_MS)}))
    specs += [TopicSpec(settings.topic(name), 1) for name in OUTPUTS]
    return specs


def partitions_of(settings: Settings, name: str) -> int:
    """How many partitions a topic of the namespace has (0: it does not exist)."""
    client = consumer(settings.kafka_bootstrap, security=settings.kafka_security())
    try:
        return len(client.partitions_for_topic(settings.topic(name)) or ())
    finally:
        client.close()


def create_topics(settings: Settings, partitions: int | None = None,
                  security: KafkaSecurity | None = None) -> list[str]:
    """Create the missing topics; returns the names created (idempotent). ``security``
    overrides the settings' own (for a broker other than the configured one)."""
    security = security or settings.kafka_security()
    check_login(settings.kafka_bootstrap, security)  # a refused password fails at once
    client = admin(settings.kafka_bootstrap, security=security)
    try:
        return ensure_topics(client, topic_specs(settings, partitions))
    finally:
        client.close()
