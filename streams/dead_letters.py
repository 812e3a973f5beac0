"""The dead-letter record of a refused input message (CONTRACT §2, ``NS.dlq.v1``).

The record keeps the exact bytes (``raw_b64``; also as text in ``raw`` when they are UTF-8 and
small) with where they came from and why they were refused. Its key is ``topic:partition:offset``: should a crash make the
worker refuse the same message twice, the two records share a key and a reader (or log
compaction) keeps one.
"""

from __future__ import annotations

import base64
import contextlib
import json
import time


# A readable copy of the bytes is added only for small messages: a refused 10,000-event batch
# must still fit one Kafka record (``raw_b64`` alone is 4/3 of the message).
TEXT_COPY_MAX = 256 * 1024


# A readable copy of the bytes is added only for small messages: a refused 10,000-event batch
# must still fit one Kafka record (``raw_b64`` alone is 4/3 of the message).
TEXT_COPY_MAX = 256 * 1024


def dead_letter(topic: str, partition: int, offset: int, raw: bytes | None, code: str,
                reason: str) -> tuple[bytes, bytes]:
    """(key, value) of the dead-letter record."""
    raw = raw or b""
    record: dict[str, object] = {
        "source_topic": topic,
        "partition": partition,
        "offset": offset,
        "code": code,
        "reason": reason,
        "raw_b64": base64.b64encode(raw).decode(),
        "refused_at": time.time(),
    }
    if len(raw) <= TEXT_COPY_MAX:
        with contextlib.suppress(UnicodeDecodeError):
            record["raw"] = raw.decode("utf-8")
    key = f"{topic}:{partition}:{offset}".encode()
    return key, json.dumps(record, separators=(",", ":")).encode()
