"""Dry run: goes through the whole enforcement path (claims, caps, the ledger) and touches
nothing.

For trying a rule's enforcement before trusting it: every plan is identified, re-checked and
counted against the cap like a live one, and the audit log says what would have been
enforced. Unlike ``mode: dry_run``, which stops before the cap, this connector exercises it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from costline.connectors.enforce import EnforceConnector, enforcer
from costline.rules.enforce import EnforcePlan
from costline.rules.enforce_params import EnforceParams
from costline.rules.reclaim import Outcome

log = logging.getLogger(__name__)


class DryRunEnforceParams(EnforceParams):
    """Plans, re-checks and logs the enforcement, never acts: for trying a rule."""


@enforcer("dry_run")
class DryRunEnforcer(EnforceConnector):
    """Remembers what it was asked to enforce, in order (``would_enforce``).

    ```yaml
    rules:
      - name: team-weekly-trial
        kind: budget
        group_by: [team]
        period: week
        limit: 30000
        enforce: {connector: dry_run, grace: 5m, max_per_hour: 3}
    ```
    """

    params_model = DryRunEnforceParams

    def __init__(self) -> None:
        self.would_enforce: list[EnforcePlan] = []

    async def identify(self, plan: EnforcePlan) -> dict[str, str]:
        return {"group": plan.subject}

    def describe(self, plan: EnforcePlan) -> str:
        return f"enforce the budget of {plan.subject}"

    async def snapshot(self, plan: EnforcePlan, before: Mapping[str, Any]) -> dict[str, Any]:
        return {}

    async def apply(self, plan: EnforcePlan, before: Mapping[str, Any]) -> Outcome:
        self.would_enforce.append(plan)
        log.info("dry run: would enforce %s for rule %s", plan.subject, plan.rule)
        return Outcome("skipped", f"dry run (connector dry_run): would enforce the budget of "
                       f"{plan.subject}; nothing was touched", {"dry_run": True})

    async def lift(self, plan: EnforcePlan, before: Mapping[str, Any]) -> Outcome:
        return Outcome("executed", f"nothing to lift for {plan.subject} (dry run)")
