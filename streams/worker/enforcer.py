"""The enforcement agent: budget findings in, audited enforcements and lifts out.

The worker hands it every evaluation's findings (``submit``) and calls ``tick`` on a timer,
as it does the reclamation agent (``costline.streams.worker.reclaimer``), whose ledger, claims,
caps and audit log it shares. ``submit`` plans the groups that crossed their rule's trigger
line and warns; ``tick`` re-checks the plans whose grace ended, applies the cap, enforces
(recording the values it changes first), sweeps (holds jobs submitted since), and lifts what
the period's end or a raised budget line released.

Its first tick reconciles: a plan a previous worker claimed and never finished (it stopped
between recording the values and recording the outcome) is finished, enforced or lifted,
from the values recorded. The decisions are ``costline.rules.enforce``'s.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import timedelta
from itertools import groupby
from typing import Any

from costline.connectors.enforce import EnforceConnector, NotEnforceable, build_enforcers
from costline.connectors.enforce_ledger import EnforceLedger
from costline.connectors.reclaim_ledger import Pause
from costline.connectors.slack_actions import ActionRequest
from costline.rules.durations import rfc3339
from costline.rules.enforce import (
    Enforcement,
    EnforcePlan,
    EnforceRecord,
    EnforceStep,
    Go,
    Hold,
    Keep,
    Outcome,
    Skip,
    cap_breach,
    dry_run_record,
    due_time,
    effective_mode,
    group_key,
    interrupted_refusal,
    keep_key,
    latest_findings,
    lift_reason,
    make_plan,
    planned,
    refusal,
    triggers,
    unplanned,
    verdict,
    warned,
)
from costline.rules.enforce_params import DEFAULT_MAX_PER_HOUR
from costline.rules.findings import Finding
from costline.rules.kinds.budget import BudgetRule
from costline.rules.loader import RuleSet
from costline.streams.settings import Settings
from costline.streams.worker.plan_rounds import act_round, error_text, flush_outbox

log = logging.getLogger("costline.enforce")

Sink = Callable[[dict[str, Any]], Awaitable[None]]
RuleSource = RuleSet | Callable[[], RuleSet]

DEFAULT_COOLDOWN_S = 3600
DEFAULT_CLAIM_TIMEOUT_S = 300
WARN_RETRY_S = 30
LIFT_RETRY_S = 60


class Enforcer:
    """One per worker; any number of workers may share a ledger.

    ``rules`` is the rule set, or a function returning the current one: a plan is re-checked
    against its rule as loaded at that moment. ``cooldown_s`` is how long a plan that closed
    without enforcing keeps its group from being planned again; ``claim_timeout_s`` how long
    an enforcement or a lift may take before another tick finishes it from the ledger.
    """

    def __init__(self, *, rules: RuleSource, ledger: EnforceLedger, sink: Sink,
                 connectors: Mapping[str, EnforceConnector] | None = None,
                 currency: str = "USD", worker: str | None = None,
                 cooldown_s: int = DEFAULT_COOLDOWN_S,
                 claim_timeout_s: int = DEFAULT_CLAIM_TIMEOUT_S,
                 clock: Callable[[], float] = time.time) -> None:
        self._rules = rules
        self._ledger = ledger
        self._sink = sink
        self._connectors = dict(connectors) if connectors is not None else build_enforcers()
        self._currency = currency
        self.worker = worker or f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        self._cooldown_s = cooldown_s
        self._claim_timeout_s = claim_timeout_s
        self._clock = clock
        self._findings: dict[str, dict[str, Finding]] = {}
        self._evaluated_at: dict[str, float] = {}  # rule → when its findings were submitted
        self._reconciled = False
        self._lift_retry: dict[str, float] = {}
        # Roll-backs whose lift failed: the plan stays ``lifting`` (never swept) and is tried
        # again; its reason and closing step, for the record that ends it.
        self._rollbacks: dict[str, tuple[str, EnforceStep]] = {}

    @property
    def ledger(self) -> EnforceLedger:
        return self._ledger

    def rule(self, name: str) -> BudgetRule | None:
        rules = self._rules() if callable(self._rules) else self._rules
        found = rules.get(name)
        return found if isinstance(found, BudgetRule) else None

    def enforces(self, name: str) -> bool:
        """Whether a rule of that name enforces (the Slack buttons ask before acting)."""
        found = self.rule(name)
        return found is not None and found.enforce is not None

    # ── planning ──────────────────────────────────────────────────────────────────────────

    async def submit(self, findings: Mapping[str, Sequence[Finding]],
                     now: float | None = None) -> list[dict[str, Any]]:
        """Take one evaluation's findings (rule name → findings) and plan the groups over
        their trigger line; a group already planned or enforced is left alone."""
        at = self._clock() if now is None else now
        paused = await self._ledger.paused() is not None
        for name, found in findings.items():
            rule = self.rule(name)
            if rule is None or rule.enforce is None:
                continue
            self._findings[name] = latest_findings(found)
            self._evaluated_at[name] = at
            for finding in found:
                if triggers(rule, finding, at):
                    await self._plan(rule, finding, at, paused)
        return await self.flush()

    async def _plan(self, rule: BudgetRule, finding: Finding, now: float, paused: bool) -> None:
        if await self._ledger.holder(rule.name, group_key(finding.group)) is not None:
            return
        keep = await self._ledger.kept(keep_key(rule.name, finding.group), now)
        why = refusal(rule, finding.group, paused=paused, keep=keep, now=now)
        if why is not None:
            log.debug("not enforcing %s for %s: %s", finding.group, rule.name, why)
            return
        plan = make_plan(rule, finding, {}, self._currency, now)
        connector = self._connectors.get(plan.connector)
        try:
            if connector is None:
                raise NotEnforceable("failed", f"connector {plan.connector} is not available "
                                     "in this worker")
            plan = make_plan(rule, finding, await connector.identify(plan), self._currency, now)
        except NotEnforceable as exc:
            record = unplanned(plan, Outcome(exc.step, exc.reason))
            await self._ledger.close_unplanned(plan, record.to_dict(), self._cooldown_s)
            return
        except Exception as exc:  # noqa: BLE001 - any failure to look up closes the plan
            record = unplanned(plan, Outcome("failed", f"cannot identify: {error_text(exc)}"))
            await self._ledger.close_unplanned(plan, record.to_dict(), self._cooldown_s)
            return
        if await self._ledger.open(plan, planned(plan, self._describe(plan)).to_dict()):
            await self._warn(plan, now)

    async def _warn(self, plan: EnforcePlan, now: float) -> None:
        record = warned(plan, now, self._describe(plan))
        await self._ledger.advance(plan.plan_id, "planned", "warned", record.to_dict(), now)

    def _describe(self, plan: EnforcePlan) -> str:
        connector = self._connectors.get(plan.connector)
        return connector.describe(plan) if connector else f"enforce {plan.subject}"

    # ── the tick ──────────────────────────────────────────────────────────────────────────

    async def tick(self, now: float | None = None) -> list[dict[str, Any]]:
        """Reconcile, warn, re-check, cap, enforce, sweep and lift. Returns the records
        handed to the sink."""
        at = self._clock() if now is None else now
        handed = await self.flush()
        paused = await self._ledger.paused() is not None
        plans = await self._ledger.plans()
        first, self._reconciled = not self._reconciled, True
        for tracked in plans:
            if tracked.state == "planned" and at - tracked.plan.planned_at >= WARN_RETRY_S:
                await self._warn(tracked.plan, at)
            elif tracked.state in ("executing", "lifting") and (
                    first or (tracked.claimed_at or at) + self._claim_timeout_s <= at
                    or (tracked.state == "lifting"
                        and self._lift_retry.get(tracked.plan.plan_id, at + 1) <= at)):
                await self._reconcile(tracked, at)
            elif tracked.state == "enforced":
                await self._maintain(tracked, at, paused)
        # Due once its grace or its budget period ends, whichever comes first.
        due = sorted((t for t in plans if t.state == "warned"
                      and at >= min(t.due_at, t.plan.period_end)),
                     key=lambda t: (t.plan.rule, t.due_at, t.plan.plan_id))
        for name, group in groupby(due, key=lambda t: t.plan.rule):
            await self._settle(name, list(group), at, paused)
        return handed + await self.flush()

    def _latest(self, plan: EnforcePlan, since: float | None = None
                ) -> tuple[Finding | None, bool]:
        """The group's latest finding, and whether its rule was evaluated since the start (at
        ``since`` or later, when given)."""
        found = self._findings.get(plan.rule)
        evaluated = self._evaluated_at.get(plan.rule)
        known = evaluated is not None and (since is None or evaluated >= since)
        return (found or {}).get(plan.subject), known

    async def _settle(self, name: str, due: list[Enforcement], now: float,
                      paused: bool) -> None:
        """Re-check one rule's due plans, then enforce the ones still over the line."""
        rule = self.rule(name)
        ready: list[Enforcement] = []
        for tracked in due:
            plan = tracked.plan
            keep = await self._ledger.kept(keep_key(plan.rule, plan.group), now)
            # The re-check after the grace reads an evaluation made once the grace was over, not
            # the one that planned it (an evaluator that stopped answering would enforce on it).
            finding, known = self._latest(plan, since=due_time(tracked, rule))
            found = verdict(tracked, rule, finding, known, now, paused=paused, keep=keep)
            if isinstance(found, Skip):
                await self._close(tracked, "skipped", found.reason, now)
            elif isinstance(found, Go):
                ready.append(tracked)
            elif isinstance(found, Hold):
                log.debug("%s held: %s", plan.subject, found.reason)
        if rule is None or rule.enforce is None or not ready:
            return
        live = [t for t in ready if effective_mode(t.plan, rule) == "live"]
        for tracked in ready:
            if tracked not in live:
                record = dry_run_record(tracked.plan, self._describe(tracked.plan), now)
                await self._ledger.close(tracked.plan.plan_id, "warned", record.to_dict(),
                                         self._cooldown_s)
        cap = rule.enforce.params.get("max_per_hour")
        await act_round(self._ledger, name, live, now, cap or DEFAULT_MAX_PER_HOUR,
                        lambda done: cap_breach(cap, len(live), done),
                        lambda t, why: self._close(t, "failed", why, now, {"aborted": True}),
                        lambda t: self._claim_and_apply(t, now), log)

    async def _claim_and_apply(self, tracked: Enforcement, now: float) -> None:
        if await self._ledger.claim(tracked.plan.plan_id, self.worker, now) == "claimed":
            await self._apply(tracked, now)

    # ── acting ────────────────────────────────────────────────────────────────────────────

    async def _apply(self, tracked: Enforcement, now: float, how: str = "") -> None:
        """Record what will change, change it, record the outcome; undo a failed change."""
        plan, before = tracked.plan, dict(tracked.before)
        connector = self._connectors.get(plan.connector)
        try:
            if connector is None:
                raise NotEnforceable("failed", f"connector {plan.connector} is not available")
            more = await connector.snapshot(plan, before)
            if more and not await self._ledger.note(plan.plan_id, "executing", more):
                return
            before = {**more, **before}
            outcome = await connector.apply(plan, before)
        except NotEnforceable as exc:
            outcome = Outcome(exc.step, exc.reason)
        except Exception as exc:  # noqa: BLE001 - reported as the plan's failure
            outcome = Outcome("failed", error_text(exc))
        detail = {**outcome.detail, **_approval(tracked)}
        reason = f"{how}{outcome.reason}"
        if outcome.step == "executed":
            record = EnforceRecord(plan, "executed", reason, now, detail)
            await self._ledger.advance(plan.plan_id, "executing", "enforced", record.to_dict(),
                                       now)
            log.info("enforced %s for %s: %s", plan.subject, plan.rule, reason)
        elif before and outcome.step == "failed":
            rolled = await self._ledger.claim(plan.plan_id, self.worker, now, seen="executing",
                                              to="lifting", name="lift", check_pause=False)
            if rolled == "claimed":
                await self._finish_lift(plan, before, now, f"could not enforce: {reason}; "
                                        "rolled back", closing="failed")
        else:
            await self._close(Enforcement(plan, "executing"), outcome.step, reason, now, detail)

    async def _maintain(self, tracked: Enforcement, now: float, paused: bool) -> None:
        """Lift an enforcement whose reason is gone; else hold what was submitted since."""
        plan = tracked.plan
        rule = self.rule(plan.rule)
        finding, known = self._latest(plan)
        reason = lift_reason(tracked, rule, finding, known, now)
        if reason is not None:
            await self._lift(tracked, now, reason)
            return
        connector = self._connectors.get(plan.connector)
        if (connector is None or paused or not connector.sweeps(plan)
                or effective_mode(plan, rule) != "live"):
            return
        more: dict[str, Any] = {}
        try:
            more = await connector.snapshot(plan, tracked.before)
            if not more or not await self._ledger.note(plan.plan_id, "enforced", more):
                return
            outcome = await connector.apply(plan, more)
        except Exception as exc:  # noqa: BLE001 - the next tick sweeps again
            log.warning("sweep of %s failed: %s", plan.subject, error_text(exc))
            if not more:
                return
            # Recorded before the command that failed, which may have acted: the audit log
            # says so, and the lift gives back whatever of it did.
            outcome = Outcome("failed", f"{error_text(exc)}; it may have acted on "
                              f"{', '.join(sorted(more))}, which the lift gives back")
        step: EnforceStep = "executed" if outcome.step == "executed" else "failed"
        record = EnforceRecord(plan, step, f"sweep: {outcome.reason}", now, outcome.detail,
                               serial=f"sweep-{now:.3f}")
        await self._ledger.advance(plan.plan_id, "enforced", "enforced", record.to_dict(), now)

    async def _lift(self, tracked: Enforcement, now: float, reason: str,
                    force: bool = False) -> bool:
        plan = tracked.plan
        if not force and self._lift_retry.get(plan.plan_id, 0.0) > now:
            return False
        claim = await self._ledger.claim(plan.plan_id, self.worker, now, seen="enforced",
                                         to="lifting", name=f"lift-{now:.3f}",
                                         check_pause=False)
        if claim != "claimed":
            return False
        return await self._finish_lift(plan, tracked.before, now, reason)

    async def _finish_lift(self, plan: EnforcePlan, before: Mapping[str, Any], now: float,
                           reason: str, closing: EnforceStep = "lifted") -> bool:
        """Restore what was recorded; a lift that fails is tried again a minute later. A lift
        goes back to ``enforced`` meanwhile (its reason is still there then); a roll-back
        (``closing`` other than ``lifted``) stays ``lifting``, as nothing else would finish it
        and an enforced plan would go on sweeping."""
        connector = self._connectors.get(plan.connector)
        try:
            if connector is None:
                raise RuntimeError(f"connector {plan.connector} is not available")
            outcome = await connector.lift(plan, before)
        except Exception as exc:  # noqa: BLE001 - retried
            outcome = Outcome("failed", error_text(exc))
        if outcome.step == "executed":
            record = EnforceRecord(plan, closing, f"{reason}: {outcome.reason}", now,
                                   outcome.detail)
            await self._ledger.close(plan.plan_id, "lifting", record.to_dict(), 0)
            self._lift_retry.pop(plan.plan_id, None)
            self._rollbacks.pop(plan.plan_id, None)
            log.info("lifted %s for %s: %s", plan.subject, plan.rule, record.reason)
            return True
        self._lift_retry[plan.plan_id] = now + LIFT_RETRY_S
        record = EnforceRecord(plan, "failed", f"lift failed ({reason}): {outcome.reason}; "
                               "tried again in a minute", now, serial=f"lift-{now:.3f}")
        rollback = closing != "lifted"
        if rollback:
            self._rollbacks[plan.plan_id] = (reason, closing)
        await self._ledger.advance(plan.plan_id, "lifting", "lifting" if rollback else "enforced",
                                   record.to_dict(), now)
        return False

    async def _reconcile(self, tracked: Enforcement, now: float) -> None:
        """Finish what a worker that stopped left half done, from the recorded values. An
        enforcement is finished only if it would still be started now; else what it recorded
        is restored, and one that recorded nothing is closed (planned again, with its grace,
        if the group is still over)."""
        if tracked.state != "executing":
            reason, closing = self._rollbacks.get(
                tracked.plan.plan_id, ("lift completed after a restart", "lifted"))
            await self._finish_lift(tracked.plan, tracked.before, now, reason, closing)
            return
        paused = await self._ledger.paused() is not None
        why = interrupted_refusal(tracked, self.rule(tracked.plan.rule), paused=paused, now=now)
        if why is None:
            await self._apply(tracked, now, how="completed after a restart: ")
        elif not tracked.before:
            await self._close(tracked, "skipped", f"stopped before it changed anything, and "
                              f"{why}", now)
        elif await self._ledger.claim(tracked.plan.plan_id, self.worker, now, seen="executing",
                                      to="lifting", name=f"lift-{now:.3f}",
                                      check_pause=False) == "claimed":
            await self._finish_lift(tracked.plan, tracked.before, now,
                                    f"stopped half way, and {why}: rolled back",
                                    closing="skipped")

    async def _close(self, tracked: Enforcement, step: EnforceStep, reason: str, now: float,
                     detail: Mapping[str, Any] | None = None) -> None:
        record = EnforceRecord(tracked.plan, step, reason, now, dict(detail or {}))
        await self._ledger.close(tracked.plan.plan_id, tracked.state, record.to_dict(),
                                 self._cooldown_s)

    # ── people ────────────────────────────────────────────────────────────────────────────

    async def lift(self, rule: str, subject: str, by: str, now: float | None = None) -> str:
        """Lift a group's enforcement by hand (``costline enforce lift``, the Lift button);
        it is not enforced again before its period ends. ``subject``: the group's key."""
        at = self._clock() if now is None else now
        tracked = await self._held(rule, subject)
        plan = tracked.plan
        await self._ledger.keep(keep_key(rule, plan.group), Keep(by, plan.period_end))
        reason = f"lifted by {by}; not enforced again before {rfc3339(plan.period_end)}"
        if tracked.state in ("planned", "warned"):
            await self._close(tracked, "skipped", reason, at)
            await self.flush()
            return f"not enforced; {reason}"
        if tracked.state != "enforced":
            raise RuntimeError(f"{plan.subject} is {tracked.state}: try again shortly")
        lifted = await self._lift(tracked, at, reason, force=True)
        await self.flush()
        if not lifted:
            raise RuntimeError("the lift failed and is tried again in a minute; `costline "
                               "actions` says why")
        return reason

    async def approve(self, rule: str, subject: str, by: str) -> str:
        """Approve a planned enforcement (rules with ``approval: manual``)."""
        tracked = await self._held(rule, subject)
        if not await self._ledger.approve(tracked.plan.plan_id, by):
            raise LookupError(f"no planned enforcement of {subject} for rule {rule}")
        return f"enforced from {rfc3339(due_time(tracked, self.rule(rule)))}"

    async def _held(self, rule: str, subject: str) -> Enforcement:
        holder = await self._ledger.holder(rule, subject)
        tracked = await self._ledger.get(holder) if holder else None
        if tracked is None or tracked.state == "closed":
            raise LookupError(f"no enforcement of {subject} for rule {rule}")
        return tracked

    async def pause(self, by: str, reason: str = "") -> None:
        await self._ledger.pause(Pause(by, self._clock(), reason))

    async def resume(self) -> bool:
        return await self._ledger.resume()

    async def flush(self) -> list[dict[str, Any]]:
        """Hand the outbox to the sink, oldest first; stop at the first refusal."""
        return await flush_outbox(self._ledger, self._sink, log)


