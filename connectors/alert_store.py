"""Where the alert lifecycle and the silences live in Redis.

The rule engine is pure; its memory (the alert book) and the people's silences are kept here
so that a restarted or newly elected evaluator carries on where the last one stopped. The book
holds only active alerts, so the resolved ones are kept beside it, newest first and at most
``RESOLVED_KEPT`` of them: what ``/api/v1/alerts`` shows as history.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterable, Mapping
from typing import Any

from costline.connectors.redis_client import RedisClient
from costline.rules.alerts import AlertBook
from costline.rules.silences import Silence, unexpired

RESOLVED_KEPT = 1000


class AlertStore:
    def __init__(self, redis: RedisClient, namespace: str) -> None:
        self.redis = redis
        self.book_key = f"{namespace}:alerts:book"
        self.silences_key = f"{namespace}:silences"
        self.resolved_key = f"{namespace}:alerts:resolved"

    def book(self) -> AlertBook:
        raw = self.redis.get(self.book_key)
        return AlertBook.from_dict(json.loads(raw)) if raw else AlertBook()

    def save_book(self, book: AlertBook) -> None:
        self.redis.set(self.book_key, json.dumps(book.to_dict(), separators=(",", ":")))

    def record_resolved(self, changes: Iterable[Mapping[str, Any]]) -> None:
        """Keep the resolutions among an evaluation's published changes (before its book is
        saved: a crash in between publishes them again, and ``resolved`` shows one)."""
        done = [json.dumps(dict(c), separators=(",", ":")) for c in changes
                if c.get("state") == "resolved"]
        if done:
            pipe = self.redis.pipeline(transaction=False)
            pipe.lpush(self.resolved_key, *done)
            pipe.ltrim(self.resolved_key, 0, RESOLVED_KEPT - 1)
            pipe.execute()

    def resolved(self, limit: int = RESOLVED_KEPT) -> list[dict[str, Any]]:
        """The latest resolved alerts, newest first, each episode (alert and the time it
        started) once."""
        raw: list[bytes] = self.redis.lrange(self.resolved_key, 0, RESOLVED_KEPT - 1)  # type: ignore[assignment]
        seen: set[tuple[Any, Any]] = set()
        found = []
        for item in raw:
            change = json.loads(item)
            episode = (change.get("alert_id"), change.get("since"))
            if episode not in seen:
                seen.add(episode)
                found.append(change)
        return found[:limit]

    def silences(self, now: float | None = None) -> list[Silence]:
        """Silences that have not ended (expired ones are removed as a side effect)."""
        now = time.time() if now is None else now
        raw: dict[bytes, bytes] = self.redis.hgetall(self.silences_key)  # type: ignore[assignment]
        every = [Silence.from_dict(json.loads(v)) for v in raw.values()]
        live = unexpired(every, now)
        ended = [s.id for s in every if s not in live]
        if ended:
            self.redis.hdel(self.silences_key, *ended)
        return sorted(live, key=lambda s: s.ends_at)

    def add_silence(self, *, ends_at: float, rule: str | None, matchers: dict[str, str],
                    created_by: str = "", comment: str = "", starts_at: float | None = None
                    ) -> Silence:
        silence = Silence(
            id=secrets.token_hex(6), ends_at=ends_at, rule=rule, matchers=matchers,
            starts_at=time.time() if starts_at is None else starts_at,
            created_by=created_by, comment=comment,
        )
        self.redis.hset(self.silences_key, silence.id, json.dumps(silence.to_dict()))
        return silence

    def expire_silence(self, silence_id: str) -> bool:
        return bool(self.redis.hdel(self.silences_key, silence_id))
