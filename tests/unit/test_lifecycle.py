"""The checkpoint lifecycle's decisions, worked out by hand on one run.

run-42 wrote a 1 TB checkpoint every 6 hours for 10 days (steps 1,000 … 40,000; checkpoint i
at T0 + 6i hours), on storage.hot at $0.0004/GB-hour: $0.40 an hour, $9.60 a day each. The
policy keeps the last 3 and every 10th, moves to storage.cold ($0.01 an hour a TB) after a
day and deletes after 7 days; "now" is T0 + 241 hours, so checkpoint i is 241 − 6i hours old.
"""

from __future__ import annotations

import dataclasses

from costline.rules.inventory import Pin, by_run
from costline.rules.kinds.checkpoint_lifecycle import CheckpointLifecycleRule
from costline.rules.lifecycle import plan_run
from costline.rules.lifecycle_flow import recheck, target_of
from costline.rules.reclaim import Go, Hold, Plan, Skip
from tests.unit.training import HOUR, PRICES, T0, checkpoint, restore, rule, state

NOW = T0 + 241 * HOUR


def written(**tags_of: dict[str, str]) -> list:
    return [checkpoint(T0 + 6 * i * HOUR, step=1000 * i, **tags_of.get(str(i), {}))
            for i in range(1, 41)]


def retention(**keys: object) -> CheckpointLifecycleRule:
    policy = {"keep_last": 3, "keep_every": 10, "cold_after": "1d",
              "cold_tier": "storage.cold", "expire_after": "7d", **keys}
    found = rule(kind="checkpoint_lifecycle", **policy)
    assert isinstance(found, CheckpointLifecycleRule)
    return found


def plan_of(found, now: float = NOW) -> dict[int, str]:
    run = by_run(found.checkpoints())["run-42"]
    return {a.checkpoint.step // 1000: a.action for a in
            plan_run(retention().retention, run, found.restores(0), found.pins(), now)}


def test_expired_ones_go_older_ones_move_the_last_and_every_tenth_stay() -> None:
    actions = plan_of(state(*written()))
    # deleted: older than 168 h (i ≤ 12) and not every 10th → 1–9, 11, 12
    assert sorted(i for i, a in actions.items() if a == "delete") == [*range(1, 10), 11, 12]
    # moved: older than 24 h (i ≤ 36), not deleted: 13–36 and the 10th
    assert sorted(i for i, a in actions.items() if a == "move") == [10, *range(13, 37)]
    # untouched: 37 (19 h old) and the last three, 38–40
    assert set(range(1, 41)) - set(actions) == {37, 38, 39, 40}


def test_the_alert_says_what_the_storage_past_retention_costs_a_day() -> None:
    [finding] = retention().evaluate(state(*written()), NOW)
    # 36 checkpoints at $9.60 a day: 11 to delete ($105.60), 25 to move ($240.00)
    assert finding.value == 345_600_000 and finding.group == {"job": "run-42"}
    assert [(c.group, c.value) for c in finding.top] == [
        ({"action": "delete", "checkpoints": "11"}, 105_600_000),
        ({"action": "move to storage.cold", "checkpoints": "25"}, 240_000_000)]
    assert "11 to delete, 25 to move to storage.cold" in retention().summarize(finding, "USD")


def test_a_move_saves_the_difference_of_the_tiers_a_deletion_all() -> None:
    run = by_run(state(*written()).checkpoints())["run-42"]
    found = {a.checkpoint.step: a for a in plan_run(retention().retention, run, [], {}, NOW)}
    assert found[1000].saves_per_hour(PRICES) == 400_000       # $0.40 an hour
    assert found[13000].saves_per_hour(PRICES) == 390_000      # $0.40 − $0.01


