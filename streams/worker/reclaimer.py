"""The reclamation agent: idle findings in, audited releases out.

The worker hands it every evaluation's findings (``submit``) and calls ``tick`` on a timer.
``submit`` turns each new reclaim request into a plan (the connector records who the target
is) and warns; ``tick`` re-verifies the plans whose grace has ended against fresh samples,
applies the caps, and releases what is still idle, each release at most once (the ledger's
execution claim). Every step goes to the ledger's outbox and from there to ``sink``, which the
worker connects to ``NS.actions.v1``; a step the sink refused is handed over again on the next
call.

The decisions are ``costline.rules.reclaim``'s; this module only does the I/O around them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from itertools import groupby
from typing import Any

from costline.connectors.reclaim import NotReclaimable, ReclaimConnector, build_connectors
from costline.connectors.reclaim_ledger import Pause, ReclaimLedger, RedisReclaimLedger
from costline.connectors.slack_actions import ActionRequest, AlertActions
from costline.rules.durations import rfc3339
from costline.rules.findings import Finding, ReclaimRequest
from costline.rules.kinds.idle import IdleRule
from costline.rules.loader import RuleSet
from costline.rules.prices import PriceBook
from costline.rules.reclaim import (
    ActionRecord,
    Go,
    Hold,
    Keep,
    Outcome,
    Plan,
    Safety,
    Skip,
    Step,
    Tracked,
    cap_breach,
    dry_run_record,
    due_time,
    effective_mode,
    hourly_cost,
    make_plan,
    outcome_record,
    planned,
    refusal,
    samples_since,
    saving,
    unknown_outcome,
    unplanned,
    verdict,
    warned,
)
from costline.rules.state import ResourceSamples, StateView
from costline.streams.settings import Settings
from costline.streams.worker.plan_rounds import act_round, error_text, flush_outbox

log = logging.getLogger("costline.reclaim")

Sink = Callable[[dict[str, Any]], Awaitable[None]]
Warn = Callable[[Plan, dict[str, Any]], Awaitable[None]]
RuleSource = RuleSet | Callable[[], RuleSet]

DEFAULT_COOLDOWN_S = 3600
DEFAULT_CLAIM_TIMEOUT_S = 900
WARN_RETRY_S = 30
"""A plan still ``planned`` this long after it was made lost its warning: send it again."""
# A release this long after its round read the samples (the releases before it were slow: a
# webhook retrying, say) reads them again first: the resource may be busy by now.
RECHECK_AFTER_S = 10.0


class Reclaimer:
    """One per worker; any number of workers may share a ledger.

    ``rules`` is the rule set, or a function returning the current one (reloads): a plan is
    re-verified against the rule as loaded at that moment (its mode, exempt tags, caps and
    approval), with the connector and parameters it was planned with. ``cooldown_s`` is how
    long a closed plan keeps its resource from being planned again; ``claim_timeout_s`` how
    long a release may run before a claim without an outcome is reported as unknown.
    """

    def __init__(self, *, rules: RuleSource, state: StateView, ledger: ReclaimLedger,
                 prices: PriceBook, sink: Sink,
                 connectors: Mapping[str, ReclaimConnector] | None = None,
                 timezone: str = "UTC", worker: str | None = None,
                 cooldown_s: int = DEFAULT_COOLDOWN_S,
                 claim_timeout_s: int = DEFAULT_CLAIM_TIMEOUT_S, warn: Warn | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self._rules = rules
        self._state = state
        self._ledger = ledger
        self._prices = prices
        self._sink = sink
        self._connectors = dict(connectors) if connectors is not None else build_connectors()
        self._timezone = timezone
        self.worker = worker or f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        self._cooldown_s = cooldown_s
        self._claim_timeout_s = claim_timeout_s
        self._warn_hook = warn
        self._clock = clock

    @property
    def ledger(self) -> ReclaimLedger:
        return self._ledger

    def _rule(self, name: str) -> IdleRule | None:
        rules = self._rules() if callable(self._rules) else self._rules
        found = rules.get(name)
        return found if isinstance(found, IdleRule) else None

    # ── planning ──────────────────────────────────────────────────────────────────────────

    async def submit(self, findings: Mapping[str, Sequence[Finding]],
                     now: float | None = None) -> list[dict[str, Any]]:
        """Plan the reclaim requests of one evaluation's findings (rule name → findings).

        A resource that already has a plan (or had one within ``cooldown_s``) is left alone,
        so the same idle resource reported at every evaluation is planned once. Returns the
        records handed to the sink.
        """
        at = self._clock() if now is None else now
        paused = await self._ledger.paused() is not None
        for rule_name, found in findings.items():
            for finding in found:
                if finding.reclaim is not None:
                    await self._plan(rule_name, finding.reclaim, at, paused)
        return await self.flush()

    async def _plan(self, rule_name: str, request: ReclaimRequest, now: float,
                    paused: bool) -> None:
        if await self._ledger.holder(rule_name, request.resource_id) is not None:
            return
        keep = await self._ledger.kept(request.resource_id, now)
        why = refusal(request, self._rule(rule_name), paused=paused, keep=keep, now=now)
        if why is not None:
            log.debug("not planning %s for %s: %s", request.resource_id, rule_name, why)
            return
        target, problem = await self._identify(request)
        hourly = hourly_cost(self._prices, request.resource_type, request.tags)
        plan = make_plan(request, rule_name, target, hourly, self._prices.currency, now)
        if problem is not None:
            await self._ledger.close_unplanned(plan, unplanned(plan, problem).to_dict(),
                                               self._cooldown_s)
            return
        estimate = saving(plan, plan.execute_at, self._timezone)
        if not await self._ledger.open(plan, planned(plan, estimate).to_dict()):
            return
        await self._warn(Tracked(plan, "planned"), now)

    async def _identify(self, request: ReclaimRequest) -> tuple[dict[str, str], Outcome | None]:
        connector = self._connectors.get(request.connector)
        if connector is None:
            return {}, Outcome("failed", f"connector {request.connector} is not available "
                               "in this worker")
        try:
            return await connector.identify(request), None
        except NotReclaimable as exc:
            return {}, Outcome(exc.step, exc.reason)
        except Exception as exc:  # noqa: BLE001 - any failure to look up closes the plan
            return {}, Outcome("failed", f"cannot identify the target: {error_text(exc)}")

    async def _warn(self, tracked: Tracked, now: float) -> None:
        record = warned(tracked.plan, now).to_dict()
        if self._warn_hook is not None:
            try:
                await self._warn_hook(tracked.plan, record)
            except Exception as exc:  # noqa: BLE001 - retried on the next tick
                log.warning("could not warn about %s: %s", tracked.plan.resource_id,
                            error_text(exc))
                return
        await self._ledger.advance(tracked.plan.plan_id, "planned", "warned", record, now)

    # ── the tick ──────────────────────────────────────────────────────────────────────────

    async def tick(self, now: float | None = None) -> list[dict[str, Any]]:
        """Advance every open plan: warn, re-verify, cap, release. Returns the records
        handed to the sink."""
        at = self._clock() if now is None else now
        handed = await self.flush()
        paused = await self._ledger.paused() is not None
        plans = await self._ledger.plans()
        for tracked in plans:
            await self._follow_up(tracked, at)
        due = sorted((t for t in plans if t.state == "warned" and at >= t.due_at),
                     key=lambda t: (t.plan.rule, t.due_at, t.plan.plan_id))
        for rule_name, group in groupby(due, key=lambda t: t.plan.rule):
            await self._settle(rule_name, list(group), at, paused)
        return handed + await self.flush()

    async def _follow_up(self, tracked: Tracked, now: float) -> None:
        """Warnings that could not be sent, and releases whose worker never reported back."""
        if tracked.state == "planned" and now - tracked.plan.planned_at >= WARN_RETRY_S:
            await self._warn(tracked, now)
        elif tracked.state == "executing" and (
                tracked.claimed_at or now) + self._claim_timeout_s <= now:
            await self._ledger.close(tracked.plan.plan_id, "executing",
                                     unknown_outcome(tracked, now).to_dict(), self._cooldown_s)

    async def _settle(self, rule_name: str, due: list[Tracked], now: float,
                      paused: bool) -> None:
        """Re-verify one rule's due plans, then release the ones still idle."""
        rule = self._rule(rule_name)
        samples, matched = await self._fresh_samples(rule, due, now)
        ready: list[Tracked] = []
        for tracked in due:
            plan = tracked.plan
            keep = await self._ledger.kept(plan.resource_id, now)
            found = verdict(tracked, rule, samples.get(plan.resource_id), now, paused=paused,
                            keep=keep)
            if isinstance(found, Skip):
                await self._close(tracked, "skipped", found.reason, now)
            elif isinstance(found, Go):
                ready.append(tracked)
            elif isinstance(found, Hold):
                log.debug("%s held: %s", plan.resource_id, found.reason)
        if rule is None or not ready:
            return
        live = [t for t in ready if effective_mode(t.plan, rule) == "live"]
        for tracked in ready:
            if tracked not in live:
                await self._dry_run(tracked, now)
        if live:
            await self._release_all(rule, live, matched, now)

    async def _no_longer(self, tracked: Tracked, now: float) -> str | None:
        """Why a plan its round found ready is not released after all, read again at ``now``."""
        rule = self._rule(tracked.plan.rule)
        samples, _ = await self._fresh_samples(rule, [tracked], now)
        paused = await self._ledger.paused() is not None
        keep = await self._ledger.kept(tracked.plan.resource_id, now)
        found = verdict(tracked, rule, samples.get(tracked.plan.resource_id), now,
                        paused=paused, keep=keep)
        return found.reason if isinstance(found, Skip) else None

    async def _fresh_samples(self, rule: IdleRule | None, due: Sequence[Tracked], now: float
                             ) -> tuple[dict[str, ResourceSamples], int]:
        """Each resource's samples since the earliest plan needs them, and how many
        resources the rule evaluates now (matched, not exempt, reporting in its window)."""
        if rule is None:
            return {}, 0
        since = min(min(samples_since(t.plan, rule, now) for t in due), now - rule.for_ -
                    rule.max_gap)
        found = await asyncio.to_thread(self._state.samples, rule.metric, rule.match, since)
        window = now - rule.for_ - rule.max_gap
        matched = sum(1 for r in found if not rule.is_exempt(r.tags)
                      and any(window <= ts <= now for ts, _ in r.points))
        return {r.resource_id: r for r in found}, matched

    async def _dry_run(self, tracked: Tracked, now: float) -> None:
        plan = tracked.plan
        connector = self._connectors.get(plan.connector)
        action = connector.describe(plan) if connector else f"release {plan.resource_id}"
        record = dry_run_record(plan, action, now, saving(plan, now, self._timezone))
        await self._ledger.close(plan.plan_id, "warned", record.to_dict(), self._cooldown_s)

    async def _release_all(self, rule: IdleRule, live: list[Tracked], matched: int,
                           now: float) -> None:
        """Caps first: if this evaluation's releases break one, none of them happens."""
        assert rule.reclaim is not None
        safety = Safety.of(rule.reclaim.params)
        await act_round(self._ledger, rule.name, live, now, safety.max_per_hour,
                        lambda done: cap_breach(safety, len(live), matched, done),
                        lambda t, why: self._close(t, "failed", why, now, {"aborted": True}),
                        lambda t: self._release(t, now), log)

    async def _release(self, tracked: Tracked, now: float) -> None:
        plan = tracked.plan
        later = self._clock()
        if later - now >= RECHECK_AFTER_S:
            why = await self._no_longer(tracked, later)
            if why is not None:
                await self._close(tracked, "skipped", why, later)
                return
            now = later
        claim = await self._ledger.claim(plan.plan_id, self.worker, now)
        if claim != "claimed":
            log.debug("not releasing %s: %s", plan.resource_id, claim)
            return
        outcome = await self._run_connector(plan)
        detail = dict(outcome.detail)
        if tracked.approved_by:
            detail["approved_by"] = tracked.approved_by
        outcome = Outcome(outcome.step, outcome.reason, detail)
        record = outcome_record(plan, outcome, now, saving(plan, now, self._timezone))
        if not await self._ledger.close(plan.plan_id, "executing", record.to_dict(),
                                        self._cooldown_s):
            await self._late(record.to_dict())
            return
        log.info("%s %s: %s", outcome.step, plan.resource_id, outcome.reason)

    async def _late(self, record: dict[str, Any]) -> None:
        """A release that outlasted its claim: the plan was closed meanwhile as outcome
        unknown (``claim_timeout_s``), and the ledger takes no other outcome for it. What did
        happen still goes to the audit log, straight to the sink."""
        record = {**record, "action_id": f"{record['action_id']}:late",
                  "reason": f"{record['reason']} (after the plan was closed as outcome unknown: "
                            "the release outlasted the claim timeout)"}
        log.error("%s %s late: %s", record["step"], record["resource_id"], record["reason"])
        try:
            await self._sink(record)
        except Exception as exc:  # noqa: BLE001 - said in the log above, which is all there is
            log.error("the audit log refused it: %s", error_text(exc))

    async def _run_connector(self, plan: Plan) -> Outcome:
        connector = self._connectors.get(plan.connector)
        if connector is None:
            return Outcome("failed", f"connector {plan.connector} is not available")
        try:
            return await connector.release(plan)
        except NotReclaimable as exc:
            return Outcome(exc.step, exc.reason)
        except Exception as exc:  # noqa: BLE001 - reported as the plan's failure
            return Outcome("failed", error_text(exc))

    async def _close(self, tracked: Tracked, step: Step, reason: str, now: float,
                     detail: Mapping[str, Any] | None = None) -> None:
        record = ActionRecord(tracked.plan, step, reason, now, detail=dict(detail or {}))
        await self._ledger.close(tracked.plan.plan_id, tracked.state, record.to_dict(),
                                 self._cooldown_s)

    # ── people ────────────────────────────────────────────────────────────────────────────

    async def keep(self, resource_id: str, by: str, seconds: float,
                   now: float | None = None) -> str:
        """Keep wins: no release of the resource, by any rule, for ``seconds``."""
        at = self._clock() if now is None else now
        until = at + seconds
        await self._ledger.keep(resource_id, Keep(by, until))
        reason = f"kept by {by} until {rfc3339(until)}"
        late = False
        for tracked in await self._ledger.plans():
            if tracked.plan.resource_id != resource_id:
                continue
            if tracked.state == "executing":
                late = True
                continue
            record = ActionRecord(tracked.plan, "skipped", reason, at)
            await self._ledger.close(tracked.plan.plan_id, tracked.state, record.to_dict(), 0)
        await self.flush()
        if late:
            return f"until {_when(until)}; a release already under way could not be stopped"
        return f"until {_when(until)}"

    async def approve(self, rule: str, resource_id: str, by: str,
                      now: float | None = None) -> str:
        """Approve the planned release of a resource (rules with ``approval: manual``)."""
        at = self._clock() if now is None else now
        holder = await self._ledger.holder(rule, resource_id)
        tracked = await self._ledger.get(holder) if holder else None
        if tracked is None or not await self._ledger.approve(tracked.plan.plan_id, by):
            raise LookupError(f"no planned release of {resource_id} for rule {rule}")
        due = due_time(tracked, self._rule(rule))
        return f"released at {_when(due)}" if due > at else "released shortly"

    async def pause(self, by: str, reason: str = "") -> None:
        await self._ledger.pause(Pause(by, self._clock(), reason))

    async def resume(self) -> bool:
        return await self._ledger.resume()

    # ── records ───────────────────────────────────────────────────────────────────────────

    async def flush(self) -> list[dict[str, Any]]:
        """Hand the outbox to the sink, oldest first; stop at the first refusal."""
        return await flush_outbox(self._ledger, self._sink, log)


