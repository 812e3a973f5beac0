"""Every reader of costline's Redis state, on a single Redis and on a Redis Cluster from the
same kind of URL: the command line (``spend``, ``alerts``, ``silence``, ``report``), the rule
evaluation and its data generation, with partitions whose slots lie on different nodes."""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from typer.testing import CliRunner, Result

from costline.connectors.alert_store import AlertStore
from costline.connectors.redis_client import (
    ClusterUrlError,
    connect,
    connect_async,
    is_cluster,
)
from costline.connectors.redis_keys import slot_tag
from costline.connectors.redis_state import RedisState
from costline.rules.engine import Engine
from costline.rules.events import AnyEvent
from costline.rules.loader import RuleSet
from costline.rules.prices import PriceBook
from costline.streams.cli.root import _register, app
from costline.streams.settings import DEFAULT_PRICES
from costline.streams.worker.evaluator import Evaluator
from costline.streams.worker.metrics import Metrics
from tests.integration.redis_writer import Writer
from tests.unit.rulefiles.builders import HOUR, T0, fault, rule, usage

pytestmark = pytest.mark.integration

PARTITIONS = 6
PRICE = Decimal("2.49")  # gpu.h100 per GPU-hour in the example price book
DAY = "2026-11-30T12:00:00Z"  # T0's day
TEAM_DAY = RuleSet((rule(kind="budget", name="team-day", group_by=["team"], period="day",
                         limit=60),))


def costline(url: str, namespace: str, *args: str) -> Result:
    _register()
    return CliRunner().invoke(app, ["--redis-url", url, "--namespace", namespace, *args])


def json_of(url: str, namespace: str, *args: str) -> Any:
    done = costline(url, namespace, *args, "--json")
    assert done.exit_code == 0, done.output
    return json.loads(done.stdout)


def spreading(redis_writer: Writer, namespace: str) -> Writer:
    """A writer that sends each event to one of ``PARTITIONS`` home partitions."""
    return Writer(redis_writer.writer, namespace, partitions=PARTITIONS)


async def spread(writer: Writer) -> dict[str, Decimal]:
    """Usage of three teams over the partitions, and a fault: each team's expected cost (an
    integer number of GPU-hours each, so the money is exact)."""
    expected = {"a": Decimal(0), "b": Decimal(0), "c": Decimal(0)}
    events: list[AnyEvent] = []
    for step in range(PARTITIONS):
        for i, team in enumerate(expected):
            hours = 1 + step + i
            events.append(usage(T0 + step * 60 + i, hours, team=team, env="prod"))
            expected[team] += hours * PRICE
    events.append(fault(T0 + HOUR, units=8, lost_seconds=3600, recovery_seconds=900,
                        team="a"))
    await writer.write(events)
    return expected


def test_the_url_alone_tells_a_cluster_from_a_single_redis(
        any_redis_url: str, redis_cluster_url: str) -> None:
    cluster = any_redis_url == redis_cluster_url
    assert is_cluster(any_redis_url) is cluster
    with connect(any_redis_url) as client:
        assert isinstance(client, RedisCluster) is cluster
        assert client.ping()
    assert isinstance(connect_async(any_redis_url), AsyncRedisCluster) is cluster


def test_a_cluster_url_naming_another_database_is_refused_in_one_line(
        redis_cluster_url: str, namespace: str) -> None:
    elsewhere = redis_cluster_url.rsplit("/", 1)[0] + "/2"
    with pytest.raises(ClusterUrlError, match="only database 0"):
        connect(elsewhere)
    done = costline(elsewhere, namespace, "spend", "--json")
    assert done.exit_code == 1 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert "is a Redis Cluster: a Redis Cluster has only database 0" in line


async def test_spend_reads_every_partition_exactly(
        redis_writer: Writer, any_redis_url: str, namespace: str) -> None:
    expected = await spread(spreading(redis_writer, namespace))
    if is_cluster(any_redis_url):
        with connect(any_redis_url) as client:
            assert isinstance(client, RedisCluster)
            tags = [slot_tag(namespace, p) for p in range(PARTITIONS)]
            assert len({client.get_node_from_key(tag).name for tag in tags}) > 1
    report = json_of(any_redis_url, namespace, "spend", "--by", "team", "--period", "day",
                     "--at", DAY, "--tz", "UTC")
    assert {row["group"]["team"]: Decimal(row["cost"]) for row in report["rows"]} == expected
    assert {row["group"]["team"]: Decimal(row["waste"]) for row in report["rows"]} == {
        "a": 8 * Decimal("1.25") * PRICE, "b": 0, "c": 0}


async def test_the_evaluation_notices_new_data_on_any_node_and_its_alerts_reach_the_cli(
        redis_writer: Writer, any_redis_url: str, namespace: str) -> None:
    writer = spreading(redis_writer, namespace)
    expected = await spread(writer)
    client = connect(any_redis_url)
    published: list[bytes] = []

    async def publish(key: bytes, value: bytes) -> None:
        published.append(value)

    class Rules:
        engine = Engine.for_prices(TEAM_DAY, PriceBook.load(DEFAULT_PRICES))

        def current(self) -> Engine:
            return self.engine

    evaluator = Evaluator(source=Rules(), state=RedisState(client, namespace, "UTC"),
                          store=AlertStore(client, namespace), publish=publish,
                          metrics=Metrics(), clock=lambda: 0.0)
    now = T0 + 2 * HOUR
    first = await evaluator.step(now)
    over = {team for team, cost in expected.items() if cost > 60}
    assert first is not None and over and {
        json.loads(value)["group"]["team"] for value in published} == over
    assert await evaluator.step(now + 1) is None  # no new data, no tick due

    await writer.write([usage(T0 + 30, 1, team="c", env="prod")])
    assert await evaluator.step(now + 2) is not None  # a watermark on one node moved

    alerts = json_of(any_redis_url, namespace, "alerts")
    assert {alert["group"]["team"] for alert in alerts} == over
    assert {alert["state"] for alert in alerts} == {"firing"}


def test_silences_are_added_listed_and_expired(any_redis_url: str, namespace: str) -> None:
    added = costline(any_redis_url, namespace, "silence", "add", "--rule", "team-day",
                     "--match", "team=a", "--for", "2h", "--by", "test")
    assert added.exit_code == 0, added.output
    [silence] = json_of(any_redis_url, namespace, "silence", "list")
    assert (silence["rule"], silence["matchers"]) == ("team-day", {"team": "a"})
    expired = costline(any_redis_url, namespace, "silence", "expire", silence["id"])
    assert expired.exit_code == 0, expired.output
    assert json_of(any_redis_url, namespace, "silence", "list") == []


async def test_the_report_reads_every_partition(
        redis_writer: Writer, any_redis_url: str, namespace: str, tmp_path: Path) -> None:
    await spread(spreading(redis_writer, namespace))
    page = tmp_path / "report.html"
    done = await asyncio.to_thread(
        costline, any_redis_url, namespace, "report", "--html", str(page), "--period", "day",
        "--at", DAY)
    assert done.exit_code == 0, done.output
    text = page.read_text()
    total = sum(Decimal(1 + p + i) for p in range(PARTITIONS) for i in range(3)) * PRICE
    assert f"{total:,.2f}" in text
