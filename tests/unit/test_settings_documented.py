"""Every setting a worker reads is documented under the name the environment gives it: in
README's table, or, for those that tune throughput and evaluation, in docs/OPERATIONS.md's
advanced settings."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import AliasChoices

from costline.streams.settings import ENV_PREFIX, Settings

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
OPERATIONS = ROOT / "docs" / "OPERATIONS.md"
ADVANCED = {"COSTLINE_BATCH_MESSAGES", "COSTLINE_BATCH_WITHIN_S", "COSTLINE_WINDOW_EVENTS",
            "COSTLINE_UNWRITTEN_EVENTS", "COSTLINE_WINDOW_LINGER_S", "COSTLINE_FOLDING",
            "COSTLINE_FOLDING_PROCESSES", "COSTLINE_FOLDING_TAKES", "COSTLINE_FETCH_BYTES"}


def environment_variables() -> set[str]:
    """The variable that sets each field: its alias when it has one (``SLACK_BOT_TOKEN``)."""
    names = set()
    for field, info in Settings.model_fields.items():
        alias = info.validation_alias
        names.add(str(alias.choices[0]) if isinstance(alias, AliasChoices)
                  else ENV_PREFIX + field.upper())
    return names


def documented(page: Path) -> set[str]:
    """The variables named in the first cell of a page's table rows (``A`` / ``B`` rows too)."""
    rows = [line for line in page.read_text().splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`([A-Z][A-Z0-9_]+)`",
                                                           row.split("|")[1])}


def test_every_setting_is_in_a_table() -> None:
    missing = sorted(environment_variables() - documented(README) - documented(OPERATIONS))
    assert missing == []


def test_the_throughput_knobs_are_advanced_settings_not_the_readme_s() -> None:
    assert environment_variables() >= ADVANCED
    assert documented(OPERATIONS) >= ADVANCED
    assert not ADVANCED & documented(README)
