"""The dead-letter topic (``NS.dlq.v1``) read back: what the worker refused, and why.

The topic is the record of refusals (Kafka keeps it as long as its retention says); it is
read from its start, or from the first record at or after a time, to its end as it stands
when asked. A message refused twice (intake repeats a take after a crash) has two records
with one key, ``topic:partition:offset``: it is listed once.
"""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from costline.connectors.kafka import consumer
from costline.connectors.kafka_security import PLAINTEXT, KafkaSecurity
from costline.connectors.refusal_tally import dead_letter_record

READ_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class DeadLetter:
    """One refused input message: its record's key and the record (``streams.worker
    .dead_letters`` writes it)."""

    key: str
    record: Mapping[str, Any]

    @property
    def code(self) -> str:
        return str(self.record.get("code", ""))

    @property
    def refused_at(self) -> float:
        return float(self.record.get("refused_at") or 0)

    @property
    def source_topic(self) -> str:
        return str(self.record.get("source_topic", ""))

    def raw(self) -> bytes | None:
        """The message's exact bytes, or ``None`` when the record keeps only their start (a
        message over 8 MiB: its bytes are at its source offset)."""
        if self.record.get("raw_truncated"):
            return None
        try:
            return base64.b64decode(str(self.record.get("raw_b64") or ""), validate=True)
        except (binascii.Error, ValueError):
            return None


def read_dead_letters(bootstrap: str, topic: str, *, since: float | None = None,
                      security: KafkaSecurity = PLAINTEXT,
                      timeout_s: float = READ_TIMEOUT_S) -> list[DeadLetter]:
    """Every dead letter of ``topic`` (refused at or after ``since``), oldest first."""
    from kafka import TopicPartition

    client = consumer(bootstrap, security=security, enable_auto_commit=False,
                      group_id=None, consumer_timeout_ms=int(timeout_s * 1000),
                      fetch_max_wait_ms=100,  # an empty partition answers at once
                      request_timeout_ms=max(int(timeout_s * 1000) + 1000, 5000))
    try:
        partitions = [TopicPartition(topic, p)
                      for p in sorted(client.partitions_for_topic(topic) or ())]
        if not partitions:
            return []
        client.assign(partitions)
        starts = client.beginning_offsets(partitions)
        if since is not None:
            found = client.offsets_for_times({tp: int(since * 1000) for tp in partitions})
            ends = client.end_offsets(partitions)  # nothing as new: start at the end
            starts = {tp: (found[tp].offset if found.get(tp) else ends[tp]) for tp in partitions}
        for tp in partitions:
            client.seek(tp, starts[tp])
        # Each partition is read to the end its first fetch reported: some brokers answer
        # ListOffsets with less than the log holds (`costline topics check`, log_end).
        targets: dict[Any, int] = {}
        wanted = set(partitions)
        letters: dict[str, DeadLetter] = {}
        deadline = time.monotonic() + timeout_s
        while wanted and time.monotonic() < deadline:
            for messages in client.poll(timeout_ms=500).values():
                for message in messages:
                    _keep(letters, message.key, message.value, since)
            for tp in list(wanted):
                high = client.highwater(tp)  # known once a fetch of it was answered
                if high is not None and client.position(tp) >= targets.setdefault(tp, high):
                    wanted.discard(tp)
        if wanted:
            raise TimeoutError(f"the dead-letter topic {topic} was not read to its end in "
                               f"{timeout_s:g} s")
        return sorted(letters.values(), key=lambda letter: letter.refused_at)
    finally:
        client.close()


def _keep(letters: dict[str, DeadLetter], key: bytes | None, value: bytes | None,
          since: float | None) -> None:
    record = dead_letter_record(value or b"")
    if record is None:
        return
    name = key.decode(errors="replace") if key else (
        f"{record.get('source_topic')}:{record.get('partition')}:{record.get('offset')}")
    letter = DeadLetter(name, record)
    if name not in letters and (since is None or letter.refused_at >= since):
        letters[name] = letter
