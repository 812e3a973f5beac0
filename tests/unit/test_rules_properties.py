"""Properties of the alert lifecycle over arbitrary histories, on observations and on the engine.

``Audit`` reads what was published, and whether each alert was found and muted at each
evaluation, and holds it to the lifecycle's promises:

* a notification is a published ``firing`` change (first firing, escalation, repeat, or the
  end of a mute). A repeat comes no sooner than ``realert`` after the last notification of
  the episode, and it does come once ``realert`` has passed; only a line above every line
  notified so far, or the end of a mute, notifies sooner;
* a new alert, the end of ``for``, a higher line and a mute starting or ending are published
  at once; nothing else is (``realert`` never republishes a muted alert);
* a muted alert (silenced or inhibited) publishes ``silenced``, never ``firing``;
* ``resolved`` follows only a published ``pending``, ``firing`` or ``silenced``, and comes at
  the first evaluation that no longer finds the alert;
* the book read back from its JSON is the same book and carries on identically.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from costline.rules.alerts import AlertBook, Mute, Observation, Policy, advance
from costline.rules.engine import Engine, alert_id
from costline.rules.loader import RuleSet
from costline.rules.memory_state import InMemoryState
from costline.rules.silences import Silence
from tests.unit.rulefiles.builders import HOUR, MIN, T0, book, fault, rule, sample, usage

NOTIFYING = "firing"


@dataclass
class Seen:
    """One alert's episode as the published changes and its observations tell it."""

    shown: str = "inactive"
    started: float = 0.0
    firing_from: float | None = None
    top_rank: int = -1
    notified_at: float | None = None
    notified_rank: int = -1


@dataclass(frozen=True)
class Observed:
    """One alert at one evaluation: its rule, how serious, and whether it was muted."""

    rule: str
    rank: int
    muted: bool


@dataclass(frozen=True)
class Moment:
    """What happened to an observed alert at this evaluation, before looking at the output."""

    new: bool
    became_firing: bool
    raised: bool


@dataclass
class Audit:
    """Checks each evaluation's changes against the published history of every alert.

    It knows each rule's ``for`` (``pending_for``) and ``realert``: an episode is due to fire
    once its condition has held for ``for``, and ``raised`` means a line above every line
    seen since then.
    """

    policies: Mapping[str, Policy]
    seen: dict[str, Seen] = field(default_factory=dict)

    def step(
        self, now: float, observed: Mapping[str, Observed], changes: Sequence[Mapping[str, Any]]
    ) -> None:
        by_id: dict[str, Mapping[str, Any]] = {}
        for change in changes:
            assert change["alert_id"] not in by_id, "one change per alert per evaluation"
            by_id[change["alert_id"]] = change
        active = {aid for aid, seen in self.seen.items() if seen.shown != "inactive"}
        for aid in sorted(active | set(observed) | set(by_id)):
            self._check(now, aid, observed.get(aid), by_id.get(aid))

    def _check(
        self, now: float, aid: str, obs: Observed | None, change: Mapping[str, Any] | None
    ) -> None:
        seen = self.seen.setdefault(aid, Seen())
        if change is not None:
            assert change["previous_state"] == seen.shown, "a change continues the last one"
        if obs is None:
            if seen.shown == "inactive":
                assert change is None, "nothing is published about an alert never seen"
                return
            assert change is not None and change["state"] == "resolved", "gone means resolved"
            del self.seen[aid]
            return
        moment = self._moment(now, seen, obs)
        if change is None:
            self._quiet(now, aid, seen, obs, moment)
        else:
            self._published(now, aid, seen, obs, moment, change["state"])

    def _moment(self, now: float, seen: Seen, obs: Observed) -> Moment:
        new = seen.shown == "inactive"
        if new:
            seen.started = now
        was_firing = seen.firing_from is not None
        became = not was_firing and now - seen.started >= self.policies[obs.rule].pending_for
        raised = was_firing and obs.rank > seen.top_rank
        if became:
            seen.firing_from, seen.top_rank = now, obs.rank
        elif was_firing:
            seen.top_rank = max(seen.top_rank, obs.rank)
        return Moment(new, became, raised)

    def _quiet(self, now: float, aid: str, seen: Seen, obs: Observed, moment: Moment) -> None:
        """An evaluation that published nothing about an alert it found."""
        assert not moment.new, f"{aid}: a new alert is published at once"
        assert not moment.became_firing, f"{aid}: starting to fire was not published"
        assert not moment.raised, f"{aid}: a higher line was not published"
        assert obs.muted == (seen.shown == "silenced"), f"{aid}: a mute change was not published"
        if seen.shown == NOTIFYING:
            assert seen.notified_at is not None
            assert now - seen.notified_at < self.policies[obs.rule].realert, f"{aid}: realert due"

    def _published(
        self, now: float, aid: str, seen: Seen, obs: Observed, moment: Moment, state: str
    ) -> None:
        assert state != "resolved", f"{aid}: an alert still found does not resolve"
        assert (state == "silenced") == obs.muted, f"{aid} muted={obs.muted} published {state}"
        if state == "pending":
            before_firing = seen.firing_from is None
            assert before_firing and (moment.new or seen.shown == "silenced"), (
                f"{aid}: pending only starts an episode or ends its mute"
            )
        if state == "silenced" and seen.shown == "silenced":
            assert moment.became_firing or moment.raised, f"{aid}: silenced again for nothing"
        if state == NOTIFYING:
            last = seen.notified_at
            if last is not None and now - last < self.policies[obs.rule].realert:
                sooner = obs.rank > seen.notified_rank or seen.shown == "silenced"
                assert sooner, f"{aid} notified again {now - last:.0f}s after the last time"
            seen.notified_at = now
            seen.notified_rank = max(seen.notified_rank, obs.rank)
        seen.shown = state


