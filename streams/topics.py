"""The topics costline uses, as the settings name and size them."""

from __future__ import annotations

from costline.connectors.kafka import TopicSpec, admin, check_login, consumer, ensure_topics
from costline.connectors.kafka_security import PLAINTEXT, KafkaSecurity
from costline.streams.settings import Settings

INPUTS = ("usage", "faults")
OUTPUTS = ("alerts", "actions", "dlq")


def topic_specs(settings: Settings, partitions: int | None = None) -> list[TopicSpec]:
    """Input topics get ``partitions`` (the unit of parallelism); outputs are low-volume."""
    wide = partitions or settings.partitions
    specs = [TopicSpec(settings.topic(name), wide) for name in INPUTS]
    specs += [TopicSpec(settings.topic(name), 1) for name in OUTPUTS]
    return specs


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


def end_offsets(bootstrap: str, namespace: str, security: KafkaSecurity = PLAINTEXT
                ) -> dict[tuple[str, int], int]:
    """Where each input partition of ``namespace`` ends now: how far a worker must get."""
    from kafka import TopicPartition

    client = consumer(bootstrap, security=security)
    try:
        wanted = []
        for name in INPUTS:
            topic = f"{namespace}.{name}.v1"
            wanted += [TopicPartition(topic, p) for p in client.partitions_for_topic(topic) or ()]
        ends = client.end_offsets(wanted) if wanted else {}
        return {(tp.topic, tp.partition): offset for tp, offset in ends.items()}
    finally:
        client.close()
