"""The titled tables the commands print for people."""

from __future__ import annotations

from typing import Any

from rich.table import Table


def titled(title: str, **options: Any) -> Table:
    """A table at least as wide as its title, so a narrow one (one ``--by`` key, an empty
    list) keeps its title, a period or a count, on one line; Rich still fits it to the
    terminal. ``options`` are ``rich.table.Table``'s."""
    return Table(title=title, min_width=len(title), **options)
