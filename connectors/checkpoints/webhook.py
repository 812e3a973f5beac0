"""Webhook: ask the tool that owns the checkpoints (an object store's lifecycle service, an
internal API) to move or delete one, with a signed JSON request.

Signed as reclamation's webhook is (``costline.connectors.reclaim.webhook``): HMAC-SHA256 with
a shared secret over ``timestamp + "." + body`` in ``X-Costline-Signature: v1=<hex>``, the
timestamp in ``X-Costline-Timestamp``, the plan id in ``Idempotency-Key``. The secret lives in
the environment variable ``secret_env`` names. A 2xx answer is done (a JSON answer may name
the moved checkpoint's new ``location``); 5xx, a timeout or a refused connection is retried
with backoff; a 4xx is the owner saying no (it found the checkpoint in use, say): not retried.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import AnyHttpUrl, Field

from costline.connectors.checkpoints import (
    CheckpointConnector,
    NotReclaimable,
    checkpoint_connector,
)
from costline.connectors.params import EnvName, Seconds
from costline.connectors.reclaim import (
    Sleep,
    backoff_delays,
    real_sleep,
    secret_from_env,
)
from costline.connectors.reclaim.webhook import DEFAULT_SECRET_ENV, MAX_REASON
from costline.connectors.signature import sign
from costline.rules.durations import rfc3339
from costline.rules.lifecycle import LifecycleAction
from costline.rules.lifecycle_params import CheckpointParams
from costline.rules.reclaim import Outcome, Plan


class CheckpointWebhookParams(CheckpointParams):
    """The checkpoint owner's API: each move or deletion is POSTed as signed JSON."""

    url: AnyHttpUrl = Field(description="the API that moves and deletes checkpoints")
    secret_env: EnvName = Field(DEFAULT_SECRET_ENV,
                                description="environment variable holding the signing secret")
    timeout: Seconds = Field(10, json_schema_extra={"default": "10s"}, description="per try")
    retries: int = Field(3, ge=0, le=10, description="tries after the first, on 5xx, "
                         "timeouts and refused connections")
    backoff: Seconds = Field(1, json_schema_extra={"default": "1s"}, description="wait "
                             "before the first retry; doubles each time (at most 30s)")


def body_of(plan: Plan) -> bytes:
    """What the owner receives: the action, the checkpoint and the plan, to audit it."""
    target = plan.target
    data: dict[str, Any] = {
        "action": target.get("action"), "plan_id": plan.plan_id, "rule": plan.rule,
        "checkpoint_id": plan.resource_id, "run": target.get("run"),
        "step": int(target.get("step") or 0), "bytes": int(target.get("bytes") or 0),
        "location": target.get("location"), "tier": target.get("tier"),
        "to_tier": target.get("to_tier") or None, "planned_at": rfc3339(plan.planned_at),
        "execute_at": rfc3339(plan.execute_at), "mode": plan.mode,
    }
    return json.dumps(data, separators=(",", ":"), sort_keys=True).encode()


class _Retry(Exception):
    """An answer worth trying again."""


@checkpoint_connector("webhook")
class WebhookCheckpoints(CheckpointConnector):
    """POSTs each move or deletion, signed, to the checkpoints' owner; retries 5xx.

    ```yaml
    rules:
      - name: object-store-retention
        kind: checkpoint_lifecycle
        match: {stage: posttrain}
        keep_last: 2
        cold_after: 3d
        cold_tier: storage.archive
        expire_after: 30d
        act:
          connector: webhook
          url: https://storage.example.com/checkpoints/lifecycle
          secret_env: CHECKPOINT_API_SECRET
          approval: manual
        mode: live
    ```
    """

    params_model = CheckpointWebhookParams

    def __init__(self, environ: Mapping[str, str] | None = None, sleep: Sleep = real_sleep,
                 clock: Callable[[], float] = time.time) -> None:
        self._environ = environ
        self._sleep = sleep
        self._clock = clock

    async def identify(self, action: LifecycleAction, params: Mapping[str, Any]
                       ) -> dict[str, str]:
        found = CheckpointWebhookParams.model_validate(params)
        secret_from_env(found.secret_env, self._environ)
        return {"url": str(found.url)}

    async def act(self, plan: Plan) -> Outcome:
        params = CheckpointWebhookParams.model_validate(plan.params)
        try:
            secret = secret_from_env(params.secret_env, self._environ)
        except NotReclaimable as exc:
            return Outcome("failed", exc.reason)
        import aiohttp  # here: every costline command loads the connectors

        body = body_of(plan)
        delays = backoff_delays(params.retries, params.backoff)
        problem = ""
        async with aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=params.timeout)) as session:
            for attempt in range(params.retries + 1):
                if attempt:
                    await self._sleep(delays[attempt - 1])
                try:
                    return await self._post(session, str(params.url), secret, plan, body,
                                            attempt + 1)
                except _Retry as exc:
                    problem = str(exc)
        return Outcome("failed", f"the API did not accept after {params.retries + 1} tries: "
                       f"{problem}", {"attempts": params.retries + 1})

    async def _post(self, session: Any, url: str, secret: str, plan: Plan, body: bytes,
                    attempt: int) -> Outcome:
        import aiohttp

        timestamp = str(int(self._clock()))
        headers = {"Content-Type": "application/json", "User-Agent": "costline-checkpoints",
                   "Idempotency-Key": plan.plan_id, "X-Costline-Timestamp": timestamp,
                   "X-Costline-Signature": sign(secret, timestamp, body)}
        try:
            async with session.post(url, data=body, headers=headers,
                                    allow_redirects=False) as response:
                text = (await response.text(errors="replace"))[:MAX_REASON]
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _Retry(type(exc).__name__) from None
        if status >= 500:
            raise _Retry(f"HTTP {status}")
        detail: dict[str, Any] = {"http_status": status, "attempts": attempt}
        if not 200 <= status < 300:
            return Outcome("failed", f"the API refused: HTTP {status} {text}".strip(), detail)
        location = _location(text)
        if location:
            detail["location"] = location
        return Outcome("executed", f"the API accepted: HTTP {status}", detail)


def _location(text: str) -> str | None:
    """The new location a JSON answer may name."""
    try:
        answer = json.loads(text)
    except ValueError:
        return None
    found = answer.get("location") if isinstance(answer, dict) else None
    return found if isinstance(found, str) and found else None
