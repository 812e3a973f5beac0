"""Fixtures every test may use: where Kafka and Redis are, and a namespace of one's own.

The services are the ones the environment names (``COSTLINE_KAFKA_BOOTSTRAP``,
``COSTLINE_REDIS_URL``; the contract's defaults otherwise), usually exported from
``costline stack up``; a Redis Cluster is ``COSTLINE_TEST_REDIS_CLUSTER_URL`` (CI starts one
with ``costline stack up --kafka none --redis cluster``). A test whose service does not answer
is skipped with the reason, but fails when ``REQUIRE_SERVICES=1`` (CI sets it): a broken CI
stack must never pass as "everything skipped".

Each test gets its own ``namespace`` (``t`` + random hex), so topics, consumer groups and
Redis keys of two tests never meet, even against a shared, long-lived broker.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest
import redis
from redis.cluster import RedisCluster

from costline.connectors.kafka import KafkaUnavailable, api_versions
from costline.connectors.redis_client import FAILURES, connect

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
CLUSTER_URL_VARIABLE = "COSTLINE_TEST_REDIS_CLUSTER_URL"


def services_required() -> bool:
    return os.environ.get("REQUIRE_SERVICES") == "1"


def unavailable(what: str, why: str) -> NoReturn:
    """Skip the test, or fail it when the environment requires real services."""
    if services_required():
        pytest.fail(f"{what} is required (REQUIRE_SERVICES=1) but unavailable: {why}",
                    pytrace=False)
    pytest.skip(f"{what} unavailable: {why}")


@dataclass(frozen=True)
class Services:
    """The Kafka and Redis the tests run against."""

    bootstrap: str
    redis_url: str


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    """A Kafka bootstrap string that answered an ApiVersions request."""
    bootstrap = os.environ.get("COSTLINE_KAFKA_BOOTSTRAP", DEFAULT_BOOTSTRAP)
    try:
        api_versions(bootstrap, timeout_s=3.0)
    except KafkaUnavailable as exc:
        unavailable(f"Kafka at {bootstrap}", str(exc))
    return bootstrap


@pytest.fixture(scope="session")
def redis_url() -> str:
    """A Redis URL that answered PING."""
    url = os.environ.get("COSTLINE_REDIS_URL", DEFAULT_REDIS_URL)
    client = redis.Redis.from_url(url, socket_timeout=3.0, socket_connect_timeout=3.0)
    try:
        client.ping()
    except (redis.RedisError, OSError) as exc:
        unavailable(f"Redis at {url}", f"{type(exc).__name__}: {exc}")
    finally:
        client.close()
    return url


@pytest.fixture(scope="session")
def redis_cluster_url() -> str:
    """The URL of a Redis Cluster every node of which answers (``COSTLINE_TEST_REDIS_CLUSTER_URL``;
    ``costline stack up --kafka none --redis cluster --redis-port 0 --state-dir DIR`` prints
    one)."""
    url = os.environ.get(CLUSTER_URL_VARIABLE)
    if not url:
        unavailable("a Redis Cluster", f"{CLUSTER_URL_VARIABLE} is not set")
    try:
        with connect(url, timeout_s=3.0, connect_timeout_s=3.0) as client:
            if not isinstance(client, RedisCluster):
                unavailable(f"a Redis Cluster at {url}", "it is a single Redis")
            client.ping(target_nodes=RedisCluster.ALL_NODES)
    except FAILURES + (OSError,) as exc:
        unavailable(f"a Redis Cluster at {url}", f"{type(exc).__name__}: {exc}")
    return url


@pytest.fixture(params=["single", "cluster"])
def any_redis_url(request: pytest.FixtureRequest) -> str:
    """A test that takes it runs twice: against a single Redis (``redis_url``) and against a
    Redis Cluster (``redis_cluster_url``)."""
    fixture = "redis_url" if request.param == "single" else "redis_cluster_url"
    return str(request.getfixturevalue(fixture))


@pytest.fixture(scope="session")
def services(kafka_bootstrap: str, redis_url: str) -> Services:
    """Both services, for tests that run the whole pipeline."""
    return Services(kafka_bootstrap, redis_url)


@pytest.fixture
def namespace() -> str:
    """A fresh ``COSTLINE_NAMESPACE`` for this test alone."""
    return "t" + secrets.token_hex(5)


@pytest.fixture
def kafka_namespace(kafka_bootstrap: str, namespace: str) -> Iterator[str]:
    """``namespace``, with its topics deleted afterwards so a shared broker does not fill up."""
    yield namespace
    from costline.connectors.kafka import admin

    client = admin(kafka_bootstrap, timeout_s=10.0)
    try:
        mine = [name for name in client.list_topics() if name.startswith(f"{namespace}.")]
        if mine:
            client.delete_topics(mine, raise_errors=False)
    except Exception:  # noqa: BLE001 - cleanup is best effort, the namespace is unique anyway
        pass
    finally:
        client.close()
    forget_redis_keys(os.environ.get("COSTLINE_REDIS_URL", DEFAULT_REDIS_URL), namespace)


def forget_redis_keys(url: str, namespace: str) -> None:
    """Delete what a test of this namespace left in Redis, so a shared Redis (a developer's
    stack, where the benchmarks also run) does not keep growing. Best effort. A cluster
    client scans every node and deletes slot by slot."""
    try:
        with connect(url, timeout_s=3.0, connect_timeout_s=3.0) as client:
            keys = list(client.scan_iter(match=f"*{namespace}*", count=1000))
            for first in range(0, len(keys), 1000):
                client.delete(*keys[first:first + 1000])
    except FAILURES + (OSError,):
        pass


@pytest.fixture
def stack_state_dir(kafka_bootstrap: str, redis_url: str) -> Path:
    """The state folder of the ``costline stack`` that runs the services under test.

    Tests that restart Kafka or Redis mid-stream use it with ``costline.streams.stack.restart``;
    services that a costline stack did not start cannot be restarted, so such a test is
    unavailable there.
    """
    from costline.streams import stack

    folder = os.environ.get("COSTLINE_STATE_DIR")
    if not folder:
        unavailable("a costline stack", "COSTLINE_STATE_DIR is not set")
    exports = stack.status(Path(folder)).exports
    if (exports.get("COSTLINE_KAFKA_BOOTSTRAP"), exports.get("COSTLINE_REDIS_URL")) != (
        kafka_bootstrap, redis_url,
    ):
        unavailable("a costline stack", f"the stack in {folder} does not run the services "
                    "the tests use")
    return Path(folder)
