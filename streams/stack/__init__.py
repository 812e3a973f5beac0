"""``costline stack``: Kafka and Redis on loopback for development, tests and the demo.

Importing the package registers every service kind (``brokers``, ``stores``, ``cluster``); the
verbs are plain functions over a state folder::

    info = up(Path(".costline/dev"), kafka="apache", redis="system")
    info = up(Path(".costline/cluster"), kafka="none", redis="cluster", redis_port=0)
    restart(Path(".costline/dev"), "redis")   # by role or by name ("redis-server")
    down(Path(".costline/dev"))
"""

from __future__ import annotations

from costline.streams.stack import brokers, cluster, stores  # noqa: F401 - fill the registry
from costline.streams.stack.control import (
    ServiceState,
    StackInfo,
    down,
    restart,
    start,
    status,
    stop,
    up,
)
from costline.streams.stack.errors import StackError
from costline.streams.stack.services import NONE, SERVICES, flavors

__all__ = [
    "NONE",
    "SERVICES",
    "ServiceState",
    "StackError",
    "StackInfo",
    "down",
    "flavors",
    "restart",
    "start",
    "status",
    "stop",
    "up",
]
