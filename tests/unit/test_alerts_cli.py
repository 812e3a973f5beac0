"""``costline alerts`` and ``costline silence add`` as people read them: figures in their unit,
a silenced alert shown as silenced, a silence of a rule that does not exist warned about."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from costline.rules.alerts import Alert, AlertBook, Mute
from costline.rules.silences import Silence
from costline.streams.cli import alerts_cmd
from costline.streams.cli.root import _register, app

ROOT = Path(__file__).parents[2]
DEFINITIONS = ROOT / "rules" / "definitions"
T0 = 1796169600.0  # 2026-12-02T00:00:00Z


def alert(rule: str, kind: str, unit: str, value: str, threshold: str,
          mute: Mute | None = None) -> Alert:
    return Alert(alert_id=f"{rule}/1", rule=rule, state="firing", active_since=T0, rank=1,
                 shown="firing", firing_since=T0, mute=mute,
                 payload={"kind": kind, "unit": unit, "currency": "USD", "value": value,
                          "threshold": threshold, "severity": "warning",
                          "group": {"team": "pretrain"}})


class Store:
    """The alert store without Redis: a book to read, silences to add."""

    def __init__(self) -> None:
        self.added: list[Silence] = []

    def book(self) -> AlertBook:
        found = [
            alert("team-monthly", "budget", "currency", "98014.788480", "250000.000000",
                  Mute("silence:abc123", T0 + 4 * 3600, "known overrun")),
            replace(alert("gpu-idle", "idle", "fraction", "0.015000", "0.050000"),
                    payload={**alert("gpu-idle", "idle", "fraction", "0.015000",
                                     "0.050000").payload,
                             "group": {"team": "research",
                                       "resource_id": "lab/dev-gpu-01-with-a-long-name"}}),
            alert("log-explosion", "log_explosion", "currency_per_hour", "120.000000",
                  "50.000000"),
        ]
        return AlertBook({a.alert_id: a for a in found})

    def add_silence(self, **fields: Any) -> Silence:
        made = Silence(id="abc123", starts_at=T0, **fields)
        self.added.append(made)
        return made


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(alerts_cmd, "_store", lambda ctx: Store())
    _register()

    def invoke(*args: str) -> Result:
        return CliRunner().invoke(app, ["--rules", str(DEFINITIONS), *args],
                                  env={"COLUMNS": "200"})
    return invoke


def test_the_table_shows_figures_in_their_unit_and_a_silence(run) -> None:
    out = run("alerts").stdout
    lines = [[cell.strip() for cell in line.split("│")[1:-1]] for line in out.splitlines()
             if line.startswith("│")]
    assert ["team-monthly", "$98,014.79", "$250,000.00", "Dec 02 00:00Z"] in lines
    assert ["gpu-idle", "2%", "5%", "Dec 02 00:00Z"] in lines
    assert ["log-explosion", "$120.00/h", "$50.00/h", "Dec 02 00:00Z"] in lines
    said = " ".join(" ".join(cell for line in lines for cell in line).split())
    assert "warning, firing, silenced until 2026-12-02T04:00:00Z team=pretrain" in said


def test_the_table_fits_an_80_column_terminal_uncut(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(alerts_cmd, "_store", lambda ctx: Store())
    _register()
    out = CliRunner().invoke(app, ["alerts"], env={"COLUMNS": "80"}).stdout
    assert "…" not in out
    assert max(len(line) for line in out.splitlines()) <= 80


def test_json_says_who_mutes_an_alert_and_keeps_exact_figures(run) -> None:
    rows = {row["rule"]: row for row in json.loads(run("alerts", "--json").stdout)}
    assert rows["team-monthly"]["value"] == "98014.788480"
    assert rows["team-monthly"]["muted_by"] == "silence:abc123"
    assert rows["team-monthly"]["muted_until"] == "2026-12-02T04:00:00Z"
    assert rows["gpu-idle"]["muted_by"] is None


def test_a_silence_of_a_rule_that_does_not_exist_is_added_with_a_warning(run) -> None:
    result = run("silence", "add", "--rule", "nosuchrule", "--for", "4h")
    assert result.exit_code == 0
    assert result.stdout.startswith("silence abc123 until ")
    assert result.stderr.startswith(
        f"costline silence add: warning: no rule in {DEFINITIONS} is named 'nosuchrule', so "
        "the silence mutes nothing until one is (rules: checkpoint-growth, checkpoint-interval, ")


@pytest.mark.parametrize("rule", ["team-monthly", "team-*"])
def test_a_silence_of_a_loaded_rule_says_nothing_more(run, rule: str) -> None:
    result = run("silence", "add", "--rule", rule, "--for", "4h")
    assert result.exit_code == 0
    assert result.stderr == ""

