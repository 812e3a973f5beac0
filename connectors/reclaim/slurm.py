"""Slurm: cancel, requeue or hold the job behind an idle resource, never a reused job id.

Which job: the resource's ``slurm_job_id`` tag (another tag with ``job_id_tag``), else a
resource id of the form ``slurm/<job id>`` (``slurm/4211``, ``slurm/4211_7`` for an array
task). When the plan is made, ``squeue`` records the job's name, user, submit time and start
time; at release the same four must still match, so a job id that now names another job
(reused, or the job was requeued and restarted meanwhile) is skipped. ``scancel`` is also
given the name and user as filters, so Slurm itself refuses to cancel a different job.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from costline.connectors.reclaim import (
    NotReclaimable,
    ReclaimConnector,
    Sleep,
    real_sleep,
    reclaimer,
)
from costline.rules.findings import ReclaimRequest
from costline.rules.kinds import DimensionKey
from costline.rules.reclaim import Outcome, Plan, target_change
from costline.rules.reclaim_params import ReclaimParams

DEFAULT_JOB_ID_TAG = "slurm_job_id"
JOB_ID = re.compile(r"^\d+(?:_\d+)?$")
RESOURCE_FORM = re.compile(r"^slurm/(\d+(?:_\d+)?)$")
SQUEUE_FORMAT = "%i|%u|%V|%S|%T|%j"
"""Job id, user, submit time, start time, state, and the name last: it may contain ``|``."""
HOLDING_STATES = frozenset({"RUNNING", "SUSPENDED"})
"""States in which a job holds its allocation: the only ones worth releasing."""


class SlurmParams(ReclaimParams):
    """Slurm: cancel, requeue or hold the job running on the idle resource."""

    action: Literal["cancel", "requeue", "hold"] = Field(
        "cancel",
        description="cancel (scancel), requeue (scontrol requeue) or hold (scontrol "
        "requeuehold: release the nodes, keep the job held)",
    )
    job_id_tag: DimensionKey | None = Field(
        None, description=f"tag that holds the Slurm job id (default {DEFAULT_JOB_ID_TAG})"
    )


@dataclass(frozen=True)
class Completed:
    returncode: int
    stdout: str
    stderr: str


Run = Callable[[Sequence[str]], Awaitable[Completed]]


@dataclass(frozen=True)
class Job:
    job_id: str
    user: str
    submit_time: str
    start_time: str
    state: str
    name: str

    def identity(self) -> dict[str, str]:
        """What must not change between plan and release."""
        return {"job_id": self.job_id, "name": self.name, "user": self.user,
                "submit_time": self.submit_time, "start_time": self.start_time}


def job_id_of(resource_id: str, tags: Mapping[str, str], job_id_tag: str | None) -> str:
    """The Slurm job id of a resource: its tag, else its ``slurm/<id>`` resource id."""
    tag = job_id_tag or DEFAULT_JOB_ID_TAG
    value = tags.get(tag, "")
    if JOB_ID.match(value):
        return value
    found = RESOURCE_FORM.match(resource_id)
    if found:
        return found.group(1)
    raise NotReclaimable("failed", f"{resource_id} names no Slurm job: no {tag} tag with a "
                         "job id, and the resource id is not slurm/<job id>")


def parse_job(line: str) -> Job:
    job_id, user, submit, start, state, name = line.split("|", 5)
    return Job(job_id, user, submit, start, state.split()[0] if state else state, name)


async def run_command(argv: Sequence[str], timeout_s: float = 30.0) -> Completed:
    """Run a Slurm client command; a command that hangs is killed after ``timeout_s``."""
    process = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout_s)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise RuntimeError(f"{argv[0]} did not answer within {timeout_s:g}s") from None
    return Completed(process.returncode or 0, out.decode(errors="replace"),
                     err.decode(errors="replace"))


@reclaimer("slurm")
class SlurmReclaimer(ReclaimConnector):
    """Talks to Slurm through its client commands (``squeue``, ``scancel``, ``scontrol``).

    ```yaml
    rules:
      - name: idle-slurm-jobs
        kind: idle
        match: {resource_type: "gpu.*"}
        below: 0.05
        for: 30m
        reclaim: {connector: slurm, grace: 15m, action: requeue, job_id_tag: jobid}
    ```
    """

    params_model = SlurmParams

    def __init__(self, run: Run | None = None, settle_s: float = 10.0,
                 sleep: Sleep = real_sleep) -> None:
        self._run: Run = run or run_command
        self._settle_s = settle_s
        self._sleep = sleep

    async def identify(self, request: ReclaimRequest) -> dict[str, str]:
        params = SlurmParams.model_validate(request.params)
        job_id = job_id_of(request.resource_id, request.tags, params.job_id_tag)
        job = await self.job(job_id)
        if job is None:
            raise NotReclaimable("skipped", f"Slurm job {job_id} does not exist")
        if job.state not in HOLDING_STATES:
            raise NotReclaimable("skipped", f"Slurm job {job_id} is {job.state}, not running")
        return job.identity()

    def describe(self, plan: Plan) -> str:
        action = SlurmParams.model_validate(plan.params).action
        return f"{action} Slurm job {plan.target.get('job_id', '?')}"

    async def release(self, plan: Plan) -> Outcome:
        job_id = plan.target["job_id"]
        job = await self.job(job_id)
        if job is None or job.state not in HOLDING_STATES:
            state = "gone" if job is None else job.state
            return Outcome("skipped", f"Slurm job {job_id} already ended ({state})")
        changed = target_change(plan.target, job.identity())
        if changed is not None:
            return Outcome("skipped", f"Slurm job id {job_id} no longer names the job planned "
                           f"({changed}): reused or restarted, left alone")
        action = SlurmParams.model_validate(plan.params).action
        return await ACTIONS[action](self, job)

    async def job(self, job_id: str) -> Job | None:
        """The job as ``squeue`` shows it (ended jobs too, while Slurm remembers them)."""
        done = await self._run(["squeue", "--noheader", "--states=all", "--jobs", job_id,
                                "--format", SQUEUE_FORMAT])
        if done.returncode != 0:
            if "invalid job id" in done.stderr.lower():
                return None
            raise RuntimeError(f"squeue failed: {done.stderr.strip()[:200]}")
        lines = [line for line in done.stdout.splitlines() if line.strip()]
        jobs = [parse_job(line) for line in lines]
        return next((job for job in jobs if job.job_id == job_id), None)

    async def _cancel(self, job: Job) -> Outcome:
        done = await self._run(["scancel", f"--name={job.name}", f"--user={job.user}",
                                job.job_id])
        state = await self._settled(job.job_id)
        if state in HOLDING_STATES:
            detail = (done.stderr or done.stdout).strip()[:200]
            return Outcome("failed", f"scancel left Slurm job {job.job_id} {state}: {detail}")
        return Outcome("executed", f"cancelled Slurm job {job.job_id} ({job.name}, "
                       f"{job.user}); now {state}", {"slurm_state": state})

    async def _settled(self, job_id: str) -> str:
        """The job's state once it stopped holding resources, or when ``settle_s`` ran out."""
        waited = 0.0
        while True:
            job = await self.job(job_id)
            state = "gone" if job is None else job.state
            if state not in HOLDING_STATES or waited >= self._settle_s:
                return state
            await self._sleep(0.2)
            waited += 0.2

    async def _scontrol(self, verb: str, job: Job, done_text: str) -> Outcome:
        done = await self._run(["scontrol", verb, job.job_id])
        if done.returncode != 0:
            return Outcome("failed", f"scontrol {verb} {job.job_id} failed: "
                           f"{done.stderr.strip()[:200]}")
        return Outcome("executed", f"{done_text} Slurm job {job.job_id} ({job.name}, {job.user})")

    async def _requeue(self, job: Job) -> Outcome:
        return await self._scontrol("requeue", job, "requeued")

    async def _hold(self, job: Job) -> Outcome:
        return await self._scontrol("requeuehold", job, "requeued and held")


ACTIONS: dict[str, Callable[[SlurmReclaimer, Job], Awaitable[Outcome]]] = {
    "cancel": SlurmReclaimer._cancel,
    "requeue": SlurmReclaimer._requeue,
    "hold": SlurmReclaimer._hold,
}
