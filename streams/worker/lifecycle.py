"""The checkpoint lifecycle's shell: what the policy asks becomes audited, safe actions.

The worker's leader calls ``tick`` on a timer. Each ``checkpoint_lifecycle`` rule with an
``act`` block is asked what it wants now (the same pure decisions its alerts come from); each
new action becomes a plan the connector identifies, announced at once in the audit log; once
its grace has passed it is re-checked against a fresh inventory (``recheck``: still asked for,
not the latest, not pinned, not exempt, not being restored), counted against the rule's caps
and carried out at most once (the ledger's execution claim). A dry run (the kind's default)
stops before the caps and says what it would have done. Every step goes to the ledger's
outbox and from there to ``sink`` (``NS.actions.v1``); what was moved or deleted is recorded
in the inventory (``CheckpointStore``).

The decisions are ``costline.rules.lifecycle`` and ``lifecycle_flow``'s; this module only
does the I/O around them, as ``reclaimer`` does for idle resources, whose ledger it reuses
under a hash tag of its own.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from itertools import groupby
from typing import Any, Protocol

from costline.connectors.checkpoints import (
    CheckpointConnector,
    NotReclaimable,
    build_checkpoint_connectors,
)
from costline.connectors.reclaim_ledger import ReclaimLedger
from costline.rules.inventory import Change, Checkpoint, by_run, hourly_storage
from costline.rules.kinds.checkpoint_lifecycle import CheckpointLifecycleRule
from costline.rules.lifecycle import LifecycleAction
from costline.rules.lifecycle_flow import (
    closed_record,
    dry_run_record,
    planned_record,
    recheck,
    target_of,
    warned_record,
)
from costline.rules.lifecycle_params import DEFAULT_MAX_PER_HOUR, DEFAULT_MAX_PERCENT
from costline.rules.loader import RuleSet
from costline.rules.prices import PriceBook
from costline.rules.reclaim import (
    Go,
    Outcome,
    Plan,
    Safety,
    Skip,
    Tracked,
    cap_breach,
    grace_end,
    plan_id_for,
)
from costline.rules.state import StateView, matches
from costline.streams.settings import Settings
from costline.streams.worker.plan_rounds import act_round, error_text, flush_outbox

log = logging.getLogger("costline.checkpoints")

Sink = Callable[[dict[str, Any]], Awaitable[None]]
RuleSource = RuleSet | Callable[[], RuleSet]

COOLDOWN_S = 86400
"""How long a closed plan keeps its checkpoint from being planned again (a dry run says what
it would do once a day, not every tick)."""
PLAN_EVERY_S = 10
"""How often the rules are asked what they want (reading the inventory and asking the ledger
about each action): due plans are settled on every tick."""
CLAIM_TIMEOUT_S = 3600
"""A move may copy terabytes: a claim without an outcome after this long is reported
unknown."""


class Inventory(Protocol):
    """What the lifecycle reads and writes of the inventory (``RedisState`` and
    ``CheckpointStore``; ``InMemoryState`` in tests)."""

    def record_change(self, change: Change) -> None: ...


def safety_of(params: Mapping[str, Any]) -> Safety:
    """The caps of an ``act`` block, with the lifecycle's defaults."""
    percent = params.get("max_percent")
    return Safety(approval="manual" if params.get("approval") == "manual" else "auto",
                  max_per_hour=int(params.get("max_per_hour") or DEFAULT_MAX_PER_HOUR),
                  max_percent=DEFAULT_MAX_PERCENT if percent is None else float(percent))


