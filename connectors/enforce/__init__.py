"""Enforcement connectors: one file per target, each registered by name with its parameters.

A connector is one file in this folder: its parameter model (an ``EnforceParams``) and one
decorated class, ``@enforcer("slurm")``, that carries the model and a docstring with a YAML
example. ``ENFORCERS.discover`` imports every module here; the loader is given the registry
(``costline.connectors.plugins.PLUGINS``), so ``enforce: {connector: ...}`` is checked against
what can actually run.

A connector answers five questions, each about one plan:

* ``identify`` — at planning time, what it will act on (the group's Slurm account). Raises
  ``NotEnforceable`` when there is nothing.
* ``describe`` — one phrase for the audit log and Slack: ``hold the pending jobs of Slurm
  account pretrain``.
* ``snapshot`` — the current values of what ``apply`` will change and ``before`` does not
  hold yet (``{}`` when there is nothing new). The worker records them before ``apply`` runs,
  so a crash in between never leaves a change nobody knows how to undo.
* ``apply`` — make the change for the items of ``before`` (idempotent: after a restart it is
  called again for the same items).
* ``lift`` — restore every item of ``before`` exactly, leaving alone what someone else
  changed since.

``sweeps`` says whether ``snapshot`` can find new items while the enforcement holds (pending
jobs submitted after a hold): the worker then calls ``snapshot`` and ``apply`` on every tick.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal, TypeVar

from costline.rules.enforce import EnforcePlan
from costline.rules.enforce_params import EnforceParams
from costline.rules.reclaim import Outcome
from costline.rules.registry import Registry


class NotEnforceable(Exception):
    """The group maps to nothing this connector can act on; the plan closes at once."""

    def __init__(self, step: Literal["skipped", "failed"], reason: str) -> None:
        super().__init__(reason)
        self.step: Literal["skipped", "failed"] = step
        self.reason = reason


class EnforceConnector(ABC):
    """One enforcement target. Instances are long-lived and shared by every plan."""

    name: ClassVar[str]
    params_model: ClassVar[type[EnforceParams]]

    def sweeps(self, plan: EnforcePlan) -> bool:
        """Whether new items may appear while the plan is enforced."""
        return False

    @abstractmethod
    async def identify(self, plan: EnforcePlan) -> dict[str, str]:
        """The target to record in the plan (``plan.target`` is still empty)."""

    @abstractmethod
    def describe(self, plan: EnforcePlan) -> str:
        """What ``apply`` does, as a phrase."""

    @abstractmethod
    async def snapshot(self, plan: EnforcePlan, before: Mapping[str, Any]) -> dict[str, Any]:
        """The current values of the items ``apply`` will change that ``before`` lacks."""

    @abstractmethod
    async def apply(self, plan: EnforcePlan, before: Mapping[str, Any]) -> Outcome:
        """Change the items of ``before``; safe to repeat."""

    @abstractmethod
    async def lift(self, plan: EnforcePlan, before: Mapping[str, Any]) -> Outcome:
        """Restore the items of ``before`` that still hold what ``apply`` set."""


C = TypeVar("C", bound=type[EnforceConnector])
ENFORCERS: Registry[EnforceConnector] = Registry("enforcement connector", EnforceConnector)


def enforcer(name: str) -> Callable[[C], C]:
    """Class decorator: register a connector, which carries its parameter model, by name."""

    def register(cls: C) -> C:
        cls.name = name
        return ENFORCERS.register(name)(cls)

    return register


def build_enforcers(**overrides: EnforceConnector) -> dict[str, EnforceConnector]:
    """One instance of every registered connector; ``overrides`` replace some by name."""
    built: dict[str, EnforceConnector] = {
        name: cls() for name, cls in ENFORCERS.items() if name not in overrides
    }
    built.update(overrides)
    return built


ENFORCERS.discover(__name__, __path__)
