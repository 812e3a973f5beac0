"""POSTing JSON to a channel the way every HTTP notifier must: retried, paced, never leaking.

A 2xx is taken. A 429, a 5xx or a connection that could not be opened is tried again after a
backoff that doubles (with jitter) and waits at least what ``Retry-After`` asks; once the tries
are spent the call raises ``Unavailable`` and the worker retries the batch later. A timeout or
a connection lost once the request was written is not tried again here: the request may have
arrived, so it is left to the ledger, which sends it again as an ambiguous step. A 429 also holds
back every later call to that host until its ``Retry-After`` has passed. Any other 4xx is the
channel saying no: ``Refused``, never retried.

``answered`` tells the ledger whether a failed call may have been acted on: a connection that
could not be opened sent nothing, an answer said no; a timeout or a connection lost after the
request was written leaves the outcome unknown.

Errors name the method and the status only: URLs can carry tokens, bodies can carry secrets.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from costline.connectors.notify import Refused, Unavailable

if TYPE_CHECKING:
    # Imported where used: every costline command loads the notifiers (their rule keys),
    # and only the worker sends.
    import aiohttp

Sleep = Callable[[float], Awaitable[None]]
MAX_WAIT_S = 3600.0


@dataclass(frozen=True)
class Answer:
    status: int
    text: str


class HttpPoster:
    """One notifier's HTTP client: a session created inside the running loop, reused."""

    def __init__(self, channel: str, *, timeout_s: float = 10.0, retries: int = 3,
                 backoff_s: float = 0.5, ceiling_s: float = 30.0,
                 sleep: Sleep = asyncio.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.channel = channel
        self._timeout_s = timeout_s
        self._retries = retries
        self._backoff_s = backoff_s
        self._ceiling_s = ceiling_s
        self._sleep = sleep
        self._clock = clock
        self._session: aiohttp.ClientSession | None = None
        self._resume_at: dict[str, float] = {}
        """Per host: no call before this (monotonic) time, the last 429's ``Retry-After``."""

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def hold_off(self, url: str) -> None:
        """Wait out the host's last ``Retry-After``."""
        delay = self._resume_at.get(_host(url), 0.0) - self._clock()
        if delay > 0:
            await self._sleep(delay)

    async def post(self, method: str, url: str, body: bytes,
                   headers: Mapping[str, str] | None = None,
                   sign: Callable[[bytes], Mapping[str, str]] | None = None,
                   secrets: tuple[str, ...] = ()) -> Answer:
        """POST ``body``; ``sign`` adds headers computed afresh for each try (a signature
        with its timestamp). ``secrets`` are blanked out of whatever the answer quotes."""
        try:
            return await self._tries(method, url, body, headers, sign)
        except (Unavailable, Refused) as exc:
            exc.error = _blanked(exc.error, secrets)
            exc.args = (_blanked(str(exc), secrets),)
            raise

    async def _tries(self, method: str, url: str, body: bytes,
                     headers: Mapping[str, str] | None,
                     sign: Callable[[bytes], Mapping[str, str]] | None) -> Answer:
        failure: Unavailable | None = None
        for attempt in range(self._retries + 1):
            await self.hold_off(url)
            if attempt:
                await self._sleep(self._backoff(attempt, failure))
            sent = {"Content-Type": "application/json", "User-Agent": "costline",
                    **(headers or {}), **(sign(body) if sign else {})}
            try:
                return await self._once(method, url, body, sent)
            except Unavailable as exc:
                if not exc.answered:
                    raise  # it may have arrived: sent again only as an ambiguous step
                failure = exc
        assert failure is not None
        raise failure

    async def _once(self, method: str, url: str, body: bytes,
                    headers: Mapping[str, str]) -> Answer:
        import aiohttp

        try:
            async with self._client().post(url, data=body, headers=dict(headers),
                                           allow_redirects=False) as response:
                text = (await response.text(errors="replace"))[:500]
                status = response.status
                retry_after = _retry_after(response.headers.get("Retry-After"))
        except aiohttp.ClientConnectorError as exc:
            raise Unavailable(method, type(exc).__name__, None, channel=self.channel) from None
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise Unavailable(method, type(exc).__name__, None, answered=False,
                              channel=self.channel) from None
        if 200 <= status < 300:
            return Answer(status, text)
        if status == 429 or status >= 500:
            error = Unavailable(method, _reason(text), status, channel=self.channel,
                                retry_after=retry_after)
            if status == 429:
                wait = retry_after if retry_after is not None else self._backoff_s
                host = _host(url)
                self._resume_at[host] = max(self._resume_at.get(host, 0.0),
                                            self._clock() + wait)
            raise error
        raise Refused(method, _reason(text), status, channel=self.channel)

    def _backoff(self, attempt: int, failure: Unavailable | None) -> float:
        """Doubling with jitter, at least what the last answer's ``Retry-After`` asked."""
        delay: float = min(self._ceiling_s, self._backoff_s * 2.0 ** (attempt - 1))
        delay *= 1.0 + random.random()
        asked = failure.retry_after if failure is not None else None
        return max(delay, asked) if asked is not None else delay

    def _client(self) -> aiohttp.ClientSession:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self._timeout_s))
        return self._session


def _retry_after(value: str | None) -> float | None:
    """``Retry-After`` in seconds, given as seconds or as an HTTP date; None if absent or
    unreadable."""
    if not value:
        return None
    try:
        return max(0.0, min(float(value.strip()), MAX_WAIT_S))
    except ValueError:
        pass
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return max(0.0, min((moment - datetime.now(UTC)).total_seconds(), MAX_WAIT_S))


def _reason(text: str) -> str:
    """What the channel said, on one short line (its own words, never ours)."""
    return " ".join(text.split())[:200] or "no reason given"


def _blanked(text: str, secrets: tuple[str, ...]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def _host(url: str) -> str:
    return urlsplit(url).netloc
