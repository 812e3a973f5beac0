"""``costline demo``: placeholder until the demo lands."""

from __future__ import annotations

import typer

from streams.commands import command_group


@command_group
def register(app: typer.Typer) -> None:
    pass