def round_trip(alerts: AlertBook) -> AlertBook:
    """The book as the worker stores it in Redis and reads it back."""
    return AlertBook.from_dict(json.loads(json.dumps(alerts.to_dict())))


# -- observations straight into ``advance`` ------------------------------------------------

POLICIES = {
    "budget": Policy(pending_for=10 * MIN, realert=HOUR),
    "idle": Policy(pending_for=0, realert=30 * MIN),
}
ALERTS = (("budget", "budget/pretrain"), ("budget", "budget/eval"), ("idle", "idle/node-7"))
HUSH = Mute("silence:s1", T0 + 1000 * HOUR, "silenced by alice")
FAULT_MUTE = Mute("fault:node_failure", T0 + 1000 * HOUR, "node_failure on job run-42")

ObservationSpec = tuple[int, Mute | None] | None
gaps = st.one_of(st.integers(1, 3 * HOUR), st.sampled_from([5 * MIN, 10 * MIN, 30 * MIN, HOUR]))
specs = st.one_of(
    st.none(), st.tuples(st.integers(0, 2), st.sampled_from([None, None, HUSH, FAULT_MUTE]))
)
histories = st.lists(st.tuples(gaps, st.tuples(specs, specs, specs)), min_size=1, max_size=40)


def observation(rule_name: str, aid: str, rank: int, mute: Mute | None) -> Observation:
    payload = {"group": {"id": aid}, "line": f"line{rank}", "summary": f"{aid} is over."}
    return Observation(aid, rule_name, rank, payload, mute)


@settings(max_examples=300, deadline=None)
@given(histories)
def test_the_lifecycle_keeps_its_promises_for_any_sequence_of_observations(
    history: list[tuple[int, tuple[ObservationSpec, ...]]],
) -> None:
    audit = Audit(POLICIES)
    kept, restored = AlertBook(), AlertBook()
    now = T0
    for gap, spec in history:
        now += gap
        observations = [
            observation(rule_name, aid, each[0], each[1])
            for (rule_name, aid), each in zip(ALERTS, spec, strict=True)
            if each is not None
        ]
        kept, changes = advance(kept, observations, POLICIES, now)
        restored, replayed = advance(round_trip(restored), observations, POLICIES, now)
        assert replayed == changes, "a book read back from JSON carries on identically"
        assert round_trip(kept) == kept
        audit.step(
            now,
            {o.alert_id: Observed(o.rule, o.rank, o.mute is not None) for o in observations},
            changes,
        )


FIRING = Observed("budget", 0, muted=False)
HUSHED = Observed("budget", 0, muted=True)


def _change(previous: str, state: str) -> dict[str, str]:
    return {"alert_id": "a", "previous_state": previous, "state": state}


@pytest.mark.parametrize(
    ("later", "observed", "changes", "complaint"),
    [
        (30 * MIN, FIRING, [("firing", "firing")], "notified again 1800s after"),
        (HOUR, FIRING, [], "realert due"),
        (MIN, Observed("budget", 1, muted=False), [], "a higher line was not published"),
        (MIN, HUSHED, [], "a mute change was not published"),
        (MIN, HUSHED, [("firing", "firing")], "muted=True published firing"),
        (MIN, FIRING, [("firing", "pending")], "pending only starts"),
        (MIN, FIRING, [("firing", "resolved")], "still found does not resolve"),
        (MIN, None, [], "gone means resolved"),
    ],
)
def test_the_audit_refuses_what_the_lifecycle_must_not_do(
    later: int, observed: Observed | None, changes: list[tuple[str, str]], complaint: str
) -> None:
    audit = Audit({"budget": Policy(pending_for=0, realert=HOUR)})
    audit.step(T0, {"a": FIRING}, [_change("inactive", "firing")])
    with pytest.raises(AssertionError, match=complaint):
        audit.step(
            T0 + later, {} if observed is None else {"a": observed}, [_change(*c) for c in changes]
        )