def _approval(tracked: Enforcement) -> dict[str, Any]:
    return {"approved_by": tracked.approved_by} if tracked.approved_by else {}



def build_enforcer(settings: Settings, rules: RuleSource, sink: Sink,
                   **options: Any) -> Enforcer:
    """The worker's enforcer: the ledger in the namespace's Redis, the price book's currency."""
    from costline.connectors.enforce_ledger import redis_enforce_ledger
    from costline.connectors.redis_client import connect_async
    from costline.rules.prices import PriceBook

    ledger = redis_enforce_ledger(connect_async(settings.redis_url), settings.namespace)
    return Enforcer(rules=rules, ledger=ledger, sink=sink,
                    currency=PriceBook.load(settings.prices).currency, **options)


class EnforceActions:
    """The Slack buttons with enforcement in the worker: Approve and Lift of an enforcement
    go to the enforcer, everything else to ``others`` (the reclamation's buttons)."""

    def __init__(self, enforcer: Enforcer, others: Any) -> None:
        self._enforcer = enforcer
        self._others = others

    async def snooze(self, request: ActionRequest, duration: timedelta) -> str | None:
        result: str | None = await self._others.snooze(request, duration)
        return result

    async def keep(self, request: ActionRequest, duration: timedelta) -> str | None:
        result: str | None = await self._others.keep(request, duration)
        return result

    async def approve(self, request: ActionRequest) -> str | None:
        if not self._enforcer.enforces(request.rule):
            result: str | None = await self._others.approve(request)
            return result
        return await self._enforcer.approve(request.rule, request.resource_id or "",
                                            request.user_name)

    async def lift(self, request: ActionRequest) -> str | None:
        if not request.resource_id:
            raise LookupError("lift needs a group")
        return await self._enforcer.lift(request.rule, request.resource_id, request.user_name)
