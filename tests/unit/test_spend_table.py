"""``costline spend`` for people: amounts in currency with a total row, and a key that no
event carries or that cannot be a tag key at all said so."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from typer.testing import CliRunner, Result

from costline.rules.money import money, money_micro
from costline.streams.cli.root import _register, app
from tests.unit.rulefiles.builders import T0
from tests.unit.test_spend_where import PRICES, State, state  # noqa: F401 - the fixture


def test_money_reads_as_currency() -> None:
    assert money(Decimal("1804.915"), "USD") == "$1,804.92"
    assert money(Decimal("1804.92"), "CHF") == "1,804.92 CHF"
    assert money(Decimal("0"), "USD") == "$0.00"
    assert money(Decimal("0.5"), "USD") == "$0.50"
    assert money(Decimal("0.370968"), "USD") == "$0.37"
    assert money(Decimal("0.000200"), "USD") == "$0.0002"  # not read as nothing
    assert money(Decimal("-1234.5"), "EUR") == "-€1,234.50"
    assert money_micro(1_974_311_500, "USD") == "$1,974.31"


@pytest.fixture
def spend(state: State, monkeypatch: pytest.MonkeyPatch):  # noqa: F811 - the fixture
    import costline.connectors.redis_client
    import costline.connectors.redis_state
    from costline.streams.cli import spend_cmd

    monkeypatch.setattr(costline.connectors.redis_client, "connect", lambda *_, **__: None)
    monkeypatch.setattr(costline.connectors.redis_state, "RedisState", lambda *_: state)
    monkeypatch.setattr(spend_cmd, "refused_warnings", lambda *_: [])
    _register()

    def run(*args: str) -> Result:
        return CliRunner().invoke(app, ["--prices", str(PRICES), "spend", "--period", "day",
                                        "--at", str(T0), "--tz", "UTC", *args],
                                  terminal_width=120)
    return run


def test_the_table_shows_currency_and_ends_with_a_total_row(spend) -> None:
    result = spend("--by", "team")
    assert result.exit_code == 0, result.output
    lines = [line.replace("│", " ").replace("┃", " ").split()
             for line in result.stdout.splitlines() if line[:1] in "│┃"]
    assert lines[0] == ["team", "net", "waste"]
    assert ["—", "$80.00", "$0.00"] in lines
    assert lines[-1] == ["total", "$157.50", "$0.00"]
    assert "0.000000" not in result.stdout


def test_a_narrow_table_keeps_its_period_on_one_line(spend) -> None:
    period = json.loads(spend("--by", "team", "--json").stdout)["period"]
    title = spend("--by", "team").stdout.splitlines()[0].strip()
    assert title == f"Spend {period['start']} → {period['end']}"


def test_json_keeps_the_exact_six_place_strings(spend) -> None:
    rows = json.loads(spend("--by", "team", "--json").stdout)["rows"]
    assert rows[0] == {"group": {"team": ""}, "cost": "80.000000", "gross": "80.000000",
                       "credits": "0.000000", "waste": "0.000000"}


def test_a_key_no_event_carries_is_said_on_stderr(spend) -> None:
    result = spend("--by", "nosuchtag")
    assert result.exit_code == 0
    assert result.stderr.splitlines() == [
        "costline spend: no event in this period carries the key 'nosuchtag': its column is "
        "empty (—) in every row"]
    assert json.loads(spend("--by", "nosuchtag", "--json").stdout)["rows"]  # still answered


@pytest.mark.parametrize("option", ["--by", "--where"])
def test_a_key_that_cannot_be_a_tag_key_is_refused(spend, option: str) -> None:
    result = spend(option, "Team" if option == "--by" else "Team=a")
    assert result.exit_code == 2
    said = " ".join(result.stderr.replace("│", " ").split())
    assert "'Team' cannot be a tag key" in said and "did you mean 'team'?" in said


def test_at_yesterday_asks_for_the_day_before(spend, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    monkeypatch.setattr(time, "time", lambda: T0 + 86400)  # 2026-12-01T08:00:00Z
    found = json.loads(spend("--by", "team", "--at", "yesterday", "--json").stdout)
    assert found["period"] == {"start": "2026-11-30T00:00:00Z", "end": "2026-12-01T00:00:00Z"}
    assert found["rows"]


def test_an_at_that_does_not_read_lists_the_forms_that_do(spend) -> None:
    result = spend("--at", "last tuesday")
    assert result.exit_code == 2
    said = " ".join(result.stderr.replace("│", " ").split())
    assert "'last tuesday' is not a time: write RFC 3339 with an offset" in said
    assert "now, today, yesterday, or a time ago such as -2h or -7d" in said