def build_reclaimer(settings: Settings, rules: RuleSource, sink: Sink,
                    **options: Any) -> Reclaimer:
    """The worker's reclaimer: samples from ``RedisState``, the ledger in the same Redis."""
    from costline.connectors.redis_client import connect, connect_async
    from costline.connectors.redis_state import RedisState

    # The clients' timeouts: a Redis that takes connections but never answers fails a tick,
    # which is retried, instead of hanging the reclaimer.
    state = RedisState(connect(settings.redis_url), settings.namespace, settings.timezone)
    ledger = RedisReclaimLedger(connect_async(settings.redis_url), settings.namespace)
    return Reclaimer(rules=rules, state=state, ledger=ledger,
                     prices=PriceBook.load(settings.prices), sink=sink,
                     timezone=settings.timezone, **options)


class ReclaimActions:
    """The Keep and Approve buttons, as ``costline.connectors.slack_actions.AlertActions``.

    Snooze belongs to the alert silences: pass their implementation as ``snoozing``.
    """

    def __init__(self, reclaimer: Reclaimer, snoozing: AlertActions | None = None) -> None:
        self._reclaimer = reclaimer
        self._snoozing = snoozing

    async def snooze(self, request: ActionRequest, duration: timedelta) -> str | None:
        if self._snoozing is None:
            raise NotImplementedError("snoozing is not handled by reclamation")
        return await self._snoozing.snooze(request, duration)

    async def keep(self, request: ActionRequest, duration: timedelta) -> str | None:
        if not request.resource_id:
            raise LookupError("keep needs a resource")
        return await self._reclaimer.keep(request.resource_id, request.user_name,
                                          duration.total_seconds())

    async def approve(self, request: ActionRequest) -> str | None:
        if not request.resource_id:
            raise LookupError("approve needs a resource")
        return await self._reclaimer.approve(request.rule, request.resource_id,
                                             request.user_name)


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")

