"""Redis servers of a test's own that it may crash while events flow: a single redis-server,
or a Redis Cluster of three masters (``costline stack up --redis cluster``), one master of
which is killed. Each keeps an append-only file (fsync every second), so it comes back with
at most its last second of writes lost, as a production Redis would."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest
from redis import Redis

from costline.connectors.redis_client import connect
from costline.connectors.redis_keys import slot_tag, wm_key
from costline.streams import stack
from tests.conftest import unavailable
from tests.integration.streamkit import free_port, kill_master


class RedisStore(Protocol):
    url: str

    def client(self) -> Any: ...

    def crash_and_restart(self, namespace: str) -> None:
        """kill -9 (a master serving ``namespace``'s first ledger partition), and have it
        come back from its append-only file."""

    def stop(self) -> None: ...


def _answers(url: str, within_s: float = 30) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            with connect(url, timeout_s=1, connect_timeout_s=1) as client:
                client.ping()
                return
        except Exception:  # noqa: BLE001 - not up yet, or still loading its file
            time.sleep(0.05)
    raise AssertionError(f"Redis at {url} did not come back in {within_s}s")


class SingleRedis:
    """A redis-server of the test's own."""

    def __init__(self, folder: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            unavailable("redis-server", "not installed")
        port = free_port()
        folder.mkdir(parents=True, exist_ok=True)
        self.url = f"redis://127.0.0.1:{port}/0"
        self.argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder),
                     "--appendonly", "yes", "--appendfsync", "everysec", "--save", ""]
        self.process = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL)
        _answers(self.url)

    def client(self) -> Any:
        return Redis.from_url(self.url)

    def crash_and_restart(self, namespace: str) -> None:
        self.process.kill()
        self.process.wait(10)
        self.process = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL)
        _answers(self.url)

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(10)


class ClusterRedis:
    """Three masters under the stack's supervisor, which starts a killed one again."""

    def __init__(self, folder: Path) -> None:
        for binary in ("redis-server", "redis-cli"):
            if shutil.which(binary) is None:
                unavailable("a Redis Cluster", f"{binary} is not installed")
        self.state = folder
        info = stack.up(folder, kafka="none", redis="cluster", redis_port=0)
        self.url = info.exports["COSTLINE_REDIS_URL"]

    def client(self) -> Any:
        return connect(self.url)

    def crash_and_restart(self, namespace: str) -> None:
        with connect(self.url) as cluster:
            node = cluster.get_node_from_key(wm_key(slot_tag(namespace, 0)))
        kill_master(f"redis://{node.host}:{node.port}/0")

    def stop(self) -> None:
        stack.down(self.state)


STORES = {"single": SingleRedis, "cluster": ClusterRedis}


@pytest.fixture(params=list(STORES))
def redis_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RedisStore]:
    store: RedisStore = STORES[request.param](tmp_path / "redis")
    yield store
    store.stop()
