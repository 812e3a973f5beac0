"""Reclamation against a real single-node Slurm, samples in Redis as the aggregation writes them.

Each test submits ``sleep 600`` jobs, reports their GPU utilization under the resource id
``slurm/<job id>`` through the aggregation's own ``BatchWriter``, reads it back with
``RedisState``, and runs the reclaimer with the real Slurm connector and the Redis ledger.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from redis.asyncio import Redis as AsyncRedis

from costline.connectors.plugins import PLUGINS
from costline.connectors.reclaim import build_connectors
from costline.connectors.reclaim.slurm import Completed, SlurmReclaimer, run_command
from costline.connectors.reclaim_ledger import RedisReclaimLedger
from costline.connectors.redis_apply import Applied, BatchWriter
from costline.connectors.redis_client import connect, connect_async
from costline.connectors.redis_keys import Calendar, slot_tag
from costline.connectors.redis_state import RedisState
from costline.rules.events import UtilizationEvent
from costline.rules.ledger import Intake
from costline.rules.loader import RuleSet, load_rule_text
from costline.rules.prices import PriceBook
from costline.rules.tally import tally_of
from costline.streams.settings import DEFAULT_PRICES
from costline.streams.worker.reclaimer import Reclaimer
from tests.integration.slurm import SlurmCluster, reclaim_redis_url, slurm, slurm_up

__all__ = ["reclaim_redis_url", "slurm", "slurm_up"]

RULES = """
rules:
  - name: slurm-idle
    kind: idle
    match: {resource_type: gpu.h100}
    metric: gpu_util
    below: 0.05
    for: 1m
    max_gap: 30s
    exempt: {keep_alive: "true"}
    reclaim: {connector: slurm, grace: %(grace)s, action: %(action)s%(extra)s}
    mode: %(mode)s
