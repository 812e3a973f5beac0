"""The tally of refused input in Redis: what each hour's refused messages held, by reason
(``costline.rules.refusals``), and which dead letters it counts.

Intake counts each dead letter it sends; ``costline dead-letters replay`` takes a dead letter's
counts back out when it re-sends its message (which is then counted in the totals, or refused
and counted here again under its new dead letter). Each dead letter is counted at most once
and taken out at most once, whatever repeats: intake may send a dead letter twice after a
crash, and a replay may be run again. One script call changes a dead letter's state and its
hours' counts together.

Keys (``R`` = ``{NS:refused}``, one hash slot so the script works on a Redis Cluster;
refusals are rare, so one slot holds them easily):

| key | type | holds |
|---|---|---|
| ``R:h:<hour>`` | hash | ``<reason>\\t<m\\|e\\|c>``, ``<reason>\\tq\\t<type>\\t<unit>`` → |
| | | the amount |
| ``R:l:<day>`` | hash | dead letter key (``topic:partition:offset``) refused that UTC day → |
| | | ``counted`` or ``replayed`` |

Both are kept for 400 days after their last change, as daily spend buckets are.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any

from costline.connectors.redis_client import RedisClient
from costline.connectors.redis_keys import Retention
from costline.rules.refusals import HOUR_S, Refused, by_reason, hourly_counts, negated

COUNTED, REPLAYED = "counted", "replayed"
DAY_S = 86400
# KEYS: the dead letter's day hash, then its hours' hashes. ARGV: the dead letter's key, the
# state it must be in ("" for none), its new state, the keys' lifetime, then per hour hash
# the number of its fields and those (field, increment) pairs. Returns the state found.
_SCRIPT = """
local found = redis.call('HGET', KEYS[1], ARGV[1]) or ''
if found ~= ARGV[2] then return found end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[4])
local at = 5
for i = 2, #KEYS do
  local n = tonumber(ARGV[at])
  at = at + 1
  for _ = 1, n do
    redis.call('HINCRBY', KEYS[i], ARGV[at], ARGV[at + 1])
    at = at + 2
  end
  redis.call('EXPIRE', KEYS[i], ARGV[4])
end
return found
"""


class RefusalTally:
    """Counts dead letters in, takes replayed ones out, and reads a period's tally."""

    def __init__(self, redis: RedisClient, namespace: str) -> None:
        self.redis = redis
        self.prefix = f"{{{namespace}:refused}}"
        self._script = redis.register_script(_SCRIPT)

    def count(self, key: bytes | str, record: Mapping[str, Any]) -> bool:
        """Count a dead letter (its record as ``NS.dlq.v1`` holds it); ``False`` when it was
        counted (or replayed) before."""
        counts = _counts_of(record)
        return self._change(key, record, "", COUNTED, counts) == ""

    def replayed(self, key: bytes | str, record: Mapping[str, Any]) -> str:
        """Take a dead letter whose message was sent again out of the tally; returns the state
        it was in (``counted``, ``replayed``, or ``""`` when it was never counted, which is
        then marked replayed too)."""
        found = self._change(key, record, COUNTED, REPLAYED, negated(_counts_of(record)))
        if found == "":
            self._change(key, record, "", REPLAYED, {})
        return found

    def state(self, key: bytes | str, record: Mapping[str, Any]) -> str:
        """``counted``, ``replayed`` or ``""`` (never counted)."""
        found = self.redis.hget(self._letters(record), _text(key))
        return _text(found) if found is not None else ""

    def read(self, start: float, end: float) -> dict[str, Refused]:
        """What was refused, by reason, in the hours starting in [start, end)."""
        first = int(start) // HOUR_S * HOUR_S
        hours = [h for h in range(first, int(end), HOUR_S) if h >= start]
        pipe = self.redis.pipeline(transaction=False)
        for hour in hours:
            pipe.hgetall(f"{self.prefix}:h:{hour}")
        sums: dict[str, int] = {}
        for fields in pipe.execute():
            for name, value in fields.items():
                text = _text(name)
                sums[text] = sums.get(text, 0) + int(value)
        return by_reason(sums.items())

    def _change(self, key: bytes | str, record: Mapping[str, Any], expected: str, to: str,
                counts: Mapping[int, Mapping[str, int]]) -> str:
        keys = [self._letters(record)]
        args: list[Any] = [_text(key), expected, to, Retention.day]
        for hour, fields in sorted(counts.items()):
            keys.append(f"{self.prefix}:h:{hour}")
            args.append(len(fields))
            for name, value in sorted(fields.items()):
                args += [name, value]
        return _text(self._script(keys=keys, args=args))

    def _letters(self, record: Mapping[str, Any]) -> str:
        day = int(float(record.get("refused_at") or 0) // DAY_S) * DAY_S
        return f"{self.prefix}:l:{day}"


def _counts_of(record: Mapping[str, Any]) -> dict[int, dict[str, int]]:
    """The tally's increments of a dead letter, from its own record: the bytes it keeps (a
    prefix only of a message over 8 MiB, which then counts as unreadable), its reason and
    when it was refused."""
    try:
        raw = base64.b64decode(str(record.get("raw_b64") or ""), validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if record.get("raw_truncated"):
        raw = b""
    return hourly_counts(raw, str(record.get("code") or "unknown"),
                         float(record.get("refused_at") or 0))


def dead_letter_record(value: bytes) -> dict[str, Any] | None:
    """A dead letter's record from its Kafka value, or ``None`` if it is not one."""
    try:
        record = json.loads(value)
    except (ValueError, UnicodeDecodeError):
        return None
    return record if isinstance(record, dict) and "code" in record else None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
