"""What a local service is, and the registry that maps a service name to its class.

A service kind is one decorated class in one module (``brokers.py``, ``stores.py``): it says
which role it fills (``kafka`` or ``redis``), under which ``--kafka``/``--redis`` flavor name,
how to prepare its files, the command that runs it, how to tell that it answers, and what a
shell must export to reach it. The orchestration in ``control.py`` never names a kind.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar, TypeVar

from costline.streams.stack.errors import StackError
from costline.streams.stack.layout import Layout

ROLES = ("kafka", "redis")
# The flavor that leaves a role out of ``up``.
NONE = "none"


class Service(ABC):
    """One local service on loopback, with its data, log and pid files in a ``Layout``."""

    name: ClassVar[str]
    role: ClassVar[str]
    flavor: ClassVar[str]
    default_port: ClassVar[int]
    # How long the first answer may take once the process runs.
    start_timeout_s: ClassVar[float] = 30.0

    def __init__(self, layout: Layout, host: str, port: int) -> None:
        self.layout = layout
        self.host = host
        self.port = port

    @property
    def data_dir(self) -> Path:
        return self.layout.data_dir(self.name)

    @property
    def log_file(self) -> Path:
        return self.layout.log_file(self.name)

    def ports(self) -> tuple[int, ...]:
        """Every port the service binds (checked for foreign listeners before it starts)."""
        return (self.port,)

    def env(self) -> dict[str, str]:
        """Environment added to the service's own."""
        return {}

    def prepare(self) -> None:  # noqa: B027 - optional hook, most services need nothing
        """Get binaries and write config and data files; runs before every start."""

    @abstractmethod
    def argv(self) -> list[str]:
        """The command line of the service."""

    @abstractmethod
    def answers(self) -> bool:
        """True once the service does real work (a protocol round trip, not an open port)."""

    @abstractmethod
    def endpoint(self) -> str:
        """Where clients connect, as they would write it in a setting."""

    @abstractmethod
    def exports(self) -> dict[str, str]:
        """The ``COSTLINE_*`` environment a client needs for this service."""


S = TypeVar("S", bound=type[Service])

SERVICES: dict[str, type[Service]] = {}


def register(cls: S) -> S:
    """Class decorator: make a service kind known by its ``name``."""
    if cls.name in SERVICES:
        raise ValueError(f"service {cls.name!r} registered twice")
    SERVICES[cls.name] = cls
    return cls


def flavors(role: str) -> list[str]:
    """The flavor names a role can be started with, e.g. ``["apache", "embedded"]``."""
    return sorted(cls.flavor for cls in SERVICES.values() if cls.role == role)


def service_for(role: str, flavor: str) -> type[Service]:
    """The service class of ``--<role> <flavor>``."""
    for cls in SERVICES.values():
        if cls.role == role and cls.flavor == flavor:
            return cls
    known = ", ".join(flavors(role)) or "none"
    raise StackError(f"unknown {role} flavor {flavor!r} (known: {known})")


def require_binary(find: Callable[[], str | None], what: str, hint: str) -> str:
    """The path ``find`` returns, or a ``StackError`` saying how to get the binary."""
    path = find()
    if not path:
        raise StackError(f"{what} not found: {hint}")
    return path
