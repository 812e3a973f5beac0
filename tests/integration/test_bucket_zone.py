"""Daily buckets are named in the zone the worker recorded: a reader configured with another
zone still finds each event on its own local day, and a worker configured with another zone
than the recorded one refuses to start."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from costline.connectors import bucket_zone
from costline.connectors.redis_client import RedisClient, connect
from costline.streams.cli.root import _register, app
from costline.streams.cli.worker_cmd import claim_bucket_zone
from costline.streams.settings import Settings
from tests.conftest import forget_redis_keys
from tests.integration.redis_writer import Writer
from tests.unit.rulefiles.builders import at, usage

pytestmark = pytest.mark.integration

EVENING = at("2025-01-01T20:00")  # in Tokyo, 2 January 05:00


def _day_cost(url: str, namespace: str, zone: str, moment: str) -> float:
    """``costline --timezone ZONE spend --period day --at MOMENT``: the day's total cost."""
    _register()
    result = CliRunner().invoke(app, [
        "--redis-url", url, "--namespace", namespace, "--timezone", zone,
        "spend", "--period", "day", "--at", moment, "--json"])
    assert result.exit_code == 0, result.output
    return sum(float(row["cost"]) for row in json.loads(result.stdout)["rows"])


async def test_a_reader_in_another_zone_finds_the_event_on_its_local_day(
        redis_writer: Writer, any_redis_url: str, namespace: str) -> None:
    await redis_writer.write([usage(EVENING, 2.0)])  # counted by a worker on UTC
    in_utc = _day_cost(any_redis_url, namespace, "UTC", "2025-01-01T12:00:00Z")
    assert in_utc > 0
    # Tokyo's 1 January ended before the event; its 2 January holds it.
    assert _day_cost(any_redis_url, namespace, "Asia/Tokyo", "2025-01-01T12:00:00+09:00") == 0
    assert _day_cost(any_redis_url, namespace, "Asia/Tokyo", "2025-01-02T12:00:00+09:00") == in_utc


@pytest.fixture
def client(any_redis_url: str, namespace: str) -> Iterator[RedisClient]:
    redis = connect(any_redis_url)
    yield redis
    redis.close()
    forget_redis_keys(any_redis_url, namespace)


def test_the_first_zone_is_recorded_and_kept(client: RedisClient, namespace: str) -> None:
    assert bucket_zone.recorded(client, namespace) is None
    bucket_zone.claim(client, namespace, "Europe/Berlin")
    bucket_zone.claim(client, namespace, "Europe/Berlin")  # a restart
    assert bucket_zone.recorded(client, namespace) == "Europe/Berlin"
    with pytest.raises(bucket_zone.ZoneMismatch):
        bucket_zone.claim(client, namespace, "UTC")
    assert bucket_zone.recorded(client, namespace) == "Europe/Berlin"


def test_a_worker_in_another_zone_refuses_to_start(
        client: RedisClient, any_redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    claim_bucket_zone(Settings(redis_url=any_redis_url, namespace=namespace, timezone="UTC"))
    tokyo = Settings(redis_url=any_redis_url, namespace=namespace, timezone="Asia/Tokyo")
    with pytest.raises(typer.Exit) as stopped:
        claim_bucket_zone(tokyo)
    assert stopped.value.exit_code == 2
    error = capsys.readouterr().err
    assert "'UTC'" in error and "'Asia/Tokyo'" in error
    assert "set COSTLINE_TIMEZONE back to 'UTC'" in error and "new namespace" in error
    assert bucket_zone.recorded(client, namespace) == "UTC"


def test_a_period_read_from_expired_finer_buckets_is_flagged(
        redis_writer: Writer, any_redis_url: str, namespace: str) -> None:
    _register()

    def spend(*zone: str, at: str) -> Any:
        return CliRunner().invoke(app, [
            "--redis-url", any_redis_url, "--namespace", namespace, "spend", "--period", "day",
            *zone, "--at", at, "--json"])

    # A Tokyo day 90 days ago, in a namespace counted in UTC: its edges come from hourly
    # buckets, kept 35 days.
    old = time.strftime("%Y-%m-%dT12:00:00+09:00", time.gmtime(time.time() - 90 * 86400))
    flagged = spend("--tz", "Asia/Tokyo", at=old)
    assert flagged.exit_code == 0, flagged.output
    assert "hourly buckets are kept 35 days" in flagged.stderr
    assert json.loads(flagged.stdout)["rows"] == []  # stdout stays JSON
    # The same day in the recorded zone is read from its daily bucket; nor is a recent one.
    assert spend("--tz", "UTC", at=old.replace("+09:00", "Z")).stderr == ""
    recent = time.strftime("%Y-%m-%dT12:00:00+09:00", time.gmtime(time.time() - 86400))
    assert spend("--tz", "Asia/Tokyo", at=recent).stderr == ""
