"""Webhook: ask a platform's release API to free the resource, with a signed JSON request.

The body is the plan as JSON. It is signed like Slack and Stripe sign theirs: HMAC-SHA256
with a shared secret over ``timestamp + "." + body``, sent as ``X-Costline-Timestamp`` (Unix
seconds) and ``X-Costline-Signature: v1=<hex>``; the receiver recomputes it and refuses a
stale timestamp. ``Idempotency-Key`` carries the plan id, so a receiver can ignore a repeat.

The secret lives in the environment variable named by ``secret_env`` (default
``COSTLINE_WEBHOOK_SECRET``): never in the rule file,
never in a log line or an action record. A 2xx answer is a release; 5xx, a timeout or a
refused connection is retried with exponential backoff (each try signed afresh); a 4xx is the
platform saying no, and is not retried.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import AnyHttpUrl, Field

from costline.connectors.params import EnvName, Seconds
from costline.connectors.reclaim import (
    NotReclaimable,
    ReclaimConnector,
    Sleep,
    backoff_delays,
    real_sleep,
    reclaimer,
    secret_from_env,
)
from costline.connectors.signature import sign
from costline.rules.durations import rfc3339
from costline.rules.findings import ReclaimRequest
from costline.rules.reclaim import Outcome, Plan
from costline.rules.reclaim_params import ReclaimParams

if TYPE_CHECKING:
    import aiohttp

DEFAULT_SECRET_ENV = "COSTLINE_WEBHOOK_SECRET"
MAX_REASON = 200


class WebhookParams(ReclaimParams):
    """A platform's release API: the plan is POSTed as signed JSON."""

    url: AnyHttpUrl = Field(description="the platform's release API")
    secret_env: EnvName = Field(
        DEFAULT_SECRET_ENV, description="environment variable holding the signing secret"
    )
    timeout: Seconds = Field(10, json_schema_extra={"default": "10s"}, description="per try")
    retries: int = Field(
        3, ge=0, le=10,
        description="tries after the first, on 5xx, timeouts and refused connections",
    )
    backoff: Seconds = Field(
        1, json_schema_extra={"default": "1s"},
        description="wait before the first retry; doubles each time (at most 30s)",
    )


def body_of(plan: Plan) -> bytes:
    """What the platform receives: enough to find the resource and to audit the request."""
    data: dict[str, Any] = {
        "action": "release", "plan_id": plan.plan_id, "rule": plan.rule,
        "resource_id": plan.resource_id, "resource_type": plan.resource_type,
        "tags": dict(plan.tags), "idle_since": rfc3339(plan.idle_since),
        "planned_at": rfc3339(plan.planned_at), "execute_at": rfc3339(plan.execute_at),
        "mode": plan.mode,
    }
    return json.dumps(data, separators=(",", ":"), sort_keys=True).encode()


class Retry(Exception):
    """An answer worth trying again (5xx, timeout, no connection); ``unanswered`` when the
    request was sent and no answer came (the platform may have acted on it)."""

    def __init__(self, reason: str, unanswered: bool = False) -> None:
        super().__init__(reason)
        self.unanswered = unanswered


@reclaimer("webhook")
class WebhookReclaimer(ReclaimConnector):
    """POSTs the plan, signed, to the platform's release API; retries 5xx with backoff.

    ```yaml
    rules:
      - name: idle-notebooks
        kind: idle
        match: {resource_type: "gpu.*", stage: dev}
        below: 0.05
        for: 1h
        reclaim:
          connector: webhook
          url: https://platform.example.com/release
          secret_env: PLATFORM_RELEASE_SECRET
          approval: manual
    ```
    """

    params_model = WebhookParams

    def __init__(self, environ: Mapping[str, str] | None = None, sleep: Sleep = real_sleep,
                 clock: Callable[[], float] = time.time) -> None:
        self._environ = environ
        self._sleep = sleep
        self._clock = clock

    async def identify(self, request: ReclaimRequest) -> dict[str, str]:
        params = WebhookParams.model_validate(request.params)
        secret_from_env(params.secret_env, self._environ)
        return {"url": str(params.url)}

    def describe(self, plan: Plan) -> str:
        return f"POST a release request for {plan.resource_id} to {plan.target.get('url', '?')}"

    async def release(self, plan: Plan) -> Outcome:
        params = WebhookParams.model_validate(plan.params)
        try:
            secret = secret_from_env(params.secret_env, self._environ)
        except NotReclaimable as exc:
            return Outcome("failed", exc.reason)
        return await self.post_signed(str(params.url), secret, plan.plan_id, body_of(plan),
                                      timeout=params.timeout, retries=params.retries,
                                      backoff=params.backoff)

    async def post_signed(self, url: str, secret: str, key: str, body: bytes, *,
                          timeout: float, retries: int, backoff: float) -> Outcome:
        """POST ``body`` signed, with ``key`` as its idempotency key; 5xx and no answer are
        retried with backoff. Budget enforcement's webhook sends its requests through this."""
        call = _Call(url, secret, key, body)
        import aiohttp  # here, not at the top: every costline command loads the connectors

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
            return await self._post_with_retries(session, call, retries, backoff)

    async def _post_with_retries(self, session: aiohttp.ClientSession, call: _Call,
                                 retries: int, backoff: float) -> Outcome:
        delays = backoff_delays(retries, backoff)
        problem, unanswered = "", False
        for attempt in range(retries + 1):
            if attempt:
                await self._sleep(delays[attempt - 1])
            try:
                return await self._post(session, call, attempt + 1)
            except Retry as exc:
                problem = str(exc)
                unanswered = unanswered or exc.unanswered
        maybe = ("; a request went unanswered, so it may have acted: check the target (the "
                 "Idempotency-Key is the plan id)") if unanswered else ""
        return Outcome("failed", f"release API did not accept after {retries + 1} "
                       f"tries: {problem}{maybe}", {"attempts": retries + 1})

    async def _post(self, session: aiohttp.ClientSession, call: _Call, attempt: int) -> Outcome:
        import aiohttp  # here, not at the top: every costline command loads the connectors

        timestamp = str(int(self._clock()))
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "costline-reclaim",
            "Idempotency-Key": call.plan_id,
            "X-Costline-Timestamp": timestamp,
            "X-Costline-Signature": sign(call.secret, timestamp, call.body),
        }
        try:
            async with session.post(call.url, data=call.body, headers=headers,
                                    allow_redirects=False) as response:
                text = (await response.text(errors="replace"))[:MAX_REASON]
                status = response.status
        except TimeoutError as exc:  # sent, and no answer in time (aiohttp's own included)
            raise Retry(type(exc).__name__, unanswered=True) from None
        except aiohttp.ClientError as exc:
            raise Retry(type(exc).__name__) from None
        if status >= 500:
            raise Retry(f"HTTP {status}")
        detail = {"http_status": status, "attempts": attempt}
        if not 200 <= status < 300:
            return Outcome("failed", f"release API refused: HTTP {status} {text}".strip(), detail)
        return Outcome("executed", f"release API accepted: HTTP {status}", detail)


@dataclass(frozen=True)
class _Call:
    url: str
    secret: str = field(repr=False)
    plan_id: str
    body: bytes
