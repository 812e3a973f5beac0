"""Dry run: goes through the whole release path (claims, caps, the ledger) and touches nothing.

For trying a rule's reclamation on a real cluster before trusting it: every plan is
identified, re-verified and counted against the caps like a live one, and the audit log says
what would have been released. Unlike ``mode: dry_run``, which stops before the caps, this
connector exercises them too.
"""

from __future__ import annotations

import logging

from costline.connectors.reclaim import ReclaimConnector, reclaimer
from costline.rules.findings import ReclaimRequest
from costline.rules.reclaim import Outcome, Plan
from costline.rules.reclaim_params import ReclaimParams

log = logging.getLogger(__name__)


class DryRunParams(ReclaimParams):
    """Plans, re-checks and logs the release, never acts: for trying a rule on a real cluster."""


@reclaimer("dry_run")
class DryRunReclaimer(ReclaimConnector):
    """Remembers what it was asked to release, in order (``would_release``).

    ```yaml
    rules:
      - name: idle-trial
        kind: idle
        match: {resource_type: "gpu.*"}
        below: 0.05
        for: 30m
        reclaim: {connector: dry_run, grace: 5m, max_per_hour: 5}
    ```
    """

    params_model = DryRunParams

    def __init__(self) -> None:
        self.would_release: list[Plan] = []

    async def identify(self, request: ReclaimRequest) -> dict[str, str]:
        return {"resource_id": request.resource_id}

    def describe(self, plan: Plan) -> str:
        return f"release {plan.resource_id}"

    async def release(self, plan: Plan) -> Outcome:
        self.would_release.append(plan)
        log.info("dry run: would release %s for rule %s", plan.resource_id, plan.rule)
        return Outcome("skipped", f"dry run (connector dry_run): would release "
                       f"{plan.resource_id}; nothing was touched", {"dry_run": True})
