"""One typed, frozen settings object: CONTRACT §1, plus the operational knobs behind it.

Every field can be set from the environment (``COSTLINE_*``; the Slack ones keep their own
names) and every command accepts the same as a flag. Secrets are ``SecretStr``: their repr
is masked, so printing the settings object never reveals them.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from redis.connection import parse_url

import rules

RULES_PACKAGE = Path(rules.__file__).parent
DEFAULT_RULES = RULES_PACKAGE / "definitions"
DEFAULT_PRICES = RULES_PACKAGE / "prices" / "example.yaml"


class Settings(BaseSettings):
    # An error never repeats the value it refuses: the Redis URL may carry a password.
    model_config = SettingsConfigDict(env_prefix="COSTLINE_", frozen=True, extra="ignore",
                                      hide_input_in_errors=True)

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

    slack_fallback_channel: str = Field(
        "#costline-alerts", description="where an alert goes when its own channel is unknown"
    )
    slack_channels: dict[str, str] = Field(
        default_factory=dict,
        description="tag value → channel for rules that route_by_tag (JSON in the environment)",
    )
    slack_approvers: dict[str, list[str]] = Field(
        default_factory=dict,
        description="rule name → Slack user ids allowed to press Approve (JSON)",
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
    state_dir: Path = Field(
        Path.home() / ".local" / "state" / "costline",
        description="where ``costline stack`` keeps pid files, logs and data",
    )
    rules_tick_s: float = Field(
        30.0, gt=0, description="evaluate the rules at least this often, data or not"
    )
    batch_within_s: float = Field(
        0.2, gt=0, description="longest wait for a batch to fill before it is applied"
    )

    @field_validator("redis_url")
    @classmethod
    def _readable_redis_url(cls, value: str) -> str:
        """Read once here, so a URL redis-py cannot read fails with a message of ours: its own
        (e.g. ``Port could not be cast to integer value as 's3cr'``) can quote the password."""
        try:
            parse_url(value)
        except ValueError:
            raise ValueError(
                "not a Redis URL: redis://, rediss:// or unix://, with any of : / ? # @ in "
                "the user name or password percent-encoded") from None
        return value

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown IANA time zone {value!r}") from exc
        return value

    def topic(self, name: str) -> str:
        """The namespaced topic name, e.g. ``costline.usage.v1``."""
        return f"{self.namespace}.{name}.v1"

    def exports(self) -> dict[str, str]:
        """The environment a shell needs to reach the same services (no secrets)."""
        return {
            "COSTLINE_KAFKA_BOOTSTRAP": self.kafka_bootstrap,
            "COSTLINE_REDIS_URL": self.redis_url,
            "COSTLINE_NAMESPACE": self.namespace,
        }


@lru_cache(maxsize=1)
def load_settings() -> Settings:
    return Settings()
