"""A titled table keeps its title on one line when its columns are narrower, and still fits
the terminal when the title is wider than it."""

from __future__ import annotations

import io

from rich.console import Console

from costline.streams.cli.tables import titled

TITLE = "Spend 2026-12-05T00:00:00Z → 2026-12-06T00:00:00Z"


def shown(width: int) -> list[str]:
    table = titled(TITLE)
    table.add_column("team")
    table.add_row("infra")
    out = io.StringIO()
    Console(file=out, width=width).print(table)
    return out.getvalue().splitlines()


def test_a_narrow_table_keeps_its_title_on_one_line() -> None:
    assert shown(120)[0].strip() == TITLE


def test_a_title_wider_than_the_terminal_wraps_inside_it() -> None:
    lines = shown(30)
    assert max(len(line) for line in lines) <= 30
    assert " ".join(line.strip() for line in lines[:3]).startswith("Spend 2026")
