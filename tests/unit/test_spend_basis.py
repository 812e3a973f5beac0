"""``costline spend --basis net|gross|credits``: net by default, every figure in ``--json``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from costline.rules.events import ChargeKind, UsageEvent
from costline.streams.cli.root import _register, app
from costline.streams.cli.spend_cmd import spend_report
from tests.unit.rulefiles.builders import DAY, HOUR, T0, book, usage
from tests.unit.test_spend_where import PRICES, START, State


def refund(ts: float, amount: float, **tags: str) -> UsageEvent:
    """Money back on the bill: a negative cost marked as a refund."""
    return usage(ts, 0, **tags).model_copy(update={"cost": -amount, "charge": ChargeKind.refund})


@pytest.fixture
def state() -> State:
    """Team a spends 25 and gets 20 back; team b spends 10 (gpu.h100 at 2.5 an hour)."""
    found = State(book())
    found.add_all([
        usage(T0, 10, team="a"),
        refund(T0 + HOUR, 20, team="a"),
        usage(T0, 4, team="b"),
    ])
    return found


def rows(state: State, basis: str = "net") -> list[dict[str, Any]]:
    report = spend_report(state, "USD", ["team"], {}, START, START + DAY, basis=basis)
    return report["rows"]  # type: ignore[no-any-return]


def test_every_row_has_net_gross_and_credits_as_exact_strings(state: State) -> None:
    assert rows(state) == [
        {"group": {"team": "b"}, "cost": "10.000000", "gross": "10.000000",
         "credits": "0.000000", "waste": "0.000000"},
        {"group": {"team": "a"}, "cost": "5.000000", "gross": "25.000000",
         "credits": "20.000000", "waste": "0.000000"},
    ]


@pytest.mark.parametrize(("basis", "order"), [
    ("net", ["b", "a"]), ("gross", ["a", "b"]), ("credits", ["a", "b"])])
def test_rows_are_sorted_by_the_basis(state: State, basis: str, order: list[str]) -> None:
    assert [row["group"]["team"] for row in rows(state, basis)] == order


def cli(state: State, monkeypatch: pytest.MonkeyPatch, *args: str) -> Any:
    import costline.connectors.redis_client
    import costline.connectors.redis_state
    from costline.streams.cli import spend_cmd

    monkeypatch.setattr(costline.connectors.redis_client, "connect", lambda *_, **__: None)
    monkeypatch.setattr(costline.connectors.redis_state, "RedisState", lambda *_: state)
    monkeypatch.setattr(spend_cmd, "refused_warnings", lambda *_: [])
    _register()
    return CliRunner().invoke(app, [
        "--prices", str(PRICES), "spend", "--by", "team", "--period", "day", "--at", str(T0),
        "--tz", "UTC", *args], terminal_width=200)


def test_the_table_shows_the_net_by_default_and_the_basis_asked(
    state: State, monkeypatch: pytest.MonkeyPatch,
) -> None:
    net = cli(state, monkeypatch)
    assert net.exit_code == 0, net.output
    assert " net " in net.stdout and "$5.00" in net.stdout and "$25.00" not in net.stdout
    gross = cli(state, monkeypatch, "--basis", "gross")
    assert " gross " in gross.stdout and "$25.00" in gross.stdout
    credits = cli(state, monkeypatch, "--basis", "credits")
    assert " credits " in credits.stdout and "$20.00" in credits.stdout


def test_json_has_all_three_whatever_the_basis(
    state: State, monkeypatch: pytest.MonkeyPatch,
) -> None:
    result = cli(state, monkeypatch, "--basis", "credits", "--json")
    assert result.exit_code == 0, result.output
    [first, _] = json.loads(result.stdout)["rows"]
    assert (first["cost"], first["gross"], first["credits"]) == (
        "5.000000", "25.000000", "20.000000")


def test_an_unknown_basis_is_refused(state: State, monkeypatch: pytest.MonkeyPatch) -> None:
    result = cli(state, monkeypatch, "--basis", "amortized")
    assert result.exit_code == 2
    assert "one of net, gross, credits" in result.output
