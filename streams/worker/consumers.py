"""The worker's plain aiokafka consumers (intake's on the input topics, the aggregation's on
the ledger), as the settings make them: brokers, credentials, group timeouts, fetch sizes."""

from __future__ import annotations

from typing import Any

from aiokafka import AIOKafkaConsumer

from costline.streams.settings import Settings


def group_consumer(settings: Settings, group: str, **options: Any) -> AIOKafkaConsumer:
    """A consumer in ``group`` that commits only when told to and starts a partition the
    group never committed at its beginning; ``options`` are aiokafka's."""
    return AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=group,
        client_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=settings.fetch_bytes,
        session_timeout_ms=int(settings.kafka_session_timeout_s * 1000),
        heartbeat_interval_ms=int(min(3.0, settings.kafka_session_timeout_s / 3) * 1000),
        rebalance_timeout_ms=int(settings.kafka_rebalance_timeout_s * 1000),
        **options,
        **settings.kafka_security().client_kwargs(),
    )
