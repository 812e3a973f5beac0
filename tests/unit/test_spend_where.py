"""``costline spend --where``: filters on several keys, and a key given more than once."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from costline.rules.memory_state import InMemoryState
from costline.rules.prices import format_micro
from costline.rules.state import Group, Measure
from costline.streams.cli.root import _register, app
from costline.streams.cli.spend_cmd import parse_filters, spend_report
from tests.unit.rulefiles.builders import DAY, HOUR, T0, book, usage

PRICES = Path(__file__).parents[2] / "rules" / "prices" / "example.yaml"
START = T0 - 8 * HOUR  # 2026-11-30T00:00Z


class State(InMemoryState):
    """The in-memory store with what the Redis reader adds for ``spend``: hourly series (for
    --peaks) and the expired-buckets check (nothing expires in memory)."""

    def short_lived_parts(self, start: float, end: float, now: float) -> list[str]:
        return []

    def series(self, measure: Measure, match: Mapping[str, str], group_by: Sequence[str],
               start: float, end: float, step: int = 3600) -> dict[Group, dict[int, int]]:
        out: dict[Group, dict[int, int]] = {}
        for t in range(int(start) // step * step, int(end), step):
            for group, value in self.totals(measure, match, group_by, t, t + step).items():
                out.setdefault(group, {})[t] = value
        return out


@pytest.fixture
def state() -> State:
    """Three teams in two environments; gpu.h100 at 2.5 an hour."""
    found = State(book())
    found.add_all([
        usage(T0, 1, team="a", env="prod"),   # 2.5
        usage(T0, 2, team="ab", env="prod"),  # 5
        usage(T0, 4, team="b", env="dev"),    # 10
        usage(T0 + HOUR, 8, team="b", env="prod"),  # 20
        usage(T0, 16, team="c", env="prod"),  # 40
        usage(T0, 32, env="prod"),            # 80, no team
    ])
    return found


def report(state: State, by: Sequence[str], *pairs: str, peaks: bool = False) -> dict[Any, Any]:
    found = spend_report(state, "USD", by, parse_filters(pairs), START, START + DAY, peaks)
    return {tuple(r["group"].values()): r["peak_hourly" if peaks else "cost"]
            for r in found["rows"]}


def money(amount: float) -> str:
    return format_micro(round(amount * 1_000_000))


def test_a_key_given_again_keeps_each_of_its_values_in_order_once():
    assert parse_filters(["team=a", "env=prod", "team=b", "team=a"]) == {
        "team": ("a", "b"), "env": ("prod",)}


def test_a_filter_without_a_key_is_refused():
    with pytest.raises(typer.BadParameter, match="expected KEY=VALUE"):
        parse_filters(["team=a", "=b"])


def test_a_key_given_again_matches_any_of_its_values(state):
    assert report(state, ["team"], "team=a", "team=b") == {
        ("b",): money(30), ("a",): money(2.5)}
    assert report(state, [], "team=a", "team=b") == {(): money(32.5)}


def test_a_key_given_once_is_still_one_glob(state):
    assert report(state, [], "team=a*") == {(): money(7.5)}
    assert report(state, [], "team=b") == {(): money(30)}


def test_overlapping_values_count_a_tag_set_once(state):
    assert report(state, [], "team=a*", "team=ab") == {(): money(7.5)}


def test_different_keys_must_all_match(state):
    assert report(state, ["team"], "team=b", "team=c", "env=prod") == {
        ("c",): money(40), ("b",): money(20)}


def test_an_absent_tag_reads_as_empty_among_the_values(state):
    assert report(state, ["team"], "team=", "team=c") == {("",): money(80), ("c",): money(40)}


def test_grouping_by_another_key_sums_the_alternatives_into_its_groups(state):
    assert report(state, ["env"], "team=a", "team=b") == {
        ("prod",): money(22.5), ("dev",): money(10)}


def test_peaks_of_a_key_given_again_are_hours_of_all_its_values_together(state):
    # team a and b in env prod: 2.5 + 0 at 08:00, 20 at 09:00; b in dev: 10 at 08:00.
    assert report(state, ["env"], "team=a", "team=b", peaks=True) == {
        ("prod",): money(20), ("dev",): money(10)}
    assert report(state, [], "team=a", "team=b", peaks=True) == {(): money(20)}


def test_the_command_passes_every_value_of_a_repeated_key(state, monkeypatch):
    import costline.connectors.redis_client
    import costline.connectors.redis_state
    from costline.streams.cli import spend_cmd

    monkeypatch.setattr(costline.connectors.redis_client, "connect", lambda *_, **__: None)
    monkeypatch.setattr(costline.connectors.redis_state, "RedisState", lambda *_: state)
    monkeypatch.setattr(spend_cmd, "refused_warnings", lambda *_: [])
    _register()
    result = CliRunner().invoke(app, [
        "--prices", str(PRICES), "spend", "--by", "team", "--where", "team=a",
        "--where", "team=b", "--period", "day", "--at", str(T0), "--tz", "UTC", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["rows"]
    assert [(r["group"]["team"], r["cost"]) for r in rows] == [("b", money(30)),
                                                               ("a", money(2.5))]


def test_the_help_says_what_a_repeated_key_means():
    _register()
    result = CliRunner().invoke(app, ["spend", "--help"], terminal_width=200)
    assert "matches any of its values" in " ".join(result.stdout.replace("│", " ").split())


def test_a_silence_matcher_given_twice_for_one_key_is_refused_not_dropped():
    from costline.streams.cli.alerts_cmd import parse_matchers

    assert parse_matchers(["team=a", "env=prod", "team=a"]) == {
        "team": "a", "env": "prod"}
    with pytest.raises(typer.BadParameter, match="'team' is given twice") as caught:
        parse_matchers(["team=a", "team=b"])
    assert caught.value.param_hint == "--match"
