"""The alert lifecycle: pending → firing → resolved, realert, escalation, silences, inhibition."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from costline.rules.alerts import AlertBook, Mute, Observation, Policy, advance
from tests.unit.rulefiles.builders import HOUR, MIN, T0

POLICY: dict[str, Any] = {"r": Policy(pending_for=10 * MIN, realert=4 * HOUR)}
NOW_FIRING: dict[str, Any] = {"r": Policy(pending_for=0, realert=4 * HOUR)}


def seen(rank: int = 0, mute: Mute | None = None, value: str = "1.000000") -> Observation:
    payload = {
        "kind": "budget",
        "group": {"team": "a"},
        "line": f"line{rank}",
        "value": value,
        "summary": "team=a is over.",
    }
    return Observation("r/abc", "r", rank, payload, mute)


class Clock:
    """Runs evaluation steps and keeps the book between them, as the worker does."""

    def __init__(self, policies: dict[str, Policy]) -> None:
        self.book = AlertBook()
        self.policies = policies

    def step(self, now: float, *observations: Observation) -> list[tuple[str, str]]:
        self.book, changes = advance(self.book, observations, self.policies, now)
        return [(c["previous_state"], c["state"]) for c in changes]

    def last(self, now: float, *observations: Observation) -> dict[str, Any]:
        self.book, changes = advance(self.book, observations, self.policies, now)
        [change] = changes
        return change


def test_an_alert_is_pending_while_for_runs_then_fires() -> None:
    clock = Clock(POLICY)
    assert clock.step(T0, seen()) == [("inactive", "pending")]
    assert clock.step(T0 + 5 * MIN, seen()) == []
    assert clock.step(T0 + 10 * MIN, seen()) == [("pending", "firing")]
    assert clock.step(T0 + 15 * MIN, seen()) == []
    assert clock.step(T0 + 20 * MIN) == [("firing", "resolved")]
    assert clock.book.alerts == {}


def test_a_pending_alert_that_goes_away_resolves_without_firing() -> None:
    clock = Clock(POLICY)
    clock.step(T0, seen())
    assert clock.step(T0 + 5 * MIN) == [("pending", "resolved")]


def test_without_for_an_alert_fires_at_once() -> None:
    clock = Clock(NOW_FIRING)
    change = clock.last(T0, seen())
    assert (change["previous_state"], change["state"]) == ("inactive", "firing")
    assert change["since"] == change["at"] == "2026-11-30T08:00:00Z"


def test_a_firing_alert_is_notified_again_after_realert() -> None:
    clock = Clock(NOW_FIRING)
    clock.step(T0, seen())
    assert clock.step(T0 + 4 * HOUR - 1, seen()) == []
    assert clock.step(T0 + 4 * HOUR, seen()) == [("firing", "firing")]
    assert clock.step(T0 + 5 * HOUR, seen()) == []


def test_a_higher_line_escalates_the_same_alert_once() -> None:
    clock = Clock(NOW_FIRING)
    clock.step(T0, seen(0))
    change = clock.last(T0 + 5 * MIN, seen(1))
    assert (change["alert_id"], change["previous_state"], change["state"], change["line"]) == (
        "r/abc",
        "firing",
        "firing",
        "line1",
    )
    assert change["since"] == "2026-11-30T08:00:00Z"
    assert clock.step(T0 + 10 * MIN, seen(0)) == []
    assert clock.step(T0 + 15 * MIN, seen(1)) == []
    assert clock.step(T0 + 20 * MIN, seen(2)) == [("firing", "firing")]


def test_a_silenced_alert_is_published_as_silenced_and_fires_when_the_silence_ends() -> None:
    clock = Clock(NOW_FIRING)
    hush = Mute("silence:s1", T0 + HOUR, "silenced by alice until 09:00")
    change = clock.last(T0, seen(mute=hush))
    assert (change["previous_state"], change["state"]) == ("inactive", "silenced")
    assert change["summary"].endswith("Muted: silenced by alice until 09:00.")
    assert clock.step(T0 + 5 * HOUR, seen(1, mute=hush)) == [("silenced", "silenced")]
    assert clock.step(T0 + 6 * HOUR, seen(1)) == [("silenced", "firing")]
    assert clock.step(T0 + 7 * HOUR, seen(1)) == []


def test_silencing_a_firing_alert_is_a_change_and_resolving_is_always_published() -> None:
    clock = Clock(NOW_FIRING)
    clock.step(T0, seen())
    hush = Mute("silence:s1", T0 + HOUR, "snoozed")
    assert clock.step(T0 + MIN, seen(mute=hush)) == [("firing", "silenced")]
    assert clock.step(T0 + 2 * MIN) == [("silenced", "resolved")]


def test_the_book_survives_a_json_round_trip_mid_lifecycle() -> None:
    clock = Clock(POLICY)
    clock.step(T0, seen(mute=Mute("fault:oom", T0 + HOUR, "oom on job x")))
    restored = AlertBook.from_dict(json.loads(json.dumps(clock.book.to_dict())))
    assert restored == clock.book
    clock.book = restored
    assert clock.step(T0 + 10 * MIN, seen()) == [("silenced", "firing")]


def test_an_alert_of_a_removed_rule_resolves() -> None:
    clock = Clock(NOW_FIRING)
    clock.step(T0, seen())
    clock.policies = {}
    assert clock.step(T0 + MIN) == [("firing", "resolved")]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(st.none(), st.tuples(st.integers(0, 2), st.booleans())),
        min_size=1,
        max_size=30,
    ),
    st.sampled_from([0, 10 * MIN]),
)
def test_every_change_continues_from_the_state_published_before(
    steps: list[tuple[int, bool] | None], pending_for: int
) -> None:
    clock = Clock({"r": Policy(pending_for, realert=HOUR)})
    shown = "inactive"
    hush = Mute("silence:s", T0 + 100 * HOUR, "snoozed")
    for index, step in enumerate(steps):
        observations = [] if step is None else [seen(step[0], hush if step[1] else None)]
        for previous, state in clock.step(T0 + index * 5 * MIN, *observations):
            assert previous == shown
            shown = "inactive" if state == "resolved" else state
        assert (shown == "inactive") == (step is None)
