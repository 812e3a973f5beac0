"""Alertmanager: costline's alerts pushed to an existing Prometheus Alertmanager.

A team then routes, groups, silences and inhibits them with its own Alertmanager
configuration, beside its other alerts. Each change is ``POST``ed to ``/api/v2/alerts`` with
the alert's labels and annotations (``_prometheus.py``), ``startsAt`` (when it started firing),
``endsAt`` and ``generatorURL``.

An Alertmanager resolves an alert it has not heard of for a while, so costline tells it again
and again: a firing alert is sent with ``endsAt`` one ``resolve_timeout`` ahead and sent again
every quarter of it (``remind``, on the worker's leader) while it fires. Its resolution is sent
with ``endsAt`` set to the moment it resolved. A muted alert (a costline silence, an
inhibition) is ended the same way, so the Alertmanager's receivers stop hearing of it, and
starts again when the mute ends. If costline stops, its alerts end by themselves one
``resolve_timeout`` later.

A burst of new alerts for one Alertmanager goes out in one request. A repeat of a request
(after a restart) is harmless: an Alertmanager keeps one alert per label set.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import AnyHttpUrl, Field

from costline.connectors.alert_change import AlertChange
from costline.connectors.delivery_ledger import DeliveryLedger, ThreadRef
from costline.connectors.notify import Delivery, Setup, notifier, params_of
from costline.connectors.notify._http import HttpPoster
from costline.connectors.notify._prometheus import (
    LabelName,
    annotations_of,
    ends_at,
    generator_url,
    labels_of,
    starts_at,
)
from costline.connectors.notify._threads import Threaded
from costline.connectors.params import Seconds
from costline.rules.notify_params import NotifierParams

DEFAULT_RESOLVE_TIMEOUT_S = 300
REMINDERS_PER_TIMEOUT = 4


class AlertmanagerParams(NotifierParams):
    """An Alertmanager's URL, how long it may go without hearing of a firing alert, and
    labels to add to every alert."""

    url: AnyHttpUrl = Field(
        description="the Alertmanager's base URL, e.g. http://alertmanager:9093")
    resolve_timeout: Seconds = Field(
        DEFAULT_RESOLVE_TIMEOUT_S, json_schema_extra={"default": "5m"},
        description="a firing alert not sent again within this ends (its endsAt); costline "
        "sends it again four times as often")
    labels: dict[LabelName, str] = Field(
        default_factory=dict, description="labels added to every alert, for the "
        "Alertmanager's routes (e.g. {team: finops})")


@notifier("alertmanager")
class AlertmanagerNotifier(Threaded):
    """Pushes alerts to an Alertmanager's API (``POST /api/v2/alerts``); ends them on
    resolution.

    ```yaml
    rules:
      - name: team-monthly
        kind: budget
        group_by: [team]
        period: month
        limit: 250000
        notify:
          alertmanager:
            url: http://alertmanager.monitoring:9093
            resolve_timeout: 5m
            labels: {receiver: finops}
    ```
    """

    params_model = AlertmanagerParams
    digest_min = 2

    def __init__(self, ledger: DeliveryLedger | None, external_url: str, *,
                 retries: int = 3, backoff_s: float = 0.5, timeout_s: float = 10.0,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__(ledger)
        self._external_url = external_url
        self._http = HttpPoster("Alertmanager", timeout_s=timeout_s, retries=retries,
                                backoff_s=backoff_s)
        self._clock = clock
        self._lock = asyncio.Lock()
        """Deliveries and reminders take turns, so a reminder never follows a resolution."""

    @classmethod
    def build(cls, setup: Setup) -> AlertmanagerNotifier:
        return cls(setup.ledger("alertmanager"), setup.external_url)

    async def close(self) -> None:
        await self._http.close()

    def route(self, change: AlertChange) -> str:
        return str(self._params(change).url).rstrip("/")

    async def deliver_changes(self, changes: Sequence[AlertChange]) -> list[Delivery]:
        async with self._lock:
            return await super().deliver_changes(changes)

    async def ready(self, destination: str) -> None:
        await self._http.hold_off(destination)

    async def open(self, changes: Sequence[AlertChange], destination: str) -> ThreadRef:
        await self._push(destination, changes)
        return ThreadRef(destination, secrets.token_hex(8))

    async def follow(self, change: AlertChange, thread: ThreadRef,
                     previous: AlertChange | None, again: bool) -> str:
        await self._push(thread.destination, [change])
        return "sent"

    async def remind(self) -> None:
        """Send again every firing alert whose last sending is a quarter of its
        ``resolve_timeout`` old, one request per Alertmanager."""
        if not self.sending:
            return
        async with self._lock:
            now = self._clock()
            due: dict[str, list[AlertChange]] = defaultdict(list)
            for alert in await self.ledger.open_alerts():
                change = AlertChange.from_record(alert.record)
                timeout = self._params(change).resolve_timeout
                if now - alert.sent_at >= timeout / REMINDERS_PER_TIMEOUT:
                    due[self.route(change)].append(change)
            for url, changes in due.items():
                await self._push(url, changes, remember=False)
                for change in changes:
                    if not await self.ledger.stamp(change.thread_key, now):
                        await self._push(url, [_ended(change)], remember=False)
                self.stats["reminders"] += len(changes)

    # ── the request ───────────────────────────────────────────────────────────────────────

    async def _push(self, url: str, changes: Sequence[AlertChange], *,
                    remember: bool = True) -> None:
        """POST the alerts; a delivery (not a reminder) names its first change in
        ``Idempotency-Key``, for proxies and logs in between."""
        now = self._clock()
        body = json.dumps([self.alert(change, now) for change in changes]).encode()
        first = changes[0]
        headers = {"Idempotency-Key": f"{first.thread_key}|{first.change_key}"} if remember \
            else None
        await self._http.post("POST /api/v2/alerts", f"{url}/api/v2/alerts", body, headers)
        if not remember:
            return
        for change in changes:
            if change.state == "firing":
                await self.ledger.keep_open(change.thread_key, change.record, now)
            else:
                await self.ledger.close(change.thread_key)

    def alert(self, change: AlertChange, now: float) -> dict[str, Any]:
        """One alert as ``POST /api/v2/alerts`` takes it."""
        params = self._params(change)
        return {
            "labels": labels_of(change, params.labels),
            "annotations": annotations_of(change),
            "startsAt": starts_at(change),
            "endsAt": ends_at(change, datetime.fromtimestamp(now, UTC),
                              timedelta(seconds=params.resolve_timeout)),
            "generatorURL": generator_url(self._external_url, change),
        }

    def _params(self, change: AlertChange) -> AlertmanagerParams:
        params = params_of(change, type(self))
        assert isinstance(params, AlertmanagerParams)
        return params


def _ended(change: AlertChange) -> AlertChange:
    """The change as a resolution: a reminder that crossed a resolution is taken back."""
    record: Mapping[str, Any] = {**change.record, "state": "resolved"}
    return AlertChange.from_record(record)