class CheckpointKeeper:
    """One per worker; any number of workers may share the ledger (only the leader ticks)."""

    def __init__(self, *, rules: RuleSource, state: StateView, changes: Inventory,
                 ledger: ReclaimLedger, prices: PriceBook, sink: Sink,
                 connectors: Mapping[str, CheckpointConnector] | None = None,
                 worker: str | None = None, cooldown_s: int = COOLDOWN_S,
                 claim_timeout_s: int = CLAIM_TIMEOUT_S,
                 clock: Callable[[], float] = time.time) -> None:
        self._rules = rules
        self._state = state
        self._changes = changes
        self._ledger = ledger
        self._prices = prices
        self._sink = sink
        self._connectors = dict(connectors) if connectors is not None else \
            build_checkpoint_connectors()
        self.worker = worker or f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        self._cooldown_s = cooldown_s
        self._claim_timeout_s = claim_timeout_s
        self._clock = clock
        self._planned_at: float | None = None

    @property
    def ledger(self) -> ReclaimLedger:
        return self._ledger

    def _ruleset(self) -> RuleSet:
        return self._rules() if callable(self._rules) else self._rules

    def _rule(self, name: str) -> CheckpointLifecycleRule | None:
        found = self._ruleset().get(name)
        return found if isinstance(found, CheckpointLifecycleRule) and found.act else None

    def _due(self, tracked: Tracked) -> float:
        """When the plan's grace ends under its rule as loaded now (``grace_end``)."""
        rule = self._rule(tracked.plan.rule)
        act = rule.act if rule is not None else None
        return grace_end(tracked.plan, tracked.warned_at, act.grace if act is not None else None)

    # ── the tick ──────────────────────────────────────────────────────────────────────────

    async def tick(self, now: float | None = None) -> list[dict[str, Any]]:
        """Plan what the rules ask now, then advance every open plan. Returns the records
        handed to the sink."""
        at = self._clock() if now is None else now
        handed = await self.flush()
        paused = await self._ledger.paused() is not None
        if not paused and (self._planned_at is None or at - self._planned_at >= PLAN_EVERY_S
                           or at < self._planned_at):
            self._planned_at = at
            for rule in self._ruleset():
                if isinstance(rule, CheckpointLifecycleRule) and rule.act is not None:
                    wanted = await asyncio.to_thread(rule.actions, self._state, at)
                    for found in wanted.values():
                        for action in found:
                            await self._plan(rule, action, at)
        plans = await self._ledger.plans()
        for tracked in plans:
            await self._follow_up(tracked, at)
        due = sorted((t for t in plans if t.state == "warned" and at >= t.due_at),
                     key=lambda t: (t.plan.rule, t.due_at, t.plan.plan_id))
        for rule_name, group in groupby(due, key=lambda t: t.plan.rule):
            await self._settle(rule_name, list(group), at, paused)
        return handed + await self.flush()

    async def _plan(self, rule: CheckpointLifecycleRule, action: LifecycleAction,
                    now: float) -> None:
        checkpoint = action.checkpoint
        if await self._ledger.holder(rule.name, checkpoint.checkpoint_id) is not None:
            return
        assert rule.act is not None
        identity, problem = await self._identify(rule, action)
        plan = Plan(plan_id=plan_id_for(rule.name, checkpoint.checkpoint_id, now),
                    rule=rule.name, resource_id=checkpoint.checkpoint_id,
                    resource_type=checkpoint.tier, tags=dict(checkpoint.tags),
                    connector=rule.act.connector, params=rule.act.params, mode=rule.mode,
                    grace=rule.act.grace, idle_since=checkpoint.written_at, planned_at=now,
                    execute_at=now + rule.act.grace, target=target_of(action, identity),
                    hourly=action.saves_per_hour(self._prices), currency=self._prices.currency)
        if problem is not None:
            words = "dry run, not planned: a live run could not act: " \
                if plan.mode == "dry_run" else "not planned: "
            step = "skipped" if plan.mode == "dry_run" else problem.step
            record = closed_record(plan, step, words + problem.reason, now)
            await self._ledger.close_unplanned(plan, record.to_dict(), self._cooldown_s)
            return
        if await self._ledger.open(plan, planned_record(plan, action.reason).to_dict()):
            await self._ledger.advance(plan.plan_id, "planned", "warned",
                                       warned_record(plan, now, plan.execute_at).to_dict(), now)

    async def _identify(self, rule: CheckpointLifecycleRule, action: LifecycleAction
                        ) -> tuple[dict[str, str], Outcome | None]:
        assert rule.act is not None
        connector = self._connectors.get(rule.act.connector)
        if connector is None:
            return {}, Outcome("failed", f"connector {rule.act.connector} is not available")
        try:
            return await connector.identify(action, rule.act.params), None
        except NotReclaimable as exc:
            return {}, Outcome(exc.step, exc.reason)
        except Exception as exc:  # noqa: BLE001 - any failure to look up closes the plan
            return {}, Outcome("failed", f"cannot identify the checkpoint: {error_text(exc)}")

    async def _follow_up(self, tracked: Tracked, now: float) -> None:
        """A plan opened by a worker that died before announcing it; a claim never settled."""
        if tracked.state == "planned":
            plan = tracked.plan
            await self._ledger.advance(plan.plan_id, "planned", "warned",
                                       warned_record(plan, now, tracked.due_at).to_dict(), now)
        elif tracked.state == "executing" and (
                tracked.claimed_at or now) + self._claim_timeout_s <= now:
            await self._close(tracked, "failed", "outcome unknown: the action was started and "
                              "its worker stopped before recording the result; it is not "
                              "retried, check the checkpoint by hand", now)

    async def _settle(self, rule_name: str, due: list[Tracked], now: float,
                      paused: bool) -> None:
        """Re-check one rule's due plans against a fresh inventory, then act on the rest."""
        rule = self._rule(rule_name)
        retention = rule.retention if rule is not None else None
        guard = retention.restore_guard if retention is not None else 0
        checkpoints, restores, pins = await asyncio.to_thread(self._fresh, now - guard)
        runs = by_run(checkpoints)
        ready: list[Tracked] = []
        for tracked in due:
            plan = tracked.plan
            manual = safety_of(plan.params).approval == "manual"
            verdict = recheck(retention, plan, self._due(tracked), runs.get(plan.target["run"], []),
                              restores, pins, now, paused=paused,
                              approved=tracked.approved_by is not None, manual=manual)
            if isinstance(verdict, Skip):
                await self._close(tracked, "skipped", verdict.reason, now)
            elif isinstance(verdict, Go):
                ready.append(tracked)
        if rule is None or not ready:
            return
        live = [t for t in ready if t.plan.mode == "live" and rule.mode == "live"]
        for tracked in ready:
            if tracked not in live:
                await self._ledger.close(tracked.plan.plan_id, tracked.state,
                                         dry_run_record(tracked.plan, now).to_dict(),
                                         self._cooldown_s)
        if live:
            matched = sum(1 for c in checkpoints if c.live and matches(rule.run_match, c.tags))
            await self._act_all(rule, live, matched, now)

    def _fresh(self, restores_since: float) -> tuple[list[Checkpoint], Any, Any]:
        state: Any = self._state
        return state.checkpoints(), state.restores(restores_since), state.pins()

    async def _act_all(self, rule: CheckpointLifecycleRule, live: list[Tracked], matched: int,
                       now: float) -> None:
        """Caps first: if this round's actions break one, none of them happens."""
        assert rule.act is not None
        safety = safety_of(rule.act.params)
        await act_round(self._ledger, rule.name, live, now, safety.max_per_hour,
                        lambda done: cap_breach(safety, len(live), matched, done),
                        lambda t, why: self._close(t, "failed", why, now, {"aborted": True}),
                        lambda t: self._act(t, now), log)

    async def _act(self, tracked: Tracked, now: float) -> None:
        plan = tracked.plan
        if await self._ledger.claim(plan.plan_id, self.worker, now) != "claimed":
            return
        outcome = await self._run_connector(plan)
        detail = dict(outcome.detail)
        if tracked.approved_by:
            detail["approved_by"] = tracked.approved_by
        if outcome.step == "executed":
            await asyncio.to_thread(self._changes.record_change, self._change(plan, outcome, now))
        record = closed_record(plan, outcome.step, outcome.reason, now, detail)
        await self._ledger.close(plan.plan_id, "executing", record.to_dict(), self._cooldown_s)
        log.info("%s %s: %s", outcome.step, plan.resource_id, outcome.reason)

    def _change(self, plan: Plan, outcome: Outcome, now: float) -> Change:
        target = plan.target
        if target["action"] == "delete":
            return Change(plan.resource_id, "delete", now)
        tier = target["to_tier"]
        location = str(outcome.detail.get("location") or target.get("destination") or
                       target["location"])
        return Change(plan.resource_id, "move", now, tier, location,
                      hourly_storage(self._prices, tier, int(target.get("bytes") or 0)))

    async def _run_connector(self, plan: Plan) -> Outcome:
        connector = self._connectors.get(plan.connector)
        if connector is None:
            return Outcome("failed", f"connector {plan.connector} is not available")
        try:
            return await connector.act(plan)
        except NotReclaimable as exc:
            return Outcome(exc.step, exc.reason)
        except Exception as exc:  # noqa: BLE001 - reported as the plan's failure
            return Outcome("failed", error_text(exc))

    async def _close(self, tracked: Tracked, step: str, reason: str, now: float,
                     detail: Mapping[str, Any] | None = None) -> None:
        record = closed_record(tracked.plan, step, reason, now, detail)
        await self._ledger.close(tracked.plan.plan_id, tracked.state, record.to_dict(),
                                 self._cooldown_s)

    # ── people and records ────────────────────────────────────────────────────────────────

    async def approve(self, rule: str, checkpoint_id: str, by: str) -> float:
        """Approve a planned action (``approval: manual``); returns when it is due."""
        holder = await self._ledger.holder(rule, checkpoint_id)
        tracked = await self._ledger.get(holder) if holder else None
        if tracked is None or not await self._ledger.approve(tracked.plan.plan_id, by):
            raise LookupError(f"no planned action on {checkpoint_id} for rule {rule}")
        return self._due(tracked)

    async def flush(self) -> list[dict[str, Any]]:
        """Hand the outbox to the sink, oldest first; stop at the first refusal."""
        return await flush_outbox(self._ledger, self._sink, log)


