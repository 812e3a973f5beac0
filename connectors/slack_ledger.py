"""What the notifier has told Slack, kept in Redis so a restart neither re-posts nor forgets.

Per alert (and period) the ledger keeps the thread: the channel and ``ts`` of the message that
every later change of the alert updates and replies under. Per thread root it keeps the latest
record of each alert the message shows (one, or several for a digest) and the notes people
added with buttons, so the root can be re-rendered from scratch.

Per change it keeps one marker per step (``root``, ``update``, ``reply``). A step is written
``pending`` just before Slack is called and ``done`` only after Slack said ok. Finding a step
still ``pending`` means an earlier process died, or lost its connection, between the call and
its answer: Slack may or may not have the message. That step is *ambiguous*. The notifier sends
it again and counts it — a possible duplicate in a thread is the price of never losing an alert.
An answer from Slack that says "not posted" (``ok: false``, 5xx, 429) clears the marker, so its
retry is not counted as ambiguous.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from redis.asyncio import Redis

DEFAULT_TTL_S = 45 * 86400
"""Longest calendar period (a month) plus margin: a thread outlives its alert's period."""


class StepState(Enum):
    FRESH = "fresh"
    DONE = "done"
    AMBIGUOUS = "ambiguous"


@dataclass(frozen=True)
class ThreadRef:
    """Where an alert's messages live: the root message's channel id and ``ts``."""

    channel: str
    ts: str


@dataclass(frozen=True)
class Member:
    """One alert shown by a root message: its latest record and the one before it."""

    thread_key: str
    record: Mapping[str, Any]
    previous: Mapping[str, Any] | None
    order: int


class SlackLedger:
    """Redis-backed; every key starts with ``{namespace}:slack:``."""

    def __init__(self, redis: Redis, namespace: str = "costline",
                 ttl_s: int = DEFAULT_TTL_S) -> None:
        self._redis = redis
        self._prefix = f"{namespace}:slack"
        self._ttl_s = ttl_s

    # ── keys ──────────────────────────────────────────────────────────────────────────────

    def _thread_key(self, thread_key: str) -> str:
        return f"{self._prefix}:thread:{thread_key}"

    def _root_key(self, ref: ThreadRef) -> str:
        return f"{self._prefix}:root:{ref.channel}:{ref.ts}"

    def _change_key(self, thread_key: str, change_key: str) -> str:
        return f"{self._prefix}:change:{thread_key}:{change_key}"

    def _counts_key(self) -> str:
        return f"{self._prefix}:counts"

    # ── threads and roots ─────────────────────────────────────────────────────────────────

    async def thread(self, thread_key: str) -> ThreadRef | None:
        raw = await self._redis.get(self._thread_key(thread_key))
        if raw is None:
            return None
        channel, ts = _text(raw).split(" ", 1)
        return ThreadRef(channel, ts)

    async def save_root(self, ref: ThreadRef, records: Mapping[str, Mapping[str, Any]]) -> None:
        """A new root message and the alerts it shows, written in one transaction."""
        root = self._root_key(ref)
        async with self._redis.pipeline(transaction=True) as pipe:
            for order, (thread_key, record) in enumerate(records.items()):
                pipe.set(self._thread_key(thread_key), f"{ref.channel} {ref.ts}", ex=self._ttl_s)
                entry = {"order": order, "record": record, "previous": None}
                pipe.hset(root, f"m:{thread_key}", json.dumps(entry))
            pipe.expire(root, self._ttl_s)
            await pipe.execute()

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
        root = self._root_key(ref)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(root, f"m:{thread_key}", json.dumps(entry))
            pipe.expire(root, self._ttl_s)
            pipe.expire(self._thread_key(thread_key), self._ttl_s)
            await pipe.execute()

    async def notes(self, ref: ThreadRef) -> list[str]:
        raw = await self._redis.hget(self._root_key(ref), "notes")
        return list(json.loads(_text(raw))) if raw else []

    async def add_note(self, ref: ThreadRef, note: str) -> list[str]:
        notes = [*await self.notes(ref), note]
        await self._redis.hset(self._root_key(ref), "notes", json.dumps(notes))
        return notes

    # ── per-change step markers ───────────────────────────────────────────────────────────

    async def begin(self, thread_key: str, change_key: str, step: str) -> StepState:
        """Claim a step before calling Slack; tells whether it was done or left in doubt."""
        key = self._change_key(thread_key, change_key)
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
        raw = await self._redis.hgetall(self._change_key(thread_key, change_key))
        return {_text(k): _text(v) for k, v in raw.items()}

    async def finish(self, thread_key: str, change_key: str, step: str, ts: str) -> None:
        """Slack said ok: the step will not be repeated."""
        await self._redis.hset(self._change_key(thread_key, change_key), step, f"done {ts}")

    async def abandon(self, thread_key: str, change_key: str, step: str) -> None:
        """Slack said no: the step is not in doubt, its retry starts clean."""
        await self._redis.hdel(self._change_key(thread_key, change_key), step)

    # ── counters ──────────────────────────────────────────────────────────────────────────

    async def count(self, name: str, by: int = 1) -> None:
        await self._redis.hincrby(self._counts_key(), name, by)

    async def counts(self) -> dict[str, int]:
        raw = await self._redis.hgetall(self._counts_key())
        return {_text(k): int(v) for k, v in raw.items()}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
