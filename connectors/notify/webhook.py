"""Webhook: Alertmanager's webhook payload (version 4), signed, POSTed to any URL.

Anything that takes Alertmanager's webhooks then takes costline's alerts: Grafana OnCall,
Teams and Google Chat bridges, ticketing systems. The body is what an Alertmanager sends:
``version``, ``groupKey``, ``truncatedAlerts``, ``status``, ``receiver``, ``groupLabels``,
``commonLabels``, ``commonAnnotations``, ``externalURL`` and ``alerts`` (each with ``status``,
``labels``, ``annotations``, ``startsAt``, ``endsAt``, ``generatorURL`` and ``fingerprint``).

A group is a thread: one alert, or a burst of new alerts for one URL sent together. Every
later change of one of them sends the group again, as an Alertmanager does: its firing alerts
and the alert that changed (a resolved alert is sent once). ``status`` is ``firing`` while any
alert of the group fires. Like an Alertmanager, a muted alert is not sent; its resolution is.

It is signed like the reclaim webhook (``connectors/reclaim/webhook.py``): HMAC-SHA256 with a
shared secret over ``timestamp + "." + body``, sent as ``X-Costline-Timestamp`` and
``X-Costline-Signature: v1=<hex>``; ``Idempotency-Key`` names the change, so a receiver can
ignore a repeat. The secret lives in the environment variable ``secret_env`` names, never in
the rule file or a log line.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import AnyHttpUrl, Field

from costline.connectors.alert_change import AlertChange
from costline.connectors.delivery_ledger import DeliveryLedger, ThreadRef
from costline.connectors.notify import Refused, Setup, notifier, params_of
from costline.connectors.notify._http import HttpPoster
from costline.connectors.notify._prometheus import (
    LabelName,
    annotations_of,
    ends_at,
    fingerprint,
    generator_url,
    labels_of,
    starts_at,
)
from costline.connectors.notify._threads import Threaded
from costline.connectors.params import EnvName
from costline.connectors.signature import sign
from costline.rules.notify_params import NotifierParams

DEFAULT_SECRET_ENV = "COSTLINE_WEBHOOK_SECRET"
VERSION = "4"


class WebhookParams(NotifierParams):
    """A receiver of Alertmanager's webhook payload, and the secret its requests are signed
    with."""

    url: AnyHttpUrl = Field(description="where the payload is POSTed")
    secret_env: EnvName = Field(
        DEFAULT_SECRET_ENV, description="environment variable holding the signing secret")
    receiver: str = Field("costline", min_length=1, max_length=128,
                          description="the payload's receiver name")
    labels: dict[LabelName, str] = Field(
        default_factory=dict, description="labels added to every alert")


@notifier("webhook")
class WebhookNotifier(Threaded):
    """POSTs Alertmanager's webhook payload (version 4), signed with HMAC-SHA256.

    ```yaml
    rules:
      - name: fault-waste
        kind: fault_waste
        group_by: [project]
        period: day
        max_waste: 5000
        severity: critical
        notify:
          webhook:
            url: https://oncall.example.com/integrations/v1/alertmanager/Kq3x/
            secret_env: ONCALL_WEBHOOK_SECRET
    ```
    """

    params_model = WebhookParams
    digest_min = 2

    def __init__(self, ledger: DeliveryLedger | None, external_url: str, *,
                 environ: Mapping[str, str], retries: int = 3, backoff_s: float = 0.5,
                 timeout_s: float = 10.0, clock: Callable[[], float] = time.time) -> None:
        super().__init__(ledger)
        self._external_url = external_url
        self._environ = environ
        self._http = HttpPoster("webhook", timeout_s=timeout_s, retries=retries,
                                backoff_s=backoff_s)
        self._clock = clock

    @classmethod
    def build(cls, setup: Setup) -> WebhookNotifier:
        return cls(setup.ledger("webhook"), setup.external_url, environ=setup.environ)

    async def close(self) -> None:
        await self._http.close()

    def wants(self, change: AlertChange) -> bool:
        """A muted alert is not sent, as an Alertmanager does not notify a silenced one."""
        return super().wants(change) and change.state != "silenced"

    def route(self, change: AlertChange) -> str:
        return str(self._params(change).url)

    async def ready(self, destination: str) -> None:
        await self._http.hold_off(destination)

    async def open(self, changes: Sequence[AlertChange], destination: str) -> ThreadRef:
        thread = ThreadRef(destination, secrets.token_hex(8))
        await self._send(thread, changes, changes[0])
        return thread

    async def follow(self, change: AlertChange, thread: ThreadRef,
                     previous: AlertChange | None, again: bool) -> str:
        members = [AlertChange.from_record(m.record) for m in await self.ledger.members(thread)]
        group = [m for m in members if m.thread_key == change.thread_key or m.state == "firing"]
        await self._send(thread, group or [change], change)
        return "sent"

    async def _send(self, thread: ThreadRef, group: Sequence[AlertChange],
                    change: AlertChange) -> None:
        params = self._params(change)
        secret = self._environ.get(params.secret_env, "")
        if not secret:
            raise Refused("POST", f"environment variable {params.secret_env} is not set", None,
                          channel="webhook")
        body = json.dumps(self.payload(thread, group, params)).encode()

        def signed(data: bytes) -> dict[str, str]:
            timestamp = str(int(self._clock()))
            return {"X-Costline-Timestamp": timestamp,
                    "X-Costline-Signature": sign(secret, timestamp, data)}

        await self._http.post("POST", thread.destination, body, sign=signed, secrets=(secret,),
                              headers={"Idempotency-Key":
                                       f"{change.thread_key}|{change.change_key}"})

    def payload(self, thread: ThreadRef, group: Sequence[AlertChange],
                params: WebhookParams) -> dict[str, Any]:
        """Alertmanager's webhook body (version 4) for a group of alerts."""
        now = datetime.fromtimestamp(self._clock(), UTC)
        alerts = [self._alert(change, params, now) for change in group]
        rules = {change.rule for change in group}
        group_labels = {"alertname": next(iter(rules))} if len(rules) == 1 else {}
        return {
            "version": VERSION,
            "groupKey": f'{{}}:{{costline_group="{thread.ref}"}}',
            "truncatedAlerts": 0,
            "status": "firing" if any(a["status"] == "firing" for a in alerts) else "resolved",
            "receiver": params.receiver,
            "groupLabels": group_labels,
            "commonLabels": _common([a["labels"] for a in alerts]),
            "commonAnnotations": _common([a["annotations"] for a in alerts]),
            "externalURL": self._external_url,
            "alerts": alerts,
        }

    def _alert(self, change: AlertChange, params: WebhookParams, now: datetime
               ) -> dict[str, Any]:
        alert_labels = labels_of(change, params.labels)
        return {
            "status": "firing" if change.state == "firing" else "resolved",
            "labels": alert_labels,
            "annotations": annotations_of(change),
            "startsAt": starts_at(change),
            "endsAt": ends_at(change, now, timedelta(0)) if change.state != "firing"
            else "0001-01-01T00:00:00Z",
            "generatorURL": generator_url(self._external_url, change),
            "fingerprint": fingerprint(alert_labels),
        }

    def _params(self, change: AlertChange) -> WebhookParams:
        params = params_of(change, type(self))
        assert isinstance(params, WebhookParams)
        return params


def _common(maps: Sequence[Mapping[str, str]]) -> dict[str, str]:
    """The pairs every map has."""
    if not maps:
        return {}
    first, *rest = maps
    return {k: v for k, v in first.items() if all(m.get(k) == v for m in rest)}
