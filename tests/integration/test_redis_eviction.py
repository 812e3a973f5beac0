"""A Redis that may evict costline's keys is found out: a real server (and one master of a
real Redis Cluster) set to an evicting ``maxmemory-policy`` under a ``maxmemory`` is named in
``/healthz`` (a warning: the status stays ok), ``/metrics`` and the log, until it is set back
to ``noeviction``."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.cluster import RedisCluster

from bench.common import worker_series
from costline.connectors.redis_client import RedisClient, connect
from costline.streams.topics import create_topics
from costline.streams.worker.eviction_watch import WARNING, EvictionWatch
from costline.streams.worker.health import Health
from tests.integration.conftest import StackUp
from tests.integration.streamkit import Worker, settings_of, worker_env

pytestmark = pytest.mark.integration

# Far above what the tests hold, so a shared server evicts nothing while it is set.
LIMIT = 8 << 30


def one_server(client: RedisClient) -> tuple[str, RedisClient | object]:
    """The server whose settings a test changes: the last master of a cluster, or the one."""
    if isinstance(client, RedisCluster):
        node = sorted(client.get_primaries(), key=lambda n: n.name)[-1]  # type: ignore[no-untyped-call]
        return node.name, node
    options = client.connection_pool.connection_kwargs
    return f"{options['host']}:{options['port']}", None


def configure(client: RedisClient, target: object, **settings: str | int) -> None:
    for name, value in settings.items():
        if target is None:
            client.config_set(name, value)
        else:
            client.config_set(name, value, target_nodes=target)  # type: ignore[call-arg]


@pytest.fixture
def evicting(any_redis_url: str) -> Iterator[tuple[RedisClient, str, object]]:
    """A client of ``any_redis_url`` whose chosen server is set back to what it was."""
    client = connect(any_redis_url)
    name, target = one_server(client)
    before = client.config_get("maxmemory*") if target is None else \
        client.config_get("maxmemory*", target_nodes=target)  # type: ignore[call-arg]
    try:
        yield client, name, target
    finally:
        configure(client, target, **{"maxmemory-policy": before["maxmemory-policy"],
                                     "maxmemory": before["maxmemory"]})
        client.close()


def test_a_server_that_may_evict_is_named_until_it_may_not(
        evicting: tuple[RedisClient, str, object], caplog: pytest.LogCaptureFixture) -> None:
    client, name, target = evicting
    health = Health()
    watch = EvictionWatch(client, health)
    asyncio.run(watch.check())
    assert not health.warnings and watch.evicting == 0

    configure(client, target, maxmemory=LIMIT, **{"maxmemory-policy": "volatile-lru"})
    with caplog.at_level(logging.INFO, logger="costline.redis"):
        asyncio.run(watch.check())
        asyncio.run(watch.check())  # said once, not on every round
    assert watch.evicting == 1 and health.ok  # a setting, not a failure: counting goes on
    warning = health.report()["warnings"][WARNING]  # type: ignore[index]
    assert f"Redis {name} may evict" in warning and "volatile-lru" in warning
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "set maxmemory-policy noeviction" in errors[0].getMessage()

    configure(client, target, **{"maxmemory-policy": "noeviction"})
    with caplog.at_level(logging.INFO, logger="costline.redis"):
        asyncio.run(watch.check())
    assert "warnings" not in health.report() and watch.evicting == 0
    assert caplog.records[-1].getMessage() == "Redis no longer evicts costline's keys"


def healthz(env: dict[str, str]) -> dict[str, object]:
    url = f"http://127.0.0.1:{env['COSTLINE_WEB_PORT']}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return json.loads(answer.read())  # type: ignore[no-any-return]
    except urllib.error.HTTPError as exc:
        return json.loads(exc.read())  # type: ignore[no-any-return]
    except OSError:
        return {}


def until(check, seconds: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "not within the time given"
        time.sleep(0.5)


def test_the_worker_reports_an_evicting_redis_in_healthz_and_metrics(
        kafka_bootstrap: str, kafka_namespace: str, tmp_path: Path,
        private_stack: tuple[Path, StackUp]) -> None:
    _, up = private_stack
    url = up(kafka="none", redis="system").exports["COSTLINE_REDIS_URL"]
    client = connect(url)
    client.config_set("maxmemory", LIMIT)
    client.config_set("maxmemory-policy", "allkeys-lru")
    env = worker_env(kafka_namespace, kafka_bootstrap, url)
    create_topics(settings_of(env))
    worker = Worker(env, tmp_path / "worker.log")
    worker.start()
    try:
        until(lambda: WARNING in healthz(env).get("warnings", {}), 90)  # type: ignore[operator]
        assert healthz(env)["status"] == "ok"
        assert ("costline_redis_evicting_nodes", {}, 1.0) in worker_series(worker)
        client.config_set("maxmemory-policy", "noeviction")
        until(lambda: "warnings" not in healthz(env), 30)
        assert ("costline_redis_evicting_nodes", {}, 0.0) in worker_series(worker)
    finally:
        worker.stop()
        client.close()
    log = worker.log.read_text()
    assert log.count("may evict costline's keys (maxmemory-policy allkeys-lru") == 1, log[-3000:]
