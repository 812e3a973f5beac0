"""Reclamation connectors: one file per target, each registered by name with its parameters.

A connector is one decorated class: ``@reclaimer("slurm")`` puts it in ``RECLAIMERS`` and its
parameter model in the rule kinds' connector registry, so ``reclaim: {connector: ...}`` in a
rule file is checked against what can actually run: an unknown connector or parameter is a
rule-file error at load time. Import this package before loading rules.

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
from typing import Annotated, ClassVar, Literal, TypeVar

from pydantic import Field, PlainSerializer

from costline.rules.durations import PositiveDuration, format_duration
from costline.rules.findings import ReclaimRequest
from costline.rules.kinds.idle import connector
from costline.rules.reclaim import Outcome, Plan, ReclaimParams

EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")]
"""The name of an environment variable that holds a secret (never the secret itself)."""

Seconds = Annotated[PositiveDuration, PlainSerializer(format_duration, return_type=str)]
"""A duration parameter: written ``10s``, held as seconds, and passed on as ``10s`` again so
the parameters of a reclaim request validate a second time where they are used."""

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
RECLAIMERS: dict[str, type[ReclaimConnector]] = {}


def reclaimer(name: str) -> Callable[[C], C]:
    """Class decorator: register a connector and its parameter model under ``name``."""

    def register(cls: C) -> C:
        if name in RECLAIMERS:
            raise ValueError(f"reclaim connector {name!r} is registered twice")
        cls.name = name
        RECLAIMERS[name] = cls
        connector(name)(cls.params_model)
        return cls

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


# Importing the connector modules fills RECLAIMERS (and the rule kinds' connector registry).
from costline.connectors.reclaim import dry_run, kubernetes, slurm, webhook  # noqa: E402,F401
