"""Every ``--help`` page says what to write, not which Python type a value has."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import typer
from typer.testing import CliRunner

from costline.streams.cli.root import _register, app

TYPE_NAMES = re.compile(r"<(bool|str|int|float|path|list\[[^\]]*\]|[a-z]+ range)>")


def commands() -> Iterator[list[str]]:
    """The path of every command and group, from the root."""
    _register()

    def walk(command: object, path: list[str]) -> Iterator[list[str]]:
        yield path
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            yield from walk(sub, [*path, name])

    yield from walk(typer.main.get_command(app), [])


@pytest.mark.parametrize("path", list(commands()), ids=lambda p: " ".join(p) or "costline")
def test_help_names_no_python_types(path: list[str]) -> None:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert not TYPE_NAMES.findall(result.stdout), result.stdout


def test_options_show_a_word_to_write_and_flags_nothing() -> None:
    _register()
    lines = CliRunner().invoke(app, ["spend", "--help"], env={"COLUMNS": "200"}).stdout
    words = {line.split()[1]: line.split()[2] for line in lines.splitlines()
             if line.startswith("│ --") and len(line.split()) > 2}
    assert words["--where"] == "KEY=VALUE"
    assert words["--period"] == "PERIOD"
    assert words["--json"] == "Print"  # a flag: its help follows at once