def test_pinned_exempt_and_restored_checkpoints_are_held_back() -> None:
    found = state(*written(**{"6": {"keep": "true"}}), restore(NOW - HOUR, step=7000))
    found.pin("/ckpt/run-42/step-5000", Pin("erin", NOW + HOUR, "eval baseline"))
    actions = plan_of(found)
    assert {5, 6, 7} & set(actions) == set()
    assert actions[8] == "delete"
    # a pin that ran out, and a restore older than the 6 h guard, hold nothing back
    later = NOW + 6 * HOUR
    assert {5, 7} <= set(plan_of(found, later))


def test_the_latest_is_never_touched_whatever_the_policy() -> None:
    found = state(*[checkpoint(T0 + i * HOUR, step=i) for i in range(1, 3)])
    old = rule(kind="checkpoint_lifecycle", keep_last=1, expire_after="1h")
    actions = old.actions(found, T0 + 30 * 86400)
    assert [a.checkpoint.step for a in actions["run-42"]] == [1]


def test_keep_every_counts_deleted_checkpoints_so_the_kept_ones_do_not_shift() -> None:
    from costline.rules.inventory import Change
    found = state(*written())
    found.record_change(Change("/ckpt/run-42/step-1000", "delete", NOW - HOUR))
    actions = plan_of(found)
    assert 1 not in actions and actions[10] == "move" and actions[11] == "delete"


def plan(action: str = "delete", step: int = 5, **changes: object) -> Plan:
    found = state(*written())
    run = by_run(found.checkpoints())["run-42"]
    wanted = next(a for a in plan_run(retention().retention, run, [], {}, NOW)
                  if a.checkpoint.step == step * 1000)
    assert wanted.action == action
    made = Plan(plan_id="p1", rule="test-checkpoint-lifecycle",
                resource_id=wanted.checkpoint.checkpoint_id, resource_type="storage.hot",
                tags={}, connector="dry_run", params={}, mode="live", grace=600,
                idle_since=wanted.checkpoint.written_at, planned_at=NOW, execute_at=NOW + 600,
                target=target_of(wanted, {}), hourly=400_000, currency="USD")
    return dataclasses.replace(made, **changes)


def check(made: Plan, found=None, now: float = NOW + 600, **options: object):
    found = found or state(*written())
    run = by_run(found.checkpoints())["run-42"]
    keys = {"paused": False, "approved": False, "manual": False, **options}
    return recheck(retention().retention, made, made.execute_at, run, found.restores(0),
                   found.pins(), now, **keys)


def test_a_plan_goes_ahead_after_its_grace_when_nothing_changed() -> None:
    assert isinstance(check(plan(), now=NOW + 599), Hold)
    assert check(plan()) == Go()
    assert isinstance(check(plan(), manual=True), Hold)
    assert check(plan(), manual=True, approved=True) == Go()


def test_a_plan_is_skipped_when_the_inventory_says_otherwise() -> None:
    pinned = state(*written())
    pinned.pin("/ckpt/run-42/step-5000", Pin("erin", NOW + 86400))
    assert check(plan(), pinned).reason.startswith("pinned by erin")  # type: ignore[union-attr]
    restored = state(*written(), restore(NOW + 300, step=5000))
    assert "being read by a restore" in check(plan(), restored).reason  # type: ignore[union-attr]
    moved = state(*written(), checkpoint(NOW + 60, step=5000, tier="storage.cold"))
    moved_reason = check(plan(), moved).reason  # type: ignore[union-attr]
    assert moved_reason.startswith("moved since it was planned")
    assert check(plan(), paused=True) == Skip("the checkpoint lifecycle is paused")
    assert check(plan(resource_id="nope")) == Skip("no longer in the inventory")


def test_a_plan_the_rule_no_longer_asks_for_is_skipped() -> None:
    made = plan()
    found = state(*written())
    run = by_run(found.checkpoints())["run-42"]
    longer = retention(expire_after="30d").retention
    verdict = recheck(longer, made, made.execute_at, run, [], {}, NOW + 600, paused=False,
                      approved=False, manual=False)
    assert verdict == Skip("the rule no longer asks for it")
    gone = recheck(None, made, made.execute_at, run, [], {}, NOW + 600, paused=False,
                   approved=False, manual=False)
    assert isinstance(gone, Skip)