# -- the engine over an in-memory state -------------------------------------------------------

JOBS = ("run-1", "run-2")
RULES = RuleSet(
    (
        rule(
            kind="budget",
            name="day-budget",
            group_by=["job"],
            period="day",
            limit=100,
            warn_at=[0.5],
            for_="10m",
            realert="1h",
        ),
        rule(
            kind="log_explosion",
            name="log-burst",
            group_by=["job"],
            window="5m",
            baseline="5m",
            max_rate=20,
            realert="30m",
        ),
        rule(kind="idle", name="idle-gpu", group_by=["job"], below=0.1, for_="10m", realert="1h"),
    )
)
INHIBITED = {r.name for r in RULES if r.inhibited_by_faults}


@dataclass(frozen=True)
class JobStep:
    """What one job did since the last evaluation."""

    gpu_hours: int
    log_gb: int
    util: float | None
    fault_recovery_min: int | None
    silence: tuple[str | None, int] | None


job_steps = st.builds(
    JobStep,
    gpu_hours=st.sampled_from([0, 0, 5, 10, 20]),
    log_gb=st.sampled_from([0, 0, 1, 4, 8]),
    util=st.sampled_from([None, 0.01, 0.01, 0.5]),
    fault_recovery_min=st.one_of(st.none(), st.none(), st.none(), st.integers(5, 60)),
    silence=st.one_of(
        st.none(),
        st.none(),
        st.none(),
        st.tuples(st.sampled_from([None, *(r.name for r in RULES)]), st.integers(10, 180)),
    ),
)
engine_histories = st.lists(
    st.tuples(st.integers(1, 120), st.tuples(job_steps, job_steps)), min_size=1, max_size=24
)


Recovery = tuple[str, float, float]
"""A fault as inhibition sees it: the job, and when its recovery starts and ends."""


def _muted(
    rule_name: str, job: str, now: float, silences: Sequence[Silence], faults: Sequence[Recovery]
) -> bool:
    """Whether a silence or a recovering fault covers this job's alert of this rule now."""
    silenced = any(
        s.starts_at <= now < s.ends_at
        and s.rule in (None, rule_name)
        and s.matchers.get("job") == job
        for s in silences
    )
    recovering = rule_name in INHIBITED and any(
        faulty == job and start <= now < end for faulty, start, end in faults
    )
    return silenced or recovering


def _happen(
    found: InMemoryState,
    job: str,
    step: JobStep,
    before: float,
    now: float,
    silences: list[Silence],
    faults: list[Recovery],
) -> None:
    """Record one job's events between the last evaluation and this one."""
    if step.gpu_hours:
        found.add(usage(now - 1, step.gpu_hours, job=job))
    if step.log_gb:
        found.add(usage(now - 1, step.log_gb, "logs.ingest", job=job))
    if step.util is not None:
        for ts in range(int(before) + 2 * MIN, int(now) + 1, 2 * MIN):
            found.add(sample(ts, step.util, resource_id=f"node-{job}", job=job))
    if step.fault_recovery_min is not None:
        recovery = step.fault_recovery_min * MIN
        found.add(fault(now, recovery_seconds=recovery, job=job))
        faults.append((job, now, now + recovery))
    if step.silence is not None:
        rule_name, minutes = step.silence
        silences.append(
            Silence(
                f"s{len(silences)}",
                ends_at=now + minutes * MIN,
                rule=rule_name,
                matchers={"job": job},
                starts_at=now,
            )
        )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(engine_histories)
def test_the_engine_keeps_the_lifecycle_promises_under_silences_and_faults(
    history: list[tuple[int, tuple[JobStep, JobStep]]],
) -> None:
    engine = Engine(RULES, "USD")
    audit = Audit(engine.policies)
    found = InMemoryState(book())
    silences: list[Silence] = []
    faults: list[Recovery] = []
    kept, restored = AlertBook(), AlertBook()
    now = T0
    for minutes, per_job in history:
        before, now = now, now + minutes * MIN
        for job, step in zip(JOBS, per_job, strict=True):
            _happen(found, job, step, before, now, silences, faults)
        result = engine.evaluate(found, now, kept, silences)
        again = engine.evaluate(found, now, round_trip(restored), silences)
        assert again.changes == result.changes, "a book read back from JSON carries on"
        assert round_trip(result.book) == result.book
        kept, restored = result.book, again.book
        observed = {
            alert_id(name, f.group): Observed(
                name, f.rank, _muted(name, f.group["job"], now, silences, faults)
            )
            for name, findings in result.findings.items()
            for f in findings
        }
        audit.step(now, observed, result.changes)
