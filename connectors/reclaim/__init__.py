"""Reclamation connectors: one file per target, each registered by name with its parameters.

A connector is one file in this folder: its parameter model (a ``ReclaimParams``) and one
decorated class, ``@reclaimer("slurm")``, that carries the model and a docstring with a YAML
example. ``RECLAIMERS.discover`` imports every module here, so the registry is complete once
this package is imported. The loader is given it (``costline.connectors.plugins.PLUGINS``),
so ``reclaim: {connector: ...}`` in a rule file is checked against what can actually run: an
unknown connector or parameter is a rule-file error at load time.

A connector answers three questions:

* ``identify`` — at planning time, who the target is (a Slurm job's name, user and start
  time; a Kubernetes object's UID). Raises ``NotReclaimable`` when there is nothing to act on.
* ``describe`` — one phrase for the audit log: ``cancel Slurm job 4211``.
* ``release`` — at execution time: check the target is still the one planned, act, and report
  an ``Outcome``. It is called at most once per plan.
"""

from __future__ import annotations

import asyncio
import os
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from typing import ClassVar, Literal, TypeVar

from costline.rules.findings import ReclaimRequest
from costline.rules.reclaim import Outcome, Plan
from costline.rules.reclaim_params import ReclaimParams
from costline.rules.registry import Registry

Sleep = Callable[[float], Awaitable[None]]


class NotReclaimable(Exception):
    """The resource maps to nothing this connector can act on; the plan closes at once."""

    def __init__(self, step: Literal["skipped", "failed"], reason: str) -> None:
        super().__init__(reason)
        self.step: Literal["skipped", "failed"] = step
        self.reason = reason


class ReclaimConnector(ABC):
    """One reclamation target. Instances are long-lived, shared by every plan, and hold no
    open connections between calls."""

    name: ClassVar[str]
    params_model: ClassVar[type[ReclaimParams]]

    @abstractmethod
    async def identify(self, request: ReclaimRequest) -> dict[str, str]:
        """The identity of the target to record in the plan."""

    @abstractmethod
    def describe(self, plan: Plan) -> str:
        """What ``release`` would do, as a phrase: ``cancel Slurm job 4211``."""

    @abstractmethod
    async def release(self, plan: Plan) -> Outcome:
        """Re-check the target against ``plan.target`` and act."""


C = TypeVar("C", bound=type[ReclaimConnector])
RECLAIMERS: Registry[ReclaimConnector] = Registry("connector", ReclaimConnector)


def reclaimer(name: str) -> Callable[[C], C]:
    """Class decorator: register a connector, which carries its parameter model, by name."""

    def register(cls: C) -> C:
        cls.name = name
        return RECLAIMERS.register(name)(cls)

    return register


def build_connectors(**overrides: ReclaimConnector) -> dict[str, ReclaimConnector]:
    """One instance of every registered connector with its defaults; ``overrides`` replace
    some by name (tests, or a connector configured by the worker)."""
    built: dict[str, ReclaimConnector] = {
        name: cls() for name, cls in RECLAIMERS.items() if name not in overrides
    }
    built.update(overrides)
    return built


def secret_from_env(variable: str, environ: Mapping[str, str] | None = None) -> str:
    """The secret an environment variable holds; the error names the variable only."""
    value = (os.environ if environ is None else environ).get(variable, "")
    if not value:
        raise NotReclaimable("failed", f"environment variable {variable} is not set")
    return value


def backoff_delays(retries: int, first: float, cap: float = 30.0) -> list[float]:
    """Waits before each retry: ``first``, doubling, at most ``cap`` seconds."""
    return [min(cap, first * 2**attempt) for attempt in range(retries)]


async def real_sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


RECLAIMERS.discover(__name__, __path__)
