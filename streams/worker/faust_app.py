"""The worker's Faust app, as the settings make it: brokers, credentials, and the few knobs of
Faust's that the worker's load needs; and Faust's worker that runs it, its stop bounded."""

from __future__ import annotations

import threading
from typing import Any

import faust

from costline.connectors.kafka import MAX_MESSAGE_BYTES, WORKER_COMPRESSION
from costline.streams.settings import Settings
from costline.streams.worker import stop_deadline


def faust_broker(bootstrap: str) -> list[str]:
    return [f"kafka://{server.strip()}" for server in bootstrap.split(",") if server.strip()]


def faust_app(settings: Settings) -> faust.App:
    """The worker's Faust app: the notifiers, timers, pages, and the producer intake sends
    the ledger with."""
    datadir = settings.state_dir / "faust" / settings.namespace
    datadir.parent.mkdir(parents=True, exist_ok=True)  # Faust creates only the last level
    return faust.App(
        settings.app_group,
        broker=faust_broker(settings.kafka_bootstrap),
        # TLS and SASL for Faust's consumer, producer and topic creation alike.
        broker_credentials=settings.kafka_security().faust_credentials(),
        store="memory://",
        datadir=str(datadir),
        web_port=settings.web_port,
        web_host="0.0.0.0",
        autodiscover=False,
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=settings.kafka_session_timeout_s,
        broker_heartbeat_interval=min(3.0, settings.kafka_session_timeout_s / 3),
        broker_rebalance_timeout=settings.kafka_rebalance_timeout_s,
        topic_partitions=settings.partitions,
        topic_allow_declare=True,
        producer_acks=-1,
        producer_compression_type=WORKER_COMPRESSION,
        # A take's ledger records and dead letters are sent together.
        producer_linger_ms=5,
        # The dead letter of a refused 10,000-event batch is a few MiB (topics allow 16 MiB).
        producer_max_request_size=MAX_MESSAGE_BYTES,
        # Compressed bytes fetched ahead per partition: Kafka's own 1 MiB, not Faust's 4 MiB.
        consumer_max_fetch_size=settings.fetch_bytes,
        web_in_thread=False,
    )


class Worker(faust.Worker):
    """Faust's worker, its stop bounded by ``stop_timeout_s`` (``None``: Faust's own stop)."""

    def __init__(self, *services: Any, stop_timeout_s: float | None = None,
                 **options: Any) -> None:
        super().__init__(*services, **options)
        self.stop_timeout_s = stop_timeout_s
        self.deadline: threading.Timer | None = None

    async def on_stop(self) -> None:
        # The first step of every stop (mode's ``Service.stop``): asked for (SIGTERM,
        # Ctrl-C), after a crash, or after a failed start, before any child stops.
        if self.stop_timeout_s is not None and self.deadline is None:
            self.deadline = stop_deadline.arm(self.stop_timeout_s)
        await super().on_stop()

    def start_again(self) -> None:
        """The command will start the worker again (``os.execv``), after waiting as long as
        it takes: the stop's deadline no longer applies."""
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None
