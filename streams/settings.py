"""One typed, frozen settings object: the settings of README's Configuration, plus the
operational knobs behind them.

Every field can be set from the environment (``COSTLINE_*``; the Slack ones keep their own
names); seven also have an option of the root command (``costline.streams.cli.root``). Secrets are
``SecretStr``: their repr is masked, so printing the settings object never reveals them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, get_origin
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import (
    AliasChoices,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from costline import rules
from costline.connectors.kafka_security import KafkaSecurity, KafkaSecurityError
from costline.connectors.redis_client import check_url

RULES_PACKAGE = Path(rules.__file__).parent
DEFAULT_RULES = RULES_PACKAGE / "definitions"
DEFAULT_PRICES = RULES_PACKAGE / "prices" / "example.yaml"
ENV_PREFIX = "COSTLINE_"
_TAG_KEY = re.compile(r"[a-z][a-z0-9_]{0,62}")


class Settings(BaseSettings):
    # An error never repeats the value it refuses: the Redis URL may carry a password.
    # JSON settings are decoded by ``_decoded_json``, not by pydantic-settings, whose parse
    # error is an exception that names neither the variable nor what is wrong with it.
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="ignore",
                                      hide_input_in_errors=True, enable_decoding=False)

    kafka_bootstrap: str = Field("127.0.0.1:9092", description="Kafka bootstrap servers")
    redis_url: str = Field("redis://127.0.0.1:6379/0", description="Redis or Valkey URL")
    namespace: str = Field(
        "costline",
        pattern=r"^[a-z][a-z0-9_-]{0,62}$",
        description="prefix of every topic, consumer group and Redis key",
    )
    rules: Path = Field(DEFAULT_RULES, description="a YAML rule file or a directory of them")
    prices: Path = Field(DEFAULT_PRICES, description="the price book")
    timezone: str = Field("UTC", description="IANA zone for calendar periods")
    web_port: int = Field(6066, ge=1, le=65535, description="worker HTTP port")

    slack_bot_token: SecretStr | None = Field(
        None, validation_alias=AliasChoices("SLACK_BOT_TOKEN", "slack_bot_token")
    )
    slack_api_url: str = Field(
        "https://slack.com/api/",
        validation_alias=AliasChoices("SLACK_API_URL", "slack_api_url"),
    )
    slack_signing_secret: SecretStr | None = Field(
        None, validation_alias=AliasChoices("SLACK_SIGNING_SECRET", "slack_signing_secret")
    )

    api_token: SecretStr | None = Field(
        None, description="when set, /api/v1/... and the dashboard's data require "
        "Authorization: Bearer <token>"
    )
    metrics_spend_keys: tuple[str, ...] = Field(
        ("team",), description="tag keys whose values label the spend counters of /metrics "
        "(comma-separated; a short list: one series per combination of their values)"
    )
    metrics_refresh_s: float = Field(
        30.0, gt=0, description="how often the leader reads the budget gauges and spend "
        "counters of /metrics from Redis"
    )

    slack_fallback_channel: str = Field(
        "#costline-alerts", description="where an alert goes when its own channel is unknown"
    )
    slack_channels: dict[str, str] = Field(
        default_factory=dict,
        description="tag value → channel for rules that route_by_tag (JSON in the environment)",
    )
    slack_approvers: dict[str, list[str]] = Field(
        default_factory=dict,
        description="rule name → Slack user ids allowed to press Approve and Lift (JSON)",
    )

    # Notifiers beyond Slack (docs/NOTIFY.md); where each alert goes is in the rule files.
    external_url: str | None = Field(
        None, description="where people reach this costline (links in alerts); default "
        "http://HOSTNAME:COSTLINE_WEB_PORT"
    )
    smtp_host: str | None = Field(
        None, description="mail server for email alerts; unset: email alerts are logged only"
    )
    smtp_port: int | None = Field(
        None, ge=1, le=65535, description="default 587 with starttls, 465 with tls, 25 with none"
    )
    smtp_security: Literal["starttls", "tls", "none"] = Field(
        "starttls", description="starttls (upgrade a plain connection), tls (SMTPS from the "
        "first byte) or none"
    )
    smtp_username: str | None = Field(None, description="SMTP AUTH user name")
    smtp_password: SecretStr | None = Field(None, description="SMTP AUTH password")
    smtp_from: str = Field("costline@localhost", description="sender of email alerts")
    smtp_ca_file: Path | None = Field(
        None, description="PEM CA bundle the mail server's certificate chains to (default: "
        "the system's)"
    )
    pagerduty_url: str = Field(
        "https://events.pagerduty.com", description="PagerDuty Events API base URL "
        "(https://events.eu.pagerduty.com for the EU service region)"
    )

    # Operational knobs (not in the contract's table, documented in README).
    partitions: int = Field(6, ge=1, le=1024, description="partitions of the input topics")
    dedup_horizon_s: int = Field(
        7 * 86400, ge=60, description="how long an event_id is remembered after it was counted"
    )
    batch_messages: int = Field(
        100, ge=1, description="most Kafka messages the worker takes at once (their events "
        "are folded into one Redis step per partition; keeps memory bounded for big batches)"
    )
    kafka_session_timeout_s: float = Field(
        30.0, gt=0, description="consumer group session timeout (the embedded broker wants ~6s)"
    )
    kafka_rebalance_timeout_s: float = Field(
        60.0, gt=0, description="how long a group join may take (the embedded broker holds "
        "every join for this long, so ``stack up --kafka embedded`` exports a short one)"
    )
    stop_timeout_s: float = Field(
        25.0, gt=0, description="the longest a worker takes to stop: past it, with Kafka or "
        "Redis not answering, it exits with status 1 without leaving its groups (nothing is "
        "lost)"
    )
    state_dir: Path = Field(
        Path.home() / ".local" / "state" / "costline",
        description="where ``costline stack`` keeps pid files, logs and data",
    )
    rules_tick_s: float = Field(
        30.0, gt=0, description="evaluate the rules at least this often, data or not"
    )
    rules_poll_s: float = Field(
        0.15, gt=0, description="how often the leader looks for new data to evaluate the rules on"
    )
    reclaim_tick_s: float = Field(
        5.0, gt=0, description="how often the leader advances reclamation plans: a release "
        "happens within this long after its grace ends (each round reads the open plans)"
    )
    evaluator: Literal["process", "inline"] = Field(
        "process", description="where the leader evaluates the rules: in a child process of "
        "its own (it never holds the aggregation's interpreter lock), or inline in the worker's "
        "process"
    )
    evaluator_nice: int = Field(
        10, ge=0, le=19, description="niceness of the evaluation process: when the machine "
        "is busy, the aggregation gets the CPU first and the rules are evaluated with what it "
        "leaves (0: the worker's own priority)"
    )
    folding: Literal["process", "inline"] = Field(
        "process", description="where intake parses and prices input messages: in child "
        "processes beside the worker's (one worker then uses more than one core), or in the "
        "worker's own process"
    )
    batch_within_s: float = Field(
        0.2, gt=0, description="longest wait for a batch to fill before it is applied"
    )
    window_events: int = Field(
        10_000, ge=1, description="most events of one ledger partition folded together while "
        "its previous Redis write is in flight (bigger: fewer, cheaper writes; more memory)"
    )
    window_linger_s: float = Field(
        0.05, ge=0, description="how long a window waits for more ledger records before it is "
        "written (fewer, larger Redis writes under load; that much more latency)"
    )
    unwritten_events: int = Field(
        50_000, ge=1, description="most events a worker holds folded and not yet written to "
        "Redis over all its partitions (bounds its memory however many partitions it owns)"
    )
    folding_processes: int = Field(
        2, ge=1, le=16, description="pricing processes of a worker (COSTLINE_FOLDING=process), "
        "started with the worker"
    )
    folding_takes: int = Field(
        4, ge=1, le=64, description="takes of input messages being priced or delivered at once "
        "(more: the pricing processes idle less; more messages held)"
    )
    fetch_bytes: int = Field(
        1024 * 1024, ge=64 * 1024, description="most compressed bytes fetched ahead per "
        "partition (Kafka still returns a larger message whole)"
    )

    # How every Kafka client connects (docs/SECURITY.md, "Transport security").
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT", description="Kafka security.protocol of every client")
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = Field(
        "PLAIN", description="SASL mechanism (SASL_PLAINTEXT, SASL_SSL)")
    kafka_sasl_username: str | None = Field(None, description="SASL user name")
    kafka_sasl_password: SecretStr | None = Field(None, description="SASL password")
    kafka_ssl_cafile: Path | None = Field(
        None, description="PEM CA bundle the brokers' certificates chain to (default: the "
        "system's)")
    kafka_ssl_certfile: Path | None = Field(
        None, description="PEM client certificate, for brokers that require one (mutual TLS)")
    kafka_ssl_keyfile: Path | None = Field(
        None, description="PEM key of the client certificate (default: inside the certfile)")
    kafka_ssl_key_password: SecretStr | None = Field(
        None, description="passphrase of an encrypted client key")
    kafka_ssl_check_hostname: bool = Field(
        True, description="check that a broker's certificate names the host connected to")

    @field_validator("*", mode="before")
    @classmethod
    def _decoded_json(cls, value: Any, info: ValidationInfo) -> Any:
        """A dict or list setting given as text (the environment's JSON) → its value; text
        that is not JSON is refused like any other bad setting, naming the variable."""
        if not isinstance(value, str) or info.field_name not in JSON_SETTINGS:
            return value
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            variable = f"{ENV_PREFIX}{info.field_name}".upper()
            raise ValueError(f"{variable} is not JSON: {exc.msg} at line {exc.lineno} column "
                             f"{exc.colno}") from None

    @field_validator("metrics_spend_keys", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        """``team,project`` → its keys, each one an event could carry as a tag key."""
        if isinstance(value, str):
            value = tuple(key.strip() for key in value.split(",") if key.strip())
        for key in value or ():
            if not isinstance(key, str) or not _TAG_KEY.fullmatch(key):
                raise ValueError(f"{key!r} cannot be a tag key (lower-case letters, digits "
                                 "and _, starting with a letter)")
        return value

    @field_validator("kafka_security_protocol", "kafka_sasl_mechanism", mode="before")
    @classmethod
    def _upper_case(cls, value: Any) -> Any:
        return value.strip().upper() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _usable_kafka_security(self) -> Settings:
        """Refuse combinations that would silently connect less securely than asked, naming the
        variables involved (never their values)."""
        problems = [problem for check in KAFKA_SECURITY_CHECKS if (problem := check(self))]
        # Loading the TLS files is worth trying only once they exist and fit together.
        problems = problems or [problem for problem in [_loadable_tls(self)] if problem]
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def kafka_security(self) -> KafkaSecurity:
        """How every Kafka client of this configuration connects."""
        return KafkaSecurity(
            protocol=self.kafka_security_protocol,
            sasl_mechanism=self.kafka_sasl_mechanism,
            sasl_username=self.kafka_sasl_username,
            sasl_password=_revealed(self.kafka_sasl_password),
            ssl_cafile=self.kafka_ssl_cafile,
            ssl_certfile=self.kafka_ssl_certfile,
            ssl_keyfile=self.kafka_ssl_keyfile,
            ssl_key_password=_revealed(self.kafka_ssl_key_password),
            ssl_check_hostname=self.kafka_ssl_check_hostname,
        )

    @field_validator("redis_url")
    @classmethod
    def _readable_redis_url(cls, value: str) -> str:
        """Read once here, so a URL redis-py cannot read fails with a message of ours, which
        never quotes the password (``costline.connectors.redis_client.check_url``)."""
        check_url(value)
        return value

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        return known_zone(value)

    def topic(self, name: str) -> str:
        """The namespaced topic name, e.g. ``costline.usage.v1``."""
        return f"{self.namespace}.{name}.v1"

    @property
    def intake_group(self) -> str:
        """The consumer group of intake, on the input topics."""
        return f"{self.namespace}-intake"

    @property
    def ledger_group(self) -> str:
        """The consumer group of the aggregation, on the ledger."""
        return f"{self.namespace}-ledger"

    @property
    def app_group(self) -> str:
        """The Faust app's id and consumer group: the notifiers on the alerts topic (and,
        before intake had a group of its own, the input topics)."""
        return f"{self.namespace}-aggregator"

    def exports(self) -> dict[str, str]:
        """The environment a shell needs to reach the same services (no secrets)."""
        return {
            "COSTLINE_KAFKA_BOOTSTRAP": self.kafka_bootstrap,
            "COSTLINE_REDIS_URL": self.redis_url,
            "COSTLINE_NAMESPACE": self.namespace,
        }


# Settings whose environment variable holds JSON (``_decoded_json`` reads them).
JSON_SETTINGS = frozenset(
    name for name, field in Settings.model_fields.items()
    if get_origin(field.annotation) in (dict, list)
)


def known_zone(value: str) -> str:
    """``value`` if it names an IANA time zone; else ``ValueError``."""
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"unknown IANA time zone {value!r}") from exc
    return value


def without_password(url: str) -> str:
    """A Redis URL to show people: a password, in the user part or as ``?password=``, is
    replaced by ``***``."""
    parts = urlsplit(url)
    netloc, query = parts.netloc, parts.query
    if parts.password is not None:
        credentials, _, host = netloc.rpartition("@")
        netloc = f"{credentials.partition(':')[0]}:***@{host}"
    pairs = parse_qsl(query, keep_blank_values=True)
    if any(key == "password" for key, _ in pairs):
        query = urlencode([(k, "***" if k == "password" else v) for k, v in pairs], safe="/:*")
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def _revealed(secret: SecretStr | None) -> str | None:
    return secret.get_secret_value() if secret is not None else None


_PROTOCOL = "COSTLINE_KAFKA_SECURITY_PROTOCOL"


def _sasl_credentials_given(settings: Settings) -> str | None:
    if settings.kafka_security().uses_sasl:
        missing = [name for name, value in (
            ("COSTLINE_KAFKA_SASL_USERNAME", settings.kafka_sasl_username),
            ("COSTLINE_KAFKA_SASL_PASSWORD", settings.kafka_sasl_password),
        ) if not value]
        if missing:
            return (f"{' and '.join(missing)} must be set with "
                    f"{_PROTOCOL}={settings.kafka_security_protocol}")
    return None


def _nothing_unused(settings: Settings) -> str | None:
    """Credentials or certificates the protocol would ignore mean the protocol is wrong:
    say so instead of connecting without them."""
    security = settings.kafka_security()
    unused = [name for name, value, used in (
        ("COSTLINE_KAFKA_SASL_USERNAME", settings.kafka_sasl_username, security.uses_sasl),
        ("COSTLINE_KAFKA_SASL_PASSWORD", settings.kafka_sasl_password, security.uses_sasl),
        ("COSTLINE_KAFKA_SSL_CAFILE", settings.kafka_ssl_cafile, security.uses_tls),
        ("COSTLINE_KAFKA_SSL_CERTFILE", settings.kafka_ssl_certfile, security.uses_tls),
        ("COSTLINE_KAFKA_SSL_KEYFILE", settings.kafka_ssl_keyfile, security.uses_tls),
        ("COSTLINE_KAFKA_SSL_KEY_PASSWORD", settings.kafka_ssl_key_password, security.uses_tls),
    ) if value and not used]
    if unused:
        return (f"{', '.join(unused)} set, but {_PROTOCOL}={settings.kafka_security_protocol} "
                "does not use them (SSL, SASL_PLAINTEXT or SASL_SSL?)")
    return None


def _key_with_certificate(settings: Settings) -> str | None:
    if settings.kafka_ssl_certfile is None and (
            settings.kafka_ssl_keyfile or settings.kafka_ssl_key_password):
        return ("COSTLINE_KAFKA_SSL_KEYFILE and COSTLINE_KAFKA_SSL_KEY_PASSWORD need "
                "COSTLINE_KAFKA_SSL_CERTFILE")
    return None


def _tls_files_exist(settings: Settings) -> str | None:
    missing = [f"{name}: no such file {path}" for name, path in (
        ("COSTLINE_KAFKA_SSL_CAFILE", settings.kafka_ssl_cafile),
        ("COSTLINE_KAFKA_SSL_CERTFILE", settings.kafka_ssl_certfile),
        ("COSTLINE_KAFKA_SSL_KEYFILE", settings.kafka_ssl_keyfile),
    ) if path is not None and not path.is_file()]
    return "; ".join(missing) or None


def _loadable_tls(settings: Settings) -> str | None:
    """Build the TLS context once now, so a wrong key password or a file that is not PEM is
    reported at start, not as a failed handshake later."""
    try:
        settings.kafka_security().ssl_context()
    except KafkaSecurityError as exc:
        return str(exc)
    return None


KAFKA_SECURITY_CHECKS: tuple[Callable[[Settings], str | None], ...] = (
    _sasl_credentials_given, _nothing_unused, _key_with_certificate, _tls_files_exist,
)


@lru_cache(maxsize=1)
def load_settings() -> Settings:
    return Settings()
