"""Redis servers of a test's own that it may crash and start again: a single redis-server, or
a Redis Cluster of three masters. Each keeps an append-only file (fsync every second), so it
comes back with at most its last second of writes lost, as a production Redis would."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis import Redis

from tests.conftest import unavailable
from tests.integration.streamkit import free_port


class RedisStore:
    """A redis-server the test owns: its URL, and a crash followed by a restart."""

    def __init__(self, folder: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            unavailable("redis-server", "not installed")
        self.port = free_port()
        folder.mkdir(parents=True, exist_ok=True)
        self.argv = [binary, "--port", str(self.port), "--bind", "127.0.0.1",
                     "--dir", str(folder), "--appendonly", "yes", "--appendfsync", "everysec",
                     "--save", ""]
        self.process = self._start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> Any:
        return Redis.from_url(self.url)

    def _start(self) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if Redis(port=self.port, socket_timeout=1).ping():
                    return process
            except Exception:  # noqa: BLE001 - not up yet (or still loading its file)
                time.sleep(0.05)
        raise AssertionError(f"redis-server on {self.port} did not start")

    def crash_and_restart(self) -> None:
        """kill -9, then start again from the append-only file."""
        self.process.kill()
        self.process.wait(10)
        self.process = self._start()

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(10)


@pytest.fixture(params=["redis"])
def redis_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RedisStore]:
    store = RedisStore(tmp_path / "redis")
    yield store
    store.stop()
