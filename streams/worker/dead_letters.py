"""The dead-letter record of a refused input message (``NS.dlq.v1``).

The record keeps the exact bytes (``raw_b64``; also as text in ``raw`` when they are UTF-8 and
small) with where they came from and why they were refused. Its key is
``topic:partition:offset``: should a crash make the worker refuse the same message twice, the
two records share a key and a reader (or log compaction) keeps one.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import time

# A readable copy of the bytes is added only for small messages, and the bytes themselves only
# up to 8 MiB (``raw_b64`` is 4/3 of them): the record must fit one Kafka record, or the
# worker could never send it. A larger message is described by its size, its SHA-256 and its
# first 64 KiB; its bytes stay in the source topic at the offset the record names.
TEXT_COPY_MAX = 256 * 1024
FULL_COPY_MAX = 8 * 1024 * 1024
PREFIX_BYTES = 64 * 1024


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
        "raw_b64": base64.b64encode(raw[:PREFIX_BYTES] if len(raw) > FULL_COPY_MAX
                                    else raw).decode(),
        "refused_at": time.time(),
    }
    if len(raw) > FULL_COPY_MAX:
        record.update(raw_truncated=True, raw_size=len(raw),
                      raw_sha256=hashlib.sha256(raw).hexdigest())
    if len(raw) <= TEXT_COPY_MAX:
        with contextlib.suppress(UnicodeDecodeError):
            record["raw"] = raw.decode("utf-8")
    key = f"{topic}:{partition}:{offset}".encode()
    return key, json.dumps(record, separators=(",", ":")).encode()
