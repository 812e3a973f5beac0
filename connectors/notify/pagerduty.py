"""PagerDuty: alerts as Events API v2 events, so a budget breach at 3 a.m. pages someone.

The first firing of an alert is a ``trigger``; later changes of it are ``trigger`` again (a
higher line, a repeat: PagerDuty adds them to the same alert), ``acknowledge`` when it is
muted (a costline silence or inhibition: the incident stops escalating) and ``resolve`` when it
resolves. ``dedup_key`` is the alert id, so every event of an alert lands on one PagerDuty
alert. Severities map one to one (``info``, ``warning``, ``critical``); ``severity_at`` keeps
the alerts below it from paging. ``custom_details`` carries the figures exactly as the rule
engine published them.

Each event is one request: ``dedup_key`` must name one alert. PagerDuty groups a burst into
incidents itself: events carry the rule as ``group`` and the line as ``class``, which its
alert grouping can key on.

The routing key is read from the environment variable the rule names (``routing_key_env``,
or one per tag value with ``by_tag``), never from a rule file; neither it nor the request is
ever logged. The Events API answers 202 when it took an event, 400 when it never will (not
retried), 429 and 5xx when it may later (retried, waiting what ``Retry-After`` asks when it
says).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import Field

from costline.connectors.alert_change import AlertChange, group_text, severity_rank, title
from costline.connectors.delivery_ledger import DeliveryLedger, ThreadRef
from costline.connectors.notify import Refused, Setup, notifier, params_of
from costline.connectors.notify._http import HttpPoster
from costline.connectors.notify._threads import Threaded
from costline.connectors.params import EnvName
from costline.rules.notify_params import NotifierParams

DEFAULT_KEY_ENV = "PAGERDUTY_ROUTING_KEY"
MAX_SUMMARY = 1024
ACTIONS = {"firing": "trigger", "silenced": "acknowledge", "resolved": "resolve"}
SEVERITY = {"info": "info", "warning": "warning", "critical": "critical"}


class PagerDutyParams(NotifierParams):
    """The PagerDuty service (by the environment variable holding its routing key), and the
    least severity that pages."""

    routing_key_env: EnvName = Field(
        DEFAULT_KEY_ENV, description="environment variable holding the Events API v2 "
        "routing key (integration key) of the service")
    severity_at: Literal["info", "warning", "critical"] = Field(
        "info", description="alerts below this severity do not page")
    by_tag: dict[str, EnvName] = Field(
        default_factory=dict, description="tag value → environment variable of that "
        "service's routing key, for route_by_tag")

    def published(self, name: str, tag: str | None, value: str | None) -> dict[str, Any]:
        """The routing key's variable for this alert: its tag value's, else
        ``routing_key_env``."""
        env = self.by_tag.get(value, self.routing_key_env) if value is not None \
            else self.routing_key_env
        return {name: {"routing_key_env": env, "severity_at": self.severity_at}}


@notifier("pagerduty")
class PagerDutyNotifier(Threaded):
    """Triggers, acknowledges and resolves PagerDuty alerts (Events API v2).

    ```yaml
    rules:
      - name: project-hard-limit
        kind: budget
        group_by: [project]
        period: month
        limit: 500000
        severity: critical
        notify:
          slack: "#ml-budgets"
          pagerduty: {routing_key_env: PD_FINOPS_KEY, severity_at: critical}
    ```
    """

    params_model = PagerDutyParams
    digest_min = None

    def __init__(self, ledger: DeliveryLedger | None, base_url: str, external_url: str, *,
                 environ: Mapping[str, str], retries: int = 3, backoff_s: float = 1.0,
                 timeout_s: float = 10.0) -> None:
        super().__init__(ledger)
        self._url = base_url.rstrip("/") + "/v2/enqueue"
        self._external_url = external_url
        self._environ = environ
        self._http = HttpPoster("PagerDuty", timeout_s=timeout_s, retries=retries,
                                backoff_s=backoff_s)

    @classmethod
    def build(cls, setup: Setup) -> PagerDutyNotifier:
        return cls(setup.ledger("pagerduty"), setup.settings.pagerduty_url, setup.external_url,
                   environ=setup.environ)

    async def close(self) -> None:
        await self._http.close()

    def wants(self, change: AlertChange) -> bool:
        """Alerts of ``severity_at`` or above; pending ones never page."""
        if not super().wants(change) or change.state not in ACTIONS:
            return False
        return severity_rank(change.severity) >= severity_rank(self._params(change).severity_at)

    def route(self, change: AlertChange) -> str:
        """The routing key's variable: the ledger and the log name it, never the key."""
        return self._params(change).routing_key_env

    async def ready(self, destination: str) -> None:
        await self._http.hold_off(self._url)

    async def open(self, changes: Sequence[AlertChange], destination: str) -> ThreadRef:
        [change] = changes
        await self._send(change, destination)
        return ThreadRef(destination, change.alert_id)

    async def follow(self, change: AlertChange, thread: ThreadRef,
                     previous: AlertChange | None, again: bool) -> str:
        await self._send(change, thread.destination)
        return ACTIONS[change.state]

    async def _send(self, change: AlertChange, key_env: str) -> None:
        key = self._environ.get(key_env, "")
        if not key:
            raise Refused("enqueue", f"environment variable {key_env} is not set", None,
                          channel="PagerDuty")
        body = json.dumps(self.event(change, key)).encode()
        await self._http.post("enqueue", self._url, body, secrets=(key,))

    def event(self, change: AlertChange, routing_key: str) -> dict[str, Any]:
        """The Events API v2 body for a change."""
        action = ACTIONS[change.state]
        event: dict[str, Any] = {"routing_key": routing_key, "event_action": action,
                                 "dedup_key": change.alert_id}
        if action != "trigger":
            return event
        event["payload"] = {
            "summary": title(change)[:MAX_SUMMARY],
            "source": group_text(change.group),
            "severity": SEVERITY.get(change.severity, "warning"),
            "timestamp": change.at.isoformat().replace("+00:00", "Z"),
            "component": change.kind,
            "group": change.rule,
            "class": change.line or change.kind,
            "custom_details": details(change),
        }
        event["client"] = "costline"
        event["client_url"] = self._external_url
        event["links"] = [{"href": f"{self._external_url}/?alert={change.alert_id}",
                           "text": f"costline: {change.alert_id}"}]
        return event

    def _params(self, change: AlertChange) -> PagerDutyParams:
        params = params_of(change, type(self))
        assert isinstance(params, PagerDutyParams)
        return params


def details(change: AlertChange) -> dict[str, Any]:
    """The alert's figures, exactly as the rule engine published them."""
    record = change.record
    found: dict[str, Any] = {
        "rule": change.rule,
        "alert_id": change.alert_id,
        "group": dict(change.group),
        "summary": change.summary,
        "value": record.get("value"),
        "threshold": record.get("threshold"),
        "line": change.line,
        "lines": {line["name"]: line["value"] for line in record.get("lines") or ()},
        "currency": change.currency,
        "unit": record.get("unit"),
        "period": record.get("period"),
        "forecast": record.get("forecast"),
        "rate_per_hour": record.get("rate_per_hour"),
        "top": record.get("top") or None,
        "waste_by_fault": record.get("faults"),
        "mode": change.mode,
    }
    return {key: value for key, value in found.items() if value not in (None, "", {}, [])}
