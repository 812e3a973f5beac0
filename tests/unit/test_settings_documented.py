"""Every setting a worker reads is in README's table of environment variables, under the name
the environment gives it."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import AliasChoices

from costline.streams.settings import ENV_PREFIX, Settings

README = Path(__file__).resolve().parents[2] / "README.md"


def environment_variables() -> set[str]:
    """The variable that sets each field: its alias when it has one (``SLACK_BOT_TOKEN``)."""
    names = set()
    for field, info in Settings.model_fields.items():
        alias = info.validation_alias
        names.add(str(alias.choices[0]) if isinstance(alias, AliasChoices)
                  else ENV_PREFIX + field.upper())
    return names


def documented() -> set[str]:
    """The variables named in the first cell of README's table rows (``A`` / ``B`` rows too)."""
    rows = [line for line in README.read_text().splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`([A-Z][A-Z0-9_]+)`",
                                                           row.split("|")[1])}


def test_every_setting_is_in_the_readme_table() -> None:
    missing = sorted(environment_variables() - documented())
    assert missing == []