"""
STEP_S = 10.0


def ruleset(grace: str = "3s", action: str = "cancel", extra: str = "",
            mode: str = "live") -> RuleSet:
    return load_rule_text(RULES % {"grace": grace, "action": action, "extra": extra,
                                   "mode": mode}, plugins=PLUGINS)


@dataclass
class Feed:
    """Writes utilization samples into Redis the way the aggregation does."""

    writer: BatchWriter
    intake: Intake
    slot: str
    watermark: int = -1
    count: int = 0

    async def report(self, job_id: str, start: float, end: float, value: float,
                     **tags: str) -> None:
        events = []
        t = start
        while t <= end + 1e-6:
            self.count += 1
            events.append(UtilizationEvent(
                event_id=f"m-{job_id}-{self.count}", kind="utilization", ts=t,
                resource_id=f"slurm/{job_id}", resource_type="gpu.h100", metric="gpu_util",
                value=value, tags={"team": "pretrain", **tags}))
            t += STEP_S
        tally = tally_of(self.intake.records(events).values())
        await self.writer.register_slots([self.slot])
        assert await self.writer.apply(self.slot, self.watermark, self.watermark + 1,
                                       tally) == Applied()
        self.watermark += 1


@dataclass
class Site:
    """One namespace: the samples, the state view, the ledger, and the published steps."""

    redis_url: str
    namespace: str
    async_redis: AsyncRedis
    feed: Feed
    state: RedisState
    published: list[dict[str, Any]] = field(default_factory=list)

    def reclaimer(self, rules: RuleSet, **options: Any) -> Reclaimer:
        async def sink(record: dict[str, Any]) -> None:
            self.published.append(record)

        options.setdefault("connectors", build_connectors())
        return Reclaimer(rules=rules, state=self.state,
                         ledger=RedisReclaimLedger(connect_async(self.redis_url),
                                                   self.namespace),
                         prices=PriceBook.load(DEFAULT_PRICES), sink=sink, **options)

    def findings(self, rules: RuleSet, now: float) -> dict[str, Any]:
        return {rule.name: rule.evaluate(self.state, now) for rule in rules}

    def steps(self) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for record in self.published:
            found.setdefault(record["resource_id"], []).append(record["step"])
        return found

    def final(self, job_id: str) -> dict[str, Any]:
        return [r for r in self.published if r["resource_id"] == f"slurm/{job_id}"][-1]


@pytest.fixture
async def site(reclaim_redis_url: str, namespace: str) -> AsyncIterator[Site]:
    client = connect_async(reclaim_redis_url)
    writer = BatchWriter(client, namespace, Calendar("UTC"), dedup_ttl=3600)
    feed = Feed(writer, Intake(PriceBook.load(DEFAULT_PRICES), 1), slot_tag(namespace, 0))
    state = RedisState(connect(reclaim_redis_url), namespace, "UTC")
    yield Site(reclaim_redis_url, namespace, client, feed, state)
    keys = [key async for key in client.scan_iter(match=f"*{namespace}*", count=1000)]
    if keys:
        await client.delete(*keys)
    await client.aclose()


async def start_jobs(slurm: SlurmCluster, *names: str) -> list[str]:
    jobs = [slurm.submit(name) for name in names]
    await asyncio.to_thread(slurm.wait_running, *jobs)
    return jobs


async def report_idle(site: Site, jobs: Sequence[str], start: float, end: float,
                      value: float = 0.01, **tags: str) -> None:
    for job in jobs:
        await site.feed.report(job, start, end, value, **tags)


async def test_an_idle_job_is_cancelled_after_the_grace_a_busy_or_exempt_one_is_not(
        site: Site, slurm: SlurmCluster) -> None:
    idle, woke, busy, exempt = await start_jobs(slurm, "idle", "woke", "busy", "exempt")
    rules = ruleset(grace="3s")
    reclaimer = site.reclaimer(rules)
    t0 = time.time()
    await report_idle(site, [idle, woke], t0 - 90, t0)
    await site.feed.report(busy, t0 - 90, t0, 0.92)
    await site.feed.report(exempt, t0 - 90, t0, 0.01, keep_alive="true")

    await reclaimer.submit(site.findings(rules, t0), t0)
    assert site.steps() == {f"slurm/{idle}": ["planned", "warned"],
                            f"slurm/{woke}": ["planned", "warned"]}
    await reclaimer.tick(time.time())
    assert slurm.state(idle) == "RUNNING", "released before its grace ended"

    await asyncio.sleep(max(0.0, t0 + 3 - time.time()))
    now = time.time()
    await site.feed.report(idle, now - 1, now, 0.01)
    await site.feed.report(woke, now - 1, now, 0.85)
    await site.feed.report(busy, now - 1, now, 0.9)
    await site.feed.report(exempt, now - 1, now, 0.01, keep_alive="true")
    await reclaimer.tick(now)

    executed = site.final(idle)
    assert executed["step"] == "executed", executed
    assert executed["reason"].startswith(f"cancelled Slurm job {idle} (idle, root)")
    assert executed["target"]["job_id"] == idle and float(executed["saved"]) > 0
    assert site.final(woke)["step"] == "skipped"
    assert site.final(woke)["reason"].startswith("busy again: gpu_util 0.85")
    assert slurm.state(idle) in ("CANCELLED", "COMPLETING")
    assert [slurm.state(j) for j in (woke, busy, exempt)] == ["RUNNING"] * 3


async def test_a_dry_run_rule_touches_nothing(site: Site, slurm: SlurmCluster) -> None:
    [job] = await start_jobs(slurm, "dry")
    rules = ruleset(grace="2s", mode="dry_run")
    reclaimer = site.reclaimer(rules)
    t0 = time.time()
    await report_idle(site, [job], t0 - 90, t0 + 2)
    await reclaimer.submit(site.findings(rules, t0), t0)
    await reclaimer.tick(t0 + 2)
    record = site.final(job)
    assert (record["step"], record["mode"]) == ("skipped", "dry_run")
    assert record["reason"] == f"dry run: would cancel Slurm job {job}; nothing was touched"
    assert slurm.state(job) == "RUNNING"


@pytest.mark.parametrize(("extra", "reason"), [
    (", max_percent: 50", "aborted: 4 releases would make 4 in the last hour of the 4 "
                          "resources the rule matches (100%), over max_percent 50"),
    (", max_per_hour: 3", "aborted: 4 releases would make 4 in the last hour, over "
                          "max_per_hour 3"),
], ids=["max_percent", "max_per_hour"])
async def test_a_cap_stops_a_mass_release(site: Site, slurm: SlurmCluster, extra: str,
                                          reason: str) -> None:
    jobs = await start_jobs(slurm, "mass-1", "mass-2", "mass-3", "mass-4")
    rules = ruleset(grace="2s", extra=extra)
    reclaimer = site.reclaimer(rules)
    t0 = time.time()
    await report_idle(site, jobs, t0 - 90, t0 + 2)
    await reclaimer.submit(site.findings(rules, t0), t0)
    await reclaimer.tick(t0 + 2)
    finals = [site.final(job) for job in jobs]
    assert {(r["step"], r["reason"]) for r in finals} == {("failed", reason)}
    assert [slurm.state(job) for job in jobs] == ["RUNNING"] * 4


async def test_a_reused_job_id_is_never_hit(site: Site, slurm: SlurmCluster) -> None:
    [job] = await start_jobs(slurm, "reused")
    rules = ruleset(grace="2s")
    reclaimer = site.reclaimer(rules)
    t0 = time.time()
    await report_idle(site, [job], t0 - 90, t0 + 2)
    await reclaimer.submit(site.findings(rules, t0), t0)
    # The job the plan recorded started at another time: the id now names another job.
    [tracked] = await reclaimer.ledger.plans()
    plan = tracked.plan.to_dict()
    plan["target"]["start_time"] = "2020-01-01T00:00:00"
    key = f"{{{site.namespace}:reclaim}}:plan:{tracked.plan.plan_id}"
    await site.async_redis.hset(key, "data", json.dumps(plan))

    await reclaimer.tick(t0 + 2)
    record = site.final(job)
    assert record["step"] == "skipped"
    assert record["reason"].startswith(f"Slurm job id {job} no longer names the job planned "
                                       "(start_time was '2020-01-01T00:00:00'")
    assert slurm.state(job) == "RUNNING"


async def test_two_reclaimers_racing_cancel_once(site: Site, slurm: SlurmCluster) -> None:
    [job] = await start_jobs(slurm, "raced")
    rules = ruleset(grace="2s")
    cancels: list[Sequence[str]] = []

    async def counting(argv: Sequence[str]) -> Completed:
        if argv[0] == "scancel":
            cancels.append(argv)
        return await run_command(argv)

    first, second = (site.reclaimer(rules, worker=name,
                                    connectors={"slurm": SlurmReclaimer(run=counting)})
                     for name in ("worker-a", "worker-b"))
    t0 = time.time()
    await report_idle(site, [job], t0 - 90, t0 + 2)
    findings = site.findings(rules, t0)
    await asyncio.gather(first.submit(findings, t0), second.submit(findings, t0))
    await asyncio.gather(first.tick(t0 + 2), second.tick(t0 + 2))

    history = await first.ledger.history()
    assert sorted(r["step"] for r in history) == ["executed", "planned", "warned"]
    assert len(cancels) == 1
    assert slurm.state(job) in ("CANCELLED", "COMPLETING")


async def test_requeue_puts_the_job_back_in_the_queue(site: Site, slurm: SlurmCluster) -> None:
    [job] = await start_jobs(slurm, "requeued")
    rules = ruleset(grace="2s", action="requeue")
    reclaimer = site.reclaimer(rules)
    t0 = time.time()
    await report_idle(site, [job], t0 - 90, t0 + 2)
    await reclaimer.submit(site.findings(rules, t0), t0)
    await reclaimer.tick(t0 + 2)
    record = site.final(job)
    assert (record["step"], record["reason"]) == (
        "executed", f"requeued Slurm job {job} (requeued, root)")
    assert slurm.state(job) in ("PENDING", "REQUEUED", "RUNNING", "COMPLETING")
