"""The demo holds research at its daily GPU budget line: for real with Slurm accounting, as a
dry run without; and it says so at the end."""

from __future__ import annotations

from typing import Any

import pytest

from costline.connectors.plugins import PLUGINS
from costline.rules.kinds.budget import BudgetRule
from costline.rules.loader import load_rules
from costline.streams.demo.enforcement import RULE, enforcement_text
from costline.streams.demo.run import Demo
from costline.streams.settings import Settings


@pytest.mark.parametrize("enforcing", [True, False])
def test_the_shipped_enforcement_runs_live_only_with_slurm_accounting(tmp_path: Any,
                                                                      enforcing: bool) -> None:
    demo = Demo(Settings(state_dir=tmp_path), days=1, use_running=False, keep=False, quiet=True)
    rules = load_rules([demo._rules(live=False, enforcing=enforcing)], "UTC", plugins=PLUGINS)
    rule = rules.get(RULE)
    assert isinstance(rule, BudgetRule) and rule.enforce is not None
    assert rule.mode == ("live" if enforcing else "dry_run")
    assert (rule.enforce.connector, rule.enforce.grace) == ("slurm", 10)
    assert rule.enforce.params["action"] == "hold_pending"


def test_the_shipped_rule_is_a_dry_run() -> None:
    rules = load_rules([Settings().rules], "UTC", plugins=PLUGINS)
    rule = rules.get(RULE)
    assert isinstance(rule, BudgetRule) and rule.mode == "dry_run"


def record(step: str, reason: str) -> dict[str, Any]:
    return {"automation": "enforce", "step": step, "reason": reason, "at": f"t-{step}",
            "resource_id": "team=research"}


def test_the_end_says_who_was_held_and_what_became_of_their_jobs() -> None:
    records = [record("warned", "owners warned"),
               record("executed", "held 2 pending job(s) of Slurm account research: 12, 13"),
               {"step": "executed", "resource_id": "lab/dev-gpu-01", "at": "t-z"}]
    text = enforcement_text(records, ["12 PENDING JobHeldAdmin", "11 RUNNING"],
                            ["12 PENDING BeginTime", "11 RUNNING"])
    assert text == ("Budget enforcement: team=research held at its budget line (held 2 "
                    "pending job(s) of Slurm account research: 12, 13). Its jobs then: 12 "
                    "PENDING JobHeldAdmin; 11 RUNNING. Lifted at the end as the Lift button "
                    "would: 12 PENDING BeginTime; 11 RUNNING.")
    dry = enforcement_text([record("skipped", "dry run: would hold the pending jobs of Slurm "
                                   "account research; nothing was touched")], [], [])
    assert dry == ("Budget enforcement: team=research skipped: dry run: would hold the "
                   "pending jobs of Slurm account research; nothing was touched.")
