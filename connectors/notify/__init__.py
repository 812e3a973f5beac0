"""Notifiers: one file per channel, each registered under the key rule files use in ``notify:``.

Modelled on Alertmanager's notify stage (one ``Notifier`` interface, one package per
integration) and ElastAlert 2's ``alerters/``. A notifier is one file in this folder: its
parameter model (a ``NotifierParams``), one decorated class, ``@notifier("email")``, that
carries the model and a docstring with a YAML example, and ``deliver``. ``NOTIFIERS.discover``
imports every module here, so the registry is complete once this package is imported; the
loader is given it (``costline.connectors.plugins.PLUGINS``), so ``notify: {email: ...}`` in a
rule file is checked against what can actually send.

The worker runs one Faust agent per notifier on ``NS.alerts.v1`` (``streams/worker/notifier``)
and acknowledges a batch of alert changes only once ``deliver`` returned: a channel that is
down holds its own alerts in Kafka, not the other channels'. What every notifier guarantees,
and where it comes from:

* at least once, duplicates only when an outcome was unknown: the delivery ledger
  (``connectors/delivery_ledger.py``), one per channel, driven by ``Threaded``
  (``_threads.py``), which also gives each alert its thread and turns a burst of new alerts
  for one destination into a digest;
* retries with backoff that wait at least what ``Retry-After`` asks, and no retry of a
  refusal (a 4xx): ``_http.py`` for the HTTP channels, the same rules for Slack and SMTP;
* the lifecycle (firing, updates, resolved), silences and inhibition: the rule engine
  publishes every change, muted ones as ``silenced``; each notifier says what a change means
  on its channel;
* routing by tag: decided by the rule engine and carried in the change (``rules/notify.py``).
"""

from __future__ import annotations

import logging
import os
import socket
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

from costline.connectors.alert_change import AlertChange, InvalidAlertRecord
from costline.connectors.delivery_ledger import DeliveryLedger
from costline.connectors.redis_client import AsyncRedisClient
from costline.rules.notify_params import NotifierParams
from costline.rules.registry import Registry


class DeliveryError(Exception):
    """Something could not be delivered now; the caller must not ack its Kafka message."""


class ChannelError(Exception):
    """A failed call to a channel, described by what was called and the channel's answer —
    never a credential or a secret."""

    def __init__(self, method: str, error: str, status: int | None, *,
                 answered: bool = True, channel: str = "channel",
                 retry_after: float | None = None) -> None:
        super().__init__(f"{channel} {method} failed: {error}"
                         + (f" (HTTP {status})" if status is not None else ""))
        self.method = method
        self.error = error
        self.status = status
        self.answered = answered
        """False when no answer came back: the channel may have acted on the request."""
        self.retry_after = retry_after
        """Seconds the channel asked to wait before trying again, when it said."""


class Unavailable(ChannelError, DeliveryError):
    """Transient: rate limited past the retries, a server error, no connection."""


class Refused(ChannelError):
    """Permanent for this request: retrying the same call cannot succeed."""


@dataclass(frozen=True)
class Delivery:
    """What happened to one alert change on one channel: posted (a new thread), digested (a
    new thread shared with other alerts), updated (a later change sent in its thread),
    duplicate (already sent), stale (older than what was sent), unposted (never fired on this
    channel, so nothing to change), logged (the channel is not configured) or failed (refused
    for good; see the log)."""

    alert_id: str
    change: str
    outcome: str
    destination: str | None = None
    ref: str | None = None


class Secret(Protocol):
    def get_secret_value(self) -> str: ...


class NotifierSettings(Protocol):
    """What notifiers read of the worker's settings (``costline.streams.settings``)."""

    @property
    def namespace(self) -> str: ...
    @property
    def web_port(self) -> int: ...
    @property
    def external_url(self) -> str | None: ...
    @property
    def slack_bot_token(self) -> Secret | None: ...
    @property
    def slack_api_url(self) -> str: ...
    @property
    def slack_fallback_channel(self) -> str: ...
    @property
    def slack_channels(self) -> dict[str, str]: ...
    @property
    def smtp_host(self) -> str | None: ...
    @property
    def smtp_port(self) -> int | None: ...
    @property
    def smtp_security(self) -> str: ...
    @property
    def smtp_username(self) -> str | None: ...
    @property
    def smtp_password(self) -> Secret | None: ...
    @property
    def smtp_from(self) -> str: ...
    @property
    def smtp_ca_file(self) -> Path | None: ...
    @property
    def pagerduty_url(self) -> str: ...


@dataclass(frozen=True)
class Setup:
    """What the worker hands each notifier it builds."""

    settings: NotifierSettings
    redis: AsyncRedisClient
    environ: Mapping[str, str] = field(default_factory=lambda: os.environ)

    def ledger(self, channel: str) -> DeliveryLedger:
        """The channel's own delivery ledger."""
        return DeliveryLedger(self.redis, self.settings.namespace, channel)

    @property
    def external_url(self) -> str:
        """Where people reach this costline: links in alerts point here."""
        configured = self.settings.external_url
        if configured:
            return configured.rstrip("/")
        return f"http://{socket.gethostname()}:{self.settings.web_port}"


class Notifier(ABC):
    """One channel. Instances are long-lived: one per worker, built by ``build``."""

    name: ClassVar[str]
    params_model: ClassVar[type[NotifierParams]]

    @classmethod
    @abstractmethod
    def build(cls, setup: Setup) -> Notifier:
        """The notifier as the worker's settings configure it."""

    def wants(self, change: AlertChange) -> bool:
        """Whether this change is for this channel: its rule names the notifier."""
        return self.name in change.notify

    async def deliver(self, records: Sequence[Mapping[str, Any]]) -> list[Delivery]:
        """Deliver the alert changes of a batch that are for this channel, in order. Raise
        ``DeliveryError`` when any must be retried later; what did get through is then
        recognised and not sent again. A malformed record is refused (``failed``), never
        retried: retrying could not help."""
        changes: list[AlertChange] = []
        refused: list[Delivery] = []
        for record in records:
            try:
                change = AlertChange.from_record(record)
            except InvalidAlertRecord as exc:
                logging.getLogger(__name__).error("alert record refused, not sent: %s", exc)
                refused.append(Delivery(str(record.get("alert_id", "?")), "-", "failed"))
                continue
            if self.wants(change):
                changes.append(change)
        return refused + await self.deliver_changes(changes)

    @abstractmethod
    async def deliver_changes(self, changes: Sequence[AlertChange]) -> list[Delivery]:
        """``deliver``, for changes already read and meant for this channel."""

    async def remind(self) -> None:
        """Work that time alone makes due (re-sends to a channel that forgets). The worker
        calls it every few seconds on its leader."""
        return None

    async def close(self) -> None:
        """Release connections."""
        return None

    async def __aenter__(self: N) -> N:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


N = TypeVar("N", bound=Notifier)
C = TypeVar("C", bound=type[Notifier])
NOTIFIERS: Registry[Notifier] = Registry("notifier", Notifier)


def notifier(name: str) -> Callable[[C], C]:
    """Class decorator: register a notifier, which carries its parameter model, by name."""

    def register(cls: C) -> C:
        cls.name = name
        return NOTIFIERS.register(name)(cls)

    return register


def params_of(change: AlertChange, notifier: type[Notifier]) -> NotifierParams:
    """A notifier's parameters as the change carries them (routed, validated again)."""
    raw: Any = change.notify.get(notifier.name)
    return notifier.params_model.model_validate(raw if raw is not None else {})


NOTIFIERS.discover(__name__, __path__)
