"""What a notifier has told its channel, kept in Redis so a restart neither re-sends nor forgets.

One ledger per channel (Slack, email, PagerDuty, ...). Per alert (and period) it keeps the
thread: where the alert's first message went and the reference every later change of the alert
follows up on (a Slack channel and message ``ts``, an email's ``Message-ID``). Per thread root
it keeps the latest record of each alert the root shows (one, or several for a digest) and the
notes people added, so the root can be re-rendered from scratch.

Per change it keeps one marker per step (``root``, ``update``, ``reply``). A step is written
``pending`` just before the channel is called and ``done`` only after it accepted. Finding a
step still ``pending`` means an earlier process died, or lost its connection, between the call
and its answer: the channel may or may not have the message. That step is *ambiguous*. The
notifier sends it again and counts it — a possible duplicate is the price of never losing an
alert. An answer that says "not taken" (a refusal, a 5xx, a 429) clears the marker, so its
retry is not counted as ambiguous.

Per alert it also keeps, for channels that must be told again and again that an alert still
fires (Alertmanager forgets an alert it has not heard of for a while), the alerts now open
and when each was last sent.

Every key of a channel shares the hash tag ``{NS:CHANNEL}``, so on a Redis Cluster a ledger
lives in one slot and a root is written with its alerts' threads in one atomic script. Slack
keys an earlier version wrote without the tag (``NS:slack:...``, only ever on a single Redis)
are renamed to their tagged names when first used, so an upgrade neither re-posts nor forgets
a thread.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.exceptions import ResponseError

from costline.connectors.redis_client import AsyncRedisClient

DEFAULT_TTL_S = 45 * 86400
"""Longest calendar period (a month) plus margin: a thread outlives its alert's period."""

# KEYS: the root, then the thread of each alert it shows
# ARGV: ttl, "<destination> <ref>", then per thread its member field and entry
_SAVE_ROOT = """
local ttl = tonumber(ARGV[1])
for i = 2, #KEYS do
  redis.call('SET', KEYS[i], ARGV[2], 'EX', ttl)
  redis.call('HSET', KEYS[1], ARGV[2 * i - 1], ARGV[2 * i])
end
redis.call('EXPIRE', KEYS[1], ttl)
"""

# KEYS: root, thread  ARGV: ttl, member field, entry
_SET_MEMBER = """
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[1])
"""

# KEYS: open alerts, their send times  ARGV: thread key, time
# Only an alert still open is stamped: one closed meanwhile stays closed.
_STAMP = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
  return 1
