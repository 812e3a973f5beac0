"""Checkpoint connectors: one file per storage, each registered by name with its parameters.

A connector is one file in this folder: its parameter model (a ``CheckpointParams``) and one
decorated class, ``@checkpoint_connector("filesystem")``, carrying the model and a docstring
with a YAML example. ``CHECKPOINT_CONNECTORS.discover`` imports every module here; the loader
is given the registry (``costline.connectors.plugins.PLUGINS``), so ``act: {connector: ...}``
in a rule file is checked against what can actually run.

A connector answers two questions, as a reclamation connector does:

* ``identify`` — at planning time, what the checkpoint is (a file's device, inode, size and
  modification time; the API that owns an object). Raises ``NotReclaimable`` when there is
  nothing it may act on.
* ``act`` — at execution time: check the checkpoint is still the one planned, move or delete
  it, and report an ``Outcome`` (a move's detail names the new ``location``). It is called at
  most once per plan.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

from costline.connectors.reclaim import NotReclaimable
from costline.rules.lifecycle import LifecycleAction
from costline.rules.lifecycle_params import CheckpointParams
from costline.rules.reclaim import Outcome, Plan
from costline.rules.registry import Registry

__all__ = ["CHECKPOINT_CONNECTORS", "CheckpointConnector", "NotReclaimable",
           "build_checkpoint_connectors", "checkpoint_connector"]


class CheckpointConnector(ABC):
    """One storage the lifecycle acts on. Instances are long-lived and shared by every plan."""

    name: ClassVar[str]
    params_model: ClassVar[type[CheckpointParams]]

    @abstractmethod
    async def identify(self, action: LifecycleAction, params: Mapping[str, Any]
                       ) -> dict[str, str]:
        """The identity of the checkpoint to record in the plan."""

    @abstractmethod
    async def act(self, plan: Plan) -> Outcome:
        """Re-check the checkpoint against ``plan.target``, then move or delete it."""


C = TypeVar("C", bound=type[CheckpointConnector])
CHECKPOINT_CONNECTORS: Registry[CheckpointConnector] = Registry("connector", CheckpointConnector)


def checkpoint_connector(name: str) -> Callable[[C], C]:
    """Class decorator: register a checkpoint connector, which carries its parameters."""

    def register(cls: C) -> C:
        cls.name = name
        return CHECKPOINT_CONNECTORS.register(name)(cls)

    return register


def build_checkpoint_connectors(**overrides: CheckpointConnector
                                ) -> dict[str, CheckpointConnector]:
    """One instance of every registered connector; ``overrides`` replace some by name."""
    built: dict[str, CheckpointConnector] = {
        name: cls() for name, cls in CHECKPOINT_CONNECTORS.items() if name not in overrides}
    built.update(overrides)
    return built


CHECKPOINT_CONNECTORS.discover(__name__, __path__)
