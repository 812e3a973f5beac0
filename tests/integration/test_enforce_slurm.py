"""Budget enforcement against a real single-node Slurm with slurmdbd and enforced accounting.

Each test makes a Slurm account of its own (root's association in it), writes the account's
spend into Redis through the aggregation's own ``BatchWriter``, evaluates a budget rule over
``RedisState``, and runs the enforcer with the real Slurm connector and the Redis ledger. Jobs
are real ``sleep`` jobs: one running before the budget is crossed, and pending ones
(``--begin`` a few seconds ahead, so they are pending when the hold comes).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from costline.connectors.enforce import build_enforcers
from costline.connectors.enforce_ledger import redis_enforce_ledger
from costline.connectors.plugins import PLUGINS
from costline.connectors.redis_apply import Applied, BatchWriter
from costline.connectors.redis_client import connect, connect_async
from costline.connectors.redis_keys import Calendar, slot_tag
from costline.connectors.redis_state import RedisState
from costline.connectors.slack_actions import (
    ApproverPolicy,
    MemoryReplayGuard,
    add_actions_route,
    make_actions_handler,
)
from costline.connectors.slack_render import render_alert
from costline.rules.durations import period_bounds
from costline.rules.events import UsageEvent
from costline.rules.ledger import Intake
from costline.rules.loader import RuleSet, load_rule_text
from costline.rules.prices import PriceBook
from costline.rules.tally import tally_of
from costline.streams.settings import DEFAULT_PRICES
from costline.streams.worker.enforce_alerts import enforcement_alert
from costline.streams.worker.enforcer import EnforceActions, Enforcer
from tests.integration.slurm import (
    SlurmCluster,
    reclaim_redis_url,
    sacctmgr,
    slurm,
    slurm_account,
    slurm_accounting,
    slurm_up,
)

__all__ = ["reclaim_redis_url", "slurm", "slurm_account", "slurm_accounting", "slurm_up"]

RULES = """
rules:
  - name: team-budget
    kind: budget
    match: {site: enforce-test}
    group_by: [team]
    period: day
    limit: %(limit)s
    enforce: {connector: slurm, account_tag: team, grace: 1s%(params)s}
    mode: %(mode)s
