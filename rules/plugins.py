"""The plug-ins a rule file names whose implementations live outside the pure core.

Rule kinds belong to the core (``rules/kinds/``). A rule file also names plug-ins that act
on the outside world — ``reclaim: {connector: slurm, action: requeue}`` — and each of those is
one file in ``connectors/`` that holds both its parameter model and the code that uses it, so
that a new connector is one file and its parameters are defined once. ``rules/`` may not
import ``connectors/``, so the loader and the JSON Schema are *given* those registries as a
``Plugins`` value by whoever composes the program (``costline.connectors.plugins.PLUGINS``).
Which parameters apply is then what the caller passed, never what happened to be imported.

A family added later (notifiers) becomes one more field here, filled in that same one place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationInfo

from costline.rules.lifecycle_params import CheckpointActor
from costline.rules.reclaim_params import Reclaimer

CONTEXT_KEY = "plugins"


@dataclass(frozen=True)
class Plugins:
    """The registries of the plug-in families rule files name, by the key they are named in."""

    reclaimers: Mapping[str, type[Reclaimer]] = field(default_factory=dict)
    """``reclaim: {connector: NAME}`` → the connector, which carries its parameter model."""
    checkpoint_connectors: Mapping[str, type[CheckpointActor]] = field(default_factory=dict)
    """``act: {connector: NAME}`` of a ``checkpoint_lifecycle`` rule → the connector."""


NO_PLUGINS = Plugins()
"""Rule files that name no plug-in (every kind but ``idle`` with ``reclaim``) need none."""


def plugins_of(info: ValidationInfo) -> Plugins:
    """The plug-ins the loader passed in the validation context (none if it passed none)."""
    context: Any = info.context
    found = context.get(CONTEXT_KEY) if isinstance(context, dict) else None
    return found if isinstance(found, Plugins) else NO_PLUGINS
