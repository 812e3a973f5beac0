"""Command groups of the ``costline`` CLI: each ``*_cmd`` module here registers its commands.

Adding a command is adding one module with a ``@command_group`` function; nothing else is
edited. Modules are imported in name order when the CLI starts.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable

import typer

Register = Callable[[typer.Typer], None]
REGISTRY: list[Register] = []


def command_group(register: Register) -> Register:
    """Decorator: add a module's ``register(app)`` to the CLI."""
    REGISTRY.append(register)
    return register


def load_all() -> list[Register]:
    """Import every command module (Python imports each once); returns the registered groups."""
    for module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
        if module.endswith("_cmd"):
            importlib.import_module(f"{__name__}.{module}")
    return REGISTRY