def lifecycle_cap_alert(record: Mapping[str, Any], notify: Mapping[str, Any] | None = None
                        ) -> dict[str, Any]:
    """An aborted lifecycle round as an alert change, for the people who own the rule."""
    rule = str(record.get("rule", ""))
    reason = record.get("reason", "a cap was hit")
    return {
        "alert_id": f"{rule}/lifecycle-cap", "rule": rule, "kind": "checkpoint_lifecycle",
        "severity": "critical", "state": "firing", "previous_state": None,
        "group": {"rule": rule}, "since": record["at"], "at": record["at"], "value": "1",
        "threshold": None, "line": None, "lines": [], "unit": "aborted round",
        "currency": record.get("currency") or "USD", "notify": dict(notify or {}),
        "mode": record.get("mode") or "live", "reclaim": None,
        "headline": f"checkpoint lifecycle stopped: {reason}",
        "summary": (f"The checkpoint lifecycle of {rule} stopped: {reason}. Nothing was moved "
                    "or deleted in that round; check what the rule matched."),
    }


def build_keeper(settings: Settings, rules: RuleSource, sink: Sink, **options: Any
                 ) -> CheckpointKeeper:
    """The worker's keeper: the inventory from ``RedisState``, the ledger beside it."""
    from costline.connectors.checkpoint_store import CheckpointStore
    from costline.connectors.reclaim_ledger import RedisReclaimLedger
    from costline.connectors.redis_client import connect, connect_async
    from costline.connectors.redis_state import RedisState

    redis = connect(settings.redis_url)
    store = CheckpointStore(redis, settings.namespace)
    return CheckpointKeeper(
        rules=rules, state=RedisState(redis, settings.namespace, settings.timezone),
        changes=store, prices=PriceBook.load(settings.prices), sink=sink,
        ledger=RedisReclaimLedger(connect_async(settings.redis_url), settings.namespace,
                                  area="checkpoints"), **options)

