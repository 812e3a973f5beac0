"""What ``--help`` shows as an option's value: a word to write, not a Python type.

Typer names each value's Python type (``<bool>``, ``<list[str]>``, ``<int range>``), where
people need to know what to write. Here a flag shows nothing (``--json``), a choice its
choices (``usage|faults``), any other option its ``metavar`` or its own name in capitals
(``--batch BATCH``, as argparse writes it), and an argument nothing beside the name it is
already listed under. The range of a number is still added after it (``[1<=x<=10000]``).
"""

from __future__ import annotations

from typing import Any

from typer import core


def install() -> None:
    """Use these placeholders in every help page (the typer versions that name types)."""
    option = getattr(core.TyperOption, "display_type_rich", None)
    if option is None or getattr(option, "costline", False):
        return
    core.TyperOption.display_type_rich = _option_value(option)  # type: ignore[method-assign]
    if hasattr(core.TyperArgument, "display_type_rich"):
        core.TyperArgument.display_type_rich = _no_value  # type: ignore[method-assign]


def _option_value(typer_shown: Any) -> Any:
    def shown(self: Any, ctx: Any) -> str | None:
        if self.is_flag or self.count:
            return None
        if self.metavar is not None:
            return str(self.metavar)
        descriptor = getattr(self, "type_descriptor", None)
        if descriptor is not None and descriptor.is_choice:
            return str(typer_shown(self, ctx)).strip("<>")
        return str(self.name or "value").upper()

    shown.costline = True  # type: ignore[attr-defined]
    return shown


def _no_value(self: Any, ctx: Any) -> None:
    return None