end
return 0
"""


class StepState(Enum):
    FRESH = "fresh"
    DONE = "done"
    AMBIGUOUS = "ambiguous"


@dataclass(frozen=True)
class ThreadRef:
    """Where an alert's messages live: the root's destination (a Slack channel id, the email
    recipients, a URL) and its reference there (a message ``ts``, a ``Message-ID``)."""

    destination: str
    ref: str


@dataclass(frozen=True)
class Member:
    """One alert shown by a root message: its latest record and the one before it."""

    thread_key: str
    record: Mapping[str, Any]
    previous: Mapping[str, Any] | None
    order: int


@dataclass(frozen=True)
class OpenAlert:
    """An alert a channel must be reminded of while it fires: its latest record and when it
    was last sent (Unix seconds)."""

    thread_key: str
    record: Mapping[str, Any]
    sent_at: float


class DeliveryLedger:
    """Redis-backed; every key starts with ``{namespace:channel}:``."""

    def __init__(self, redis: AsyncRedisClient, namespace: str = "costline",
                 channel: str = "slack", ttl_s: int = DEFAULT_TTL_S) -> None:
        self._redis = redis
        self.channel = channel
        self._prefix = f"{{{namespace}:{channel}}}"
        self._legacy_prefix = (f"{namespace}:slack" if channel == "slack"
                               and not isinstance(redis, AsyncRedisCluster) else None)
        self._ttl_s = ttl_s
        self._counts_adopted = False
        self._save_root = redis.register_script(_SAVE_ROOT)
        self._set_member = redis.register_script(_SET_MEMBER)
        self._stamp = redis.register_script(_STAMP)

    def __repr__(self) -> str:
        return f"DeliveryLedger({self._prefix})"

    # ── keys ──────────────────────────────────────────────────────────────────────────────

    def _thread_key(self, thread_key: str) -> str:
        return f"{self._prefix}:thread:{thread_key}"

    def _root_key(self, ref: ThreadRef) -> str:
        return f"{self._prefix}:root:{ref.destination}:{ref.ref}"

    def _change_key(self, thread_key: str, change_key: str) -> str:
        return f"{self._prefix}:change:{thread_key}:{change_key}"

    def _counts_key(self) -> str:
        return f"{self._prefix}:counts"

    def _open_key(self) -> str:
        return f"{self._prefix}:open"

    def _sent_key(self) -> str:
        return f"{self._prefix}:sent"

    async def _adopt(self, key: str) -> bool:
        """Rename the untagged key an earlier version wrote for ``key``, if there is one and
        ``key`` is not taken; True if it was."""
        if self._legacy_prefix is None:
            return False
        legacy = self._legacy_prefix + key[len(self._prefix):]
        try:
            return bool(await self._redis.renamenx(legacy, key))
        except ResponseError:  # no such key: nothing to adopt
            return False

    # ── threads and roots ─────────────────────────────────────────────────────────────────

    async def thread(self, thread_key: str) -> ThreadRef | None:
        key = self._thread_key(thread_key)
        raw = await self._redis.get(key)
        if raw is None and await self._adopt(key):
            raw = await self._redis.get(key)
            if raw is not None:
                await self._adopt(self._root_key(_ref(raw)))
        return None if raw is None else _ref(raw)

    async def save_root(self, ref: ThreadRef, records: Mapping[str, Mapping[str, Any]]) -> None:
        """A new root message and the alerts it shows, written in one atomic script."""
        keys = [self._root_key(ref)]
        args: list[str | int] = [self._ttl_s, f"{ref.destination} {ref.ref}"]
        for order, (thread_key, record) in enumerate(records.items()):
            keys.append(self._thread_key(thread_key))
            entry = {"order": order, "record": record, "previous": None}
            args += [f"m:{thread_key}", json.dumps(entry)]
        await self._save_root(keys=keys, args=args)

    async def members(self, ref: ThreadRef) -> list[Member]:
        """The alerts a root shows, in the order they were first posted."""
        raw = await self._redis.hgetall(self._root_key(ref))
        found = []
        for field, value in raw.items():
            name = _text(field)
            if name.startswith("m:"):
                entry = json.loads(_text(value))
                found.append(Member(name[2:], entry["record"], entry["previous"],
                                    entry["order"]))
        return sorted(found, key=lambda m: m.order)

    async def set_member(self, ref: ThreadRef, thread_key: str, record: Mapping[str, Any],
                         previous: Mapping[str, Any] | None, order: int) -> None:
        entry = {"order": order, "record": record, "previous": previous}
        await self._set_member(keys=[self._root_key(ref), self._thread_key(thread_key)],
                               args=[self._ttl_s, f"m:{thread_key}", json.dumps(entry)])

    async def field(self, ref: ThreadRef, name: str) -> str | None:
        """A fact a channel keeps about a root (an email's subject)."""
        raw = await self._redis.hget(self._root_key(ref), f"f:{name}")
        return None if raw is None else _text(raw)

    async def set_field(self, ref: ThreadRef, name: str, value: str) -> None:
        await self._redis.hset(self._root_key(ref), f"f:{name}", value)

    async def notes(self, ref: ThreadRef) -> list[str]:
        raw = await self._redis.hget(self._root_key(ref), "notes")
        return list(json.loads(_text(raw))) if raw else []

    async def add_note(self, ref: ThreadRef, note: str) -> list[str]:
        notes = [*await self.notes(ref), note]
        await self._redis.hset(self._root_key(ref), "notes", json.dumps(notes))
        return notes

    # ── per-change step markers ───────────────────────────────────────────────────────────

    async def begin(self, thread_key: str, change_key: str, step: str) -> StepState:
        """Claim a step before calling the channel; tells whether it was done or left in
        doubt."""
        key = self._change_key(thread_key, change_key)
        await self._adopt(key)
        claimed = await self._redis.hsetnx(key, step, f"pending {time.time():.3f}")
        if claimed:
            await self._redis.expire(key, self._ttl_s)
            return StepState.FRESH
        marker = _text(await self._redis.hget(key, step) or b"pending")
        if marker.startswith("done"):
            return StepState.DONE
        await self.count("ambiguous")
        return StepState.AMBIGUOUS

    async def steps(self, thread_key: str, change_key: str) -> dict[str, str]:
        """The markers of a change's steps, to recognise a change already delivered."""
        key = self._change_key(thread_key, change_key)
        await self._adopt(key)
        raw = await self._redis.hgetall(key)
        return {_text(k): _text(v) for k, v in raw.items()}

    async def finish(self, thread_key: str, change_key: str, step: str, ref: str) -> None:
        """The channel accepted: the step will not be repeated."""
        await self._redis.hset(self._change_key(thread_key, change_key), step, f"done {ref}")

    async def abandon(self, thread_key: str, change_key: str, step: str) -> None:
        """The channel said no: the step is not in doubt, its retry starts clean."""
        await self._redis.hdel(self._change_key(thread_key, change_key), step)

    # ── alerts to remind the channel of ───────────────────────────────────────────────────

    async def keep_open(self, thread_key: str, record: Mapping[str, Any],
                        sent_at: float) -> None:
        """The alert fires, and its latest record was sent at ``sent_at``."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hset(self._open_key(), thread_key, json.dumps(record))
            pipe.hset(self._sent_key(), thread_key, f"{sent_at:.3f}")
            await pipe.execute()

    async def stamp(self, thread_key: str, sent_at: float) -> bool:
        """A reminder was sent at ``sent_at``; False when the alert was closed meanwhile."""
        return bool(await self._stamp(keys=[self._open_key(), self._sent_key()],
                                      args=[thread_key, f"{sent_at:.3f}"]))

    async def close(self, thread_key: str) -> None:
        """The alert no longer fires (resolved, or muted): no more reminders."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hdel(self._open_key(), thread_key)
            pipe.hdel(self._sent_key(), thread_key)
            await pipe.execute()

    async def open_alerts(self) -> list[OpenAlert]:
        records = await self._redis.hgetall(self._open_key())
        sent = {_text(k): float(v) for k, v in (await self._redis.hgetall(self._sent_key())
                                                ).items()}
        found = [OpenAlert(_text(k), json.loads(_text(v)), sent.get(_text(k), 0.0))
                 for k, v in records.items()]
        return sorted(found, key=lambda alert: alert.thread_key)

    # ── counters ──────────────────────────────────────────────────────────────────────────

    async def count(self, name: str, by: int = 1) -> None:
        await self._adopt_counts()
        await self._redis.hincrby(self._counts_key(), name, by)

    async def counts(self) -> dict[str, int]:
        await self._adopt_counts()
        raw = await self._redis.hgetall(self._counts_key())
        return {_text(k): int(v) for k, v in raw.items()}

    async def _adopt_counts(self) -> None:
        if not self._counts_adopted:
            await self._adopt(self._counts_key())
            self._counts_adopted = True


def _ref(raw: Any) -> ThreadRef:
    destination, ref = _text(raw).split(" ", 1)
    return ThreadRef(destination, ref)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
