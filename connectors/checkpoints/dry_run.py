"""Dry run: goes through the whole lifecycle path (claims, caps, the ledger) and touches nothing.

For trying a retention on real checkpoints before trusting it: every action is planned,
re-checked and counted against the caps like a live one, and the audit log says what would
have been moved or deleted. Unlike ``mode: dry_run``, which stops before the caps, this
connector exercises them too.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from costline.connectors.checkpoints import CheckpointConnector, checkpoint_connector
from costline.rules.lifecycle import LifecycleAction
from costline.rules.lifecycle_flow import describe
from costline.rules.lifecycle_params import CheckpointParams
from costline.rules.reclaim import Outcome, Plan

log = logging.getLogger(__name__)


class DryRunCheckpointParams(CheckpointParams):
    """Plans, re-checks and logs each action, never acts: for trying a retention for real."""


@checkpoint_connector("dry_run")
class DryRunCheckpoints(CheckpointConnector):
    """Remembers what it was asked to do, in order (``would_act``).

    ```yaml
    rules:
      - name: retention-trial
        kind: checkpoint_lifecycle
        keep_last: 2
        expire_after: 7d
        act: {connector: dry_run, grace: 10m, max_per_hour: 20}
        mode: live
    ```
    """

    params_model = DryRunCheckpointParams

    def __init__(self) -> None:
        self.would_act: list[Plan] = []

    async def identify(self, action: LifecycleAction, params: Mapping[str, Any]
                       ) -> dict[str, str]:
        return {"location": action.checkpoint.location}

    async def act(self, plan: Plan) -> Outcome:
        self.would_act.append(plan)
        log.info("dry run: would %s for rule %s", describe(plan), plan.rule)
        return Outcome("skipped", f"dry run (connector dry_run): would {describe(plan)}; "
                       "nothing was touched", {"dry_run": True})
