"""Webhook: ask another system to enforce (a cloud budget action, a Kueue ClusterQueue quota,
an internal portal), with a signed JSON request, and to lift again.

Requests are signed exactly like the reclaim webhook's (``costline.connectors.reclaim.
webhook``): ``X-Costline-Timestamp``, ``X-Costline-Signature: v1=<hex HMAC-SHA256(secret,
timestamp + "." + body)>``, ``Idempotency-Key``, retries on 5xx with backoff, a 4xx is a no.
The body says ``"action": "enforce"`` or ``"action": "lift"`` with the plan: rule, group,
the line crossed, the spend, the period. The receiver keeps what it changed; costline records
that it asked, and asks once for each.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Annotated, Any

from pydantic import AnyHttpUrl, Field, PlainSerializer

from costline.connectors.enforce import EnforceConnector, NotEnforceable, enforcer
from costline.connectors.params import EnvName
from costline.connectors.reclaim import (
    NotReclaimable,
    Sleep,
    real_sleep,
    secret_from_env,
)
from costline.connectors.reclaim.webhook import DEFAULT_SECRET_ENV, WebhookReclaimer
from costline.rules.durations import PositiveDuration, format_duration, rfc3339
from costline.rules.enforce import EnforcePlan
from costline.rules.enforce_params import EnforceParams
from costline.rules.prices import format_micro
from costline.rules.reclaim import Outcome

Seconds = Annotated[PositiveDuration, PlainSerializer(format_duration, return_type=str)]
ASKED = "asked"


class WebhookEnforceParams(EnforceParams):
    """Another system's enforcement API: enforce and lift are POSTed as signed JSON."""

    url: AnyHttpUrl = Field(description="the enforcement API")
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


def body_of(plan: EnforcePlan, action: str) -> bytes:
    data: dict[str, Any] = {
        "action": action, "plan_id": plan.plan_id, "rule": plan.rule,
        "group": dict(plan.group), "line": plan.line, "threshold": format_micro(plan.threshold),
        "spent": format_micro(plan.spent), "currency": plan.currency,
        "period_start": rfc3339(plan.period_start), "period_end": rfc3339(plan.period_end),
        "mode": plan.mode,
    }
    return json.dumps(data, separators=(",", ":"), sort_keys=True).encode()


@enforcer("webhook")
class WebhookEnforcer(EnforceConnector):
    """POSTs ``enforce`` and later ``lift``, signed, to the enforcement API.

    ```yaml
    rules:
      - name: project-monthly-cloud
        kind: budget
        group_by: [project]
        period: month
        limit: 20000
        forecast: true
        enforce:
          connector: webhook
          url: https://platform.example.com/budget-actions
          secret_env: PLATFORM_BUDGET_SECRET
          at: forecast
          within: 3d
          approval: manual
    ```
    """

    params_model = WebhookEnforceParams

    def __init__(self, environ: Mapping[str, str] | None = None, sleep: Sleep = real_sleep,
                 clock: Callable[[], float] = time.time) -> None:
        self._environ = environ
        self._http = WebhookReclaimer(environ=environ, sleep=sleep, clock=clock)

    async def identify(self, plan: EnforcePlan) -> dict[str, str]:
        params = WebhookEnforceParams.model_validate(plan.params)
        try:
            secret_from_env(params.secret_env, self._environ)
        except NotReclaimable as exc:
            raise NotEnforceable("failed", exc.reason) from None
        return {"url": str(params.url)}

    def describe(self, plan: EnforcePlan) -> str:
        return f"POST an enforce request for {plan.subject} to {plan.target.get('url', '?')}"

    async def snapshot(self, plan: EnforcePlan, before: Mapping[str, Any]) -> dict[str, Any]:
        return {} if ASKED in before else {ASKED: True}

    async def apply(self, plan: EnforcePlan, before: Mapping[str, Any]) -> Outcome:
        return await self._post(plan, "enforce", plan.plan_id)

    async def lift(self, plan: EnforcePlan, before: Mapping[str, Any]) -> Outcome:
        return await self._post(plan, "lift", f"{plan.plan_id}:lift")

    async def _post(self, plan: EnforcePlan, action: str, key: str) -> Outcome:
        params = WebhookEnforceParams.model_validate(plan.params)
        try:
            secret = secret_from_env(params.secret_env, self._environ)
        except NotReclaimable as exc:
            return Outcome("failed", exc.reason)
        outcome = await self._http.post_signed(
            str(params.url), secret, key, body_of(plan, action), timeout=params.timeout,
            retries=params.retries, backoff=params.backoff)
        reason = outcome.reason.replace("release API", f"{action} API")
        return Outcome(outcome.step, reason, outcome.detail)
