"""The plug-ins a rule file names whose implementations live outside the pure core.

Rule kinds belong to the core (``rules/kinds/``). A rule file also names plug-ins that act
on the outside world — ``reclaim: {connector: slurm, action: requeue}``,
``notify: {pagerduty: {routing_key_env: PD_KEY}}`` — and each of those is one file in
``connectors/`` that holds both its parameter model and the code that uses it, so that a new
connector or notifier is one file and its parameters are defined once. ``rules/`` may not
import ``connectors/``, so the loader and the JSON Schema are *given* those registries as a
``Plugins`` value by whoever composes the program (``costline.connectors.plugins.PLUGINS``).
Which parameters apply is then what the caller passed, never what happened to be imported.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import ValidationInfo

from costline.rules.lifecycle_params import CheckpointActor
from costline.rules.notify_params import Notifier
from costline.rules.reclaim_params import Reclaimer

if TYPE_CHECKING:  # enforce_params reads the plug-ins through plugins_of below
    from costline.rules.enforce_params import Enforcer

CONTEXT_KEY = "plugins"


@dataclass(frozen=True)
class Plugins:
    """The registries of the plug-in families rule files name, by the key they are named in."""

    reclaimers: Mapping[str, type[Reclaimer]] = field(default_factory=dict)
    """``reclaim: {connector: NAME}`` → the connector, which carries its parameter model."""
    enforcers: Mapping[str, type[Enforcer]] = field(default_factory=dict)
    """``enforce: {connector: NAME}`` of a budget rule → the connector, likewise."""

    notifiers: Mapping[str, type[Notifier]] = field(default_factory=dict)
    """``notify: {NAME: ...}`` → the notifier, which carries its parameter model."""

    checkpoint_connectors: Mapping[str, type[CheckpointActor]] = field(default_factory=dict)
    """``act: {connector: NAME}`` of a ``checkpoint_lifecycle`` rule → the connector."""


NO_PLUGINS = Plugins()
"""Rule files that name no plug-in (no ``notify``, no ``reclaim``) need none."""


def plugins_of(info: ValidationInfo) -> Plugins:
    """The plug-ins the loader passed in the validation context (none if it passed none)."""
    context: Any = info.context
    found = context.get(CONTEXT_KEY) if isinstance(context, dict) else None
    return found if isinstance(found, Plugins) else NO_PLUGINS