"""
SECRET = "enforce-test-signing-secret"


def ruleset(params: str = "", limit: int = 100, mode: str = "live") -> RuleSet:
    return load_rule_text(RULES % {"params": params, "limit": limit, "mode": mode},
                          plugins=PLUGINS)


@dataclass
class Site:
    """One namespace: spend in Redis, the ledger, and the published steps."""

    redis_url: str
    namespace: str
    writer: BatchWriter
    state: RedisState
    published: list[dict[str, Any]] = field(default_factory=list)
    watermark: int = -1

    async def spend(self, account: str, gpu_hours: float, ts: float) -> None:
        """Usage of ``gpu_hours`` H100 hours by the team ``account`` ($2.49 each)."""
        event = UsageEvent(event_id=f"u-{account}-{self.watermark + 1}", kind="usage", ts=ts,
                           resource_id="hpc/pool", resource_type="gpu.h100",
                           quantity=gpu_hours, unit="gpu_hour",
                           tags={"team": account, "site": "enforce-test"})
        tally = tally_of(Intake(PriceBook.load(DEFAULT_PRICES), 1).records([event]).values())
        slot = slot_tag(self.namespace, 0)
        await self.writer.register_slots([slot])
        applied = await self.writer.apply(slot, self.watermark, self.watermark + 1, tally)
        assert applied == Applied()
        self.watermark += 1

    def enforcer(self, rules: RuleSet | Any) -> Enforcer:
        async def sink(record: dict[str, Any]) -> None:
            self.published.append(record)

        return Enforcer(rules=rules, ledger=redis_enforce_ledger(
            connect_async(self.redis_url), self.namespace), sink=sink,
            connectors=build_enforcers())

    async def evaluate(self, enforcer: Enforcer, rules: RuleSet, now: float) -> None:
        findings = {rule.name: rule.evaluate(self.state, now) for rule in rules}
        await enforcer.submit(findings, now)

    def steps(self) -> list[str]:
        return [record["step"] for record in self.published]


@pytest.fixture
async def site(reclaim_redis_url: str, namespace: str) -> AsyncIterator[Site]:
    client = connect_async(reclaim_redis_url)
    writer = BatchWriter(client, namespace, Calendar("UTC"), dedup_ttl=3600)
    yield Site(reclaim_redis_url, namespace, writer,
               RedisState(connect(reclaim_redis_url), namespace, "UTC"))
    keys = [key async for key in client.scan_iter(match=f"*{namespace}*", count=1000)]
    if keys:
        await client.delete(*keys)
    await client.aclose()


def running(slurm: SlurmCluster, account: str) -> str:
    [job] = [slurm.submit("before", 600, f"--account={account}")]
    slurm.wait_running(job)
    return job


def pending(slurm: SlurmCluster, account: str, name: str = "queued", begin_s: int = 4) -> str:
    return slurm.submit(name, 600, f"--account={account}", f"--begin=now+{begin_s}")


async def eventually(check: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if await asyncio.to_thread(check):
            return
        if time.monotonic() > deadline:
            raise AssertionError("not within the time")
        await asyncio.sleep(0.5)


async def crossed(site: Site, enforcer: Enforcer, rules: RuleSet, account: str) -> float:
    """Spend past the budget line, evaluated and planned; returns when it was."""
    now = time.time()
    await site.spend(account, 50, now - 60)  # 124.50 USD of a 100 USD budget
    await site.evaluate(enforcer, rules, now)
    assert site.steps()[-2:] == ["planned", "warned"], site.published
    return now


async def test_hold_pending_holds_queued_and_new_jobs_and_rollover_releases_them(
        site: Site, slurm: SlurmCluster, slurm_account: str) -> None:
    account = slurm_account
    before = await asyncio.to_thread(running, slurm, account)
    queued = pending(slurm, account)
    rules = ruleset(", action: hold_pending")
    enforcer = site.enforcer(rules)
    t0 = await crossed(site, enforcer, rules, account)
    await site.evaluate(enforcer, rules, t0 + 1)  # the re-check after the grace
    await enforcer.tick(t0 + 1)
    assert site.published[-1]["step"] == "executed", site.published[-1]
    assert slurm.reason(queued) == "PENDING JobHeldAdmin"
    late = pending(slurm, account, "late")  # submitted while enforced: held on the next sweep
    await enforcer.tick(t0 + 2)
    assert site.published[-1]["reason"].startswith("sweep: held 1 pending job(s)")
    await asyncio.sleep(5)  # both begin times have passed: only the hold keeps them
    assert [slurm.reason(j) for j in (queued, late)] == ["PENDING JobHeldAdmin"] * 2
    assert slurm.state(before) == "RUNNING"

    tomorrow = period_bounds(t0, "day", "UTC")[1] + 1
    await enforcer.tick(tomorrow)
    lifted = site.published[-1]
    assert lifted["step"] == "lifted" and "the budget period ended" in lifted["reason"]
    assert "released 2 job(s)" in lifted["reason"]
    await eventually(lambda: {slurm.state(j) for j in (queued, late)} == {"RUNNING"})


async def test_limit_keeps_new_jobs_pending_and_a_raised_line_restores_it_exactly(
        site: Site, slurm: SlurmCluster, slurm_account: str) -> None:
    account = slurm_account
    sacctmgr("modify", "account", "where", f"name={account}", "set", "GrpTRES=mem=90000")
    before = await asyncio.to_thread(running, slurm, account)
    rules = {"now": ruleset(", action: limit, grp_tres: {cpu: 0}, max_submit_jobs: 20")}
    enforcer = site.enforcer(lambda: rules["now"])
    t0 = await crossed(site, enforcer, rules["now"], account)
    await site.evaluate(enforcer, rules["now"], t0 + 1)
    await enforcer.tick(t0 + 1)
    executed = site.published[-1]
    assert executed["step"] == "executed", executed
    assert "(was GrpTRES=mem=90000M MaxSubmitJobs=(none))" in executed["reason"]
    shown = sacctmgr("show", "assoc", "where", f"account={account}", "user=",
                     "format=GrpTRES,MaxSubmit")
    assert shown.split()[0] in ("cpu=0,mem=90000M|20", "mem=90000M,cpu=0|20")
    after = slurm.submit("after", 600, f"--account={account}")
    await eventually(lambda: slurm.reason(after).startswith("PENDING AssocGrp"))
    assert slurm.state(before) == "RUNNING"

    rules["now"] = ruleset(", action: limit, grp_tres: {cpu: 0}, max_submit_jobs: 20",
                           limit=200)
    await site.evaluate(enforcer, rules["now"], t0 + 2)
    await enforcer.tick(t0 + 2)
    lifted = site.published[-1]
    assert lifted["step"] == "lifted" and "raised from $100.00 to $200.00" in lifted[
        "reason"]
    shown = sacctmgr("show", "assoc", "where", f"account={account}", "user=",
                     "format=GrpTRES,MaxSubmit")
    assert shown.split()[0] == "mem=90000M|"
    await eventually(lambda: slurm.state(after) == "RUNNING")


async def test_qos_moves_the_association_and_the_lift_moves_it_back(
        site: Site, slurm: SlurmCluster, slurm_account: str) -> None:
    account, qos = slurm_account, f"{slurm_account}-held"
    sacctmgr("add", "qos", qos, "set", "GrpTRES=cpu=0")
    try:
        rules = ruleset(f", action: qos, qos: {qos}")
        enforcer = site.enforcer(rules)
        t0 = await crossed(site, enforcer, rules, account)
        await site.evaluate(enforcer, rules, t0 + 1)
        await enforcer.tick(t0 + 1)
        assert site.published[-1]["step"] == "executed", site.published[-1]
        after = slurm.submit("after", 600, f"--account={account}")
        await eventually(lambda: slurm.reason(after).startswith("PENDING QOS"))
        await enforcer.tick(period_bounds(t0, "day", "UTC")[1] + 1)
        assert site.published[-1]["step"] == "lifted", site.published[-1]
        shown = sacctmgr("show", "assoc", "where", f"account={account}", "user=",
                         "format=QOS,DefaultQOS")
        assert shown.split()[0] == "normal|"
        await eventually(lambda: slurm.state(after) == "RUNNING")
    finally:
        slurm.cancel_all()
        sacctmgr("delete", "qos", qos)


async def press(enforcer: Enforcer, action_id: str, value: str) -> None:
    """Press a button as Slack does: a signed form POST to /slack/actions."""
    handler = make_actions_handler(
        signing_secret=SECRET, actions=EnforceActions(enforcer, None),
        approvers=ApproverPolicy(by_rule={"team-budget": frozenset({"U042"})}),
        replay_guard=MemoryReplayGuard())
    app = web.Application()
    add_actions_route(app, handler)
    payload = {"type": "block_actions", "user": {"id": "U042", "username": "ada"},
               "actions": [{"action_id": action_id, "type": "button", "value": value}]}
    body = urlencode({"payload": json.dumps(payload)})
    stamp = str(int(time.time()))
    signature = "v0=" + hmac.new(SECRET.encode(), f"v0:{stamp}:{body}".encode(),
                                 hashlib.sha256).hexdigest()
    async with TestClient(TestServer(app)) as client:
        answer = await client.post("/slack/actions", data=body, headers={
            "X-Slack-Request-Timestamp": stamp, "X-Slack-Signature": signature,
            "Content-Type": "application/x-www-form-urlencoded"})
        assert answer.status == 200, await answer.text()
        await handler.drain()


def button(record: dict[str, Any], label: str, approval: str = "auto") -> tuple[str, str]:
    """The action id and value of a button on the Slack message of an enforcement step."""
    change = enforcement_alert(record, approval=approval)
    assert change is not None
    found = [e for b in render_alert(change).blocks if b["type"] == "actions"
             for e in b["elements"] if e["text"]["text"] == label]
    return found[0]["action_id"], found[0]["value"]


async def test_approval_waits_for_the_approve_button_and_the_lift_button_lifts(
        site: Site, slurm: SlurmCluster, slurm_account: str) -> None:
    account = slurm_account
    rules = ruleset(", action: limit, grp_tres: {cpu: 0}, approval: manual")
    enforcer = site.enforcer(rules)
    t0 = await crossed(site, enforcer, rules, account)
    await enforcer.tick(t0 + 5)
    assert site.steps()[-1] == "warned", "enforced without approval"
    await press(enforcer, *button(site.published[-1], "Approve", approval="manual"))
    await site.evaluate(enforcer, rules, t0 + 6)
    await enforcer.tick(t0 + 6)
    executed = site.published[-1]
    assert executed["step"] == "executed" and executed["approved_by"] == "ada", executed
    job = slurm.submit("after", 600, f"--account={account}")
    await eventually(lambda: slurm.reason(job).startswith("PENDING AssocGrp"))

    await press(enforcer, *button(executed, "Lift"))
    lifted = site.published[-1]
    assert lifted["step"] == "lifted" and "lifted by ada" in lifted["reason"]
    await eventually(lambda: slurm.state(job) == "RUNNING")
    await site.evaluate(enforcer, rules, time.time())  # still over: not enforced again today
    assert site.steps()[-1] == "lifted"


async def test_a_dry_run_plans_and_warns_and_touches_nothing(
        site: Site, slurm: SlurmCluster, slurm_account: str) -> None:
    account = slurm_account
    rules = ruleset(", action: limit, grp_tres: {cpu: 0}", mode="dry_run")
    enforcer = site.enforcer(rules)
    t0 = await crossed(site, enforcer, rules, account)
    await site.evaluate(enforcer, rules, t0 + 1)
    await enforcer.tick(t0 + 1)
    record = site.published[-1]
    assert (record["step"], record["mode"]) == ("skipped", "dry_run")
    assert record["reason"] == (f"dry run: would set GrpTRES=cpu=0 on Slurm account "
                                f"{account}; nothing was touched")
    shown = sacctmgr("show", "assoc", "where", f"account={account}", "user=", "format=GrpTRES")
    assert shown.strip() == ""
    job = slurm.submit("free", 600, f"--account={account}")
    await eventually(lambda: slurm.state(job) == "RUNNING")
