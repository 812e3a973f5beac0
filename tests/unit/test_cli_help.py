"""Every ``--help`` page says what to write, not which Python type a value has."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

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


def command_at(path: list[str]) -> Any:
    command: Any = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]
    return command


@pytest.mark.parametrize("path", [p for p in commands() if hasattr(command_at(p), "commands")],
                         ids=lambda p: " ".join(p) or "costline")
def test_a_command_list_shows_each_summary_on_one_line(path: list[str]) -> None:
    """A docstring wraps at the source's width; the list joins its first paragraph again."""
    listed = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "300"}).stdout
    for name, command in command_at(path).commands.items():
        if command.hidden or not command.help:
            continue
        summary = " ".join(command.help.split("\n\n")[0].split())
        line = next(row for row in listed.splitlines() if row.startswith(f"│ {name} "))
        assert summary in line, f"{name}: {line!r}"
