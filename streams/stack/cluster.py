"""``costline stack up --redis cluster``: a Redis Cluster of three masters on loopback.

Three ``redis-server`` nodes of the distribution (``cluster-enabled yes``), each with its own
port, cluster bus port and data folder (``data/redis-cluster/node-N``: append-only file and
``nodes.conf``), made one cluster by ``redis-cli --cluster create`` the first time. The stack
tracks one process per service, so the service's process is a small supervisor
(``costline.streams.stack.cluster_supervisor``) that runs the nodes as its children: stopping
it stops them, and a node that dies is started again from its append-only file, as a service
manager would.

The ports are ``--redis-port`` and the five after it: the nodes' client ports, then their bus
ports (``cluster-port``, so a free port near the top of the range needs no room 10000 above
it). The printed ``COSTLINE_REDIS_URL`` names the first node; every costline client learns
the others from it (``costline.connectors.redis_client``).

Sized for a small machine: no RDB snapshots (the append-only file is what a node restarts
from; three nodes forking every minute would compete with the rest for two CPUs), the default
node timeout (15 s: with no replicas, declaring a master failed sooner gains nothing).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import ClassVar

from costline.connectors.redis_client import FAILURES, connect_node
from costline.streams.stack.services import Service, register, require_binary

NODES = 3
SLOTS = 16384


@register
class RedisClusterService(Service):
    """Three masters, no replicas, one supervisor process."""

    name: ClassVar[str] = "redis-cluster"
    role: ClassVar[str] = "redis"
    flavor: ClassVar[str] = "cluster"
    default_port: ClassVar[int] = 7000
    start_timeout_s: ClassVar[float] = 60.0

    @property
    def node_ports(self) -> tuple[int, ...]:
        return tuple(self.port + i for i in range(NODES))

    @property
    def bus_ports(self) -> tuple[int, ...]:
        return tuple(self.port + NODES + i for i in range(NODES))

    def node_dir(self, index: int) -> Path:
        return self.data_dir / f"node-{index + 1}"

    def node_url(self, index: int) -> str:
        return f"redis://{self.host}:{self.node_ports[index]}/0"

    def ports(self) -> tuple[int, ...]:
        return (*self.node_ports, *self.bus_ports)

    def endpoint(self) -> str:
        return self.node_url(0)

    def exports(self) -> dict[str, str]:
        return {"COSTLINE_REDIS_URL": self.endpoint()}

    def node_config(self, index: int) -> str:
        settings = {
            "bind": self.host,
            "port": str(self.node_ports[index]),
            "protected-mode": "yes",
            "daemonize": "no",
            "dir": str(self.node_dir(index)),
            "logfile": '""',
            "cluster-enabled": "yes",
            "cluster-port": str(self.bus_ports[index]),
            "cluster-config-file": "nodes.conf",
            "appendonly": "yes",
            "appendfsync": "everysec",
            "save": '""',
        }
        return "".join(f"{key} {value}\n" for key, value in settings.items())

    def _binaries(self) -> tuple[str, str]:
        hint = "install it (Debian: apt-get install redis-server)"
        server = require_binary(lambda: shutil.which("redis-server"), "redis-server", hint)
        cli = require_binary(lambda: shutil.which("redis-cli"), "redis-cli", hint)
        return server, cli

    def prepare(self) -> None:
        self._binaries()
        for index in range(NODES):
            self.node_dir(index).mkdir(parents=True, exist_ok=True)
            (self.node_dir(index) / "redis.conf").write_text(self.node_config(index))
        readdress([self.node_dir(i) for i in range(NODES)],
                  [f"{self.host}:{port}@{bus}"
                   for port, bus in zip(self.node_ports, self.bus_ports, strict=True)])

    def argv(self) -> list[str]:
        server, cli = self._binaries()
        return [sys.executable, "-m", "costline.streams.stack.cluster_supervisor",
                "--redis-server", server, "--redis-cli", cli, "--host", self.host,
                *(str(self.node_dir(i) / "redis.conf") for i in range(NODES))]

    def answers(self) -> bool:
        """Every node has loaded its data (PING) and sees every slot served."""
        return all((cluster_info(self.node_url(i)) or {}).get("cluster_state") == "ok"
                   for i in range(NODES))


def cluster_info(url: str) -> dict[str, str] | None:
    """``CLUSTER INFO`` of the node at ``url`` (``cluster_state``, ``cluster_slots_assigned``,
    ``cluster_known_nodes``, ...), or None while it does not answer or is still loading its
    data."""
    try:
        with connect_node(url, timeout_s=1.0, connect_timeout_s=1.0) as node:
            node.ping()
            info = node.cluster("info")
    except FAILURES + (OSError,):
        return None
    if isinstance(info, dict):
        return {str(key): _text(value) for key, value in info.items()}
    pairs = (line.partition(":") for line in _text(info).splitlines())
    return {key: value.strip() for key, _, value in pairs if key}


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def readdress(node_dirs: list[Path], addresses: list[str]) -> None:
    """Point every node's ``nodes.conf`` at the nodes' addresses of this start.

    A node keeps the addresses of the cluster's nodes in ``nodes.conf`` and finds them there
    when it starts again. A stack taken down and brought up on other ports (``--redis-port 0``
    picks free ones) would leave every node looking for the others where they no longer are:
    so each node's own entry (``myself``) tells which node id the folder holds, and every
    entry of that id gets the node's new ``ip:port@bus``, data and slots unchanged.
    """
    files = [folder / "nodes.conf" for folder in node_dirs]
    moved: dict[str, str] = {}
    for path, address in zip(files, addresses, strict=True):
        for fields in _entries(path):
            if "myself" in fields[2].split(","):
                moved[fields[0]] = address
    for path in files:
        if not path.exists():
            continue
        lines = []
        for line in path.read_text().splitlines():
            fields = line.split(" ")
            if len(fields) > 2 and fields[0] in moved:
                # ip:port@bus, then ",hostname" on Redis versions that announce one
                _, comma, rest = fields[1].partition(",")
                fields[1] = moved[fields[0]] + comma + rest
            lines.append(" ".join(fields))
        path.write_text("".join(f"{line}\n" for line in lines))


def _entries(path: Path) -> list[list[str]]:
    if not path.exists():
        return []
    entries = [line.split(" ") for line in path.read_text().splitlines()]
    return [fields for fields in entries if len(fields) > 2 and fields[0] != "vars"]
