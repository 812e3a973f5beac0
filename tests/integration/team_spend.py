"""What the tests of producers (transactional ones, clients costline did not write) send and
read back: a team's GPU-hours on one day, and each team's spend that day."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from costline.streams.settings import Settings
from costline.streams.topics import create_topics
from tests.integration.streamkit import spend_json, worker_env

DAY = 1795824000  # 2026-11-28T00:00:00Z
AT = "2026-11-28T12:00:00Z"


def gpu_hours(event_id: str, team: str, hours: float = 1.0) -> dict[str, Any]:
    """A usage event of ``hours`` GPU-hours (2.49 each in the example price book)."""
    return {"event_id": event_id, "kind": "usage", "ts": DAY + 3600, "resource_id": "node-1",
            "resource_type": "gpu.h100", "unit": "gpu_hour", "quantity": hours,
            "tags": {"team": team}}


def spend_by_team(env: dict[str, str]) -> dict[str, str]:
    report = spend_json(env, "--by", "team", "--at", AT, "--period", "day")
    return {row["group"]["team"]: row["cost"] for row in report["rows"]}


def pipeline_env(services: Any, namespace: str, partitions: int, state: Path
                 ) -> dict[str, str]:
    """A worker's environment on the namespace's topics, created with ``partitions``."""
    create_topics(Settings(kafka_bootstrap=services.bootstrap, namespace=namespace,
                           partitions=partitions))
    return worker_env(namespace, services.bootstrap, services.redis_url,
                      COSTLINE_PARTITIONS=str(partitions), COSTLINE_STATE_DIR=str(state))
